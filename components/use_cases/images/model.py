"""The images use case's model: a small convolutional network, or EfficientNetV2 (B0 and up).

`hyperparameters["network"]` chooses: "small_cnn" (the default: on this project's 2-core
machines it reaches the gate within the default run's few minutes) or "efficientnetv2-b0" ...
"efficientnetv2-b3" (`tf_keras.applications`, from scratch unless the config's initial_weights
names a weights file). The input is pixels in [0, 255] as `preprocessing.prepare_batch` gives
them; the output is one probability per class, float32 even under mixed precision.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from components.base.image_features import IMAGE_KEY  # noqa: E402
from components.use_cases.images.preprocessing import CHANNELS  # noqa: E402

EFFICIENTNETS = {
    "efficientnetv2-b0": "EfficientNetV2B0",
    "efficientnetv2-b1": "EfficientNetV2B1",
    "efficientnetv2-b2": "EfficientNetV2B2",
    "efficientnetv2-b3": "EfficientNetV2B3",
}
NETWORKS = ("small_cnn", *EFFICIENTNETS)


def _small_cnn(pixels: tf.Tensor, filters: list[int]) -> tf.Tensor:
    x = tf.keras.layers.Rescaling(1 / 255.0)(pixels)
    for count in filters:
        x = tf.keras.layers.Conv2D(count, 3, padding="same", use_bias=False)(x)
        # Momentum 0.9, not Keras' 0.99: on a training of a few hundred steps the slower moving
        # statistics lag the weights, and evaluation (which uses them) fell to chance on some
        # seeds while training accuracy was 0.9 (0.27 vs 0.93 at 400 steps, measured).
        x = tf.keras.layers.BatchNormalization(momentum=0.9)(x)
        x = tf.keras.layers.ReLU()(x)
        x = tf.keras.layers.MaxPooling2D()(x)
    return tf.keras.layers.GlobalAveragePooling2D()(x)


def backbone(network: str, size: int) -> tf.keras.Model:
    """An EfficientNetV2 without its top, taking [0, 255] pixels (its own rescaling inside)."""
    build = getattr(tf.keras.applications, EFFICIENTNETS[network])
    return build(include_top=False, weights=None, input_shape=(size, size, CHANNELS),
                 include_preprocessing=True, pooling="avg")  # fmt: skip


def _load_weights(model: tf.keras.Model, network: str, path: str) -> None:
    """The whole model's weights (a previous training of the same network and classes), else,
    for an EfficientNetV2, its backbone's (a "notop" file such as Keras' own)."""
    try:
        model.load_weights(path)
        return
    except ValueError as whole:
        if network == "small_cnn":
            raise ValueError(
                f"initial_weights {path}: not weights of this model ({whole})"
            ) from whole
        backbone = next(layer for layer in model.layers if isinstance(layer, tf.keras.Model))
        try:
            backbone.load_weights(path)
        except ValueError as part:
            raise ValueError(
                f"initial_weights {path}: neither this model's weights ({whole}) nor its "
                f"{network} backbone's ({part})"
            ) from part


def build_model(
    hyperparameters: dict,
    learning_rate: float,
    class_names: list[str],
    weights_path: str | None = None,
) -> tf.keras.Model:
    """A compiled classifier over `class_names`: {"image": pixels} -> [batch, classes]
    probabilities, with metrics "accuracy" and "top_2_accuracy". `weights_path` (a Keras
    weights file of the same network, e.g. one saved by a previous training) initialises it."""
    network, size = hyperparameters["network"], int(hyperparameters["image_size"])
    if network not in NETWORKS:
        raise ValueError(f"hyperparameter network must be one of {NETWORKS}, got {network!r}")
    pixels = tf.keras.layers.Input(shape=(size, size, CHANNELS), name=IMAGE_KEY)
    if network == "small_cnn":
        x = _small_cnn(pixels, list(hyperparameters["filters"]))
    else:
        x = backbone(network, size)(pixels)
    x = tf.keras.layers.Dropout(float(hyperparameters["dropout"]))(x)
    # float32 even under mixed precision: a float16 softmax loses the small probabilities.
    output = tf.keras.layers.Dense(
        len(class_names), activation="softmax", dtype="float32", name="probabilities"
    )(x)
    model = tf.keras.Model(inputs={IMAGE_KEY: pixels}, outputs=output)
    if weights_path:
        _load_weights(model, network, weights_path)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.SparseCategoricalCrossentropy(),
        metrics=[
            tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy"),
            tf.keras.metrics.SparseTopKCategoricalAccuracy(k=2, name="top_2_accuracy"),
        ],
    )
    return model


def search_space(hp) -> None:
    """What a hyperparameter search tries (keras_tuner.HyperParameters; config tune=1): the
    learning rate, the batch size, the network's width (its filters, a Choice of JSON lists),
    its input size and dropout."""
    hp.Float("learning_rate", 3e-4, 1e-2, sampling="log")
    hp.Choice("batch_size", [16, 32, 64])
    hp.Choice("filters", ["[8, 16, 32]", "[16, 32, 64]", "[32, 64, 128]"])
    hp.Choice("image_size", [32, 48])
    hp.Float("dropout", 0.0, 0.5, step=0.1)
