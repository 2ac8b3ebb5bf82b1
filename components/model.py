"""TFX Trainer module: a Keras model on the transformed taxi-trip features.

`run_fn` trains on Transform's output and exports a SavedModel whose `serving_default` takes
serialized raw tf.Examples, so clients never see the transformed feature space.
"""

from __future__ import annotations

import os

# Transform's Keras layer and TFMA are built on Keras 2; pick it before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import logging  # noqa: E402
import re  # noqa: E402

import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
from tfx import v1 as tfx  # noqa: E402
from tfx_bsl.public import tfxio  # noqa: E402

from components import features, preprocessing  # noqa: E402

DEFAULT_HIDDEN_UNITS = [64, 32]
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BATCH_SIZE = 64  # per replica, so a step sees the same examples per device
EMBEDDING_DIM = 8
CHECKPOINT_NAME = "epoch-{epoch:03d}"  # Keras numbers epochs from 1: the count of finished ones
MIXED_PRECISION_SETTINGS = ("auto", "on", "off")


def strategy_kind(num_gpus: int) -> str:
    """'mirrored', 'gpu' or 'cpu': the kind of strategy for `num_gpus` visible GPUs."""
    if num_gpus > 1:
        return "mirrored"
    return "gpu" if num_gpus == 1 else "cpu"


def choose_strategy(gpus: list | None = None) -> tf.distribute.Strategy:
    """The distribution strategy for `gpus` (default: the visible GPUs)."""
    gpus = tf.config.list_logical_devices("GPU") if gpus is None else gpus
    kind = strategy_kind(len(gpus))
    if kind == "mirrored":
        return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(len(gpus))])
    return tf.distribute.OneDeviceStrategy("/gpu:0" if kind == "gpu" else "/cpu:0")


def use_mixed_precision(setting: str, num_gpus: int) -> bool:
    """Whether to train in mixed_float16: 'on', 'off', or 'auto' (only where a GPU makes it pay)."""
    if setting not in MIXED_PRECISION_SETTINGS:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION_SETTINGS}: {setting!r}")
    return setting == "on" or (setting == "auto" and num_gpus > 0)


def build_model(hidden_units: list[int], learning_rate: float) -> tf.keras.Model:
    """A compiled binary classifier over the transformed features (dict input, [batch, 1] out)."""
    inputs, parts = {}, []
    for name in preprocessing.NUMERIC_FEATURES:
        inputs[name] = tf.keras.layers.Input(shape=(1,), name=name, dtype=tf.float32)
        parts.append(inputs[name])
    for name, num_ids in preprocessing.CATEGORICAL_FEATURES.items():
        inputs[name] = tf.keras.layers.Input(shape=(1,), name=name, dtype=tf.int64)
        embedded = tf.keras.layers.Embedding(num_ids, EMBEDDING_DIM, name=f"{name}_emb")(
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


def _dataset(files, fn_args, tf_transform_output, batch_size: int) -> tf.data.Dataset:
    options = tfxio.TensorFlowDatasetOptions(batch_size=batch_size, label_key=features.LABEL_KEY)
    schema = tf_transform_output.transformed_metadata.schema
    return fn_args.data_accessor.tf_dataset_factory(files, options, schema).prefetch(
        tf.data.AUTOTUNE
    )


def _restore_latest(model: tf.keras.Model, checkpoint_dir: str) -> int:
    """Loads the newest epoch checkpoint, if any, so a restarted Trainer resumes from it."""
    latest = tf.train.latest_checkpoint(checkpoint_dir)
    if latest is None:
        return 0
    model.load_weights(latest)
    return int(re.search(r"epoch-(\d+)", latest).group(1))


# Signatures of the exported SavedModel, as TF Serving's REST API reaches them:
# - SERVING_SIGNATURE takes serialized raw tf.Examples ("examples") and returns {"outputs":
#   [batch, 1]} P(big tip): `:predict` with base64 examples (the TFX convention); TFMA
#   evaluates through it.
# - CLASSIFY_SIGNATURE and REGRESS_SIGNATURE take the same examples under the name "inputs",
#   which TF Serving's :classify and :regress require (classifier.cc, regressor.cc): "classes"
#   ["0", "1"] and their "scores"; "outputs" [batch, 1].
# - RAW_SIGNATURE takes one [batch] tensor per raw feature: `:predict` with plain JSON values.
#   Every feature is required there (TF Serving wants every input of a signature); an optional
#   feature says "missing" with the value preprocessing_fn gives a missing one ("" or 0).
SERVING_SIGNATURE = "serving_default"
CLASSIFY_SIGNATURE = "classify"
REGRESS_SIGNATURE = "regress"
RAW_SIGNATURE = "raw_features"
TRANSFORM_SIGNATURE = "transform_features"
CLASS_LABELS = ("0", "1")


def _export(model: tf.keras.Model, tf_transform_output, serving_model_dir: str) -> None:
    # A layer built under mixed_float16 would cast the raw floats to half before the transform
    # graph, which takes float32; the trained layers keep the policy they were built with.
    tf.keras.mixed_precision.set_global_policy("float32")
    model.tft_layer = tf_transform_output.transform_features_layer()  # tracks the vocab assets
    raw_spec = tf_transform_output.raw_feature_spec()
    serving_spec = {k: v for k, v in raw_spec.items() if k != features.LABEL_KEY}
    examples_spec = tf.TensorSpec([None], tf.string, name="examples")

    def probability(parsed: dict) -> tf.Tensor:
        transformed = model.tft_layer(parsed)
        transformed.pop(features.LABEL_KEY, None)
        return tf.cast(model(transformed), tf.float32)

    @tf.function(input_signature=[examples_spec])
    def serve(examples):
        return {"outputs": probability(tf.io.parse_example(examples, serving_spec))}

    inputs_spec = tf.TensorSpec([None], tf.string, name="inputs")

    @tf.function(input_signature=[inputs_spec])
    def classify(inputs):
        p = probability(tf.io.parse_example(inputs, serving_spec))
        scores = tf.concat([1.0 - p, p], axis=1)
        classes = tf.tile(tf.constant([CLASS_LABELS]), [tf.shape(p)[0], 1])
        return {"classes": classes, "scores": scores}

    @tf.function(input_signature=[inputs_spec])
    def regress(inputs):
        return {"outputs": probability(tf.io.parse_example(inputs, serving_spec))}

    raw_inputs = {
        key: tf.TensorSpec([None], spec.dtype, name=key) for key, spec in serving_spec.items()
    }

    @tf.function
    def raw_features(**inputs):
        parsed = {}
        for key, spec in serving_spec.items():
            column = tf.reshape(inputs[key], [-1, 1])
            # A VarLen feature is sparse after parsing; from_dense drops the "missing" 0 / "".
            varlen = isinstance(spec, tf.io.VarLenFeature)
            parsed[key] = tf.sparse.from_dense(column) if varlen else column
        return {"outputs": probability(parsed)}

    # TFMA evaluates on labelled examples, so this one parses the label too.
    @tf.function(input_signature=[examples_spec])
    def transform_features(examples):
        return model.tft_layer(tf.io.parse_example(examples, raw_spec))

    signatures = {
        SERVING_SIGNATURE: serve,
        CLASSIFY_SIGNATURE: classify,
        REGRESS_SIGNATURE: regress,
        RAW_SIGNATURE: raw_features.get_concrete_function(**raw_inputs),
        TRANSFORM_SIGNATURE: transform_features,
    }
    model.save(serving_model_dir, save_format="tf", signatures=signatures)


def run_fn(fn_args: tfx.components.FnArgs) -> None:
    """Trains on `fn_args.train_files` and exports to `fn_args.serving_model_dir`."""
    config = fn_args.custom_config or {}
    if not fn_args.train_steps:
        raise ValueError("train_steps must be set: the training dataset repeats forever")
    gpus = tf.config.list_logical_devices("GPU")
    strategy = choose_strategy(gpus)
    mixed = use_mixed_precision(config.get("mixed_precision", "auto"), len(gpus))
    # Set either way: the policy is process-global and a previous run may have changed it.
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    epochs = max(1, int(config.get("epochs", 1)))
    steps_per_epoch = max(1, fn_args.train_steps // epochs)
    batch_size = int(config.get("batch_size", DEFAULT_BATCH_SIZE)) * strategy.num_replicas_in_sync

    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
    train = _dataset(fn_args.train_files, fn_args, tf_transform_output, batch_size)
    evaluation = _dataset(fn_args.eval_files, fn_args, tf_transform_output, batch_size)
    with strategy.scope():
        model = build_model(
            config.get("hidden_units", DEFAULT_HIDDEN_UNITS),
            config.get("learning_rate", DEFAULT_LEARNING_RATE),
        )
    checkpoint_dir = os.path.join(fn_args.model_run_dir, "checkpoints")
    initial_epoch = _restore_latest(model, checkpoint_dir)
    logging.getLogger(__name__).info(
        f"Training: strategy={type(strategy).__name__} devices={strategy.extended.worker_devices} "
        f"mixed_precision={mixed} epochs={epochs} (from {initial_epoch}) steps_per_epoch="
        f"{steps_per_epoch} eval_steps={fn_args.eval_steps} global_batch={batch_size}"
    )
    callbacks = [
        tf.keras.callbacks.TensorBoard(
            os.path.join(fn_args.model_run_dir, "logs"), update_freq="epoch"
        ),
        tf.keras.callbacks.ModelCheckpoint(
            os.path.join(checkpoint_dir, CHECKPOINT_NAME), save_weights_only=True
        ),
    ]
    model.fit(
        train,
        epochs=epochs,
        initial_epoch=initial_epoch,
        steps_per_epoch=steps_per_epoch,
        validation_data=evaluation if fn_args.eval_steps else None,
        validation_steps=fn_args.eval_steps or None,
        callbacks=callbacks,
        verbose=2,
    )
    _export(model, tf_transform_output, fn_args.serving_model_dir)
