"""Reads the outcome of the latest local run from ML Metadata and prints it for a person."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components.base.config import PipelineConfig
from components.steps.auc_text import AUC_UNDEFINED_KEY, auc_text

_STATES = {
    metadata_store_pb2.Execution.COMPLETE: "ran",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.FAILED: "FAILED",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.CANCELED: "canceled",
}
STEP_ORDER = [
    "SelectSpans",
    "ExampleGen", "StatisticsGen", "CuratedSchema", "ExampleValidator", "Transform", "Tuner",
    "Trainer", "LatestPushedModel", "Evaluator", "Pusher", "RunReport",
]  # fmt: skip


@dataclasses.dataclass
class StepResult:
    name: str
    state: str
    seconds: float


@dataclasses.dataclass
class RunSummary:
    steps: list[StepResult]
    span: int | None = None
    metrics: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)
    blessed: bool | None = None
    validation_failures: list[str] = dataclasses.field(default_factory=list)
    baseline_version: int | None = None
    # Candidate AUC minus the baseline's, as the Evaluator computed it; None without a baseline.
    auc_change: float | None = None
    not_compared: str | None = None  # why the served model was not compared (Evaluator)
    pushed_path: str | None = None
    spans: list[int] = dataclasses.field(default_factory=list)
    trained: bool | None = None  # False: no new data, nothing after SelectSpans ran
    decision: str = ""
    # What the Trainer reported (components/steps/trainer.py SUMMARY_PROPERTIES).
    training: dict[str, str | int | float] = dataclasses.field(default_factory=dict)
    report_uri: str | None = None  # the RunReport's HTML page
    # What the model was trained with, where those values came from ("search", "served
    # version N", "defaults") and the search's facts (components/steps/tuner.py).
    hyperparameters: dict = dataclasses.field(default_factory=dict)
    hyperparameter_source: str = ""
    search: dict = dataclasses.field(default_factory=dict)


def _store(config: PipelineConfig) -> metadata_store.MetadataStore:
    connection = metadata_store_pb2.ConnectionConfig()
    connection.sqlite.filename_uri = config.metadata_path
    connection.sqlite.connection_mode = metadata_store_pb2.SqliteMetadataSourceConfig.READONLY
    return metadata_store.MetadataStore(connection)


def _latest_output(store, execution_id: int) -> dict[str, metadata_store_pb2.Artifact]:
    events = store.get_events_by_execution_ids([execution_id])
    kinds = (metadata_store_pb2.Event.OUTPUT, metadata_store_pb2.Event.DECLARED_OUTPUT)
    outputs = {e.path.steps[0].key: e.artifact_id for e in events if e.type in kinds}
    artifacts = {a.id: a for a in store.get_artifacts_by_id(list(outputs.values()))}
    return {key: artifacts[artifact_id] for key, artifact_id in outputs.items()}


def latest_step_outputs(
    config: PipelineConfig, node: str
) -> dict[str, metadata_store_pb2.Artifact]:
    """The outputs of `node`'s newest execution in the local ML Metadata ({} when it never ran)."""
    if not Path(config.metadata_path).exists():
        return {}
    store = _store(config)
    context = store.get_context_by_type_and_name("node", f"{config.pipeline_name}.{node}")
    executions = store.get_executions_by_context(context.id) if context else []
    done = [e for e in executions if e.last_known_state == metadata_store_pb2.Execution.COMPLETE]
    return _latest_output(store, max(done, key=lambda e: e.id).id) if done else {}


def last_execution_id(config: PipelineConfig) -> int:
    """The newest execution's id in the run's ML Metadata (0 before the first run)."""
    if not Path(config.metadata_path).exists():
        return 0
    return max((e.id for e in _store(config).get_executions()), default=0)


def read_summary(
    config: PipelineConfig, after_execution: int, seconds: dict[str, float] | None = None
) -> RunSummary:
    """A RunSummary of the executions of this pipeline newer than `after_execution`.

    `seconds` are the wall times the runner measured per step (MLMD's timestamps leave out the
    driver and publishing).
    """
    store = _store(config)
    summary = RunSummary(steps=[])
    outputs: dict[str, dict] = {}
    for node in STEP_ORDER:
        context = store.get_context_by_type_and_name("node", f"{config.pipeline_name}.{node}")
        if context is None:
            continue
        executions = [
            e for e in store.get_executions_by_context(context.id) if e.id > after_execution
        ]
        if not executions:
            summary.steps.append(StepResult(node, "not run", 0.0))
            continue
        execution = max(executions, key=lambda e: e.id)
        took = (seconds or {}).get(node, 0.0)
        summary.steps.append(StepResult(node, _STATES.get(execution.last_known_state, "?"), took))
        outputs[node] = _latest_output(store, execution.id)

    selection = outputs.get("SelectSpans", {})
    if "selection" in selection:
        props = selection["selection"].custom_properties
        summary.span = props["span"].int_value
        summary.spans = json.loads(props["spans"].string_value)
    if "decision" in selection:
        props = selection["decision"].custom_properties
        summary.trained = props["train"].int_value == 1
        summary.decision = props["reason"].string_value
    if "model_run" in outputs.get("Trainer", {}):
        for name, value in outputs["Trainer"]["model_run"].custom_properties.items():
            kind = value.WhichOneof("value")
            if kind in ("int_value", "double_value", "string_value"):
                summary.training[name] = getattr(value, kind)
    if "model" in outputs.get("Trainer", {}):
        props = outputs["Trainer"]["model"].custom_properties
        if "hyperparameters" in props:
            summary.hyperparameters = json.loads(props["hyperparameters"].string_value)
    if "best_hyperparameters" in outputs.get("Tuner", {}):
        props = outputs["Tuner"]["best_hyperparameters"].custom_properties
        summary.hyperparameter_source = props["source"].string_value
        summary.search = json.loads(props["search"].string_value or "{}")
    if "baseline_model" in outputs.get("LatestPushedModel", {}):
        props = outputs["LatestPushedModel"]["baseline_model"].custom_properties
        version = props["baseline_version"].int_value if "baseline_version" in props else -1
        summary.baseline_version = version if version >= 0 else None
    evaluator = outputs.get("Evaluator", {})
    if "blessing" in evaluator:
        summary.blessed = evaluator["blessing"].custom_properties["blessed"].int_value == 1
    if "evaluation" in evaluator:
        # The Evaluator's verdict: TFMA's metrics under the names every reader uses (with the
        # classes of a multi-class model), the failed thresholds and its own refusal.
        from components.steps.step_outputs import read_verdict

        verdict = read_verdict(evaluator["blessing"])
        summary.metrics, summary.validation_failures = verdict["metrics"], verdict["failures"]
        summary.auc_change = verdict["auc_change"]
        summary.not_compared = verdict.get("not_compared")
    pushed = outputs.get("Pusher", {}).get("pushed_model")
    if pushed is not None and pushed.custom_properties["pushed"].int_value == 1:
        summary.pushed_path = pushed.custom_properties["pushed_destination"].string_value
    if "report" in outputs.get("RunReport", {}):
        summary.report_uri = outputs["RunReport"]["report"].uri
    return summary


def format_summary(summary: RunSummary) -> str:
    lines = ["", "Pipeline run summary", "--------------------"]
    for step in summary.steps:
        lines.append(f"  {step.name:<18} {step.state:<8} {step.seconds:7.1f} s")
    if summary.span is not None:
        window = f" (training window: spans {summary.spans})" if len(summary.spans) > 1 else ""
        lines.append(f"Data span: {summary.span}{window}")
    if summary.trained is False:
        lines.append(summary.decision)
        return "\n".join(lines)
    if summary.hyperparameters:
        lines.append(_hyperparameters_line(summary))
    if summary.training:
        lines.append(_training_line(summary.training))
    overall = summary.metrics.get("overall", {})
    if overall:
        shown = ", ".join(
            f"{k}={v:.4f}" for k, v in sorted(overall.items())
            if k != "example_count" and isinstance(v, float)
        )  # fmt: skip
        if overall.get(AUC_UNDEFINED_KEY):
            shown += f", auc={auc_text(overall)}"
        count = int(overall.get("example_count", 0))
        lines.append(f"Evaluation ({count} eval examples): {shown}")
        for name, values in sorted(summary.metrics.items()):
            if name != "overall" and "auc" in values:
                count = int(values.get("example_count", 0))
                lines.append(f"  {name:<32} auc={auc_text(values)}  n={count}")
    baseline = (
        f"version {summary.baseline_version}" if summary.baseline_version else "none (first model)"
    )
    if summary.not_compared:
        lines.append(f"Not compared with the served model: {summary.not_compared}")
    elif summary.auc_change is not None and overall.get("auc") is not None:
        # TFMA reports the difference on the same eval data; the served model's AUC follows.
        served_auc = overall["auc"] - summary.auc_change
        baseline += (
            f": AUC {served_auc:.4f} on this eval data, candidate {overall['auc']:.4f} "
            f"(change {summary.auc_change:+.4f})"
        )
    if not summary.not_compared:
        lines.append(f"Compared with the served model: {baseline}")
    if summary.blessed is not None:
        lines.append(f"Blessed: {'yes' if summary.blessed else 'NO'}")
    lines.extend(f"  failed threshold: {failure}" for failure in summary.validation_failures)
    lines.append(f"Pushed: {summary.pushed_path or 'nothing pushed'}")
    return "\n".join(lines)


def _hyperparameters_line(summary: RunSummary) -> str:
    values = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                       for k, v in sorted(summary.hyperparameters.items()))  # fmt: skip
    search, source = summary.search, summary.hyperparameter_source or "defaults"
    if source == "search":
        source = (f"search: {search.get('completed')} of {search.get('trials')} trials "
                  f"completed, best {search.get('objective')} {search.get('best_value', 0):.4f} "
                  f"in trial {search.get('best_trial')}")  # fmt: skip
    elif source != "defaults":
        source += "'s search"
    return f"Hyperparameters ({source}): {values}"


def _training_line(training: dict) -> str:
    replicas, workers = training.get("replicas", 1), training.get("workers", 1)
    line = (
        f"Training: {training.get('steps', '?')} steps on {replicas} replica(s), "
        f"{workers} worker(s), {training.get('examples_per_second', 0):,.0f} examples/s"
    )
    if training.get("resumed"):
        line += ", resumed from its backup"
    stopped = training.get("stopped", "completed")
    return line + ("" if stopped == "completed" else f"; {stopped}")
