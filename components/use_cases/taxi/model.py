"""The taxi use case's model: a small dense network over the transformed trip features."""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Transform's layer and TFMA need tf_keras

import tensorflow as tf  # noqa: E402

from components.use_cases.taxi import preprocessing  # noqa: E402


def build_model(hyperparameters: dict, learning_rate: float) -> tf.keras.Model:
    """A compiled binary classifier over the transformed features (dict input, [batch, 1] out):
    numeric features as they are, categorical ones embedded, then dense layers."""
    hidden_units = hyperparameters["hidden_units"]
    embedding_dim = hyperparameters["embedding_dim"]
    inputs, parts = {}, []
    for name in preprocessing.NUMERIC_FEATURES:
        inputs[name] = tf.keras.layers.Input(shape=(1,), name=name, dtype=tf.float32)
        parts.append(inputs[name])
    for name, num_ids in preprocessing.CATEGORICAL_FEATURES.items():
        inputs[name] = tf.keras.layers.Input(shape=(1,), name=name, dtype=tf.int64)
        embedded = tf.keras.layers.Embedding(num_ids, embedding_dim, name=f"{name}_emb")(
            inputs[name]
        )
        parts.append(tf.keras.layers.Flatten()(embedded))
    x = tf.keras.layers.Concatenate()(parts)
    for units in hidden_units:
        x = tf.keras.layers.Dense(units, activation="relu")(x)
    # float32 even under mixed precision: a float16 sigmoid saturates and the loss goes unstable.
    output = tf.keras.layers.Dense(1, activation="sigmoid", dtype="float32", name="probability")(x)
    model = tf.keras.Model(inputs=inputs, outputs=output)
    model.compile(
        optimizer=tf.keras.optimizers.Adam(learning_rate),
        loss=tf.keras.losses.BinaryCrossentropy(),
        metrics=[
            tf.keras.metrics.AUC(name="auc"),
            tf.keras.metrics.BinaryAccuracy(name="binary_accuracy"),
        ],
    )
    return model


def search_space(hp) -> None:
    """What a hyperparameter search tries (keras_tuner.HyperParameters; config tune=1): the
    learning rate, the batch size, the dense layers (a Choice of JSON lists) and the width of
    the embeddings."""
    hp.Float("learning_rate", 3e-4, 3e-2, sampling="log")
    hp.Choice("batch_size", [64, 128, 256])
    hp.Choice("hidden_units", ["[32]", "[64, 32]", "[128, 64]", "[128, 64, 32]"])
    hp.Choice("embedding_dim", [4, 8, 16])
