"""The training loop every use case shares: TFX's `run_fn`.

`run_fn` builds the use case's model (`custom_config["use_case"]`, its `build_model`), trains it
on Transform's output under the chosen tf.distribute strategy, with backups, a time budget and
early stopping, and exports a SavedModel whose signatures take raw features
(components/training/export.py), so clients never see the transformed feature space.

Every setting comes from the Trainer's custom_config (pipelines/pipeline.py `trainer_config`, from
the config): no default here can disagree with the config's.
"""

from __future__ import annotations

import os

# Transform's Keras layer and TFMA are built on Keras 2; pick it before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import dataclasses  # noqa: E402
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

from components.base import storage  # noqa: E402
from components.base.use_case import IMAGE_FOLDERS  # noqa: E402
from components.base.use_case import load as load_use_case  # noqa: E402
from components.training import (  # noqa: E402
    checkpoints,
    distribution,
    export,  # noqa: E402
    guards,
)
from components.training.autograph_rules import keep_autograph_out_of_libraries  # noqa: E402

keep_autograph_out_of_libraries()  # 15 s less tracing before the first step

BUDGET_CHECK_STEPS = 20  # multi-worker: steps between agreements on the time budget
TRAINING_SUMMARY = "training_summary.json"  # in model_run: what the run summary reports
SHARED_SHUFFLE_SEED = 20  # multi-worker: the same order on every worker (see _shard_by_files)
CACHED_SHUFFLE_BATCHES = 64
MIXED_PRECISION_SETTINGS = ("auto", "on", "off")
# Settings run_fn takes from custom_config without a default of its own (the config has them).
REQUIRED_SETTINGS = (
    "use_case", "strategy", "mixed_precision", "epochs", "batch_size", "learning_rate",
    "max_train_minutes", "early_stopping_patience", "checkpoint_every_steps",
    "cache_training_data", "tensorboard_every_steps",
)  # fmt: skip

_log = logging.getLogger(__name__)


def use_mixed_precision(setting: str, num_gpus: int) -> bool:
    """Whether to train in mixed_float16: 'on', 'off', or 'auto' (only where a GPU makes it pay)."""
    if setting not in MIXED_PRECISION_SETTINGS:
        raise ValueError(f"mixed_precision must be one of {MIXED_PRECISION_SETTINGS}: {setting!r}")
    return setting == "on" or (setting == "auto" and num_gpus > 0)


def _dataset(
    files, fn_args, tf_transform_output, label_key: str, batch_size: int, training: bool,
    cache: bool = False, seed: int | None = None, prepare=None,
) -> tf.data.Dataset:  # fmt: skip
    """Batches of (transformed features, label) from Transform's gzip TFRecords.

    tfxio reads the files in parallel (interleaved, AUTOTUNE) and parses after batching (one
    vectorised parse per batch, no Python per example); training data is shuffled, with `seed`
    when every worker must see the same order. `cache` keeps the parsed batches in memory after
    the first pass and shuffles the batches anew each epoch. `prepare(features, training)` (the
    use case's prepare_batch: decoding images) runs on AUTOTUNE parallel calls after the cache,
    so cached data stay small and augmentation differs each epoch."""
    options = tfxio.TensorFlowDatasetOptions(
        batch_size=batch_size,
        label_key=label_key,
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
    if prepare is not None:
        dataset = dataset.map(
            lambda features, label: (prepare(features, training), label),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=seed is not None or not training,
        )
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


def run_fn(fn_args: tfx.components.FnArgs) -> None:
    """Trains on `fn_args.train_files` and exports to `fn_args.serving_model_dir`.

    Resumes from the training's backup when there is one (components/training/checkpoints.py),
    stops on the time budget or early (components/training/guards.py), and writes
    TRAINING_SUMMARY into the model_run folder for the run summary."""
    started = time.monotonic()
    config = fn_args.custom_config or {}
    missing = [key for key in REQUIRED_SETTINGS if key not in config]
    if missing:
        raise ValueError(f"the Trainer's custom_config lacks {missing} (pipelines/pipeline.py "
                         "trainer_config gives every setting)")  # fmt: skip
    use_case = load_use_case(config["use_case"])  # an unknown use case fails first
    if not fn_args.train_steps:
        raise ValueError("train_steps must be set: the training dataset repeats forever")
    # First: MultiWorkerMirroredStrategy must exist before TensorFlow runs anything.
    strategy = distribution.choose_strategy(config["strategy"])
    workers = max(1, distribution.num_tasks(distribution.cluster_spec()))
    chief = distribution.is_chief()
    epochs = max(1, int(config["epochs"]))
    steps_per_epoch = max(1, fn_args.train_steps // epochs)
    built = build(fn_args, config, strategy, workers, cache=bool(config["cache_training_data"]))
    model, train, evaluation = built.model, built.train, built.evaluation
    replicas, batch_size, mixed = strategy.num_replicas_in_sync, built.batch_size, built.mixed

    backup = checkpoints.TrainingBackup(
        config.get("checkpoint_dir") or os.path.join(fn_args.model_run_dir, "backup"),
        local_dir=tempfile.mkdtemp(prefix="training-backup-"),
        writer=chief,
    )
    resumed = backup.download()
    finished = backup.load_final(model)  # trained before, killed in the export: export again
    budget = guards.TimeBudget(
        float(config["max_train_minutes"]),
        started,
        agree=guards.any_worker(strategy),
        check_every=1 if workers < 2 else BUDGET_CHECK_STEPS,
    )
    throughput = guards.Throughput(batch_size)
    stopper = guards.early_stopping(int(config["early_stopping_patience"]), epochs,
                                    monitor=f"val_{use_case.quality_metric}")  # fmt: skip
    callbacks = [
        throughput,  # first: its timing brackets the training step, not the other callbacks
        checkpoints.StoreBackedBackup(backup, int(config["checkpoint_every_steps"])),
        tf.keras.callbacks.TensorBoard(
            os.path.join(fn_args.model_run_dir, "logs"),
            update_freq=int(config["tensorboard_every_steps"]),
            histogram_freq=1,
            write_graph=True,
        ),
        budget,
    ] + ([stopper] if fn_args.eval_steps else [])
    _log.info(
        f"Training: strategy={type(strategy).__name__} replicas={replicas} workers={workers} "
        f"devices={strategy.extended.worker_devices} mixed_precision={mixed} epochs={epochs} "
        f"steps_per_epoch={steps_per_epoch} eval_steps={fn_args.eval_steps} "
        f"global_batch={batch_size} learning_rate={built.learning_rate:g} "
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
    export.export(model, built.transform_output, fn_args.serving_model_dir, use_case.label_key,
                  class_names=config.get("class_names"), prepare=built.prepare)  # fmt: skip
    if chief:
        storage.write_bytes(
            storage.join(fn_args.model_run_dir, TRAINING_SUMMARY), json.dumps(summary).encode()
        )
    backup.delete_remote()  # a finished training leaves no backup behind
    shutil.rmtree(backup.local_dir, ignore_errors=True)


@dataclasses.dataclass
class Built:
    """What `build` returns: the model and its data, as run_fn and a search's trials train."""

    model: tf.keras.Model
    train: tf.data.Dataset
    evaluation: tf.data.Dataset
    transform_output: tft.TFTransformOutput
    prepare: object  # model_inputs': None or (features, training) -> the model's inputs
    batch_size: int  # global: per replica x replicas
    learning_rate: float  # scaled to the replicas
    mixed: bool  # training in mixed_float16


def build(fn_args, config: dict, strategy: tf.distribute.Strategy, workers: int = 1,
          cache: bool = False) -> Built:  # fmt: skip
    """The use case's model (built under `strategy`) and its datasets from Transform's output,
    with the config's hyperparameters, batch size and learning rate (scaled to the replicas)
    and mixed precision where it pays; each of `workers` reads its share of the files."""
    use_case = load_use_case(config["use_case"])
    gpus = tf.config.list_logical_devices("GPU")
    mixed = use_mixed_precision(config["mixed_precision"], len(gpus))
    # Set either way: the policy is process-global and a previous run may have changed it.
    tf.keras.mixed_precision.set_global_policy("mixed_float16" if mixed else "float32")
    replicas = strategy.num_replicas_in_sync
    batch_size = distribution.global_batch_size(int(config["batch_size"]), replicas)
    learning_rate = distribution.scaled_learning_rate(float(config["learning_rate"]), replicas)
    transform_output = tft.TFTransformOutput(fn_args.transform_output)
    seed = SHARED_SHUFFLE_SEED if workers > 1 else None
    label = use_case.label_key
    hyperparameters = use_case.resolved_hyperparameters(config.get("hyperparameters") or {})
    prepare = model_inputs(use_case, hyperparameters)
    train = _dataset(fn_args.train_files, fn_args, transform_output, label, batch_size, True,
                     cache, seed, prepare)  # fmt: skip
    evaluation = _dataset(fn_args.eval_files, fn_args, transform_output, label, batch_size,
                          False, prepare=prepare)  # fmt: skip
    with strategy.scope():
        model = use_case.function("build_model")(
            hyperparameters, learning_rate, **model_context(use_case, config)
        )
    return Built(
        model=model,
        train=_shard_by_files(train, fn_args.train_files, workers),
        evaluation=_shard_by_files(evaluation, fn_args.eval_files, workers),
        transform_output=transform_output,
        prepare=prepare,
        batch_size=batch_size,
        learning_rate=learning_rate,
        mixed=mixed,
    )


def model_inputs(use_case, hyperparameters: dict):
    """The use case's prepare_batch bound to its hyperparameters: (features, training) -> the
    model's inputs; None when it has none."""
    if not use_case.prepare_batch:
        return None
    prepare_batch = use_case.function("prepare_batch")
    return lambda features, training: prepare_batch(features, hyperparameters, training)


def model_context(use_case, config: dict) -> dict:
    """build_model's arguments beyond the hyperparameters and learning rate: the classes and
    initial weights of a use case whose classes come from the data."""
    if use_case.input_format != IMAGE_FOLDERS:
        return {}
    if not config.get("class_names"):
        raise ValueError(
            "the Trainer's custom_config lacks class_names: the Trainer step takes them from "
            "ExampleGen's examples (components/steps/trainer.py)"
        )
    weights = config.get("initial_weights") or ""
    return {"class_names": list(config["class_names"]), "weights_path": local_weights(weights)}


def local_weights(uri: str) -> str | None:
    """A local copy of the weights file at `uri` (the store's, or a local path as it is), for
    Keras, which reads local files; None for "". A missing file stops the training naming it."""
    if not uri:
        return None
    if "://" not in uri:
        if not os.path.exists(uri):
            raise FileNotFoundError(f"initial_weights {uri} does not exist: give the path of a "
                                    "Keras weights file (.h5), or set it to '' to start from "
                                    "scratch")  # fmt: skip
        return uri
    if not storage.list_files(uri):
        raise FileNotFoundError(
            f"initial_weights {uri} does not exist on the object store: upload the weights "
            "file there, or set initial_weights to ''"
        )
    local = os.path.join(tempfile.mkdtemp(prefix="initial-weights-"), os.path.basename(uri))
    with open(local, "wb") as file:
        file.write(storage.read_bytes(uri))
    return local


def _stop_reason(budget: guards.TimeBudget, stopper) -> str:
    if budget.stopped_at_step is not None:
        return f"stopped on budget ({budget.minutes:g} min) at step {budget.stopped_at_step}"
    if stopper is not None and stopper.stopped_epoch:
        return (
            f"stopped early: no better {stopper.monitor} for {stopper.patience} epoch(s) "
            f"after epoch {stopper.best_epoch + 1}, whose weights were kept"
        )
    return "completed"
