"""Reads the outcome of the latest local run from ML Metadata and prints it for a person."""

from __future__ import annotations

import dataclasses

from ml_metadata.metadata_store import metadata_store
from ml_metadata.proto import metadata_store_pb2

from components import features
from pipelines.config import PipelineConfig

_STATES = {
    metadata_store_pb2.Execution.COMPLETE: "ran",
    metadata_store_pb2.Execution.CACHED: "cached",
    metadata_store_pb2.Execution.FAILED: "FAILED",
    metadata_store_pb2.Execution.RUNNING: "running",
    metadata_store_pb2.Execution.CANCELED: "canceled",
}
STEP_ORDER = [
    "ExampleGen", "StatisticsGen", "CuratedSchema", "ExampleValidator", "Transform", "Trainer",
    "LatestPushedModel", "Evaluator", "Pusher",
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
    pushed_path: str | None = None


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


def read_summary(
    config: PipelineConfig, since: float, seconds: dict[str, float] | None = None
) -> RunSummary:
    """A RunSummary of the executions of this pipeline started at or after `since` (Unix s).

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
        executions = [e for e in store.get_executions_by_context(context.id)
                      if e.create_time_since_epoch >= since * 1000 - 1000]  # fmt: skip
        if not executions:
            summary.steps.append(StepResult(node, "not run", 0.0))
            continue
        execution = max(executions, key=lambda e: e.id)
        took = (seconds or {}).get(node, 0.0)
        summary.steps.append(StepResult(node, _STATES.get(execution.last_known_state, "?"), took))
        outputs[node] = _latest_output(store, execution.id)

    if "examples" in outputs.get("ExampleGen", {}):
        summary.span = outputs["ExampleGen"]["examples"].properties["span"].int_value
    if "baseline_model" in outputs.get("LatestPushedModel", {}):
        props = outputs["LatestPushedModel"]["baseline_model"].custom_properties
        version = props["baseline_version"].int_value if "baseline_version" in props else -1
        summary.baseline_version = version if version >= 0 else None
    evaluator = outputs.get("Evaluator", {})
    if "blessing" in evaluator:
        summary.blessed = evaluator["blessing"].custom_properties["blessed"].int_value == 1
    if "evaluation" in evaluator:
        uri = evaluator["evaluation"].uri
        summary.metrics, summary.validation_failures = _evaluation(uri)
        summary.auc_change = _auc_change(uri)
    pushed = outputs.get("Pusher", {}).get("pushed_model")
    if pushed is not None and pushed.custom_properties["pushed"].int_value == 1:
        summary.pushed_path = pushed.custom_properties["pushed_destination"].string_value
    return summary


def _evaluation(uri: str) -> tuple[dict[str, dict[str, float]], list[str]]:
    """Metrics by slice ("overall", "payment_type=Cash", ...) and the failed thresholds."""
    import tensorflow_model_analysis as tfma

    result = tfma.load_eval_result(uri)
    metrics: dict[str, dict[str, float]] = {}
    for slice_key, values in result.slicing_metrics:
        name = "overall" if not slice_key else ", ".join(f"{k}={v}" for k, v in slice_key)
        flat = {}
        for metric, value in values.get("", {}).get("", {}).items():
            if "doubleValue" in value:
                flat[metric] = value["doubleValue"]
        metrics[name] = flat
    failures = []
    validation = tfma.load_validation_result(uri)
    for per_slice in validation.metric_validations_per_slice:
        for f in per_slice.failures:
            value = f.metric_value.double_value.value
            threshold = " ".join(str(f.metric_threshold).split())
            against = "change vs baseline" if f.metric_key.is_diff else "value"
            failures.append(f"{f.metric_key.name} {against} {value:.4f} fails {{{threshold}}}")
    return metrics, failures


def _auc_change(uri: str) -> float | None:
    """The overall AUC difference to the baseline, present only when TFMA evaluated one."""
    import tensorflow_model_analysis as tfma

    for per_slice in tfma.load_metrics(uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for item in per_slice.metric_keys_and_values:
            if item.key.name == "auc" and item.key.is_diff:
                return item.value.double_value.value
    return None


def format_summary(summary: RunSummary) -> str:
    lines = ["", "Pipeline run summary", "--------------------"]
    for step in summary.steps:
        lines.append(f"  {step.name:<18} {step.state:<8} {step.seconds:7.1f} s")
    if summary.span is not None:
        lines.append(f"Data span: {summary.span}")
    overall = summary.metrics.get("overall", {})
    if overall:
        shown = ", ".join(
            f"{k}={v:.4f}" for k, v in sorted(overall.items()) if k != "example_count"
        )
        count = int(overall.get("example_count", 0))
        lines.append(f"Evaluation ({count} eval examples): {shown}")
        for name, values in sorted(summary.metrics.items()):
            if name.startswith(features.SLICE_KEY) and "auc" in values:
                lines.append(
                    f"  {name:<32} auc={values['auc']:.4f}  n={int(values.get('example_count', 0))}"
                )
    baseline = (
        f"version {summary.baseline_version}" if summary.baseline_version else "none (first model)"
    )
    if summary.auc_change is not None:
        baseline += f" (AUC change {summary.auc_change:+.4f})"
    lines.append(f"Compared with last blessed model: {baseline}")
    if summary.blessed is not None:
        lines.append(f"Blessed: {'yes' if summary.blessed else 'NO'}")
    lines.extend(f"  failed threshold: {failure}" for failure in summary.validation_failures)
    lines.append(f"Pushed: {summary.pushed_path or 'nothing pushed'}")
    return "\n".join(lines)
