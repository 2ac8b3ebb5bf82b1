"""The custom components' executors, run as TFX runs them, against a real SeaweedFS server.

ExampleGen (components/example_gen.py): an unknown span, a data root without spans, a span folder
without CSV files and two CSV files with different headers each stop with an error naming the
files and the fix; an explicitly requested older span is read through the real executor on
Beam's DirectRunner, and only that span's rows land in the Examples artifact.

Pusher (components/pusher.py): a push takes the number after the highest existing version,
half-written ones included, and copies every file of the model; pushing onto an existing version
is refused and leaves it byte-identical; a model that is not blessed is not pushed.

Baseline (components/baseline.py): a half-written newer version is skipped in favour of the last
complete one (tests/test_baseline.py covers the empty serving directory and the plain case).
"""

from __future__ import annotations

import types

import pytest
import tensorflow as tf
from tfx import version as tfx_version
from tfx.types import artifact_utils, standard_artifacts
from tfx.types.standard_artifact_utils import ARTIFACT_TFX_VERSION_CUSTOM_PROPERTY_KEY
from tfx.utils import path_utils

from components.baseline import BASELINE_VERSION_KEY, LatestPushedModelExecutor
from components.example_gen import (
    LATEST_SPAN,
    CacheKeyDriver,
    ExampleGenInputError,
    Executor,
    SpanCsvExampleGen,
)
from components.pusher import VersionedPusherExecutor, push_version
from pipelines import data, storage

MODEL_NAME = "taxi-tips"

# A stand-in for the Trainer's SavedModel: the Pusher and the baseline step copy files, they
# never load them.
MODEL_FILES = {
    "saved_model.pb": b"graph of the candidate",
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


def _run_example_gen(input_base: str, span: int, tmp_path) -> standard_artifacts.Examples:
    """Runs the ExampleGen executor with the exec_properties the component compiles to."""
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    component = SpanCsvExampleGen(input_base=input_base, span=span)
    Executor().Do({}, {"examples": [examples]}, dict(component.exec_properties))
    return examples


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
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "evaluator" / "blessing")
    blessing.set_int_custom_property("blessed", int(blessed))
    return blessing


def _push(serving_root: str, model, blessing, tmp_path) -> standard_artifacts.PushedModel:
    pushed = standard_artifacts.PushedModel()
    pushed.uri = str(tmp_path / "pusher" / "pushed_model")
    VersionedPusherExecutor().Do(
        {"model": [model], "model_blessing": [blessing]},
        {"pushed_model": [pushed]},
        {"serving_root": serving_root, "model_name": MODEL_NAME},
    )
    return pushed


def _version_files(tag: str) -> dict[str, bytes]:
    return {
        "saved_model.pb": f"graph of {tag}".encode(),
        "variables/variables.index": f"index of {tag}".encode(),
    }


# --------------------------------------------------------------------------------------------
# ExampleGen
# --------------------------------------------------------------------------------------------


def test_example_gen_unknown_span_names_the_span_the_root_and_the_spans_there(
    object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-unknown')}/data"
    data.write_span(data_root, 0, 20)
    data.write_span(data_root, 1, 20)

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, 5, tmp_path)

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


def test_example_gen_span_folder_without_csv_names_the_folder(object_store, tmp_path):
    data_root = f"s3://{object_store.new_bucket('eg-nocsv')}/data"
    data.write_span(data_root, 0, 20)
    storage.write_bytes(storage.join(data_root, "span-1", "notes.txt"), b"export pending\n")

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, LATEST_SPAN, tmp_path)

    assert str(raised.value).startswith(f"{data_root}/span-1/ holds no .csv files: write")


def test_example_gen_files_of_one_span_with_different_headers_name_both_files(
    object_store, tmp_path
):
    data_root = f"s3://{object_store.new_bucket('eg-headers')}/data"
    first = storage.join(data.span_dir(data_root, 0), "part-00000.csv")
    second = storage.join(data.span_dir(data_root, 0), "part-00001.csv")
    frame = data.generate_trips(10, span=0)
    storage.write_bytes(first, frame.to_csv(index=False, na_rep="").encode())
    renamed = frame.rename(columns={"fare": "fare_usd"})
    storage.write_bytes(second, renamed.to_csv(index=False, na_rep="").encode())

    with pytest.raises(ExampleGenInputError) as raised:
        _run_example_gen(data_root, LATEST_SPAN, tmp_path)

    message = str(raised.value)
    assert first in message and second in message
    assert "'fare_usd'" in message
    assert "must share one header" in message


def test_example_gen_reads_an_explicitly_requested_older_span(object_store, tmp_path):
    data_root = f"s3://{object_store.new_bucket('eg-older')}/data"
    data.write_span(data_root, 0, 37)
    data.write_span(data_root, 1, 61)

    examples = _run_example_gen(data_root, 0, tmp_path)

    assert examples.span == 0
    assert examples.get_string_custom_property("input_base") == data_root
    assert artifact_utils.decode_split_names(examples.split_names) == ["train", "eval"]
    counts = {}
    for split in ("train", "eval"):
        split_dir = artifact_utils.get_split_uri([examples], split)
        files = tf.io.gfile.glob(f"{split_dir}/*.gz")
        assert files, f"no TFRecord files in {split_dir}"
        records = tf.data.TFRecordDataset(files, compression_type="GZIP")
        counts[split] = sum(1 for _ in records)
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
    assert _files_under(f"{versions_dir}/8") == MODEL_FILES
    for version, files in existing.items():
        assert _files_under(f"{versions_dir}/{version}") == files
    assert set(storage.numbered_children(versions_dir)) == {1, 5, 7, 8}


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
    assert storage.list_files(f"{serving_root}/**") == []


# --------------------------------------------------------------------------------------------
# Baseline
# --------------------------------------------------------------------------------------------


def test_baseline_skips_a_half_written_newer_version(object_store, tmp_path):
    serving_root = f"s3://{object_store.new_bucket('baseline')}/serving"
    versions_dir = f"{serving_root}/{MODEL_NAME}"
    _write_files(f"{versions_dir}/1", _version_files("v1"))
    _write_files(f"{versions_dir}/2", {"variables/variables.index": b"index of v2"})
    baseline = standard_artifacts.Model()
    baseline.uri = str(tmp_path / "baseline_model")

    LatestPushedModelExecutor().Do(
        {"model": []},
        {"baseline_model": [baseline]},
        {"serving_root": serving_root, "model_name": MODEL_NAME},
    )

    assert baseline.get_int_custom_property(BASELINE_VERSION_KEY) == 1
    assert baseline.get_string_custom_property("source_uri") == f"{versions_dir}/1/"
    assert _files_under(path_utils.serving_model_path(baseline.uri)) == _version_files("v1")


def test_cache_key_of_an_unresolvable_span_never_repeats(object_store):
    """The driver's fingerprint is the step's cache key under TFX's local cache: a failure to
    list the data must never produce a key that a second run could match."""
    bucket = object_store.new_bucket("driver")
    data_root = f"s3://{bucket}/data"
    driver = CacheKeyDriver.__new__(CacheKeyDriver)  # run() needs no ML Metadata handle

    def key(root: str) -> str:
        info = types.SimpleNamespace(exec_properties={"input_base": root, "span": -1},
                                     output_dict={})  # fmt: skip
        result = driver.run(info)
        return result.exec_properties["input_fingerprint"].string_value

    first, second = key(data_root), key(data_root)  # no spans yet
    assert first.startswith("unresolved:") and first != second
    data.write_span(data_root, 0, 20)
    assert key(data_root) == key(data_root)  # a resolved span keys on its files
    assert key(data_root).startswith("span-0:")
