"""The whole pipeline with LocalDagRunner against a real SeaweedFS server on loopback.

One data root and serving directory are shared by the tests in order, as a user's would be:
first span → a pushed model; a rerun → served from cache; a new span → evaluated against the
first model; bad spans → stopped before Transform with nothing pushed.
"""

from __future__ import annotations

import os

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


@pytest.fixture(scope="module")
def config(object_store, tmp_path_factory) -> PipelineConfig:
    bucket = object_store.new_bucket("e2e")
    work = tmp_path_factory.mktemp("e2e")
    return PipelineConfig(
        data_root=f"s3://{bucket}/data",
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


def states(summary) -> dict[str, str]:
    return {step.name: step.state for step in summary.steps}


def test_first_span_ends_with_a_pushed_model_that_answers(config):
    data.write_span(config.data_root, 0, 4000)
    summary = run_pipeline(config)

    assert set(states(summary).values()) == {"ran"}, states(summary)
    assert summary.span == 0
    assert summary.baseline_version is None
    assert summary.blessed is True
    assert summary.metrics["overall"]["auc"] > 0.7
    assert any(name.startswith("payment_type=") for name in summary.metrics)
    assert summary.pushed_path == f"{config.serving_model_dir}/1"
    assert set(pushed_versions(config.serving_model_dir)) == {1}

    # The pushed model answers serialized raw tf.Examples, as a serving client sends them.
    rows = serving.read_rows(
        storage.list_files(data.span_dir(config.data_root, 0) + "/*.csv")[0], 400
    )
    probabilities = np.array(serving.predict(summary.pushed_path, rows))
    labels = np.array([int(row["big_tipper"]) for row in rows])
    assert probabilities.shape == (400,)
    assert ((probabilities > 0) & (probabilities < 1)).all()
    assert roc_auc_score(labels, probabilities) > 0.7


def test_second_run_without_new_data_is_served_from_cache(config):
    summary = run_pipeline(config)

    assert states(summary)["ExampleGen"] == "cached"
    assert states(summary)["Trainer"] == "cached"
    assert states(summary)["Pusher"] == "cached"
    assert set(pushed_versions(config.serving_model_dir)) == {1}


def test_new_span_flows_through_and_is_compared_with_the_previous_model(config):
    data.write_span(config.data_root, 1, 4000, drift=0.5)
    summary = run_pipeline(config)

    assert states(summary)["ExampleGen"] == "ran"
    assert states(summary)["Trainer"] == "ran"
    assert summary.span == 1
    assert summary.baseline_version == 1
    if summary.blessed:
        assert summary.pushed_path == f"{config.serving_model_dir}/2"
        assert set(pushed_versions(config.serving_model_dir)) == {1, 2}
    else:
        assert summary.pushed_path is None
        assert summary.validation_failures


def _write_csv(config: PipelineConfig, span: int, frame) -> None:
    path = storage.join(data.span_dir(config.data_root, span), "part-00000.csv")
    storage.write_bytes(path, frame.to_csv(index=False, na_rep="").encode())


def test_span_with_missing_column_stops_at_validation_and_pushes_nothing(config):
    versions_before = pushed_versions(config.serving_model_dir)
    frame = data.generate_trips(2000, span=2).drop(columns=["fare"])
    _write_csv(config, 2, frame)

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    message = str(actionable_cause(raised.value))
    assert isinstance(actionable_cause(raised.value), DataValidationError)
    assert "'fare'" in message
    assert pushed_versions(config.serving_model_dir) == versions_before


def test_span_with_wrong_type_stops_at_validation(config):
    versions_before = pushed_versions(config.serving_model_dir)
    frame = data.generate_trips(2000, span=3)
    frame["trip_seconds"] = frame["trip_seconds"].astype(str)
    frame.loc[::50, "trip_seconds"] = "about ten minutes"
    _write_csv(config, 3, frame)

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, DataValidationError)
    assert "'trip_seconds'" in str(error)
    assert pushed_versions(config.serving_model_dir) == versions_before


def test_empty_file_is_named_in_the_error(config):
    path = storage.join(data.span_dir(config.data_root, 4), "part-00000.csv")
    storage.write_bytes(path, b"")

    with pytest.raises(Exception) as raised:
        run_pipeline(config)

    error = actionable_cause(raised.value)
    assert isinstance(error, ExampleGenInputError)
    assert path in str(error)


def test_unreachable_object_store_is_a_clear_error(config, monkeypatch):
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
