"""tf.Transform `preprocessing_fn` for the taxi-trip data.

The same graph runs in the Transform component and, through `transform_features_layer`, in the
serving signature, so training and serving can't drift apart.
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_transform as tft

from components.use_cases.taxi import features

# Raw-ish names of the derived features; their transformed names go through
# `features.transformed_name` like every other feature.
BUCKET_KEY = "trip_miles_bucket"
HOUR_KEY = "trip_start_hour"
DAY_KEY = "trip_start_day"

SECONDS_PER_HOUR = 3600
SECONDS_PER_DAY = 24 * SECONDS_PER_HOUR
EPOCH_WEEKDAY = 3  # 1970-01-01 was a Thursday; Monday = 0 as in datetime.weekday()

# Transformed float features the model reads.
NUMERIC_FEATURES = [features.transformed_name(key) for key in features.NUMERIC_FEATURE_KEYS]

# Transformed integer features and how many ids each can take (the model's embedding sizes).
# OOV ids start at the actual vocabulary size, which is at most VOCAB_SIZE.
CATEGORICAL_FEATURES = {
    **{
        features.transformed_name(key): features.VOCAB_SIZE + features.OOV_SIZE
        for key in features.CATEGORICAL_STRING_KEYS
    },
    features.transformed_name(BUCKET_KEY): features.NUM_BUCKETS,
    **{
        features.transformed_name(key): features.COMMUNITY_AREAS
        for key in features.CATEGORICAL_INT_KEYS
    },
    features.transformed_name(HOUR_KEY): features.HOURS,
    features.transformed_name(DAY_KEY): features.DAYS,
}


def vocab_filename(key: str) -> str:
    """Name of the vocabulary asset for raw column `key` (findable in transform_fn/assets)."""
    return f"{key}_vocab"


def to_dense(tensor: tf.Tensor | tf.SparseTensor | tf.RaggedTensor, default) -> tf.Tensor:
    """A dense [batch] tensor from a [batch], [batch, 1] or 0-or-1-valued [batch, None] input.

    Columns with missing values are decoded as VarLen (sparse or ragged) features; an empty row
    becomes `default`.
    """
    if isinstance(tensor, tf.SparseTensor):
        batch_size = tensor.dense_shape[0]
        tensor = tf.sparse.to_dense(
            tf.SparseTensor(tensor.indices, tensor.values, [batch_size, 1]), default
        )
    elif isinstance(tensor, tf.RaggedTensor):
        tensor = tensor.to_tensor(default_value=default, shape=[None, 1])
    return tf.reshape(tensor, [-1])


def preprocessing_fn(inputs: dict) -> dict:
    """Maps raw columns to the model's features (and the label, when `inputs` has it)."""
    outputs = {}
    for key in features.NUMERIC_FEATURE_KEYS:
        value = tf.cast(to_dense(inputs[key], 0), tf.float32)
        outputs[features.transformed_name(key)] = tft.scale_to_z_score(value)
    miles = tf.cast(to_dense(inputs[features.BUCKET_FEATURE_KEY], 0), tf.float32)
    outputs[features.transformed_name(BUCKET_KEY)] = tft.bucketize(miles, features.NUM_BUCKETS)

    for key in features.CATEGORICAL_STRING_KEYS:
        # Empty strings never enter a tf.Transform vocabulary, so missing values land in OOV.
        outputs[features.transformed_name(key)] = tft.compute_and_apply_vocabulary(
            to_dense(inputs[key], ""),
            top_k=features.VOCAB_SIZE,
            num_oov_buckets=features.OOV_SIZE,
            vocab_filename=vocab_filename(key),
        )
    for key in features.CATEGORICAL_INT_KEYS:
        # 0 is the reserved "missing" area; clipping keeps a bad value from breaking embeddings.
        area = tf.cast(to_dense(inputs[key], 0), tf.int64)
        outputs[features.transformed_name(key)] = tf.clip_by_value(
            area, 0, features.COMMUNITY_AREAS - 1
        )

    # Timestamps are UTC seconds, so plain integer arithmetic gives hour and weekday.
    timestamp = tf.cast(to_dense(inputs[features.TIMESTAMP_KEY], 0), tf.int64)
    outputs[features.transformed_name(HOUR_KEY)] = (timestamp // SECONDS_PER_HOUR) % features.HOURS
    outputs[features.transformed_name(DAY_KEY)] = (
        timestamp // SECONDS_PER_DAY + EPOCH_WEEKDAY
    ) % features.DAYS

    # Serving requests carry no label, and the transform graph must still apply to them.
    if features.LABEL_KEY in inputs:
        outputs[features.LABEL_KEY] = tf.cast(to_dense(inputs[features.LABEL_KEY], 0), tf.int64)
    return outputs
