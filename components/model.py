"""TFX Trainer module: a Keras model on the transformed taxi-trip features.

`run_fn` trains on Transform's output and exports a SavedModel whose `serving_default` takes
serialized raw tf.Examples, so clients never see the transformed feature space.
"""

from __future__ import annotations

import os

# Transform's Keras layer and TFMA are built on Keras 2; pick it before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import json  # noqa: E402
import logging  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
from tfx_bsl.public import tfxio  # noqa: E402

if TYPE_CHECKING:  # the annotation only: tfx.v1 imports every component and Vertex AI's SDK
    from tfx import v1 as tfx

from components import checkpoints, distribution, features, guards, preprocessing  # noqa: E402
from components.autograph_rules import keep_autograph_out_of_libraries  # noqa: E402
from pipelines import storage  # noqa: E402

keep_autograph_out_of_libraries()  # 15 s less tracing before the first step

DEFAULT_HIDDEN_UNITS = [64, 32]
DEFAULT_LEARNING_RATE = 1e-3
DEFAULT_BATCH_SIZE = 64  # per replica, so a step sees the same examples per device
EMBEDDING_DIM = 8
DEFAULT_MAX_TRAIN_MINUTES = 120.0
DEFAULT_TENSORBOARD_STEPS = 50
BUDGET_CHECK_STEPS = 20  # multi-worker: steps between agreements on the time budget
TRAINING_SUMMARY = "training_summary.json"  # in model_run: what the run summary reports
SHARED_SHUFFLE_SEED = 20  # multi-worker: the same order on every worker (see _shard_by_files)
CACHED_SHUFFLE_BATCHES = 64
MIXED_PRECISION_SETTINGS = ("auto", "on", "off")

_log = logging.getLogger(__name__)


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


def _dataset(
    files, fn_args, tf_transform_output, batch_size: int, training: bool, cache: bool = False,
    seed: int | None = None,
) -> tf.data.Dataset:  # fmt: skip
    """Batches of (transformed features, label) from Transform's gzip TFRecords.

    tfxio reads the files in parallel (interleaved, AUTOTUNE) and parses after batching (one
    vectorised parse per batch, no Python per example); training data is shuffled, with `seed`
    when every worker must see the same order. `cache` keeps the parsed batches in memory after
    the first pass and shuffles the batches anew each epoch."""
    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size,
        label_key=features.LABEL_KEY,
        shuffle=training and not cache,
        shuffle_seed=seed,
        num_epochs=1 if cache else None,
        reader_num_threads=tf.data.AUTOTUNE,
    )
    schema = tf_transform_output.transformed_metadata.schema
    dataset = fn_args.data_accessor.tf_dataset_factory(files, options, schema)
    if cache:
        dataset = dataset.cache()
        if training:
            dataset = dataset.shuffle(CACHED_SHUFFLE_BATCHES, seed=seed)
        dataset = dataset.repeat()
    if training and seed is None:
        # tfxio's TFExampleRecord fixes the interleave's order (it ignores `sloppy_ordering`);
        # training wants whichever file is ready first. A seeded order must stay reproducible.
        unordered = tf.data.Options()
        unordered.deterministic = False
        dataset = dataset.with_options(unordered)
    return dataset.prefetch(tf.data.AUTOTUNE)


def _shard_by_files(dataset: tf.data.Dataset, files: list[str], workers: int) -> tf.data.Dataset:
    """Each worker reads its own files when there are enough of them, else every worker reads
    all and keeps every N-th batch: the order is then seeded alike on every worker (run_fn), so
    the workers' shares do not overlap; each worker reads the whole data, though."""
    if workers < 2:
        return dataset
    count = sum(len(tf.io.gfile.glob(pattern)) for pattern in files)
    policy = tf.data.experimental.AutoShardPolicy
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = (
        policy.FILE if count >= workers else policy.DATA
    )
    return dataset.with_options(options)


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
    """Trains on `fn_args.train_files` and exports to `fn_args.serving_model_dir`.

    Resumes from the training's backup when there is one (components/checkpoints.py), stops on
    the time budget or early (components/guards.py), and writes TRAINING_SUMMARY into the
    model_run folder for the run summary."""
    started = time.monotonic()
    config = fn_args.custom_config or {}
    if not fn_args.train_steps:
        raise ValueError("train_steps must be set: the training dataset repeats forever")
    # First: MultiWorkerMirroredStrategy must exist before TensorFlow runs anything.
    strategy = distribution.choose_strategy(config.get("strategy", "auto"))
    gpus = tf.config.list_logical_devices("GPU")
    mixed = use_mixed_precision(config.get("mixed_precision", "auto"), len(gpus))
    # Set either way: the policy is process-global and a previous run may have changed it.
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    replicas = strategy.num_replicas_in_sync
    workers = max(1, distribution.num_tasks(distribution.cluster_spec()))
    chief = distribution.is_chief()
    epochs = max(1, int(config.get("epochs", 1)))
    steps_per_epoch = max(1, fn_args.train_steps // epochs)
    per_replica = int(config.get("batch_size", DEFAULT_BATCH_SIZE))
    batch_size = distribution.global_batch_size(per_replica, replicas)
    learning_rate = distribution.scaled_learning_rate(
        config.get("learning_rate", DEFAULT_LEARNING_RATE), replicas
    )

    tf_transform_output = tft.TFTransformOutput(fn_args.transform_output)
    cache = bool(config.get("cache_training_data", 0))
    seed = SHARED_SHUFFLE_SEED if workers > 1 else None
    train = _dataset(
        fn_args.train_files, fn_args, tf_transform_output, batch_size, True, cache, seed
    )
    train = _shard_by_files(train, fn_args.train_files, workers)
    evaluation = _dataset(fn_args.eval_files, fn_args, tf_transform_output, batch_size, False)
    evaluation = _shard_by_files(evaluation, fn_args.eval_files, workers)
    with strategy.scope():
        model = build_model(config.get("hidden_units", DEFAULT_HIDDEN_UNITS), learning_rate)

    backup = checkpoints.TrainingBackup(
        config.get("checkpoint_dir") or os.path.join(fn_args.model_run_dir, "backup"),
        local_dir=tempfile.mkdtemp(prefix="training-backup-"),
        writer=chief,
    )
    resumed = backup.download()
    finished = backup.load_final(model)  # trained before, killed in the export: export again
    budget = guards.TimeBudget(
        float(config.get("max_train_minutes", DEFAULT_MAX_TRAIN_MINUTES)),
        started,
        agree=guards.any_worker(strategy),
        check_every=1 if workers < 2 else BUDGET_CHECK_STEPS,
    )
    throughput = guards.Throughput(batch_size)
    stopper = guards.early_stopping(int(config.get("early_stopping_patience", 0)), epochs)
    callbacks = [
        throughput,  # first: its timing brackets the training step, not the other callbacks
        checkpoints.StoreBackedBackup(backup, int(config.get("checkpoint_every_steps", 0))),
        tf.keras.callbacks.TensorBoard(
            os.path.join(fn_args.model_run_dir, "logs"),
            update_freq=int(config.get("tensorboard_every_steps", DEFAULT_TENSORBOARD_STEPS)),
            histogram_freq=1,
            write_graph=True,
        ),
        budget,
    ] + ([stopper] if fn_args.eval_steps else [])
    _log.info(
        f"Training: strategy={type(strategy).__name__} replicas={replicas} workers={workers} "
        f"devices={strategy.extended.worker_devices} mixed_precision={mixed} epochs={epochs} "
        f"steps_per_epoch={steps_per_epoch} eval_steps={fn_args.eval_steps} "
        f"global_batch={batch_size} learning_rate={learning_rate:g} "
        f"backup={backup.remote_dir} ({'resuming' if resumed else 'new'})"
    )
    if finished is None:
        model.fit(
            train,
            epochs=epochs,
            steps_per_epoch=steps_per_epoch,
            validation_data=evaluation if fn_args.eval_steps else None,
            validation_steps=fn_args.eval_steps or None,
            callbacks=callbacks,
            verbose=2,
        )
    summary = finished or {
        "strategy": distribution.name_of(strategy),
        "replicas": replicas,
        "workers": workers,
        "steps": int(model._train_counter.numpy()),
        "planned_steps": steps_per_epoch * epochs,
        "resumed": resumed,
        "examples_per_second": round(throughput.examples_per_second, 1),
        "stopped": _stop_reason(budget, stopper if fn_args.eval_steps else None),
    }
    _log.info("Training finished: %s", json.dumps(summary))
    if finished is None:  # the weights to export (the best epoch's), kept until exported
        backup.save_final(model, summary)
    _export(model, tf_transform_output, fn_args.serving_model_dir)
    if chief:
        storage.write_bytes(
            storage.join(fn_args.model_run_dir, TRAINING_SUMMARY), json.dumps(summary).encode()
        )
    backup.delete_remote()  # a finished training leaves no backup behind
    shutil.rmtree(backup.local_dir, ignore_errors=True)


def _stop_reason(budget: guards.TimeBudget, stopper) -> str:
    if budget.stopped_at_step is not None:
        return f"stopped on budget ({budget.minutes:g} min) at step {budget.stopped_at_step}"
    if stopper is not None and stopper.stopped_epoch:
        return (
            f"stopped early: no better {guards.EARLY_STOP_METRIC} for {stopper.patience} epoch(s) "
            f"after epoch {stopper.best_epoch + 1}, whose weights were kept"
        )
    return "completed"
