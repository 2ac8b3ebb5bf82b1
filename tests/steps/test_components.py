"""The custom components' executors, run as TFX runs them, against a real SeaweedFS server.

SelectSpans and ExampleGen (components/steps/span_selection.py, example_gen.py): an unknown span, a
data root without spans, a span folder without CSV files, a span without its success marker and
two CSV files with different headers each stop with an error naming the files and the fix; an
explicitly requested older span and a window of spans are read through the real executor on
Beam's DirectRunner; a trained input is "no new data" unless forced, by content, not by upload.

Pusher (components/steps/pusher.py): a push takes the number after the highest existing version,
half-written ones included, copies every file of the model, serves it and records it; pushing
onto an existing version is refused and leaves it byte-identical; a model that is not blessed is
not pushed, and its input is recorded as trained.

Baseline (components/steps/baseline.py): a half-written newer version is skipped in favour of the
last
complete one; after a rollback the served version is the baseline, not the highest number
(tests/steps/test_baseline.py covers the empty serving directory and the plain case).
"""

from __future__ import annotations

import json
import tempfile

import pytest
import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2, saved_model_pb2
from tensorflow_serving.apis import prediction_log_pb2
from tfx import version as tfx_version
from tfx.types import Channel, artifact_utils, standard_artifacts
from tfx.types.standard_artifact_utils import ARTIFACT_TFX_VERSION_CUSTOM_PROPERTY_KEY
from tfx.utils import path_utils

from components.base import registry, release, serving_state, spans, storage
from components.base.use_case import load as load_use_case
from components.steps import warmup
from components.steps.baseline import BASELINE_VERSION_KEY, LatestPushedModelExecutor
from components.steps.example_gen import ExampleGenInputError, Executor, SpanExampleGen
from components.steps.pusher import VersionedPusherExecutor, push_version
from components.steps.span_selection import (
    LATEST_SPAN,
    SelectSpans,
    SelectSpansExecutor,
    SpanSelection,
    TrainingDecision,
)
from components.use_cases.taxi import USE_CASE
from components.use_cases.taxi import data as taxi_data
from pipelines import data

MODEL_NAME = "taxi-tips"

# A stand-in for the Trainer's SavedModel: the Pusher and the baseline step copy files, they
# never load them (the Pusher reads saved_model.pb's signatures for the warm-up requests; this
# one has none, so only the default signature is warmed up).
MODEL_FILES = {
    "saved_model.pb": saved_model_pb2.SavedModel(
        meta_graphs=[meta_graph_pb2.MetaGraphDef()]
    ).SerializeToString(),
    "fingerprint.pb": b"fingerprint",
    "variables/variables.index": b"index",
    "variables/variables.data-00000-of-00001": b"weights " * 64,
    "assets/vocab_payment_type": b"Cash\nCredit Card\n",
}


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def _files_under(root: str) -> dict[str, bytes]:
    """Every file under `root` (local or s3://) by its path relative to `root`, with its bytes."""
    root = root.rstrip("/") + "/"
    return {path[len(root) :]: storage.read_bytes(path) for path in storage.list_files(root + "**")}


def _write_files(root: str, files: dict[str, bytes]) -> None:
    for relative, content in files.items():
        storage.write_bytes(storage.join(root, relative), content)


def _select_spans(input_base: str, span: int, tmp_path, window: int = 1, force: int = 0,
                  serving_root: str = "", use_case: str = "taxi",
                  ) -> tuple[SpanSelection, TrainingDecision]:  # fmt: skip
    """Runs SelectSpans' executor with the exec_properties its component compiles to."""
    selection, decision = SpanSelection(), TrainingDecision()
    selection.uri, decision.uri = str(tmp_path / "selection"), str(tmp_path / "decision")
    component = SelectSpans(
        data_root=input_base, span=span, window_spans=window, success_marker="_SUCCESS",
        force=force, serving_root=serving_root or str(tmp_path / "serving"), model_name=MODEL_NAME,
        input_format=load_use_case(use_case).input_format,
    )  # fmt: skip
    SelectSpansExecutor().Do(
        {}, {"selection": [selection], "decision": [decision]}, dict(component.exec_properties)
    )
    return selection, decision


def _run_example_gen(
    input_base: str, span: int, tmp_path, window: int = 1, use_case: str = "taxi"
) -> standard_artifacts.Examples:
    """Runs SelectSpans, then the ExampleGen executor on its selection, as the pipeline does
    for `use_case` (its input format and options)."""
    selection, _ = _select_spans(input_base, span, tmp_path, window, use_case=use_case)
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    case = load_use_case(use_case)
    component = SpanExampleGen(
        selection=Channel(type=SpanSelection), input_base=input_base,
        input_format=case.input_format, input_options=case.input_options,
        serving_root=str(tmp_path / "serving"), model_name=MODEL_NAME,
    )  # fmt: skip
    Executor().Do(
        {"selection": [selection]}, {"examples": [examples]}, dict(component.exec_properties)
    )
    return examples


def _split_counts(examples: standard_artifacts.Examples) -> dict[str, int]:
    counts = {}
    for split in ("train", "eval"):
        split_dir = artifact_utils.get_split_uri([examples], split)
        files = tf.io.gfile.glob(f"{split_dir}/*.gz")
        assert files, f"no TFRecord files in {split_dir}"
        counts[split] = sum(1 for _ in tf.data.TFRecordDataset(files, compression_type="GZIP"))
    return counts


def _trained_model(tmp_path, files: dict[str, bytes] = MODEL_FILES) -> standard_artifacts.Model:
    """A Model artifact laid out as TFX's Trainer leaves it: the SavedModel in Format-Serving/."""
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "trainer" / "model")
    # As resolved from MLMD: a live artifact stamped with the TFX version that wrote it.
    model.mlmd_artifact.state = model.mlmd_artifact.LIVE
    model.set_string_custom_property(
        ARTIFACT_TFX_VERSION_CUSTOM_PROPERTY_KEY, tfx_version.__version__
    )
    _write_files(path_utils.serving_model_dir(model.uri), files)
    return model


def _blessing(tmp_path, blessed: bool) -> standard_artifacts.ModelBlessing:
    """A blessing as the Evaluator leaves it, with its verdict.json."""
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "evaluator" / "blessing")
    blessing.set_int_custom_property("blessed", int(blessed))
    verdict = {
        "metrics": {"overall": {"auc": 0.8, "binary_accuracy": 0.75}},
        "failures": [] if blessed else ["auc value 0.6000 fails: must be at least 0.75"],
        "auc_change": None,
        "quality_index": 0.0,
    }
    storage.write_bytes(f"{blessing.uri}/verdict.json", json.dumps(verdict).encode())
    return blessing


def _push(
    serving_root: str, model, blessing, tmp_path, export_tflite: int = 0, examples=None
) -> standard_artifacts.PushedModel:
    """The Pusher's executor on a span selected from a one-span data root, with no baseline."""
    data_root = f"{serving_root}-data"
    if not storage.list_files(f"{data_root}/**"):
        data.write_span(data_root, 0, 20)
    selection, _ = _select_spans(data_root, LATEST_SPAN, tmp_path, serving_root=serving_root)
    # Compared with what serves now (else the Pusher refuses: another run pushed meanwhile).
    served = serving_state.read(f"{serving_root}/{MODEL_NAME}", MODEL_NAME).stable
    baseline = standard_artifacts.Model()
    baseline.set_int_custom_property(BASELINE_VERSION_KEY, -1 if served is None else served)
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pusher" / "pushed_model")
    VersionedPusherExecutor().Do(
        {"model": [model], "model_blessing": [blessing], "baseline_model": [baseline],
         "selection": [selection], "examples": [examples or _eval_examples(tmp_path)]},
        {"pushed_model": [pushed]},
        {"serving_root": serving_root, "model_name": MODEL_NAME, "keep_versions": 5,
         "export_tflite": export_tflite, "label_key": USE_CASE.label_key},
    )  # fmt: skip
    return pushed


def _eval_examples(tmp_path, rows: list[bytes] | None = None) -> standard_artifacts.Examples:
    """ExampleGen's output with a small eval split (the Pusher builds warm-up requests from it):
    `rows` (serialized tf.Examples), or three made-up ones."""
    if rows is None:
        rows = []
        for fare in (5.0, 12.5, 30.0):
            example = tf.train.Example()
            example.features.feature["fare"].float_list.value.append(fare)
            example.features.feature["big_tipper"].int64_list.value.append(1)
            rows.append(example.SerializeToString())
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "example_gen" / "examples")
    path = f"{examples.uri}/Split-eval/data_tfrecord-00000-of-00001.gz"
    storage.write_bytes(path, b"")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for row in rows:
            writer.write(row)
    return examples


def _warmup_requests(version_dir: str) -> list[prediction_log_pb2.PredictionLog]:
    path = f"{version_dir}/{warmup.WARMUP_PATH}"
    with tempfile.NamedTemporaryFile() as local:
        local.write(storage.read_bytes(path))
        local.flush()
        records = tf.data.TFRecordDataset(local.name).as_numpy_iterator()
        return [prediction_log_pb2.PredictionLog.FromString(r) for r in records]


def _version_files(tag: str) -> dict[str, bytes]:
    return {
        "saved_model.pb": f"graph of {tag}".encode(),
        "variables/variables.index": f"index of {tag}".encode(),
    }


# --------------------------------------------------------------------------------------------
# ExampleGen
# --------------------------------------------------------------------------------------------


def test_example_gen_unknown_span_names_the_span_the_root_and_the_spans_there(
    shipped_use_case, object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-unknown')}/data"
    data.write_span(data_root, 0, 20, use_case=shipped_use_case)
    data.write_span(data_root, 1, 20, use_case=shipped_use_case)

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, 5, tmp_path, use_case=shipped_use_case)

    message = str(raised.value)
    assert "span 5 requested" in message
    assert data_root in message
    assert "[0, 1]" in message
    assert "-1 for the newest" in message
    assert not (tmp_path / "examples").exists()


def test_example_gen_without_any_span_says_to_write_data(object_store, tmp_path):
    data_root = f"s3://{object_store.new_bucket('eg-empty')}/data"

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, LATEST_SPAN, tmp_path)

    message = str(raised.value)
    assert f"no span-N/ folders under {data_root}" in message
    assert "make add-span" in message


def test_example_gen_span_folder_without_csv_names_the_folder(
    shipped_use_case, object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-nocsv')}/data"
    data.write_span(data_root, 0, 20, use_case=shipped_use_case)
    storage.write_bytes(storage.join(data_root, "span-1", "notes.txt"), b"export pending\n")
    storage.write_bytes(storage.join(data_root, "span-1", "_SUCCESS"), b"")

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, LATEST_SPAN, tmp_path, use_case=shipped_use_case)

    what = spans.describe_files(load_use_case(shipped_use_case).input_format)
    assert str(raised.value).startswith(f"{data_root}/span-1/ holds no {what}")


def test_a_span_without_its_success_marker_is_never_read(shipped_use_case, object_store, tmp_path):
    """An upload in progress: span 1's files are there, its marker is not (yet)."""
    data_root = f"s3://{object_store.new_bucket('eg-marker')}/data"
    data.write_span(data_root, 0, 20, use_case=shipped_use_case)
    data.write_span(data_root, 1, 20, marker="", use_case=shipped_use_case)

    selection, _ = _select_spans(data_root, LATEST_SPAN, tmp_path, use_case=shipped_use_case)
    assert selection.get_int_custom_property("span") == 0
    incomplete = r"span 1 under .* is not complete: .*'_SUCCESS'"
    with pytest.raises(ExampleGenInputError, match=incomplete):
        _select_spans(data_root, 1, tmp_path, use_case=shipped_use_case)
    only_incomplete = f"s3://{object_store.new_bucket('eg-marker2')}/data"
    data.write_span(only_incomplete, 0, 20, marker="", use_case=shipped_use_case)
    with pytest.raises(ExampleGenInputError, match=r"no span under .*without it: \[0\]"):
        _select_spans(only_incomplete, LATEST_SPAN, tmp_path, use_case=shipped_use_case)


def test_a_window_trains_on_older_spans_and_evaluates_on_the_newest_only(
    shipped_use_case, object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-window')}/data"
    for span, rows in ((0, 30), (1, 40), (2, 50)):
        data.write_span(data_root, span, rows, use_case=shipped_use_case)

    examples = _run_example_gen(
        data_root, LATEST_SPAN, tmp_path, window=2, use_case=shipped_use_case
    )

    assert examples.span == 2 and examples.get_string_custom_property("spans") == "[1, 2]"
    counts = _split_counts(examples)
    assert counts["train"] + counts["eval"] == 40 + 50  # span 0 is outside the window
    assert 0 < counts["eval"] < 50 and counts["train"] > 40  # eval: a part of span 2 only


def test_select_spans_says_no_new_data_for_a_trained_input_unless_forced(
    shipped_use_case, object_store, tmp_path
):
    bucket = object_store.new_bucket("select")
    data_root, serving_root = f"s3://{bucket}/data", f"s3://{bucket}/serving"
    data.write_span(data_root, 0, 20, use_case=shipped_use_case)

    def select(force: int = 0):
        return _select_spans(data_root, LATEST_SPAN, tmp_path, serving_root=serving_root,
                             force=force, use_case=shipped_use_case)  # fmt: skip

    selection, decision = select()
    assert decision.get_int_custom_property("train") == 1
    fingerprint = selection.get_string_custom_property("input_fingerprint")
    registry.record_trained(f"{serving_root}/{MODEL_NAME}", fingerprint,
                            {"time": "t", "pushed_version": 3})  # fmt: skip

    _, again = select()
    assert again.get_int_custom_property("train") == 0
    reason = again.get_string_custom_property("reason")
    assert "no new data since span 0" in reason and "version 3 was pushed" in reason
    assert "force=1" in reason
    _, forced = select(force=1)
    assert forced.get_int_custom_property("train") == 1
    # The same bytes uploaded again are the same data; a changed file is new data.
    first = json.loads(storage.read_bytes(f"{selection.uri}/selection.json"))["spans"]["0"]
    path = first["files"][0]
    content = storage.read_bytes(path)
    storage.write_bytes(path, content)
    _, same = select()
    assert same.get_int_custom_property("train") == 0
    storage.write_bytes(path, content[:-1] + bytes([content[-1] ^ 1]))
    _, changed = select()
    assert changed.get_int_custom_property("train") == 1


def test_example_gen_files_of_one_span_with_different_headers_name_both_files(
    object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-headers')}/data"
    first = storage.join(data.span_dir(data_root, 0), "part-00000.csv")
    second = storage.join(data.span_dir(data_root, 0), "part-00001.csv")
    frame = taxi_data.generate_span(10, span=0)
    storage.write_bytes(first, frame.to_csv(index=False, na_rep="").encode())
    renamed = frame.rename(columns={"fare": "fare_usd"})
    storage.write_bytes(second, renamed.to_csv(index=False, na_rep="").encode())
    storage.write_bytes(storage.join(data.span_dir(data_root, 0), "_SUCCESS"), b"")

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, LATEST_SPAN, tmp_path)

    message = str(raised.value)
    assert first in message and second in message
    assert "'fare_usd'" in message
    assert "must share one header" in message


def test_example_gen_reads_an_explicitly_requested_older_span(
    shipped_use_case, object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-older')}/data"
    data.write_span(data_root, 0, 37, use_case=shipped_use_case)
    data.write_span(data_root, 1, 61, use_case=shipped_use_case)

    examples = _run_example_gen(data_root, 0, tmp_path, use_case=shipped_use_case)

    assert examples.span == 0
    assert examples.get_string_custom_property("input_base") == data_root
    assert artifact_utils.decode_split_names(examples.split_names) == ["train", "eval"]
    counts = _split_counts(examples)
    assert counts["train"] > 0 and counts["eval"] > 0
    assert counts["train"] + counts["eval"] == 37


# --------------------------------------------------------------------------------------------
# Pusher
# --------------------------------------------------------------------------------------------


def test_push_takes_the_number_after_the_highest_version_and_copies_every_file(
    object_store, tmp_path
):
    serving_root = f"s3://{object_store.new_bucket('push-gaps')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    existing = {
        1: _version_files("v1"),
        5: _version_files("v5"),
        # Half-written: a push that died before saved_model.pb. Its number is never reused.
        7: {"variables/variables.index": b"index of v7"},
    }
    for version, files in existing.items():
        _write_files(f"{versions_dir}/{version}", files)

    pushed = _push(serving_root, _trained_model(tmp_path), _blessing(tmp_path, True), tmp_path)

    assert pushed.get_int_custom_property("pushed") == 1
    assert pushed.get_string_custom_property("pushed_destination") == f"{versions_dir}/8"
    assert pushed.get_string_custom_property("pushed_version") == "8"
    pushed_files = _files_under(f"{versions_dir}/8")
    assert pushed_files.pop(warmup.WARMUP_PATH) and pushed_files == MODEL_FILES
    # Warm-up: :predict with one example and with the batch (this stand-in has no classify,
    # regress or raw_features signature to warm up); real eval rows, no label.
    logs = _warmup_requests(f"{versions_dir}/8")
    assert [log.WhichOneof("log_type") for log in logs] == ["predict_log", "predict_log"]
    batch = tf.make_ndarray(logs[1].predict_log.request.inputs["examples"])
    rows = [tf.train.Example.FromString(b) for b in batch]
    assert [r.features.feature["fare"].float_list.value[0] for r in rows] == [5.0, 12.5, 30.0]
    assert all("big_tipper" not in r.features.feature for r in rows)
    for version, files in existing.items():
        assert _files_under(f"{versions_dir}/{version}") == files
    assert set(storage.numbered_children(versions_dir)) == {1, 5, 7, 8}
    assert serving_state.read(versions_dir, MODEL_NAME).stable == 8  # models.config pins it
    record = registry.read_record(versions_dir, 8)
    assert record["spans"] and record["metrics"]["overall"]["auc"] == 0.8
    assert record["baseline_version"] == 5 and record["code_version"].startswith("0.1.0+")


def test_a_model_compared_with_a_version_that_no_longer_serves_is_not_pushed(
    object_store, tmp_path
):
    """Two runs side by side: both compared with version 1; the first pushes 2; the second
    must not replace 2 with a model never compared with it."""
    serving_root = f"s3://{object_store.new_bucket('push-stale')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    _write_files(f"{versions_dir}/1", _version_files("v1"))
    first = _push(serving_root, _trained_model(tmp_path), _blessing(tmp_path, True), tmp_path)
    assert first.get_string_custom_property("pushed_version") == "2"
    registry.write_record(versions_dir, 1, {})  # (any record: 2 beat 1)

    data_root = f"{serving_root}-data"
    selection, _ = _select_spans(data_root, LATEST_SPAN, tmp_path, serving_root=serving_root)
    stale = standard_artifacts.Model()
    stale.set_int_custom_property(BASELINE_VERSION_KEY, 1)
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pusher-2" / "pushed_model")
    VersionedPusherExecutor().Do(
        {"model": [_trained_model(tmp_path)], "model_blessing": [_blessing(tmp_path, True)],
         "baseline_model": [stale], "selection": [selection],
         "examples": [_eval_examples(tmp_path)]},
        {"pushed_model": [pushed]},
        {"serving_root": serving_root, "model_name": MODEL_NAME, "keep_versions": 5,
         "label_key": USE_CASE.label_key},
    )  # fmt: skip

    assert pushed.get_int_custom_property("pushed") == 0
    assert sorted(registry.complete_versions(versions_dir)) == [1, 2]
    assert serving_state.read(versions_dir, MODEL_NAME).stable == 2
    outcome = registry.trained_outcome(versions_dir, selection.get_string_custom_property(
        "input_fingerprint"))  # fmt: skip
    assert "version 2 serves now" in outcome["reason"] and "force=1" in outcome["reason"]


def test_without_eval_rows_for_the_warm_up_nothing_is_pushed_or_claimed(object_store, tmp_path):
    serving_root = f"s3://{object_store.new_bucket('push-no-warmup')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"

    with pytest.raises(warmup.WarmupError) as raised:
        _push(serving_root, _trained_model(tmp_path), _blessing(tmp_path, True), tmp_path,
              examples=_eval_examples(tmp_path, rows=[]))  # fmt: skip

    assert "Split-eval" in str(raised.value) and "nothing was pushed" in str(raised.value)
    assert storage.list_files(f"{versions_dir}/**") == []  # no version, claim or config


def test_push_onto_an_existing_version_is_refused_and_leaves_it_untouched(object_store, tmp_path):
    versions_dir = f"s3://{object_store.new_bucket('push-exists')}/serving/{MODEL_NAME}"
    _write_files(f"{versions_dir}/3", _version_files("v3"))
    model = _trained_model(tmp_path)

    with pytest.raises(FileExistsError) as raised:
        push_version(path_utils.serving_model_path(model.uri), versions_dir, 3)

    message = str(raised.value)
    assert f"{versions_dir}/3" in message
    assert "never overwritten" in message
    assert _files_under(f"{versions_dir}/3") == _version_files("v3")


def test_a_model_that_is_not_blessed_is_not_pushed(object_store, tmp_path):
    serving_root = f"s3://{object_store.new_bucket('push-unblessed')}/serving"

    pushed = _push(serving_root, _trained_model(tmp_path), _blessing(tmp_path, False), tmp_path)

    assert pushed.get_int_custom_property("pushed") == 0
    assert not pushed.has_custom_property("pushed_destination")
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    assert storage.numbered_children(versions_dir) == {}
    assert serving_state.read(versions_dir, MODEL_NAME).stable is None
    # The input still counts as trained: the next run on the same data ends early.
    (outcome,) = [registry.trained_outcome(versions_dir, p.rsplit("/", 1)[1][:-5])
                  for p in storage.list_files(f"{versions_dir}/_trained/*.json")]  # fmt: skip
    assert outcome["pushed_version"] is None and "auc value 0.6000 fails" in outcome["reason"]


# --------------------------------------------------------------------------------------------
# Baseline
# --------------------------------------------------------------------------------------------


def _run_baseline(serving_root: str, tmp_path) -> standard_artifacts.Model:
    baseline = standard_artifacts.Model()
    baseline.uri = str(tmp_path / "baseline_model")
    LatestPushedModelExecutor().Do(
        {"model": []},
        {"baseline_model": [baseline]},
        {"serving_root": serving_root, "model_name": MODEL_NAME},
    )
    return baseline


def test_baseline_skips_a_half_written_newer_version(object_store, tmp_path):
    serving_root = f"s3://{object_store.new_bucket('baseline')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    _write_files(f"{versions_dir}/1", _version_files("v1"))
    _write_files(f"{versions_dir}/2", {"variables/variables.index": b"index of v2"})
    baseline = _run_baseline(serving_root, tmp_path)

    assert baseline.get_int_custom_property(BASELINE_VERSION_KEY) == 1
    assert baseline.get_string_custom_property("source_uri") == f"{versions_dir}/1"
    assert _files_under(path_utils.serving_model_path(baseline.uri)) == _version_files("v1")


def test_baseline_is_the_served_version_not_the_highest_number(object_store, tmp_path):
    serving_root = f"s3://{object_store.new_bucket('baseline-served')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    # Version 3 (rolled back from) had the best index; 2 beat 1, which did better than 2.
    for version, quality in ((1, 0.03), (2, 0.02), (3, 0.05)):
        _write_files(f"{versions_dir}/{version}", _version_files(f"v{version}"))
        record = {"quality_index": quality, "baseline_version": version - 1 or None}
        registry.write_record(versions_dir, version, record)
    release.rollback(versions_dir, MODEL_NAME, 2)  # what `tkp rollback 2` writes
    baseline = _run_baseline(serving_root, tmp_path)

    assert baseline.get_int_custom_property(BASELINE_VERSION_KEY) == 2
    assert _files_under(path_utils.serving_model_path(baseline.uri)) == _version_files("v2")
    assert baseline.get_float_custom_property("quality_index") == pytest.approx(0.02)
    # The best along 2's lineage (2, 1); the rejected 3 sets no bar.
    assert baseline.get_float_custom_property("best_quality_index") == pytest.approx(0.03)
    assert baseline.get_int_custom_property("best_version") == 1
