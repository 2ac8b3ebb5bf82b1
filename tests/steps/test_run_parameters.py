"""Every executor checks its run parameters with the config's rules before doing any work.

On Kubeflow a run's parameters come from the UI or a recurring run and reach the executors
without passing through PipelineConfig. Each case below ran to completion (or escaped
serving_root) before the executors checked them.
"""

from __future__ import annotations

import pytest
from tfx.types import standard_artifacts

from components.base.config import ConfigError
from components.steps.baseline import LatestPushedModelExecutor
from components.steps.evaluation import ThresholdEvaluatorExecutor
from components.steps.pusher import VersionedPusherExecutor
from components.steps.span_selection import SelectSpansExecutor
from components.steps.trainer import TunableTrainerExecutor


def _artifact(kind, uri: str):
    artifact = kind()
    artifact.uri = uri
    return artifact


@pytest.mark.parametrize(
    ("exec_properties", "message"),
    [
        ({"serving_root": "s3://b/serving", "model_name": ".."}, "model_name must be one folder"),
        ({"serving_root": "", "model_name": "taxi"}, "serving_root must not be empty"),
    ],
)
def test_serving_steps_refuse_a_model_name_or_root_that_leaves_the_serving_dir(
    tmp_path, exec_properties, message
):
    baseline = _artifact(standard_artifacts.Model, str(tmp_path / "baseline"))
    with pytest.raises(ConfigError, match=f"LatestPushedModel: invalid run parameter: {message}"):
        LatestPushedModelExecutor().Do({}, {"baseline_model": [baseline]}, exec_properties)
    pushed = _artifact(standard_artifacts.PushedModel, str(tmp_path / "pushed"))
    with pytest.raises(ConfigError, match=f"Pusher: invalid run parameter: {message}"):
        VersionedPusherExecutor().Do({}, {"pushed_model": [pushed]}, exec_properties)
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize(
    ("thresholds", "message"),
    [
        ({"min_auc": 5.0, "min_accuracy": 0.7, "max_auc_drop": 0.01}, "min_auc must be between"),
        ({"min_auc": 0.7, "min_accuracy": 0.7, "max_auc_drop": -0.1}, "max_auc_drop must be"),
    ],
)
def test_evaluator_refuses_thresholds_no_model_can_meet_or_that_invert_the_gate(
    thresholds, message
):
    with pytest.raises(ConfigError, match=f"Evaluator: invalid run parameter: {message}"):
        ThresholdEvaluatorExecutor().Do({}, {}, thresholds)


def test_trainer_refuses_more_epochs_than_steps():
    with pytest.raises(ConfigError, match=r"Trainer: invalid run parameter: epochs \(8\) cannot"):
        TunableTrainerExecutor().Do(
            {}, {}, {"train_steps": 4, "epochs": 8, "max_train_minutes": 5.0}
        )


def test_trainer_refuses_a_time_budget_out_of_range():
    with pytest.raises(ConfigError, match="max_train_minutes must be between 0.1 and 10080"):
        TunableTrainerExecutor().Do(
            {}, {}, {"train_steps": 4, "epochs": 1, "max_train_minutes": 0.0}
        )


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        ({"span": -2}, "span must be -1"),
        ({"window_spans": 0}, "window_spans must be between 1 and 52"),
        ({"force": 2}, "force must be 0 or 1"),
        ({"model_name": "../x"}, "model_name must be one folder"),
    ],
)
def test_select_spans_refuses_a_span_window_force_or_model_name_out_of_range(changed, message):
    properties = {
        "data_root": "s3://b/data",
        "span": -1,
        "window_spans": 1,
        "force": 0,
        "serving_root": "s3://b/serving",
        "model_name": "taxi",
        "success_marker": "",
    }
    with pytest.raises(ConfigError, match=f"SelectSpans: invalid run parameter: {message}"):
        SelectSpansExecutor().Do({}, {}, {**properties, **changed})
