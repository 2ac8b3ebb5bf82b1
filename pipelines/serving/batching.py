"""Server-side batching for `tkp serve`, as TF Serving 2.16.1 runs it with `--enable_batching`.

Concurrent requests to one version and signature are merged along dim 0 into one call of the
model and their answers split back (`tensorflow_serving/batching/batching_session.cc`); batches
are formed and handed to a pool of batch threads shared by every version, queue by queue in
turn (TensorFlow's `core/kernels/batching_util/shared_batch_scheduler.h`). The parameters are
TF Serving's `BatchingParameters` text proto (`servables/tensorflow/session_bundle_config.proto`),
read from the same file the Kubernetes manifests give TF Serving, with the same defaults for
fields left out and the same errors, in TF Serving's words, for a request too large, a full queue,
tensors that cannot be merged and outputs that cannot be split.

What this server does not play, and refuses at start naming the field: large-batch splitting
turned on (`enable_large_batch_splitting { value: true }`; `max_execution_batch_size` counts only
then, as in TF Serving) and `pad_variable_length_inputs`. The serving signatures this project
exports take serialized examples (one string per row), which never need padding. Differences on
purpose: the checks TF Serving makes when it loads a model (`allowed_batch_sizes`, the sizes and
timeout) are made at start here, with every problem listed, so no server runs with parameters
TF Serving would refuse; a queue is one per version, signature and inputs (TF Serving's also
splits by the outputs fetched: this server always fetches every output); a batch's model run
gets no deadline of its own; the batch threads are woken when a batch is ready or its timeout
ends, where TF Serving's look for work every millisecond.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from google.protobuf import text_format

from components.base.errors import ActionableError
from pipelines.serving import tf_serving_protos
from pipelines.serving.tfs_json import ServingError, code_name, invalid

# REST's --rest_api_timeout_in_ms default (model_servers/server.h): a batch whose every task
# waited longer than this fails with RESOURCE_EXHAUSTED (batching_session.cc ProcessBatch).
REST_TIMEOUT_SECONDS = 30.0
# What an unset field means (shared_batch_scheduler.h QueueOptions and Options defaults).
DEFAULTS = {"max_batch_size": 1000, "batch_timeout_micros": 0, "max_enqueued_batches": 10}


class BatchingConfigError(ActionableError, ValueError):
    """The parameters file cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class BatchingParameters:
    max_batch_size: int = DEFAULTS["max_batch_size"]
    batch_timeout_micros: int = DEFAULTS["batch_timeout_micros"]
    max_enqueued_batches: int = DEFAULTS["max_enqueued_batches"]
    # TF's port::MaxParallelism(): the CPUs this process may be scheduled on.
    num_batch_threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    allowed_batch_sizes: tuple[int, ...] = ()

    def describe(self) -> str:
        allowed = ""
        if self.allowed_batch_sizes:
            allowed = f", allowed sizes {list(self.allowed_batch_sizes)}"
        return (f"batches of up to {self.max_batch_size} examples, {self.batch_timeout_micros} us "
                f"timeout, {self.num_batch_threads} batch threads, up to "
                f"{self.max_enqueued_batches} batches queued{allowed}")  # fmt: skip


def load_parameters(path: Path | None) -> BatchingParameters:
    """The parameters in `path` (TF Serving's defaults for what it leaves out; None: all of
    them), checked as TF Serving checks them at start and at model load."""
    if path is None:
        return BatchingParameters()
    try:
        text = Path(path).read_text()
    except OSError as e:
        raise BatchingConfigError(f"cannot read the batching parameters file {path}: "
                                  f"{e.strerror or e}") from e  # fmt: skip
    parsed = tf_serving_protos.message("BatchingParameters")
    try:
        text_format.Parse(text, parsed)
    except text_format.ParseError as e:  # TF Serving: "Invalid protobuf file" and no start
        raise BatchingConfigError(f"{path} is not a BatchingParameters text proto ({e}); its "
                                  "fields are listed in TF Serving's "
                                  "session_bundle_config.proto") from e  # fmt: skip
    # max_execution_batch_size counts only with splitting on (bundle_factory_util.h
    # GetQueueOptions), and so does this refusal.
    if parsed.enable_large_batch_splitting.value:
        raise BatchingConfigError(f"{path}: enable_large_batch_splitting (large-batch splitting) "
                                  "is not played by tkp serve; turn it off to run this file "
                                  "here")  # fmt: skip
    if parsed.pad_variable_length_inputs:
        raise BatchingConfigError(f"{path}: pad_variable_length_inputs is not played by tkp "
                                  "serve; remove it to run this file here")  # fmt: skip
    values = {name: getattr(parsed, name).value for name in (*DEFAULTS, "num_batch_threads")
              if parsed.HasField(name)}  # fmt: skip
    parameters = BatchingParameters(**values, allowed_batch_sizes=tuple(parsed.allowed_batch_sizes))
    _check(parameters, path)
    return parameters


def _check(p: BatchingParameters, path: Path) -> None:
    """TF Serving's start-up and load-time refusals (shared_batch_scheduler.h Create, AddQueue;
    bundle_factory_util.cc WrapSessionForBatching), in its words, after the file's name. A
    negative size, which TF Serving casts to a huge unsigned one, is refused too."""
    problems = []
    if p.num_batch_threads < 1:
        problems.append(f"num_batch_threads must be positive; was {p.num_batch_threads}")
    if p.max_batch_size < 1:
        problems.append(f"input_batch_size_limit must be positive; was {p.max_batch_size}")
    if p.batch_timeout_micros < 0:
        problems.append(f"batch_timeout_micros must be non-negative; was {p.batch_timeout_micros}")
    if p.max_enqueued_batches < 0:
        problems.append(f"max_enqueued_batches must be positive; was {p.max_enqueued_batches}")
    if p.allowed_batch_sizes and p.allowed_batch_sizes[-1] != p.max_batch_size:
        problems.append(
            "Last entry in allowed_batch_sizes must match max_batch_size; last "
            f"entry was {p.allowed_batch_sizes[-1]}; expected {p.max_batch_size}"
        )
    if problems:
        raise BatchingConfigError(f"{path}: " + "; ".join(problems))


def _max_enqueued(p: BatchingParameters) -> int:
    # shared_batch_scheduler.h AddQueue: without splitting, 0 is taken as 1.
    return max(1, p.max_enqueued_batches)


@dataclass
class _Task:
    inputs: dict  # name: tf.Tensor, dim 0 = size
    size: int
    enqueued: float
    done: threading.Event = field(default_factory=threading.Event)
    outputs: dict | None = None
    error: Exception | None = None


@dataclass
class _Batch:
    tasks: list[_Task] = field(default_factory=list)
    size: int = 0


class _Queue:
    """One version's queue for one signature: closed batches in front, the open one last."""

    def __init__(self, run: Callable[..., dict]):
        self.run = run
        self.batches: deque[_Batch] = deque([_Batch()])
        self.open_since = 0.0
        self.forgotten = False  # its version was unloaded: dropped once drained

    @property
    def drained(self) -> bool:
        return not any(batch.tasks for batch in self.batches)


class BatchScheduler:
    """The pool of batch threads and the queues it serves (SharedBatchScheduler)."""

    def __init__(self, parameters: BatchingParameters, metrics=None):
        self.parameters, self.metrics = parameters, metrics
        self._queues: dict[tuple, _Queue] = {}
        # Unloaded versions: a request that took one before its unload may still come, and its
        # queue goes once drained too (the queue holds the version, and its model, alive).
        self._forgotten: weakref.WeakSet = weakref.WeakSet()
        self._turn = 0  # round robin over the queues
        self._cv = threading.Condition()
        self._stopping = False
        self._threads = [
            threading.Thread(target=self._work, name=f"batch-thread-{i}", daemon=True)
            for i in range(parameters.num_batch_threads)
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify_all()
        for thread in self._threads:
            thread.join(timeout=30)

    def forget(self, owner: object) -> None:
        """An unloaded version's queues go once their batches have run (a request that took
        the version before it was unloaded still gets its answer)."""
        with self._cv:
            self._forgotten.add(owner)
            for key in [k for k in self._queues if k[0] is owner]:
                self._queues[key].forgotten = True
                self._drop_if_done(key)

    def _drop_if_done(self, key: tuple) -> None:
        queue = self._queues.get(key)
        if queue is not None and queue.forgotten and queue.drained:
            del self._queues[key]

    # -- a request ------------------------------------------------------------------------------

    def run(self, owner: object, signature: str, run: Callable[..., dict], inputs: dict) -> dict:
        """Runs `inputs` (a request's tensors) in a batch with other requests to the same
        signature of `owner`; returns this request's rows of the outputs."""
        size = _task_size(inputs)
        p = self.parameters
        if size > p.max_batch_size:  # shared_batch_scheduler.h Queue::Schedule
            raise invalid(f"Task size {size} is larger than maximum input batch size "
                          f"{p.max_batch_size}")  # fmt: skip
        task = _Task(inputs, size, time.monotonic())
        key = (owner, signature, tuple(sorted(inputs)))  # the owner object: no id reuse
        with self._cv:
            if self._stopping:
                raise ServingError("UNAVAILABLE", "The server is shutting down")
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = _Queue(run)
                queue.forgotten = owner in self._forgotten
            open_batch = queue.batches[-1]
            if open_batch.size + size > p.max_batch_size:
                if len(queue.batches) >= _max_enqueued(p):  # ValidateBatchTaskQueueCapacity
                    raise ServingError(
                        "UNAVAILABLE", "The batch scheduling queue to which this task was "
                        f"submitted is full; currently {len(queue.batches)} batches enqueued and "
                        f"max_enqueued_batches is {_max_enqueued(p)}",
                    )  # fmt: skip
                queue.batches.append(open_batch := _Batch())
            if not open_batch.tasks:
                queue.open_since = task.enqueued
            open_batch.tasks.append(task)
            open_batch.size += size
            self._cv.notify_all()
        if self.metrics is not None:
            self.metrics.batch_input(size)
        task.done.wait()
        if task.error is not None:
            raise _own_copy(task.error)  # one exception object per request thread
        return task.outputs

    # -- the batch threads ----------------------------------------------------------------------

    def _next_batch(self) -> tuple[_Queue, _Batch] | float | None:
        """A batch ready to run (the queues in turn, SharedBatchScheduler's round robin), else
        how long until the first open one times out, else None (nothing waits). While stopping,
        every open batch is ready: no request is left waiting."""
        p, now = self.parameters, time.monotonic()
        keys = list(self._queues)
        wait = None
        for i in range(len(keys)):
            key = keys[(self._turn + i) % len(keys)]
            queue = self._queues[key]
            ready = len(queue.batches) > 1
            if not ready and queue.batches[0].tasks:
                opened = queue.batches[0]
                due = queue.open_since + p.batch_timeout_micros / 1e6
                ready = opened.size >= p.max_batch_size or now >= due or self._stopping
                if not ready:
                    wait = due - now if wait is None else min(wait, due - now)
            if ready:
                self._turn = (self._turn + i + 1) % len(keys)
                batch = queue.batches.popleft()
                if not queue.batches:
                    queue.batches.append(_Batch())
                self._drop_if_done(key)
                return queue, batch
        return wait

    def _work(self) -> None:
        while True:
            with self._cv:
                while True:
                    found = self._next_batch()
                    if isinstance(found, tuple):
                        break
                    if self._stopping:
                        return
                    self._cv.wait(found)
            queue, batch = found
            self._process(queue.run, batch)

    def _process(self, run: Callable[..., dict], batch: _Batch) -> None:
        """Runs one batch and hands each task its rows, or the batch's error. Metrics as
        batching_session.cc records them: the time in the queue of every task, the processed
        size (padding included) once the batch is merged, a wrapped run once the model ran."""
        now = time.monotonic()
        try:
            if self.metrics is not None:
                self.metrics.batch_queued([now - t.enqueued for t in batch.tasks])
            if all(now - t.enqueued > REST_TIMEOUT_SECONDS for t in batch.tasks):
                raise ServingError(
                    "RESOURCE_EXHAUSTED", "Run() timeout exceeded while waiting in batching queue"
                )
            self._run_batch(run, batch)
        except Exception as e:  # every task of the batch gets the batch's error
            for task in batch.tasks:
                task.error = _serving_error(e)
        finally:
            for task in batch.tasks:
                task.done.set()

    def _run_batch(self, run: Callable[..., dict], batch: _Batch) -> None:
        import tensorflow as tf

        merged, padding = _merge(batch, self.parameters.allowed_batch_sizes)
        if self.metrics is not None:
            self.metrics.batch_merged(batch.size + padding, padding)
        try:
            outputs = run(**merged)
        finally:
            if self.metrics is not None:
                self.metrics.batches_run.inc()
        sizes = [t.size for t in batch.tasks] + ([padding] if padding else [])
        split = {}
        for name, tensor in outputs.items():
            if tensor.shape.rank == 0:
                raise ServingError("FAILED_PRECONDITION", "Batched output tensor has 0 dimensions")
            if tensor.shape[0] != sum(sizes):
                raise ServingError(
                    "FAILED_PRECONDITION", "Batched output tensor's 0th dimension does not "
                    "equal the sum of the 0th dimension sizes of the input tensors",
                )  # fmt: skip
            split[name] = tf.split(tensor, sizes, axis=0)
        for i, task in enumerate(batch.tasks):
            task.outputs = {name: parts[i] for name, parts in split.items()}


def _serving_error(error: Exception) -> Exception:
    """A TensorFlow error from merging or splitting as TF Serving reports it (its code and
    message); anything else as it is."""
    import tensorflow as tf

    if isinstance(error, tf.errors.OpError):
        return ServingError(code_name(error), error.message)
    return error


def _own_copy(error: Exception) -> Exception:
    if isinstance(error, ServingError):
        return ServingError(error.code, error.message)
    return error


def _task_size(inputs: dict) -> int:
    """batching_util.h ComputeTensorBatchSize, in its words."""
    if not inputs:
        raise invalid("Batching Run() must have at least one input tensor")
    sizes = set()
    for tensor in inputs.values():
        if tensor.shape.rank == 0:
            raise invalid("Batching Run() input tensors must have at least one dimension")
        sizes.add(int(tensor.shape[0]))
    if len(sizes) > 1:
        raise invalid("Batching Run() input tensors must have equal 0th-dimension size")
    return sizes.pop()


def _merge(batch: _Batch, allowed: tuple[int, ...]) -> tuple[dict, int]:
    """The tasks' tensors concatenated along dim 0 (batching_session.cc MergeInputTensors),
    padded up to the smallest allowed batch size with the last task's first row."""
    import tensorflow as tf

    padded = next((size for size in allowed if size >= batch.size), batch.size)
    padding = padded - batch.size
    first, merged = batch.tasks[0], {}
    for name in first.inputs:
        if any(t.inputs[name].shape[1:] != first.inputs[name].shape[1:] for t in batch.tasks):
            raise ServingError(
                "FAILED_PRECONDITION", f"Tensors with name '{name}' from different tasks have "
                "different shapes and padding is turned off. Set pad_variable_length_inputs "
                "to true, or ensure that all tensors with the same name have equal dimensions "
                "starting with the first dim.",
            )  # fmt: skip
        parts = [task.inputs[name] for task in batch.tasks]
        if padding:
            parts.append(tf.repeat(batch.tasks[-1].inputs[name][:1], padding, axis=0))
        merged[name] = tf.concat(parts, axis=0) if len(parts) > 1 else parts[0]
    return merged, padding
