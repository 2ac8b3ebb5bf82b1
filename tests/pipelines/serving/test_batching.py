"""`tkp serve --enable-batching`: TF Serving 2.16.1's batching (pipelines/serving/batching.py
cites the sources of each rule and message). The scheduler is tested on a small TensorFlow
function whose calls a test can hold (to fill a queue the way a busy batch thread does); the
server on the session's trained model, answering concurrent requests over HTTP."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import numpy as np
import pytest
import requests
import tensorflow as tf

from pipelines.serving import batching, metrics
from pipelines.serving.batching import (
    BatchingConfigError,
    BatchingParameters,
    BatchScheduler,
    load_parameters,
)
from pipelines.serving.serve import ServeError, batching_of
from pipelines.serving.tfs_json import ServingError
from tests.pipelines.serving.served import push, serving

SHIPPED = Path(batching.__file__).with_name("batching_parameters.txt")


def test_the_shipped_parameters_parse_and_fields_left_out_take_tf_servings_defaults(tmp_path):
    shipped = load_parameters(SHIPPED)
    assert shipped == BatchingParameters(max_batch_size=256, batch_timeout_micros=0,
                                         num_batch_threads=2, max_enqueued_batches=4)  # fmt: skip
    partial = tmp_path / "partial.txt"
    partial.write_text("# only one field\nmax_batch_size { value: 32 }\n")
    assert load_parameters(partial) == BatchingParameters(
        max_batch_size=32, batch_timeout_micros=0, max_enqueued_batches=10
    )  # shared_batch_scheduler.h QueueOptions defaults
    assert load_parameters(None).max_batch_size == 1000
    # Splitting off: its execution size counts for nothing, in TF Serving as here.
    off = tmp_path / "off.txt"
    off.write_text("enable_large_batch_splitting { value: false } "
                   "max_execution_batch_size { value: 64 }")  # fmt: skip
    assert load_parameters(off) == BatchingParameters()


@pytest.mark.parametrize(
    "text, complaint",
    [
        ("max_batch_size: 8", r"not a BatchingParameters text proto"),  # a wrapper, not a scalar
        ("max_batch_sise { value: 8 }", r'no field named "max_batch_sise"'),
        ("num_batch_threads { value: 0 }", r"num_batch_threads must be positive; was 0"),
        ("max_batch_size { value: 8 } allowed_batch_sizes: 4",
         r"Last entry in allowed_batch_sizes must match max_batch_size; last entry was 4; "
         r"expected 8"),
        ("enable_large_batch_splitting { value: true }", r"enable_large_batch_splitting .* not "
         r"played by tkp serve; turn it off"),
        ("pad_variable_length_inputs: true", r"pad_variable_length_inputs is not played"),
    ],
)  # fmt: skip
def test_a_bad_parameters_file_is_refused_naming_the_file_and_the_field(tmp_path, text, complaint):
    path = tmp_path / "batching.txt"
    path.write_text(text)
    with pytest.raises(BatchingConfigError, match=complaint) as refused:
        load_parameters(path)
    assert str(path) in str(refused.value)


def test_the_flags_follow_tf_serving_a_file_without_the_switch_is_refused(tmp_path):
    def flags(enable: bool, file: Path | None) -> argparse.Namespace:
        return argparse.Namespace(enable_batching=enable, batching_parameters_file=file)

    with pytest.raises(ServeError, match="without --enable-batching"):
        batching_of(flags(False, SHIPPED))
    assert batching_of(flags(False, None)) is None
    assert batching_of(flags(True, None)) == BatchingParameters()
    assert batching_of(flags(True, SHIPPED)).max_batch_size == 256
    with pytest.raises(BatchingConfigError, match="cannot read the batching parameters file"):
        batching_of(flags(True, tmp_path / "missing.txt"))


class HeldModel:
    """A TensorFlow function (y = 2x) whose first call waits until the test lets it go, as a
    batch thread busy with a long batch: meanwhile requests queue. Records each call's rows."""

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []
        self.entered, self.release = threading.Event(), threading.Event()
        self._double = tf.function(lambda x: {"y": x * 2.0})

    def __call__(self, **inputs) -> dict:
        self.calls.append(inputs["x"].numpy())
        if len(self.calls) == 1:
            self.entered.set()
            self.release.wait(30)
        return self._double(**inputs)


def _submit(
    scheduler: BatchScheduler, model: HeldModel, rows, results: dict, key
) -> threading.Thread:
    def send() -> None:
        try:
            results[key] = scheduler.run(model, "serving_default", model, {"x": tf.constant(rows)})
        except ServingError as e:
            results[key] = e

    thread = threading.Thread(target=send)
    thread.start()
    return thread


def _queued(scheduler: BatchScheduler, rows: int) -> None:
    """Until `rows` rows wait in the scheduler's queues (the held batch not counted)."""
    for _ in range(3000):
        with scheduler._cv:
            waiting = sum(b.size for q in scheduler._queues.values() for b in q.batches)
        if waiting == rows:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"never {rows} rows queued (last: {waiting})")


@pytest.fixture
def scheduler_of():
    made = []

    def make(**parameters) -> BatchScheduler:
        parameters.setdefault("num_batch_threads", 1)
        made.append(BatchScheduler(BatchingParameters(**parameters)))
        return made[-1]

    yield make
    for scheduler in made:
        scheduler.stop()


def test_requests_waiting_for_a_busy_thread_run_as_one_batch_each_getting_its_own_rows(
    scheduler_of,
):
    scheduler, model, results = scheduler_of(max_batch_size=16), HeldModel(), {}
    first = _submit(scheduler, model, [[-1.0]], results, "held")
    assert model.entered.wait(30)
    threads = [_submit(scheduler, model, [[float(i)]] * (1 + i % 3), results, i) for i in range(6)]
    _queued(scheduler, sum(1 + i % 3 for i in range(6)))
    model.release.set()
    for thread in [first, *threads]:
        thread.join(30)
    # One call for the held request, one for the six that queued behind it, in their order.
    assert [len(call) for call in model.calls] == [1, 12]
    for i in range(6):
        assert results[i]["y"].numpy().tolist() == [[2.0 * i]] * (1 + i % 3)


def test_a_task_over_the_batch_size_and_a_full_queue_get_tf_servings_errors(scheduler_of):
    scheduler, model, results = (
        scheduler_of(max_batch_size=4, max_enqueued_batches=1),
        HeldModel(),
        {},
    )
    with pytest.raises(ServingError, match=r"^Task size 5 is larger than maximum input batch "
                       r"size 4$") as too_large:  # fmt: skip
        scheduler.run(model, "serving_default", model, {"x": tf.zeros([5, 1])})
    assert too_large.value.http_status == 400
    held = _submit(scheduler, model, [[1.0]], results, "held")
    assert model.entered.wait(30)
    queued = _submit(scheduler, model, [[2.0]] * 3, results, "queued")
    _queued(scheduler, 3)
    with pytest.raises(ServingError) as full:  # 3 + 2 rows do not fit; one batch already waits
        scheduler.run(model, "serving_default", model, {"x": tf.zeros([2, 1])})
    assert full.value.http_status == 503 and full.value.message == (
        "The batch scheduling queue to which this task was submitted is full; currently 1 "
        "batches enqueued and max_enqueued_batches is 1"
    )
    model.release.set()
    held.join(30), queued.join(30)
    assert results["queued"]["y"].numpy().tolist() == [[4.0]] * 3


def test_tasks_that_cannot_merge_fail_together_and_padding_rows_are_dropped(scheduler_of):
    scheduler, model, results = scheduler_of(max_batch_size=8), HeldModel(), {}
    held = _submit(scheduler, model, [[0.0, 0.0]], results, "held")
    assert model.entered.wait(30)
    threads = [_submit(scheduler, model, [[1.0, 1.0]], results, "two"),
               _submit(scheduler, model, [[1.0, 1.0, 1.0]], results, "three")]  # fmt: skip
    _queued(scheduler, 2)
    model.release.set()
    for thread in [held, *threads]:
        thread.join(30)
    for key in ("two", "three"):  # batching_session.cc MergeInputTensors fails the whole batch
        assert isinstance(results[key], ServingError) and results[key].http_status == 400
        assert results[key].message.startswith(
            "Tensors with name 'x' from different tasks have different shapes and padding is "
            "turned off."
        )

    padded = scheduler_of(max_batch_size=8, allowed_batch_sizes=(4, 8))
    model = HeldModel()
    model.release.set()
    answer = padded.run(model, "serving_default", model, {"x": tf.constant([[1.0], [2.0], [3.0]])})
    # Padded to 4 rows with the last task's first row; the padding's answer is dropped.
    assert model.calls[0].tolist() == [[1.0], [2.0], [3.0], [1.0]]
    assert answer["y"].numpy().tolist() == [[2.0], [4.0], [6.0]]


def test_an_output_that_does_not_follow_the_batch_fails_every_request_in_it(scheduler_of):
    scheduler = scheduler_of()

    def summed(**inputs) -> dict:
        return {"total": tf.reduce_sum(inputs["x"], axis=0, keepdims=True)}

    with pytest.raises(ServingError, match="Batched output tensor's 0th dimension does not equal"):
        scheduler.run(summed, "serving_default", summed, {"x": tf.ones([3, 1])})


def _metric(url: str, name: str) -> float:
    return metrics.sample_value(requests.get(url + metrics.PATH, timeout=10).text, name)


def test_tkp_serve_batches_concurrent_requests_and_answers_each_as_the_saved_model_does(
    object_store, tabular_use_case_model, tmp_path
):
    """Requests released together reach a server with one batch thread and a 2 s timeout:
    they are answered from fewer model calls than requests, each with its own rows' outputs
    (as the SavedModel gives them unbatched); a request over max_batch_size is a 400."""
    model_name, eval_frame = tabular_use_case_model.model_name, tabular_use_case_model.eval_frame
    to_examples, model_dir = (
        tabular_use_case_model.to_examples,
        tabular_use_case_model.fn_args.serving_model_dir,
    )
    examples = to_examples(eval_frame.head(24), with_label=False)
    folder = f"s3://{object_store.new_bucket('batching')}/serving/{model_name}"
    push(folder, model_name, model_dir, 1, examples[:4])
    expected = (
        tf.saved_model.load(model_dir)
        .signatures["serving_default"](examples=tf.constant(examples))["outputs"]
        .numpy()
    )
    # A batch closes when full (the 12 rows below) or 2 s after its first request: the
    # requests released together land in one batch or two, never eight.
    parameters = BatchingParameters(max_batch_size=12, batch_timeout_micros=2_000_000,
                                    num_batch_threads=1)  # fmt: skip
    with serving(model_name, folder, tmp_path / "cache", batching=parameters) as server:
        url = f"{server.url}/v1/models/{model_name}:predict"
        runs_before = _metric(server.url, ":tensorflow:serving:batching_session:wrapped_run_count")
        rows_before = _metric(
            server.url, ":tensorflow:serving:batching_session:processed_batch_size_sum"
        )
        inputs_before = _metric(
            server.url, ":tensorflow:serving:batching_session:input_batch_size_count"
        )
        slices = [(i * 2, i * 2 + 1 + i % 2) for i in range(8)]  # 1 or 2 rows each
        start, answers = threading.Barrier(len(slices)), {}

        def ask(index: int, rows: slice) -> None:
            instances = [{"b64": _b64(e)} for e in examples[rows[0] : rows[1]]]
            start.wait(30)
            answers[index] = requests.post(url, json={"instances": instances}, timeout=60)

        threads = [threading.Thread(target=ask, args=(i, s)) for i, s in enumerate(slices)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for index, (begin, end) in enumerate(slices):
            answer = answers[index]
            assert answer.status_code == 200, answer.text
            got = np.array(answer.json()["predictions"]).reshape(expected[begin:end].shape)
            np.testing.assert_allclose(got, expected[begin:end], rtol=1e-5, atol=1e-6)
        runs = _metric(server.url, ":tensorflow:serving:batching_session:wrapped_run_count")
        rows = _metric(server.url, ":tensorflow:serving:batching_session:processed_batch_size_sum")
        assert rows - rows_before == sum(end - begin for begin, end in slices)
        assert 1 <= runs - runs_before < len(slices)

        inputs = _metric(server.url, ":tensorflow:serving:batching_session:input_batch_size_count")
        assert inputs - inputs_before == len(slices)

        too_many = [{"b64": _b64(e)} for e in examples[:13]]
        refused = requests.post(url, json={"instances": too_many}, timeout=60)
        assert refused.status_code == 400
        assert refused.json() == {
            "error": "Task size 13 is larger than maximum input batch size 12"
        }


def _b64(example: bytes) -> str:
    import base64

    return base64.b64encode(example).decode()


def test_stopping_runs_what_waits_and_refuses_what_comes_after(scheduler_of):
    scheduler, model, results = scheduler_of(batch_timeout_micros=60_000_000), HeldModel(), {}
    model.release.set()
    waiting = _submit(scheduler, model, [[3.0]], results, "waiting")  # its batch waits 60 s
    _queued(scheduler, 1)
    scheduler.stop()
    waiting.join(30)
    assert results["waiting"]["y"].numpy().tolist() == [[6.0]]
    with pytest.raises(ServingError, match="shutting down") as refused:
        scheduler.run(model, "serving_default", model, {"x": tf.ones([1, 1])})
    assert refused.value.http_status == 503


def test_a_busy_thread_holds_up_only_its_own_queue_when_another_thread_is_free(scheduler_of):
    """Two batch threads shared by two versions' queues (SharedBatchScheduler): one held by a
    long batch of version A, version B's request is answered meanwhile."""
    scheduler, results = scheduler_of(num_batch_threads=2), {}
    slow, quick = HeldModel(), HeldModel()
    quick.release.set()
    held = _submit(scheduler, slow, [[1.0]], results, "slow")
    assert slow.entered.wait(30)
    answered = _submit(scheduler, quick, [[5.0]], results, "quick")
    answered.join(30)
    assert results["quick"]["y"].numpy().tolist() == [[10.0]] and "slow" not in results
    slow.release.set()
    held.join(30)
    assert results["slow"]["y"].numpy().tolist() == [[2.0]]


def test_a_request_waiting_past_the_rest_timeout_gets_resource_exhausted(scheduler_of, monkeypatch):
    monkeypatch.setattr(batching, "REST_TIMEOUT_SECONDS", 0.2)
    scheduler, model, results = scheduler_of(), HeldModel(), {}
    held = _submit(scheduler, model, [[1.0]], results, "held")
    assert model.entered.wait(30)
    late = _submit(scheduler, model, [[2.0]], results, "late")
    _queued(scheduler, 1)
    threading.Event().wait(0.4)  # longer than the timeout, still queued behind the held batch
    model.release.set()
    held.join(30), late.join(30)
    assert isinstance(results["late"], ServingError) and results["late"].http_status == 429
    assert results["late"].message == "Run() timeout exceeded while waiting in batching queue"
    assert len(model.calls) == 1  # the late batch never ran


def test_an_unloaded_versions_queue_goes_once_its_last_request_is_answered(scheduler_of):
    """A request that took a version before its unload is still answered, and the version's
    queue (which holds its model) is not kept."""
    scheduler, model = scheduler_of(), HeldModel()
    model.release.set()
    scheduler.run(model, "serving_default", model, {"x": tf.ones([1, 1])})
    assert len(scheduler._queues) == 1
    scheduler.forget(model)
    assert not scheduler._queues
    late = scheduler.run(model, "serving_default", model, {"x": tf.ones([1, 1])})
    assert late["y"].numpy().tolist() == [[2.0]] and not scheduler._queues
