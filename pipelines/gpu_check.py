"""`tkp gpu-check`: one script to run once on a machine with NVIDIA GPUs.

Trains the use case's model (its `build_model` with its `gpu_check_hyperparameters` over its
defaults, then the config's `hyperparameters`; the config's batch size) for a fixed number of
steps on the CPU, on one GPU and on all GPUs (MirroredStrategy),
each in float32 and in mixed precision, and prints examples/second and the GPUs' mean
utilisation (nvidia-smi, sampled every 0.2 s) for each. The batches are synthetic transformed
features already in memory, so the figures are the model's and the device's, not the input's
(`tkp bench-input` measures that); an image model's inputs are decoded pixels at its size. Without
a GPU it prints the CPU rows and says so; beside GPUs the CPU row is a float32 reference of 20
steps.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import threading
import time

from components.base.config import PipelineConfig


def _batches(keras_model, batch_size: int, count: int, classes: int):
    """Random inputs shaped as the model's (integer ids 0 or 1: valid for any embedding), and
    labels: a class index of `classes`, or 0/1 for a binary model (classes 0)."""
    import tensorflow as tf

    rng = tf.random.Generator.from_seed(0)
    features = {}
    for tensor in keras_model.inputs:
        shape = [count * batch_size, *tensor.shape[1:]]
        features[tensor.name.split(":")[0]] = (
            rng.uniform(shape, 0, 2, dtype=tf.int64) if tensor.dtype.is_integer
            else rng.normal(shape)
        )  # fmt: skip
    if classes:
        labels = rng.uniform([count * batch_size], 0, classes, dtype=tf.int64)
    else:
        labels = tf.cast(rng.uniform([count * batch_size, 1]) > 0.5, tf.float32)
    data = tf.data.Dataset.from_tensor_slices((features, labels)).batch(batch_size)
    return data.cache().repeat()


class _Utilisation:
    """Mean GPU utilisation (%) from nvidia-smi while a block runs; None without nvidia-smi."""

    def __init__(self):
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.2):
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"],
                capture_output=True, text=True, check=False,
            )  # fmt: skip
            values = [float(v) for v in out.stdout.split() if v.strip().isdigit()]
            if values:
                self.samples.append(statistics.mean(values))

    def __enter__(self):
        if shutil.which("nvidia-smi"):
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()

    @property
    def mean(self) -> float | None:
        return statistics.mean(self.samples) if self.samples else None


CPU_STEPS_BESIDE_GPUS = 20


def model_settings(config: PipelineConfig) -> tuple[dict, dict]:
    """(hyperparameters, build_model's other arguments) of the model gpu-check measures: the use
    case's gpu_check_hyperparameters over its defaults, then the config's; a use case whose
    classes come from the data gets the configured classes, else four."""
    from components.base.use_case import load as load_use_case
    from components.training.loop import model_context

    use_case = load_use_case(config.use_case)
    hyperparameters = use_case.resolved_hyperparameters(
        {**use_case.gpu_check_hyperparameters, **json.loads(config.hyperparameters)}
    )
    classes = config.class_names.split(",") if config.class_names else []
    context = model_context(use_case, {"class_names": classes or [f"class-{i}" for i in range(4)]})
    context.pop("weights_path", None)  # from scratch: the speed is the same
    return hyperparameters, context


def run(config: PipelineConfig, steps: int = 300, say=print) -> list[dict]:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    from components.base.use_case import load as load_use_case

    use_case = load_use_case(config.use_case)
    build_model = use_case.function("build_model")
    hyperparameters, context = model_settings(config)
    classes = len(context.get("class_names", []))  # 0: a binary model

    gpus = tf.config.list_logical_devices("GPU")
    say(f"GPUs visible to TensorFlow: {len(gpus)}"
        f"{'' if gpus else ' (no GPU: CPU rows only)'}")  # fmt: skip
    say(f"Model: use case {use_case.name!r}, hyperparameters {json.dumps(hyperparameters)}")
    if gpus:
        say(f"cuDNN {tf.sysconfig.get_build_info().get('cudnn_version', '?')}")
    setups = [("CPU", tf.distribute.OneDeviceStrategy("/cpu:0"))]
    if gpus:
        setups.append(("1 GPU", tf.distribute.OneDeviceStrategy("/gpu:0")))
    if len(gpus) > 1:
        setups.append((f"{len(gpus)} GPUs", tf.distribute.MirroredStrategy()))
    rows = []
    for name, strategy in setups:
        # Beside GPUs the CPU row is a reference only: float32, CPU_STEPS_BESIDE_GPUS steps after
        # 2 (an image network on a CPU would take many minutes of a GPU machine's time, and
        # float16 is emulated there).
        reference = bool(gpus) and name == "CPU"
        for precision in ("float32",) if reference else ("float32", "mixed_float16"):
            timed = min(steps, CPU_STEPS_BESIDE_GPUS) if reference else steps
            tf.keras.mixed_precision.set_global_policy(precision)
            replicas = strategy.num_replicas_in_sync
            batch = config.batch_size * replicas
            with strategy.scope():
                keras_model = build_model(hyperparameters, config.learning_rate, **context)
            data = _batches(keras_model, batch, 20, classes)
            warm_up = 2 if reference else 20  # tracing, cache
            keras_model.fit(data, steps_per_epoch=warm_up, epochs=1, verbose=0)
            with _Utilisation() as utilisation:
                began = time.perf_counter()
                keras_model.fit(data, steps_per_epoch=timed, epochs=1, verbose=0)
                seconds = time.perf_counter() - began
            row = {
                "devices": name, "precision": precision, "replicas": replicas,
                "examples_per_second": timed * batch / seconds,
                "gpu_utilisation": utilisation.mean,
            }  # fmt: skip
            rows.append(row)
            used = "-" if row["gpu_utilisation"] is None else f"{row['gpu_utilisation']:.0f} %"
            say(f"  {name:<8} {precision:<14} {row['examples_per_second']:>12,.0f} examples/s"
                f"   GPU utilisation {used}")  # fmt: skip
    tf.keras.mixed_precision.set_global_policy("float32")
    return rows
