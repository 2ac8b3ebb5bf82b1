"""The whole pipeline with LocalDagRunner against a real SeaweedFS server on loopback.

The `served` fixture runs span 0 twice (a pushed model, then a run served from cache) and records
what it saw; every test that needs a served model asks for it, and the tests that write data use
folders of their own, so the tests pass in any order and alone.
"""

from __future__ import annotations

import dataclasses
import os
import types

import numpy as np
import pytest
from sklearn.metrics import roc_auc_score

from components.baseline import pushed_versions
from components.example_gen import ExampleGenInputError
from components.validation import DataValidationError
from pipelines import data, serving, storage
from pipelines.config import PipelineConfig
from pipelines.errors import actionable_cause
from pipelines.local_runner import run_pipeline


def states(summary) -> dict[str, str]:
    return {step.name: step.state for step in summary.steps}


def _config(bucket: str, work, data_folder: str = "data", **overrides) -> PipelineConfig:
    values = dict(
        data_root=f"s3://{bucket}/{data_folder}",
        serving_root=f"s3://{bucket}/serving",
        pipeline_root=str(work / "pipeline_root"),
        metadata_path=str(work / "metadata.sqlite"),
        train_steps=300,
        eval_steps=20,
        epochs=2,
        min_auc=0.7,
        min_accuracy=0.6,
        max_auc_drop=0.05,
    )
    return PipelineConfig(**{**values, **overrides})


@pytest.fixture(scope="module")
def served(object_store, tmp_path_factory) -> types.SimpleNamespace:
    bucket = object_store.new_bucket("e2e")
    config = _config(bucket, tmp_path_factory.mktemp("e2e"))
    data.write_span(config.data_root, 0, 4000)
    first = run_pipeline(config)
    versions_after_first = set(pushed_versions(config.serving_model_dir))
    second = run_pipeline(config)
    return types.SimpleNamespace(
        bucket=bucket,
        config=config,
        first=first,
        versions_after_first=versions_after_first,
        second=second,
        versions_after_second=set(pushed_versions(config.serving_model_dir)),
    )


def test_first_span_ends_with_a_pushed_model_that_answers(served):
    summary, config = served.first, served.config

    assert set(states(summary).values()) == {"ran"}, states(summary)
    assert summary.span == 0
    assert summary.baseline_version is None and summary.auc_change is None
    assert summary.blessed is True
    assert summary.metrics["overall"]["auc"] > 0.7
    assert any(name.startswith("payment_type=") for name in summary.metrics)
    assert summary.pushed_path == f"{config.serving_model_dir}/1"
    assert served.versions_after_first == {1}

    # The pushed model answers serialized raw tf.Examples, as a serving client sends them.
    rows = serving.read_rows(
        storage.list_files(data.span_dir(config.data_root, 0) + "/*.csv")[0], 400
    )
    probabilities = np.array(serving.predict(summary.pushed_path, rows))
    labels = np.array([int(row["big_tipper"]) for row in rows])
    assert probabilities.shape == (400,)
    assert ((probabilities > 0) & (probabilities < 1)).all()
    assert roc_auc_score(labels, probabilities) > 0.7


def test_second_run_without_new_data_is_served_from_cache(served):
    summary = served.second

    assert states(summary)["ExampleGen"] == "cached"
    assert states(summary)["Trainer"] == "cached"
    assert states(summary)["Pusher"] == "cached"
    assert served.versions_after_second == {1}


def test_new_span_is_gated_against_the_served_model_and_each_gate_can_stop_it(served):
    """A candidate trained for one step on a new span is compared with served version 1: the
    AUC-drop gate stops it, then the accuracy gate, then with both relaxed it becomes version 2.
    Only the Evaluator and the Pusher run again between the three runs."""
    config = dataclasses.replace(
        served.config, train_steps=1, epochs=1, learning_rate=1e-6,  # an untrained candidate
        min_auc=0.0, min_accuracy=0.0, max_auc_drop=0.05,
    )  # fmt: skip
    data.write_span(config.data_root, 1, 4000)

    dropped = run_pipeline(config)
    assert dropped.span == 1 and states(dropped)["Trainer"] == "ran"
    assert dropped.baseline_version == 1
    assert dropped.auc_change is not None and dropped.auc_change < -0.05, dropped.metrics
    assert dropped.blessed is False and dropped.pushed_path is None
    assert len(dropped.validation_failures) == 1
    assert dropped.validation_failures[0].startswith("auc change vs baseline")

    inaccurate = run_pipeline(dataclasses.replace(config, max_auc_drop=1.0, min_accuracy=0.999))
    assert states(inaccurate)["Trainer"] == "cached" and states(inaccurate)["Evaluator"] == "ran"
    assert inaccurate.blessed is False and inaccurate.pushed_path is None
    assert len(inaccurate.validation_failures) == 1
    assert inaccurate.validation_failures[0].startswith("binary_accuracy value")
    assert 2 not in pushed_versions(config.serving_model_dir)

    accepted = run_pipeline(dataclasses.replace(config, max_auc_drop=1.0))
    assert accepted.baseline_version == 1
    assert accepted.auc_change == pytest.approx(dropped.auc_change)
    assert accepted.blessed is True and accepted.validation_failures == []
    assert accepted.pushed_path == f"{config.serving_model_dir}/2"
    assert {1, 2} <= set(pushed_versions(config.serving_model_dir))


def _bad_span_config(served, tmp_path, name: str) -> PipelineConfig:
    """Data of its own; the serving directory of the served model, which must stay as it is."""
    return _config(served.bucket, tmp_path, data_folder=f"bad-{name}")


def _write_csv(config: PipelineConfig, span: int, body: bytes) -> str:
    path = storage.join(data.span_dir(config.data_root, span), "part-00000.csv")
    storage.write_bytes(path, body)
    return path


def test_span_with_missing_column_stops_at_validation_and_pushes_nothing(served, tmp_path):
    config = _bad_span_config(served, tmp_path, "missing-column")
    versions_before = pushed_versions(config.serving_model_dir)
    frame = data.generate_trips(2000, span=0).drop(columns=["fare"])
    _write_csv(config, 0, frame.to_csv(index=False, na_rep="").encode())

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, DataValidationError)
    assert "'fare'" in str(error)
    assert pushed_versions(config.serving_model_dir) == versions_before


def test_span_with_wrong_type_stops_at_validation(served, tmp_path):
    config = _bad_span_config(served, tmp_path, "wrong-type")
    versions_before = pushed_versions(config.serving_model_dir)
    frame = data.generate_trips(2000, span=0)
    frame["trip_seconds"] = frame["trip_seconds"].astype(str)
    frame.loc[::50, "trip_seconds"] = "about ten minutes"
    _write_csv(config, 0, frame.to_csv(index=False, na_rep="").encode())

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, DataValidationError)
    assert "'trip_seconds'" in str(error)
    assert pushed_versions(config.serving_model_dir) == versions_before


def test_empty_file_is_named_in_the_error_and_nothing_is_pushed(served, tmp_path):
    config = _bad_span_config(served, tmp_path, "empty-file")
    versions_before = pushed_versions(config.serving_model_dir)
    path = _write_csv(config, 0, b"")

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, ExampleGenInputError)
    assert path in str(error)
    assert versions_before and pushed_versions(config.serving_model_dir) == versions_before


def test_unreachable_object_store_is_a_clear_error(served, tmp_path, monkeypatch):
    config = _bad_span_config(served, tmp_path, "unreachable")
    versions_before = pushed_versions(config.serving_model_dir)
    endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # nothing listens on port 9

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, storage.StorageError)
    assert "http://127.0.0.1:9" in str(error) and config.data_root in str(error)
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    assert pushed_versions(config.serving_model_dir) == versions_before
