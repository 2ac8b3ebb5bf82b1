"""The images use case's decoding and model: JPEG and PNG (grey, RGB, RGBA) decode to one size
and three channels, augmentation runs in training only, the exported model scores an image's
bytes exactly as the Keras model scores prepare_batch's pixels, and each network builds."""

import io
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
from PIL import Image  # noqa: E402

from components.base.image_features import IMAGE_KEY  # noqa: E402
from components.training.export import RAW_SIGNATURE  # noqa: E402
from components.use_cases.images import model, preprocessing  # noqa: E402

HYPERPARAMETERS = {"network": "small_cnn", "image_size": 32, "filters": [8, 16], "dropout": 0.1,
                   "augment": True}  # fmt: skip


def _encoded(mode: str, kind: str, size=(50, 70)) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], len(mode)))
    image = Image.fromarray(pixels.astype(np.uint8).squeeze(), mode)
    buffer = io.BytesIO()
    image.save(buffer, kind)
    return buffer.getvalue()


def test_every_mode_and_format_decodes_to_the_model_size_with_three_channels():
    encoded = [_encoded("L", "PNG"), _encoded("RGB", "JPEG"), _encoded("RGBA", "PNG"),
               _encoded("RGB", "PNG", size=(300, 20))]  # fmt: skip
    pixels = preprocessing.decode_images(tf.constant(encoded), 32).numpy()
    assert pixels.shape == (4, 32, 32, 3) and pixels.dtype == np.float32
    assert 0 <= pixels.min() and pixels.max() <= 255
    grey = pixels[0]
    np.testing.assert_allclose(grey[..., 0], grey[..., 2])  # grey stays grey in three channels


def test_augmentation_runs_when_training_only():
    tf.random.set_seed(7)  # 32 images: that none is flipped or cropped has odds of 2^-32
    features = {IMAGE_KEY: tf.constant([_encoded("RGB", "PNG")] * 32)}
    served = preprocessing.prepare_batch(features, HYPERPARAMETERS, training=False)[IMAGE_KEY]
    again = preprocessing.prepare_batch(features, HYPERPARAMETERS, training=False)[IMAGE_KEY]
    np.testing.assert_array_equal(served.numpy(), again.numpy())
    trained = preprocessing.prepare_batch(features, HYPERPARAMETERS, training=True)[IMAGE_KEY]
    assert trained.shape == served.shape and not np.allclose(trained.numpy(), served.numpy())


def test_the_served_model_scores_bytes_as_the_model_scores_prepared_pixels(session_models):
    trained = session_models.trained("images")
    frame = trained.eval_frame.head(6)
    images = tf.constant(list(frame[IMAGE_KEY]))
    saved = tf.saved_model.load(trained.fn_args.serving_model_dir)
    served = saved.signatures[RAW_SIGNATURE](image=images)
    hyperparameters = trained.use_case.resolved_hyperparameters(
        trained.fn_args.custom_config.get("hyperparameters", {})
    )
    pixels = preprocessing.prepare_batch({IMAGE_KEY: images}, hyperparameters, training=False)
    keras = tf.keras.models.load_model(trained.fn_args.serving_model_dir)
    np.testing.assert_allclose(served["scores"].numpy(), keras(pixels).numpy(), atol=1e-5)
    assert [c.decode() for c in served["classes"].numpy()[0]] == trained.kit.class_names


@pytest.mark.parametrize("network", ["small_cnn", "efficientnetv2-b0"])
def test_each_network_builds_a_classifier_of_one_probability_per_class(network):
    hyperparameters = dict(HYPERPARAMETERS, network=network)
    built = model.build_model(hyperparameters, 0.001, ["a", "b", "c"])
    pixels = tf.random.uniform([2, 32, 32, 3], 0, 255)
    scores = built({IMAGE_KEY: pixels}).numpy()
    assert scores.shape == (2, 3) and np.allclose(scores.sum(axis=1), 1.0, atol=1e-5)
    with pytest.raises(ValueError, match="network must be one of"):
        model.build_model(dict(HYPERPARAMETERS, network="resnet"), 0.001, ["a", "b"])


def test_initial_weights_come_from_the_store_whole_or_for_the_backbone(object_store, tmp_path):
    from components.base import storage
    from components.training.loop import local_weights

    classes = ["a", "b", "c"]
    trained = model.build_model(HYPERPARAMETERS, 0.001, classes)
    trained.save_weights(str(tmp_path / "trained.h5"))
    uri = f"s3://{object_store.new_bucket('weights')}/start/trained.h5"
    storage.write_bytes(uri, (tmp_path / "trained.h5").read_bytes())

    started = model.build_model(HYPERPARAMETERS, 0.001, classes, weights_path=local_weights(uri))
    for mine, theirs in zip(started.get_weights(), trained.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)
    fresh = model.build_model(HYPERPARAMETERS, 0.001, classes)
    assert not all(np.array_equal(a, b) for a, b in
                   zip(fresh.get_weights(), trained.get_weights(), strict=True))  # fmt: skip

    # An EfficientNetV2 starts from its backbone's weights alone (a "notop" file).
    network = dict(HYPERPARAMETERS, network="efficientnetv2-b0")
    backbone = model.backbone("efficientnetv2-b0", 32)
    backbone.save_weights(str(tmp_path / "notop.h5"))
    started = model.build_model(network, 0.001, classes, weights_path=str(tmp_path / "notop.h5"))
    inner = next(layer for layer in started.layers if isinstance(layer, tf.keras.Model))
    for mine, theirs in zip(inner.get_weights(), backbone.get_weights(), strict=True):
        np.testing.assert_array_equal(mine, theirs)

    with pytest.raises(FileNotFoundError, match="initial_weights s3://.*/nothing.h5 does not"):
        local_weights(uri.replace("trained.h5", "nothing.h5"))
    with pytest.raises(ValueError, match="not weights of this model"):
        model.build_model(HYPERPARAMETERS, 0.001, ["a", "b"], weights_path=local_weights(uri))
