"""Evaluator whose thresholds are top-level parameters, and that evaluates the first model alone.

The EvalConfig is built here from three numbers, so Kubeflow users can change the bar per run
(values inside a compiled EvalConfig could not be set from the UI).

TFMA compares the candidate with one baseline, the served model, on the new evaluation data. A
chain of candidates, each within `max_auc_drop` of the one before, could still walk quality down
run after run; so each pushed version's record keeps a quality index (the served version's index
plus the candidate's AUC change against it, measured on the same data), and a candidate whose
index falls more than `max_auc_drop` below the best version's is not blessed (`slide_check`).
"""

from __future__ import annotations

import json
import math
from typing import Any

import tensorflow_model_analysis as tfma
from google.protobuf.wrappers_pb2 import BoolValue
from tfx import types
from tfx.components.evaluator import executor as evaluator_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types.standard_component_specs import EvaluatorSpec
from tfx.utils import path_utils, proto_utils

from components.base import storage
from components.base.config import check_run_parameters
from components.steps.auc_text import AUC_UNDEFINED_KEY
from components.steps.baseline import (
    BASELINE_VERSION_KEY,
    BEST_QUALITY_KEY,
    BEST_VERSION_KEY,
    NO_BASELINE,
    QUALITY_KEY,
)
from components.steps.prediction_samples import prediction_samples
from components.steps.step_outputs import CLASS_NAMES_KEY, NOT_COMPARED_KEY, VERDICT_FILE

# The probability above which a client calls a row positive: BinaryAccuracy's threshold.
SERVING_THRESHOLD = 0.5
# ConfusionMatrixPlot's thresholds are -1e-6, 0, 1/n, ..., 1 (confusion_matrix_plot.py): n + 2
# points of the ROC curve.
ROC_THRESHOLDS = 100
SLIDE_CHECK_KEY = "slide_check"  # blessing's custom property: why the slide check refused


def eval_config(
    min_auc: float,
    min_accuracy: float,
    max_auc_drop: float,
    label_key: str,
    slice_keys: list[str] | tuple[str, ...] = (),
    class_names: list[str] | None = None,
) -> tfma.EvalConfig:
    """AUC and accuracy must clear fixed bars on the whole eval set, and AUC may not fall more
    than `max_auc_drop` below the baseline's. Metrics per value of each slice key (the use
    case's) are reported, not gated: small slices are too noisy to block a release on.

    With `class_names` (a model with one probability per class) the AUC is the macro average
    of each class's one-vs-rest AUC and the accuracy the top-1 accuracy; top-2 accuracy, each
    class's precision and recall and the N x N confusion matrix are reported."""
    overall = [tfma.SlicingSpec()]

    def gated(metric: str, threshold: tfma.MetricThreshold) -> tfma.MetricConfig:
        return tfma.MetricConfig(
            class_name=metric,
            per_slice_thresholds=[
                tfma.PerSliceMetricThreshold(slicing_specs=overall, threshold=threshold)
            ],
        )

    auc = tfma.MetricThreshold(
        value_threshold=tfma.GenericValueThreshold(lower_bound={"value": min_auc}),
        change_threshold=tfma.GenericChangeThreshold(
            direction=tfma.MetricDirection.HIGHER_IS_BETTER, absolute={"value": -max_auc_drop}
        ),
    )
    accuracy = tfma.MetricThreshold(
        value_threshold=tfma.GenericValueThreshold(lower_bound={"value": min_accuracy})
    )
    return tfma.EvalConfig(
        model_specs=[tfma.ModelSpec(label_key=label_key, signature_name="serving_default")],
        slicing_specs=[
            tfma.SlicingSpec(),
            *(tfma.SlicingSpec(feature_keys=[key]) for key in slice_keys),
        ],
        metrics_specs=(
            _multi_class_specs(
                len(class_names), gated("AUC", auc), gated("SparseCategoricalAccuracy", accuracy)
            )
            if class_names
            else _binary_specs(gated("AUC", auc), gated("BinaryAccuracy", accuracy))
        ),
        # TFMA's default adds the model's compiled Keras metrics, which it computes by loading
        # each model again with Keras in every worker (keras_util.py): that was half of this
        # step (measured: 28.9 s -> 14.7 s with a baseline). The metrics above are TFMA's own.
        options=tfma.Options(include_default_metrics=BoolValue(value=False)),
    )


def _binary_specs(auc, accuracy) -> list[tfma.MetricsSpec]:
    """Metrics of a model with one probability (of the positive class) and a 0/1 label."""
    return [
        tfma.MetricsSpec(
            metrics=[
                tfma.MetricConfig(class_name="ExampleCount"),
                tfma.MetricConfig(class_name="BinaryCrossEntropy"),  # the training loss
                # The run report's ROC curve (run_report.py), from a histogram, and its
                # confusion matrix, computed exactly as BinaryAccuracy is.
                tfma.MetricConfig(
                    class_name="ConfusionMatrixPlot",
                    config=json.dumps({"num_thresholds": ROC_THRESHOLDS}),
                ),
                tfma.MetricConfig(
                    class_name="ConfusionMatrixAtThresholds",
                    config=json.dumps({"thresholds": [SERVING_THRESHOLD]}),
                ),
                auc,
                accuracy,
            ]
        )
    ]


def _multi_class_specs(classes: int, auc, accuracy) -> list[tfma.MetricsSpec]:
    """Metrics of a model with one probability per class and an integer label."""
    ids = list(range(classes))
    return [
        tfma.MetricsSpec(
            metrics=[
                tfma.MetricConfig(class_name="ExampleCount"),
                tfma.MetricConfig(class_name="SparseCategoricalCrossentropy"),  # the training loss
                accuracy,
                tfma.MetricConfig(
                    class_name="SparseTopKCategoricalAccuracy", config=json.dumps({"k": 2})
                ),
                tfma.MetricConfig(class_name="MultiClassConfusionMatrixPlot"),
            ]
        ),
        # Each class against the rest, at the 0.5 threshold.
        tfma.MetricsSpec(
            binarize=tfma.BinarizationOptions(class_ids={"values": ids}),
            metrics=[
                tfma.MetricConfig(class_name="Precision"),
                tfma.MetricConfig(class_name="Recall"),
            ],  # fmt: skip
        ),
        # The gated AUC: every class's one-vs-rest AUC, averaged with equal weights.
        tfma.MetricsSpec(
            aggregate=tfma.AggregationOptions(
                macro_average=True, class_weights={i: 1.0 for i in ids}
            ),
            metrics=[auc],
        ),
    ]


class ThresholdEvaluatorExecutor(evaluator_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        from components.training.autograph_rules import keep_autograph_out_of_libraries

        keep_autograph_out_of_libraries()  # TFMA loads the models with Keras (model_util.py)
        properties = dict(exec_properties)
        thresholds = {
            name: properties.pop(name) for name in ("min_auc", "min_accuracy", "max_auc_drop")
        }
        check_run_parameters("Evaluator", thresholds)
        examples = artifact_utils.get_single_instance(input_dict["examples"])
        class_names = json.loads(examples.get_string_custom_property(CLASS_NAMES_KEY) or "null")
        config = eval_config(
            **thresholds,
            label_key=properties.pop("label_key"),
            slice_keys=json.loads(properties.pop("slice_keys")),
            class_names=class_names,
        )
        properties["eval_config"] = proto_utils.proto_to_json(config)
        # A baseline artifact without a model (nothing pushed yet) is dropped: the first model is
        # judged on the value thresholds alone.
        input_dict = dict(input_dict)
        baselines = [
            b
            for b in input_dict.pop("baseline_model", [])
            if b.get_int_custom_property(BASELINE_VERSION_KEY) != NO_BASELINE
        ]
        # A served model that cannot parse this eval data (the schema made a column it requires
        # optional, or changed its type) would fail TFMA's evaluation: it is not compared.
        not_compared = None
        if baselines:
            candidate, examples = input_dict["model"][0], input_dict["examples"][0]
            not_compared = other_classes(baselines[0], class_names) or not_comparable(
                baselines[0], candidate, examples
            )
        if not_compared:
            baselines = []
        if baselines:
            input_dict["baseline_model"] = baselines
        super().Do(input_dict, output_dict, properties)
        evaluation = artifact_utils.get_single_instance(output_dict["evaluation"])
        blessing = artifact_utils.get_single_instance(output_dict["blessing"])
        metrics, failures = read_metrics(evaluation.uri, class_names)
        change = auc_change(evaluation.uri)
        quality, refusal = 0.0, None
        undefined = metrics.get("overall", {}).get(AUC_UNDEFINED_KEY)
        if undefined:  # TFMA's number there (0 or 1) must not decide a release
            refusal = f"AUC {undefined}: the model cannot be judged on this eval data"
        elif baselines and change is None:
            refusal = "TFMA computed no AUC change against the baseline: not comparable"
        elif baselines:
            quality, refusal = quality_gate(
                baselines[0].get_float_custom_property(QUALITY_KEY),
                baselines[0].get_float_custom_property(BEST_QUALITY_KEY),
                change,
                thresholds["max_auc_drop"],
                best_version=baselines[0].get_int_custom_property(BEST_VERSION_KEY),
            )
        blessing.set_float_custom_property(QUALITY_KEY, quality)
        if not_compared:
            blessing.set_string_custom_property(NOT_COMPARED_KEY, not_compared)
        if refusal and blessing.get_int_custom_property("blessed") == 1:
            _unbless(blessing, refusal)
            failures.append(refusal)
        # What the Pusher records and the summaries show, without reading TFMA's files again.
        verdict = {"metrics": metrics, "failures": failures, "auc_change": change,
                   QUALITY_KEY: quality, NOT_COMPARED_KEY: not_compared}  # fmt: skip
        if class_names:  # the report's N x N matrix and sample images, named classes
            verdict["class_names"] = class_names
            verdict["confusion_matrix"] = multi_class_matrices(evaluation.uri).get("overall")
            verdict["samples"] = prediction_samples(
                input_dict["model"][0], input_dict["examples"][0], class_names
            )
        else:  # the report's ROC curve and its matrix at the serving threshold
            verdict["roc_curve"] = roc_curve(evaluation.uri)
            verdict["serving_confusion_matrix"] = serving_confusion_matrix(evaluation.uri)
        storage.write_bytes(storage.join(blessing.uri, VERDICT_FILE), json.dumps(verdict).encode())


def other_classes(baseline, class_names: list[str] | None) -> str | None:
    """Why the served model `baseline` cannot be compared with a multi-class candidate over
    `class_names`: it knows other classes, or orders them otherwise (its output i is another
    class), after a config change of class_names. None when they agree or the model is binary."""
    from components.training.export import CLASS_NAMES_PATH

    if not class_names:
        return None
    path = storage.join(path_utils.serving_model_path(baseline.uri), CLASS_NAMES_PATH)
    served = json.loads(storage.read_bytes(path)) if storage.list_files(path) else None
    if served == list(class_names):
        return None
    version = baseline.get_int_custom_property(BASELINE_VERSION_KEY)
    return (f"served version {version} predicts the classes {served or 'of another model'}, this "
            f"model {list(class_names)}: judged on the thresholds alone; the next run compares "
            "with this model")  # fmt: skip


def not_comparable(baseline, model, examples) -> str | None:
    """Why the served model `baseline` cannot score this run's eval rows (`examples`' eval
    split), or None when it can. The input contracts the two exports wrote say whether it might
    not (components/training/input_contract.py); only then are the rows read, each checked as
    the served model's parser would. A model exported before contracts existed is compared as
    before."""
    from components.steps.warmup import eval_rows
    from components.training import input_contract

    contracts = []
    for artifact in (baseline, model):
        path = path_utils.serving_model_path(artifact.uri)
        path = storage.join(path, input_contract.INPUT_CONTRACT_PATH)
        if not storage.list_files(path):
            return None
        contracts.append(json.loads(storage.read_bytes(path)))
    if not input_contract.may_refuse(*contracts):
        return None
    seen, refused = input_contract.refused_rows(contracts[0], eval_rows(examples.uri))
    if not refused:
        return None
    version = baseline.get_int_custom_property(BASELINE_VERSION_KEY)
    reasons = "; ".join(f"{count} {why}" for why, count in refused.most_common(3))
    return (
        f"served version {version} cannot parse {sum(refused.values())} of {seen} eval rows "
        f"({reasons}): judged on the thresholds alone; the next run compares with this model"
    )


def quality_gate(
    served_quality: float,
    best_quality: float,
    auc_change: float,
    max_auc_drop: float,
    best_version: int | None = None,
) -> tuple[float, str | None]:
    """(the candidate's quality index, why it may not be pushed or None).

    The index of the served version plus the candidate's AUC change against it; it may not fall
    more than `max_auc_drop` below the best index along the served version's lineage."""
    quality = served_quality + auc_change
    floor = best_quality - max_auc_drop
    if quality < floor - 1e-9:
        best = f"version {best_version}'s" if best_version is not None else "the best version's"
        return quality, (
            f"quality would slide: AUC {auc_change:+.4f} against the served model puts the "
            f"quality index at {quality:+.4f}, more than max_auc_drop={max_auc_drop:g} below "
            f"{best} {best_quality:+.4f} (the best the served model's lineage reached); if the "
            "data changed for good, run with a larger max_auc_drop once"
        )
    return quality, None


def _unbless(blessing, reason: str) -> None:
    """Turns TFMA's blessing into a refusal: the property the Pusher checks, and the marker
    file that TFX's own consumers read."""
    storage.delete_files(storage.list_files(storage.join(blessing.uri, "BLESSED")))
    storage.write_bytes(storage.join(blessing.uri, "NOT_BLESSED"), b"")
    blessing.set_int_custom_property("blessed", 0)
    blessing.set_string_custom_property(SLIDE_CHECK_KEY, reason)


def one_class_reason(values: dict) -> str | None:
    """Why a slice's AUC is undefined, from TFMA's confusion matrix of that slice (tp + fn are
    its positives, tn + fp its negatives): an ROC curve needs examples of both labels. TFMA
    still reports a number there (0 or 1), which would read as a perfect or a hopeless model."""
    matrices = values.get("confusionMatrixAtThresholds", {}).get("matrices", [])
    if not matrices:
        return None
    m = matrices[0]  # MessageToDict leaves out zero counts
    positives = m.get("truePositives", 0) + m.get("falseNegatives", 0)
    negatives = m.get("trueNegatives", 0) + m.get("falsePositives", 0)
    if positives and negatives:
        return None
    label = 0 if negatives else 1
    return f"n/a: every example of this slice has label {label} (AUC needs both labels)"


# Multi-class metrics under the names every reader uses (the binary model's are TFMA's own).
_RENAMED = {
    "sparse_categorical_accuracy": "accuracy",
    "sparse_top_k_categorical_accuracy": "top_2_accuracy",
}


def metric_name(name: str) -> str:
    """TFMA's name of a metric as the verdict holds it: the macro-averaged AUC (TFMA prefixes
    its aggregation, `macro_average: true\n_auc`) is "auc"; a difference keeps `_diff`."""
    base, diff = (name[: -len("_diff")], "_diff") if name.endswith("_diff") else (name, "")
    if base.startswith("macro_average") and base.endswith("_auc"):
        base = "auc"
    return _RENAMED.get(base, base) + diff


def _slice_name(slice_key) -> str:
    return "overall" if not slice_key else ", ".join(f"{k}={v}" for k, v in slice_key)


def read_metrics(
    uri: str, class_names: list[str] | None = None
) -> tuple[dict[str, dict[str, float | str | None]], list[str]]:
    """Metrics by slice ("overall", "<slice key>=<value>", ...) and the failed thresholds. A
    slice of one label has "auc" None and the reason under AUC_UNDEFINED_KEY. With
    `class_names` (multi-class): "precision[<class>]" and "recall[<class>]" too."""
    result = tfma.load_eval_result(uri)
    matrices = multi_class_matrices(uri) if class_names else {}
    metrics: dict[str, dict[str, float | str | None]] = {}
    for slice_key, values in result.slicing_metrics:
        name = _slice_name(slice_key)
        flat: dict[str, float | str | None] = {}
        reason = None
        for sub_key, sub_values in values.get("", {}).items():
            suffix = ""
            if sub_key.startswith("classId:") and class_names:
                suffix = f"[{class_names[int(sub_key.partition(':')[2])]}]"
            elif sub_key:
                continue
            for metric, value in sub_values.items():
                if "doubleValue" in value:  # NaN (no example to count) reads as absent
                    number = float(value["doubleValue"])
                    flat[metric_name(metric) + suffix] = number if math.isfinite(number) else None
                if not metric.endswith("_diff") and not suffix:  # diffs have no counts
                    reason = reason or one_class_reason(value)
        if class_names and name in matrices:
            reason = one_class_present(matrices[name], class_names)
        if reason and "auc" in flat:
            flat["auc"] = None
            flat.pop("auc_diff", None)
            flat[AUC_UNDEFINED_KEY] = reason
        metrics[name] = flat
    failures = []
    validation = tfma.load_validation_result(uri)
    for per_slice in validation.metric_validations_per_slice:
        for f in per_slice.failures:
            value = f.metric_value.double_value.value
            against = "change vs baseline" if f.metric_key.is_diff else "value"
            bound = _bounds(f.metric_threshold, f.metric_key.is_diff)
            failures.append(
                f"{metric_name(f.metric_key.name)} {against} {value:.4f} fails: must be {bound}"
            )
    return metrics, failures


def multi_class_matrices(uri: str) -> dict[str, list[list[float]]]:
    """The candidate's confusion matrix per slice, [true class][predicted class] counts, from
    TFMA's MultiClassConfusionMatrixPlot at its threshold 0 (the predicted class is the most
    probable one)."""
    found = {}
    for per_slice in tfma.load_plots(uri):
        name = _slice_name(
            [(k.column, k.bytes_value.decode() if k.HasField("bytes_value") else
              k.int64_value if k.HasField("int64_value") else k.float_value)
             for k in per_slice.slice_key.single_slice_keys]
        )  # fmt: skip
        for item in per_slice.plot_keys_and_values:
            value = item.value
            if (not value.HasField("multi_class_confusion_matrix_at_thresholds")
                    or item.key.model_name == tfma.BASELINE_KEY):  # fmt: skip
                continue
            entries = value.multi_class_confusion_matrix_at_thresholds.matrices[0].entries
            size = 1 + max((max(e.actual_class_id, e.predicted_class_id) for e in entries),
                           default=0)  # fmt: skip
            matrix = [[0.0] * size for _ in range(size)]
            for e in entries:
                if e.actual_class_id >= 0 and e.predicted_class_id >= 0:
                    matrix[e.actual_class_id][e.predicted_class_id] += e.num_weighted_examples
            found[name] = matrix
    return found


def one_class_present(matrix: list[list[float]], class_names: list[str]) -> str | None:
    """Why a slice's macro-averaged AUC is undefined: its examples are all of one class, or a
    class has none (each class's one-vs-rest curve needs examples in and out of it; TFMA would
    count a class without examples as an AUC of 0 in the average)."""
    present = [i for i, row in enumerate(matrix) if sum(row) and i < len(class_names)]
    if len(present) == 1:
        return (f"n/a: every example of this slice has label {class_names[present[0]]} (AUC "
                "needs several labels)")  # fmt: skip
    missing = [name for i, name in enumerate(class_names) if i not in present]
    if present and missing:
        return (f"n/a: no example of class {', '.join(missing)} in this slice (the "
                "macro-averaged AUC needs every class)")  # fmt: skip
    return None


def _bounds(threshold: tfma.MetricThreshold, change: bool) -> str:
    """The bound a value (or, for `change`, its change vs the baseline) failed, in words:
    "at least 0.75", "a change of at least -0.01"."""
    parts = []
    if not change:
        value = threshold.value_threshold
        if value.HasField("lower_bound"):
            parts.append(f"at least {value.lower_bound.value:g}")
        if value.HasField("upper_bound"):
            parts.append(f"at most {value.upper_bound.value:g}")
    else:
        bounds = threshold.change_threshold
        side = ("at least" if bounds.direction == tfma.MetricDirection.HIGHER_IS_BETTER
                else "at most")  # fmt: skip
        if bounds.HasField("absolute"):
            parts.append(f"a change of {side} {bounds.absolute.value:+g}")
        if bounds.HasField("relative"):
            parts.append(f"a relative change of {side} {bounds.relative.value:+g}")
    return " and ".join(parts) or " ".join(str(threshold).split())


def roc_curve(uri: str) -> list[dict[str, float]]:
    """The overall slice's ROC points, lowest threshold first: threshold, recall,
    falsePositiveRate (TFMA's ConfusionMatrixAtThresholds matrices, in camel case)."""
    from google.protobuf import json_format

    for per_slice in tfma.load_plots(uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for item in per_slice.plot_keys_and_values:
            # With a baseline TFMA plots both models; the baseline's is named "baseline".
            if (item.value.HasField("confusion_matrix_at_thresholds")
                    and item.key.model_name != tfma.BASELINE_KEY):  # fmt: skip
                return [
                    json_format.MessageToDict(m, including_default_value_fields=True)
                    for m in item.value.confusion_matrix_at_thresholds.matrices
                ]
    return []


def serving_confusion_matrix(uri: str) -> dict[str, float]:
    """The overall confusion matrix at SERVING_THRESHOLD (trueNegatives, falsePositives,
    falseNegatives, truePositives), the candidate's, not its difference to the baseline."""
    from google.protobuf import json_format

    for per_slice in tfma.load_metrics(uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for item in per_slice.metric_keys_and_values:
            if (item.key.name == "confusion_matrix_at_thresholds" and not item.key.is_diff
                    and item.key.model_name != tfma.BASELINE_KEY):  # fmt: skip
                matrices = item.value.confusion_matrix_at_thresholds.matrices
                return json_format.MessageToDict(matrices[0], including_default_value_fields=True)
    return {}


def auc_change(uri: str) -> float | None:
    """The overall AUC difference to the baseline, present only when TFMA evaluated one."""
    for per_slice in tfma.load_metrics(uri):
        if per_slice.slice_key.single_slice_keys:
            continue
        for item in per_slice.metric_keys_and_values:
            # The overall AUC (macro-averaged for several classes), not a class's own.
            if item.key.name == "auc" and item.key.is_diff and not item.key.HasField("sub_key"):
                return item.value.double_value.value
    return None


class ThresholdEvaluatorSpec(types.ComponentSpec):
    PARAMETERS = {
        **{k: v for k, v in EvaluatorSpec.PARAMETERS.items() if k != "eval_config"},
        "min_auc": component_spec.ExecutionParameter(type=float),
        "min_accuracy": component_spec.ExecutionParameter(type=float),
        "max_auc_drop": component_spec.ExecutionParameter(type=float),
        # The use case's label column and slice columns (a JSON list).
        "label_key": component_spec.ExecutionParameter(type=str),
        "slice_keys": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = EvaluatorSpec.INPUTS
    OUTPUTS = EvaluatorSpec.OUTPUTS


class ThresholdEvaluator(base_component.BaseComponent):
    SPEC_CLASS = ThresholdEvaluatorSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(ThresholdEvaluatorExecutor)

    def __init__(
        self,
        examples: types.BaseChannel,
        model: types.BaseChannel,
        baseline_model: types.BaseChannel,
        min_auc: float | Any,
        min_accuracy: float | Any,
        max_auc_drop: float | Any,
        label_key: str,
        slice_keys: list[str] | tuple[str, ...] = (),
    ):
        super().__init__(
            spec=ThresholdEvaluatorSpec(
                label_key=label_key,
                slice_keys=json.dumps(list(slice_keys)),
                examples=examples,
                model=model,
                baseline_model=baseline_model,
                min_auc=min_auc,
                min_accuracy=min_accuracy,
                max_auc_drop=max_auc_drop,
                evaluation=types.Channel(type=standard_artifacts.ModelEvaluation),
                blessing=types.Channel(type=standard_artifacts.ModelBlessing),
            )
        )
