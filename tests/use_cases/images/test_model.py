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
    features = {IMAGE_KEY: tf.constant([_encoded("RGB", "PNG")] * 8)}
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
