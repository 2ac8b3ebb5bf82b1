"""Evaluator whose thresholds are top-level parameters, and that evaluates the first model alone.

The EvalConfig is built here from three numbers, so Kubeflow users can change the bar per run
(values inside a compiled EvalConfig could not be set from the UI).
"""

from __future__ import annotations

from typing import Any

import tensorflow_model_analysis as tfma
from tfx import types
from tfx.components.evaluator import executor as evaluator_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import component_spec, standard_artifacts
from tfx.types.standard_component_specs import EvaluatorSpec
from tfx.utils import proto_utils

from components import features
from components.baseline import BASELINE_VERSION_KEY, NO_BASELINE
from pipelines.config import check_run_parameters


def eval_config(min_auc: float, min_accuracy: float, max_auc_drop: float) -> tfma.EvalConfig:
    """AUC and accuracy must clear fixed bars on the whole eval set, and AUC may not fall more
    than `max_auc_drop` below the baseline's. Per-payment-type metrics are reported, not gated:
    small slices are too noisy to block a release on."""
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
        model_specs=[
            tfma.ModelSpec(label_key=features.LABEL_KEY, signature_name="serving_default")
        ],
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=[features.SLICE_KEY])],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(class_name="ExampleCount"),
                    gated("AUC", auc),
                    gated("BinaryAccuracy", accuracy),
                ]
            )
        ],
    )


class ThresholdEvaluatorExecutor(evaluator_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        properties = dict(exec_properties)
        thresholds = {
            name: properties.pop(name) for name in ("min_auc", "min_accuracy", "max_auc_drop")
        }
        check_run_parameters("Evaluator", thresholds)
        config = eval_config(**thresholds)
        properties["eval_config"] = proto_utils.proto_to_json(config)
        # A baseline artifact without a model (nothing pushed yet) is dropped: the first model is
        # judged on the value thresholds alone.
        input_dict = dict(input_dict)
        baselines = [
            b
            for b in input_dict.pop("baseline_model", [])
            if b.get_int_custom_property(BASELINE_VERSION_KEY) != NO_BASELINE
        ]
        if baselines:
            input_dict["baseline_model"] = baselines
        super().Do(input_dict, output_dict, properties)


class ThresholdEvaluatorSpec(types.ComponentSpec):
    PARAMETERS = {
        **{k: v for k, v in EvaluatorSpec.PARAMETERS.items() if k != "eval_config"},
        "min_auc": component_spec.ExecutionParameter(type=float),
        "min_accuracy": component_spec.ExecutionParameter(type=float),
        "max_auc_drop": component_spec.ExecutionParameter(type=float),
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
    ):
        super().__init__(
            spec=ThresholdEvaluatorSpec(
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
