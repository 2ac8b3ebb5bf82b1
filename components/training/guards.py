"""Bounds on a training: a time budget, early stopping, and what the run reports about both.

No Trainer runs unbounded: `max_train_minutes` stops it cleanly (the model so far is exported)
and EarlyStopping on the eval AUC stops it when it no longer improves; both export the best
epoch's weights. Workers of a multi-worker training must stop at the same step, or the ones
still training wait forever in the next all-reduce: the budget is agreed on through a
collective every `check_every` steps, so the slowest clock does not decide alone.
"""

from __future__ import annotations

import time

import tensorflow as tf

EARLY_STOP_METRIC = "val_auc"  # the default; a use case names its own (quality_metric)


def any_worker(strategy: tf.distribute.Strategy):
    """A function flag -> whether `flag` is true on any worker (itself on one machine)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return bool

    @tf.function
    def reduce(flag):
        per_replica = strategy.run(lambda: tf.identity(flag))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)

    return lambda flag: bool(reduce(tf.constant(1.0 if flag else 0.0)).numpy() > 0)


class TimeBudget(tf.keras.callbacks.Callback):
    """Stops training cleanly once `minutes` have passed since `started` (time.monotonic)."""

    def __init__(self, minutes: float, started: float, agree=bool, check_every: int = 1):
        super().__init__()
        self.deadline = started + minutes * 60
        self.agree = agree
        self.check_every = max(1, check_every)
        self.minutes = minutes
        self.stopped_at_step: int | None = None
        self._steps = 0

    def on_train_batch_end(self, batch, logs=None):
        self._steps += 1
        if self._steps % self.check_every:
            return
        if self.agree(time.monotonic() >= self.deadline):
            self.model.stop_training = True
            self.stopped_at_step = int(self.model._train_counter.numpy())


def early_stopping(
    patience: int, epochs: int, monitor: str = EARLY_STOP_METRIC
) -> tf.keras.callbacks.EarlyStopping:
    """Stops after `patience` epochs without a better `monitor` (the eval AUC; 0: never stops
    early); either way the best epoch's weights are restored at the end."""
    return tf.keras.callbacks.EarlyStopping(
        monitor=monitor,
        mode="max",
        patience=patience or epochs + 1,
        restore_best_weights=True,
    )


class Throughput(tf.keras.callbacks.Callback):
    """Examples per second over the training steps alone: evaluation between epochs and the
    first step (tracing) are not counted."""

    def __init__(self, global_batch: int):
        super().__init__()
        self.global_batch = global_batch
        self.steps = 0
        self.seconds = 0.0
        self._traced = False
        self._began = 0.0

    def on_train_batch_begin(self, batch, logs=None):
        self._began = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        if self._traced:
            self.steps += 1
            self.seconds += time.monotonic() - self._began
        self._traced = True

    @property
    def examples_per_second(self) -> float:
        return self.steps * self.global_batch / self.seconds if self.seconds else 0.0
