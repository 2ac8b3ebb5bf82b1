"""Which tf.distribute strategy trains the model, and how batch and learning rate follow it.

`strategy` (PipelineConfig) is one of:
- auto: multi_worker when TF_CONFIG names more than one task, else mirrored over all visible
  GPUs when there are several, else one device (the GPU, or the CPU);
- one_device: OneDeviceStrategy on the first GPU, or the CPU;
- mirrored: MirroredStrategy over every visible GPU (the CPU when there is none);
- multi_worker: MultiWorkerMirroredStrategy over the cluster in TF_CONFIG (local processes on
  loopback, components/training/local_workers.py, or a TrainJob's or TFJob's replicas on
  Kubeflow).
parameter_server and tpu are refused when the config is built (components/base/config.py says why).

Batch and learning rate: `batch_size` is per replica, so the global batch is
batch_size x replicas (all GPUs of all workers) and a step takes as long on 8 GPUs as on one.
A bigger batch averages the gradient over more examples; for Adam the learning rate is scaled
by sqrt(replicas) (the square-root rule: Hoffer et al. 2017; Malladi et al. 2022 derive it for
adaptive optimizers), not linearly as for SGD (Goyal et al. 2017), which makes Adam unstable.
`train_steps` counts global steps, so more replicas see more examples in the same steps.
"""

from __future__ import annotations

import functools
import json
import math
import os

import tensorflow as tf


def cluster_spec() -> dict:
    """The TF_CONFIG of this process, or {} when there is none."""
    return json.loads(os.environ.get("TF_CONFIG") or "{}")


def num_tasks(tf_config: dict) -> int:
    return sum(len(tasks) for tasks in tf_config.get("cluster", {}).values())


def is_chief(tf_config: dict | None = None) -> bool:
    """Whether this process writes what only one may: the model, TensorBoard, the backups.

    The chief is task `chief` when the cluster has one (a TFJob's Chief, a TrainJob's replica
    0), else worker 0: MultiWorkerMirroredStrategy's own rule (multi_worker_util.is_chief)."""
    tf_config = cluster_spec() if tf_config is None else tf_config
    task = tf_config.get("task", {})
    if not task:
        return True
    if "chief" in tf_config.get("cluster", {}):
        return task.get("type") == "chief"
    return task.get("type") == "worker" and int(task.get("index", 0)) == 0


def strategy_kind(setting: str, num_gpus: int, tf_config: dict | None = None) -> str:
    """'multi_worker', 'mirrored', 'gpu' or 'cpu' for a `strategy` setting on this machine."""
    tf_config = cluster_spec() if tf_config is None else tf_config
    if setting == "multi_worker" or (setting == "auto" and num_tasks(tf_config) > 1):
        if num_tasks(tf_config) < 2:
            raise ValueError(
                "strategy=multi_worker needs TF_CONFIG naming two or more tasks; set num_workers "
                "so that the runner starts the workers (locally or as a job on Kubeflow)"
            )
        return "multi_worker"
    if setting == "mirrored" or (setting == "auto" and num_gpus > 1):
        return "mirrored"
    return "gpu" if num_gpus >= 1 else "cpu"


def choose_strategy(setting: str = "auto", gpus: list | None = None) -> tf.distribute.Strategy:
    """The strategy for `setting` on the visible GPUs (or `gpus`, a stand-in device list).

    Under multi_worker the strategy is the one the worker's entry point built at start-up."""
    gpus = tf.config.list_logical_devices("GPU") if gpus is None else gpus
    kind = strategy_kind(setting, len(gpus))
    if kind == "multi_worker":
        return multi_worker_strategy()
    if kind == "mirrored":
        devices = [f"/gpu:{i}" for i in range(len(gpus))] or ["/cpu:0"]
        return tf.distribute.MirroredStrategy(devices)
    return tf.distribute.OneDeviceStrategy("/gpu:0" if kind == "gpu" else "/cpu:0")


@functools.cache
def multi_worker_strategy() -> tf.distribute.MultiWorkerMirroredStrategy:
    """The process's one MultiWorkerMirroredStrategy (from TF_CONFIG). It must be built before
    TensorFlow runs anything, so a worker's entry point builds it first and run_fn reuses it."""
    # AUTO picks NCCL between GPUs and RING over gRPC otherwise.
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO
    )
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)


def name_of(strategy: tf.distribute.Strategy) -> str:
    """The `strategy` setting that builds a strategy like this one."""
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return "multi_worker"
    if isinstance(strategy, tf.distribute.MirroredStrategy):
        return "mirrored"
    return "one_device"


def global_batch_size(per_replica: int, replicas: int) -> int:
    return per_replica * replicas


def scaled_learning_rate(learning_rate: float, replicas: int) -> float:
    """The square-root rule (module docstring): 1 replica keeps `learning_rate`."""
    return learning_rate * math.sqrt(replicas)
