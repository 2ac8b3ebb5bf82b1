"""The run's last step: what the Kubeflow UI shows of a run, and the same report locally.

Three outputs, of the types the KFP 2.5 UI draws (components/steps/kfp_artifacts.py):
- `metrics` (system.Metrics): AUC, accuracy (and top-2 accuracy), example count, the served
  model's AUC on the same data and the difference, blessed (1/0), pushed version (0: none) and
  the span;
- `classification_metrics` (system.ClassificationMetrics): the ROC curve over the eval split and
  the confusion matrix at the serving threshold (a multi-class model: its N x N confusion matrix
  of the most probable class, no ROC curve);
- `report` (system.HTML): one page for a person (components/steps/report_html.py), which `tkp run`
  also copies beside the run's log: the decision, the data (examples per split, each feature's
  range or counts: components/steps/data_summary.py), anomalies and drift, metrics, step times.
Everything comes from the artifacts of this run's steps; nothing is computed again.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts

from components.base import storage
from components.steps import data_summary, kfp_artifacts, report_html, step_times
from components.steps.auc_text import AUC_UNDEFINED_KEY, accuracy_of
from components.steps.span_selection import SpanSelection
from components.steps.step_outputs import (
    ANOMALIES_FILE,
    DRIFT_BASELINE_SPAN_KEY,
    DRIFT_SPLIT,
    NOT_PUSHED_REASON_KEY,
    read_verdict,
)


def _int(artifact, name: str, default: int) -> int:
    """An int custom property. TFX's typed getters read both runners' forms (on Kubeflow every
    value comes back as a struct); its untyped get_custom_property returns None for a 0 there."""
    return artifact.get_int_custom_property(name) if artifact.has_custom_property(name) else default


def _anomalies(artifact) -> dict[str, Any]:
    """Anomalies per split and column, and the drift measured per column on the eval split."""
    from tensorflow_metadata.proto.v0 import anomalies_pb2

    result: dict[str, Any] = {"columns": {}, "drift": []}
    for split in artifact_utils.decode_split_names(artifact.split_names):
        path = storage.join(artifact_utils.get_split_uri([artifact], split), ANOMALIES_FILE)
        if not storage.list_files(path):
            continue
        anomalies = anomalies_pb2.Anomalies.FromString(storage.read_bytes(path))
        for column, info in anomalies.anomaly_info.items():
            result["columns"][f"{split}: {column}"] = info.description or info.short_description
        if split != DRIFT_SPLIT:
            continue
        for info in anomalies.drift_skew_info:
            for m in info.drift_measurements:
                result["drift"].append({"column": info.path.step[-1], "distance": m.value,
                                        "threshold": m.threshold})  # fmt: skip
    return result


def gather(inputs: dict[str, list], class_names: list[str]) -> dict[str, Any]:
    """What the report says, from the run's artifacts; `class_names` name the label's values
    (the use case's)."""
    selection = artifact_utils.get_single_instance(inputs["selection"])
    blessing = artifact_utils.get_single_instance(inputs["blessing"])
    pushed_model = artifact_utils.get_single_instance(inputs["pushed_model"])
    anomalies = artifact_utils.get_single_instance(inputs["anomalies"])
    statistics = artifact_utils.get_single_instance(inputs["statistics"])
    verdict = read_verdict(blessing)
    overall = verdict["metrics"].get("overall", {})
    pushed = _int(pushed_model, "pushed", 0) == 1
    multi_class = bool(verdict.get("class_names"))  # classes from the data (images)
    return {
        "span": _int(selection, "span", -1),
        "spans": json.loads(selection.get_string_custom_property("spans") or "[]"),
        "fingerprint": selection.get_string_custom_property("input_fingerprint"),
        "data": data_summary.summarize(statistics),
        "validation": {
            **_anomalies(anomalies),
            "drift_baseline_span": _int(anomalies, DRIFT_BASELINE_SPAN_KEY, -1),
        },  # fmt: skip
        "metrics": verdict["metrics"],
        "failures": verdict["failures"],
        "auc": overall.get("auc"),
        "auc_change": verdict["auc_change"],
        "not_compared": verdict.get("not_compared"),
        "baseline_auc": (
            None
            if verdict["auc_change"] is None or overall.get("auc") is None
            else overall["auc"] - verdict["auc_change"]
        ),  # fmt: skip
        "blessed": _int(blessing, "blessed", 0) == 1,
        "pushed_version": (
            int(pushed_model.get_string_custom_property("pushed_version")) if pushed else None
        ),  # fmt: skip
        "not_pushed_reason": pushed_model.get_string_custom_property(NOT_PUSHED_REASON_KEY),
        "curve": verdict.get("roc_curve", []),
        "confusion": verdict.get("serving_confusion_matrix", {}),
        # Multi-class: the N x N matrix [true][predicted] and a few eval images, predicted.
        "multi_class": multi_class,
        "matrix": verdict.get("confusion_matrix"),
        "samples": verdict.get("samples", []),
        "steps": step_times.carried(inputs),
        "class_names": list(verdict.get("class_names") or class_names),
        "tuning": _tuning(inputs),
    }


def _tuning(inputs: dict[str, list]) -> dict[str, Any]:
    """Where the hyperparameters came from, and the search's trials when one ran this run."""
    from components.steps import tuner

    if not inputs.get("best_hyperparameters"):
        return {}
    best = artifact_utils.get_single_instance(inputs["best_hyperparameters"])
    results = artifact_utils.get_single_instance(inputs["tuner_results"])
    path = storage.join(results.uri, tuner.TRIALS_FILE)
    return {
        "source": best.get_string_custom_property(tuner.SOURCE_KEY),
        "search": json.loads(best.get_string_custom_property(tuner.SEARCH_KEY) or "{}"),
        "trials": json.loads(storage.read_bytes(path)) if storage.list_files(path) else [],
    }


def _finite(value: Any) -> float | None:
    """A number the KFP UI can show: the launcher cannot record a null, nor JSON a NaN."""
    return float(value) if value is not None and math.isfinite(float(value)) else None


def write_metrics(metrics, facts: dict[str, Any]) -> None:
    overall = facts["metrics"].get("overall", {})
    values = {
        "auc": overall.get("auc"),
        "accuracy": accuracy_of(overall),
        "top_2_accuracy": overall.get("top_2_accuracy"),
        "example_count": overall.get("example_count"),
        "baseline_auc": facts["baseline_auc"],
        "auc_change": facts["auc_change"],
        "blessed": 1.0 if facts["blessed"] else 0.0,
        "pushed_version": float(facts["pushed_version"] or 0),
        "span": float(facts["span"]),
    }
    for name, value in values.items():
        if _finite(value) is not None:  # absent rather than null (converter.go fails on null)
            metrics.set_float_custom_property(name, float(value))
    search = facts.get("tuning", {}).get("search") or {}
    if facts.get("tuning", {}).get("source") == "search":  # the best trial of this run's search
        metrics.set_float_custom_property(f"tuner_best_{search['objective']}",
                                          float(search["best_value"]))  # fmt: skip
        metrics.set_float_custom_property("tuner_trials_completed", float(search["completed"]))
        for name, value in search["values"].items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics.set_float_custom_property(f"tuner_best_{name}", float(value))
            else:
                metrics.set_string_custom_property(f"tuner_best_{name}", json.dumps(value))
    if facts.get("not_compared"):  # no baseline_auc / auc_change: why, as text
        metrics.set_string_custom_property("not_compared", facts["not_compared"])
    if overall.get(AUC_UNDEFINED_KEY):  # no number to show: the reason, as text
        metrics.set_string_custom_property(AUC_UNDEFINED_KEY, overall[AUC_UNDEFINED_KEY])


def write_classification_metrics(artifact, facts: dict[str, Any]) -> None:
    """KFP's shapes (ClassificationMetrics.log_roc_curve / log_confusion_matrix), every number
    finite: the UI's runtypes take numbers only (ROCCurveHelper.tsx)."""
    if facts["curve"]:  # binary only: a multi-class model has one curve per class
        artifact.set_json_value_custom_property("confidenceMetrics", [
            {"confidenceThreshold": m.get("threshold", 0.0),
             "recall": _finite(m.get("recall")) or 0.0,
             "falsePositiveRate": _finite(m.get("falsePositiveRate")) or 0.0}
            for m in facts["curve"]
        ])  # fmt: skip
    rows = report_html.confusion_rows(facts)
    artifact.set_json_value_custom_property("confusionMatrix", {
        "annotationSpecs": [{"displayName": label} for label in facts["class_names"]],
        "rows": [{"row": row} for row in rows],
    })  # fmt: skip


class RunReportExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        facts = gather(input_dict, json.loads(exec_properties["class_names"]))
        write_metrics(artifact_utils.get_single_instance(output_dict["metrics"]), facts)
        write_classification_metrics(
            artifact_utils.get_single_instance(output_dict["classification_metrics"]), facts
        )
        report = artifact_utils.get_single_instance(output_dict["report"])
        if os.path.isdir(report.uri) and not os.listdir(report.uri):
            os.rmdir(report.uri)  # TFX made a folder; the UI reads a file at the URI
        storage.write_bytes(report.uri, report_html.render(facts).encode())


class RunReportSpec(types.ComponentSpec):
    # The label's values as people read them (a JSON list, the use case's `class_names`).
    PARAMETERS = {"class_names": component_spec.ExecutionParameter(type=str)}
    INPUTS = {
        "selection": component_spec.ChannelParameter(type=SpanSelection),
        "statistics": component_spec.ChannelParameter(type=standard_artifacts.ExampleStatistics),
        "anomalies": component_spec.ChannelParameter(type=standard_artifacts.ExampleAnomalies),
        "evaluation": component_spec.ChannelParameter(type=standard_artifacts.ModelEvaluation),
        "blessing": component_spec.ChannelParameter(type=standard_artifacts.ModelBlessing),
        "pushed_model": component_spec.ChannelParameter(type=standard_artifacts.PushedModel),
        # The Tuner step's: where the hyperparameters came from, the search's trials.
        "best_hyperparameters": component_spec.ChannelParameter(
            type=standard_artifacts.HyperParameters, optional=True
        ),
        "tuner_results": component_spec.ChannelParameter(
            type=standard_artifacts.TunerResults, optional=True
        ),
    }
    OUTPUTS = {
        "metrics": component_spec.ChannelParameter(type=kfp_artifacts.Metrics),
        "classification_metrics": component_spec.ChannelParameter(
            type=kfp_artifacts.ClassificationMetrics
        ),
        "report": component_spec.ChannelParameter(type=kfp_artifacts.HTML),
    }


class RunReport(base_component.BaseComponent):
    SPEC_CLASS = RunReportSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(RunReportExecutor)

    def __init__(self, selection, statistics, anomalies, evaluation, blessing, pushed_model,
                 class_names, best_hyperparameters=None, tuner_results=None):  # fmt: skip
        super().__init__(
            spec=RunReportSpec(
                class_names=json.dumps(list(class_names)),
                selection=selection,
                statistics=statistics,
                anomalies=anomalies,
                evaluation=evaluation,
                blessing=blessing,
                pushed_model=pushed_model,
                best_hyperparameters=best_hyperparameters,
                tuner_results=tuner_results,
                metrics=types.Channel(type=kfp_artifacts.Metrics),
                classification_metrics=types.Channel(type=kfp_artifacts.ClassificationMetrics),
                report=types.Channel(type=kfp_artifacts.HTML),
            )
        )
