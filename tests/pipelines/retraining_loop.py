"""The retraining loop as a user lives it, run once per test session and shared by the test
modules that check what it saw (tests/pipelines/test_pipeline_e2e.py,
tests/steps/test_run_report.py)."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import signal
import subprocess
import sys
import time
import types

import pytest

from components.base import registry, serving_state
from components.base.config import DEFAULT_DRIFT, PipelineConfig
from components.base.errors import actionable_cause
from components.base.registry import complete_versions as pushed_versions
from components.steps.baseline import QUALITY_KEY
from components.steps.evaluation import quality_gate
from components.training.checkpoints import CHECKPOINTS_FOLDER
from pipelines import data, models
from pipelines.local.local_runner import run_pipeline
from pipelines.run_summary import latest_step_outputs
from tests.use_cases.kit import scalar_steps


def loop_config(bucket: str, work, data_folder: str = "data", **overrides) -> PipelineConfig:
    values = dict(
        data_root=f"s3://{bucket}/{data_folder}",
        serving_root=f"s3://{bucket}/serving",
        pipeline_root=str(work / "pipeline_root"),
        metadata_path=str(work / "metadata.sqlite"),
        train_steps=300,
        eval_steps=20,
        epochs=2,
        # The gate, set where training noise cannot move a verdict (measured over 10 loops of
        # 4,000-row spans): a model of a clean span reaches AUC 0.868-0.888 and accuracy
        # 0.819-0.835, one of a span with 60 % coin-flip labels AUC 0.634-0.653 and accuracy
        # 0.589-0.622; so each bar is 0.08-0.12 from both (9 standard deviations or more), and
        # the noisy model fails both. A model of the next clean span changed AUC by -0.003 to
        # +0.007 against the one before, so max_auc_drop is 0.047 or more away.
        min_auc=0.75,
        min_accuracy=0.7,
        max_auc_drop=0.05,
    )
    # Over the config's defaults as a user gets them (the taxi use case's names and bars).
    return dataclasses.replace(PipelineConfig.load(environ={}), **{**values, **overrides})


def gate_failures(summary, config: PipelineConfig) -> list[str]:
    """The checks a run's candidate fails by the values it recorded, worked out here from its
    metrics and AUC change, the config's thresholds and the registry's quality indices: "auc
    value", "binary_accuracy value", "auc change vs baseline", "quality would slide". Whatever
    training noise gave, the gate must have refused exactly these (assert_gate_agrees).

    TFMA 0.47's rule (evaluators/metrics_validator.py): a value passes when it is >= its lower
    bound, a change when it is >= -max_auc_drop; a missing or NaN value fails. The quality
    indices are the registry's exact ones, where the Evaluator reads ML Metadata's 6 decimals:
    the two could part only within 1e-6 of the slide check's floor."""
    overall, change = summary.metrics.get("overall", {}), summary.auc_change
    compared = summary.baseline_version is not None

    def fails(value, bound: float) -> bool:
        return not (value is not None and float(value) >= bound)  # NaN >= x is False

    failed = [name for name, failing in (
        ("auc value", fails(overall.get("auc"), config.min_auc)),
        ("binary_accuracy value", fails(overall.get("binary_accuracy"), config.min_accuracy)),
        ("auc change vs baseline", compared and fails(change, -config.max_auc_drop)),
    ) if failing]  # fmt: skip
    if not failed and compared:  # TFMA blessed: the Evaluator's slide check
        folder = config.serving_model_dir
        records = registry.records(folder)
        chain = registry.lineage(folder, summary.baseline_version)
        quality = {v: (records.get(v) or {}).get(QUALITY_KEY, 0.0) for v in chain}
        served = quality[summary.baseline_version]
        if quality_gate(served, max(quality.values()), change, config.max_auc_drop)[1]:
            failed.append("quality would slide")
    return failed


def assert_gate_agrees(summary, config: PipelineConfig) -> None:
    """The run blessed and pushed its candidate exactly when no check fails for the values it
    recorded, and named every check that failed."""
    expected = gate_failures(summary, config)
    recorded = [re.match(r"\w+ value|auc change vs baseline|quality would slide", failure)
                for failure in summary.validation_failures]  # fmt: skip
    seen = (summary.metrics.get("overall"), summary.auc_change, summary.validation_failures)
    assert sorted(m.group(0) for m in recorded if m) == sorted(expected), seen
    assert len(recorded) == len(expected) and summary.blessed is (not expected), seen
    assert (summary.pushed_path is not None) is (not expected), seen


_SET_BY_TEST = ("data_root", "serving_root", "pipeline_root", "metadata_path", "train_steps",
                "eval_steps", "epochs", "min_auc", "min_accuracy", "max_auc_drop")  # fmt: skip


def _kill_a_run_once_training_is_backed_up(config: PipelineConfig, work) -> int:
    """Starts `tkp run` with `config`, SIGKILLs it once the Trainer's first backup is complete,
    and returns the step the backup holds."""
    settings = [f"--set={name}={getattr(config, name)}" for name in _SET_BY_TEST]
    process = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "run", *settings],
        env={**os.environ, "PIPELINE_WORK_DIR": str(work)},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    index = os.path.join(config.pipeline_root, CHECKPOINTS_FOLDER, "*", "chief", "checkpoint")
    try:
        deadline = time.monotonic() + 600
        while not glob.glob(index) and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert glob.glob(index), f"no backup after {time.monotonic() - deadline + 600:.0f} s"
    finally:
        process.kill()
        process.wait(60)
    steps = re.findall(r"ckpt-(\d+)", open(glob.glob(index)[0]).read())
    assert process.returncode == -signal.SIGKILL and steps
    return int(steps[-1])


@pytest.fixture(scope="session")
def loop(object_store, tmp_path_factory) -> types.SimpleNamespace:
    """The retraining loop as a user lives it, one span after another: span 0 gives version 1;
    span 0 again trains nothing; span 1 gives version 2; span 2, drifted, stops at validation;
    span 3, with broken labels, is not blessed and version 2 keeps serving; a rollback serves
    version 1 again. Each test below checks one stage of what this saw."""
    bucket = object_store.new_bucket("e2e")
    config = loop_config(bucket, tmp_path_factory.mktemp("e2e"))
    seen = types.SimpleNamespace(bucket=bucket, config=config)

    def served() -> int | None:
        return serving_state.read(config.serving_model_dir, config.model_name).stable

    data.write_span(config.data_root, 0, 4000)
    # `tkp run` is killed (SIGKILL) once its Trainer has backed up epoch 1; running the
    # pipeline again resumes the training there instead of starting over.
    seen.killed_at = _kill_a_run_once_training_is_backed_up(
        config, tmp_path_factory.mktemp("killed")
    )
    seen.first = run_pipeline(config)
    seen.first_report = latest_step_outputs(config, "RunReport")
    model_runs = glob.glob(os.path.join(config.pipeline_root, "Trainer", "model_run", "*"))
    seen.first_logged_steps = scalar_steps(max(model_runs, key=lambda p: int(os.path.basename(p))))
    seen.served_after_first = served()
    seen.again = run_pipeline(config)
    seen.versions_after_again = set(pushed_versions(config.serving_model_dir))
    data.write_span(config.data_root, 1, 4000)
    seen.second = run_pipeline(config)
    seen.second_report = latest_step_outputs(config, "RunReport")
    seen.served_after_second = served()
    data.write_span(config.data_root, 2, 4000, drift=DEFAULT_DRIFT)
    with pytest.raises(Exception) as raised:
        run_pipeline(config)
    seen.drift_error = actionable_cause(raised.value)
    seen.served_after_drift = served()
    data.write_span(config.data_root, 3, 4000, label_noise=0.6)
    seen.noisy = run_pipeline(config)
    seen.noisy_report = latest_step_outputs(config, "RunReport")
    seen.served_after_noisy = served()
    seen.rollback = models.rollback(config, None)
    seen.served_after_rollback = served()
    seen.listing = models.list_versions(config)
    return seen
