"""ExampleValidator that stops the run when the data break the curated schema or drift.

Stock ExampleValidator only records anomalies; a pipeline that goes on would train and maybe push
a model on broken data. This executor fails the step instead, naming each column and problem.

Drift: the schema's `drift_comparator`s (schemas/<use case>/schema.pbtxt: L-infinity distance for
categorical features, Jensen-Shannon divergence for numeric ones, each with its threshold) compare
the eval split's statistics of this span with those of the previous span, the newest span below it
that passed this step before. Only the eval split is compared: it always holds the newest span
alone, while the train split may hold a window of several spans. Without a resolver task (open-
source Kubeflow rejects them), the previous statistics come from the serving directory, where this
step records a span's eval statistics when, and only when, the span passes:
`<serving_root>/<model_name>/_statistics/span-<N>/FeatureStats.pb` (a binary
DatasetFeatureStatisticsList, as StatisticsGen writes it). An empty `DRIFT_ACCEPTED` file in a
span's folder accepts that span's drift once a person has looked at it (the error says how)."""

from __future__ import annotations

import logging
import os
import re
from typing import Any

import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import anomalies_pb2, statistics_pb2
from tfx import types
from tfx.components.example_validator import executor as validator_executor
from tfx.components.statistics_gen import stats_artifact_utils
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types import standard_component_specs as specs
from tfx.utils import io_utils, json_utils, writer_utils

from components.base import registry, storage
from components.base.config import check_run_parameters
from components.base.errors import ActionableError
from components.base.spans import SPAN_PREFIX
from components.steps.baseline import serving_model_dir, serving_parameters
from components.steps.step_outputs import (
    DRIFT_BASELINE_SPAN_KEY,
    DRIFT_SPLIT,
    STATISTICS_FILE,
    read_statistics,
)

_log = logging.getLogger(__name__)

STATISTICS_FOLDER = registry.STATISTICS
DRIFT_ACCEPTED_FILE = "DRIFT_ACCEPTED"
# DRIFT_BASELINE_SPAN_KEY, on the anomalies artifact: the span the statistics were compared with
# (NO_SPAN: none recorded below this one).
NO_SPAN = -1

_MEASURES = {
    anomalies_pb2.DriftSkewInfo.Measurement.L_INFTY: "L-infinity distance",
    anomalies_pb2.DriftSkewInfo.Measurement.JENSEN_SHANNON_DIVERGENCE: "Jensen-Shannon divergence",
}
_MOST_CHANGED = re.compile(r"The feature value with maximum difference is: (.*)$")


class DataValidationError(ActionableError, ValueError):
    """The examples do not match the schema, or drifted too far from the previous span."""


def statistics_root(serving_root: str, model_name: str) -> str:
    """Where the eval statistics of the spans that passed validation are recorded."""
    return storage.join(serving_model_dir(serving_root, model_name), STATISTICS_FOLDER)


def span_statistics_dir(statistics_root: str, span: int) -> str:
    return storage.join(statistics_root, f"{SPAN_PREFIX}{span}")


def recorded_spans(statistics_root: str) -> dict[int, str]:
    """The spans whose statistics were recorded, by number, each with its file's path."""
    storage.check_reachable(statistics_root)
    prefix = statistics_root.rstrip("/") + "/" + SPAN_PREFIX
    pattern = re.compile(re.escape(prefix) + r"(\d+)/" + re.escape(STATISTICS_FILE))
    found = {}
    for path in storage.list_files(prefix + "*/" + STATISTICS_FILE):
        match = pattern.fullmatch(path)
        if match:
            found[int(match.group(1))] = path
    return found


def drift_problems(anomalies: anomalies_pb2.Anomalies) -> list[str]:
    """One line per feature whose drift comparator is above its threshold (with distance and
    threshold), and one per other anomaly of the comparison."""
    lines, measured = [], set()
    for info in sorted(anomalies.drift_skew_info, key=lambda i: list(i.path.step)):
        feature = ".".join(info.path.step)
        for measurement in info.drift_measurements:
            if measurement.value <= measurement.threshold:  # TFDV's rule: above is an anomaly
                continue
            measured.add(feature)
            what = _MEASURES.get(measurement.type, "distance")
            line = (
                f"  feature '{feature}': {what} {measurement.value:.4f} is above its threshold "
                f"{measurement.threshold:g}"
            )
            anomaly = anomalies.anomaly_info.get(feature)
            changed = anomaly and _MOST_CHANGED.search(anomaly.description)
            if changed:
                line += f" (the value whose share changed most: {changed.group(1)})"
            lines.append(line)
    for feature, info in sorted(anomalies.anomaly_info.items()):
        if feature not in measured:
            lines.append(f"  feature '{feature}': {info.short_description}: {info.description}")
    return lines


def _span_of(statistics: types.Artifact) -> int:
    if not statistics.has_property("span"):
        raise DataValidationError(
            f"the statistics artifact {statistics.uri} carries no span, so the drift check cannot "
            "tell which span it holds: StatisticsGen copies it from ExampleGen's examples; run "
            "this step after them."
        )
    return int(statistics.span)


class Executor(validator_executor.Executor):
    def _Validate(self, inputs, outputs):
        anomalies = super()._Validate(inputs, outputs)
        self._anomalies.append((outputs, anomalies))
        return anomalies

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        check_run_parameters("ExampleValidator", serving_parameters(exec_properties))
        self._anomalies = []
        super().Do(input_dict, output_dict, exec_properties)
        problems = []
        for outputs, anomalies in self._anomalies:
            split_dir = next(iter(outputs.values()))
            for column, info in sorted(anomalies.anomaly_info.items()):
                problems.append(
                    f"  column '{column}': {info.short_description}: {info.description}"
                )
            if anomalies.HasField("dataset_anomaly_info"):
                info = anomalies.dataset_anomaly_info
                problems.append(f"  whole data set: {info.short_description}: {info.description}")
            if problems:
                problems.insert(0, f"in {split_dir}:")
                break  # one split's list is enough to act on; the others are on disk
        if problems:
            statistics = artifact_utils.get_single_instance(input_dict[specs.STATISTICS_KEY])
            span = statistics.span if statistics.has_property("span") else "N"
            raise DataValidationError(
                f"the data do not match the curated schema ({exec_properties['schema_file']}); "
                "fix the input span or, if the change is intended, update the schema: `tkp "
                f"schema propose --span {span} --set use_case={exec_properties['use_case']}` "
                "shows what the data need, field by field, and `--write` writes it for you to "
                "review:\n" + "\n".join(problems)
            )
        self._check_drift(input_dict, output_dict, exec_properties)

    def _check_drift(self, input_dict, output_dict, exec_properties) -> None:
        """Compares the eval split with the previous span's; records it when within bounds."""
        statistics = artifact_utils.get_single_instance(input_dict[specs.STATISTICS_KEY])
        span = _span_of(statistics)
        splits = artifact_utils.decode_split_names(statistics.split_names)
        if DRIFT_SPLIT not in splits:
            raise DataValidationError(
                f"the statistics {statistics.uri} have no '{DRIFT_SPLIT}' split (only {splits}), "
                "which the drift check compares: ExampleGen must write a train and an eval split."
            )
        current = stats_artifact_utils.load_statistics(statistics, DRIFT_SPLIT).proto()
        root = statistics_root(exec_properties["serving_root"], exec_properties["model_name"])
        anomalies_artifact = artifact_utils.get_single_instance(output_dict[specs.ANOMALIES_KEY])
        recorded = recorded_spans(root)
        earlier = [n for n in recorded if n < span]
        if not earlier:
            _log.info(
                "Drift check: no span below %d has passed validation yet (recorded statistics: "
                "%s): nothing to compare with, no drift check.",
                span,
                root,
            )
            anomalies_artifact.set_int_custom_property(DRIFT_BASELINE_SPAN_KEY, NO_SPAN)
            self._record(root, span, current)
            return
        previous = max(earlier)
        anomalies_artifact.set_int_custom_property(DRIFT_BASELINE_SPAN_KEY, previous)
        schema = io_utils.SchemaReader().read(
            io_utils.get_only_uri_in_dir(artifact_utils.get_single_uri(input_dict["schema"]))
        )
        anomalies = tfdv.validate_statistics(
            current, schema, previous_statistics=read_statistics(recorded[previous])
        )
        # The eval split's anomalies as the stock validator writes them when given the previous
        # span, measured distances (drift_skew_info) included.
        eval_dir = artifact_utils.get_split_uri([anomalies_artifact], DRIFT_SPLIT)
        writer_utils.write_anomalies(
            os.path.join(eval_dir, validator_executor.DEFAULT_FILE_NAME), anomalies
        )
        for info in anomalies.drift_skew_info:
            for measurement in info.drift_measurements:
                _log.info(
                    "Drift check, span %d vs span %d: '%s' %s %.4f (threshold %g)",
                    span,
                    previous,
                    ".".join(info.path.step),
                    _MEASURES.get(measurement.type, "distance"),
                    measurement.value,
                    measurement.threshold,
                )
        problems = drift_problems(anomalies)
        folder = span_statistics_dir(root, span)
        accepted = storage.join(folder, DRIFT_ACCEPTED_FILE)
        if problems and storage.list_files(accepted):
            _log.warning(
                "Span %d drifted from span %d, accepted by %s:\n%s",
                span,
                previous,
                accepted,
                "\n".join(problems),
            )
        elif problems:
            create = (
                f"`aws s3 cp - {accepted} < /dev/null`"
                if accepted.startswith("s3://")
                else f"`mkdir -p {folder} && touch {accepted}`"
            )
            raise DataValidationError(
                f"span {span} drifted from span {previous}, the newest earlier span that passed "
                f"validation (statistics of the eval split; thresholds: drift_comparator in "
                f"{exec_properties['schema_file']}):\n" + "\n".join(problems) + "\n"
                f"Span {span} is not recorded as passed: the next span is compared with span "
                f"{previous} again. If the data are broken, fix or replace span {span}. If the "
                "change is expected: raise that feature's threshold in the curated schema "
                f"(for every later span), or accept span {span} as it is: create an empty file "
                f"{accepted} (e.g. {create}) and run span {span} again; it then passes, and "
                "later spans are compared with it."
            )
        self._record(root, span, current)

    @staticmethod
    def _record(root: str, span: int, current: statistics_pb2.DatasetFeatureStatisticsList):
        path = storage.join(span_statistics_dir(root, span), STATISTICS_FILE)
        storage.write_bytes(path, current.SerializeToString())
        _log.info("Span %d passed validation; its eval statistics are recorded at %s", span, path)


class StrictExampleValidatorSpec(types.ComponentSpec):
    PARAMETERS = {
        **specs.ExampleValidatorSpec.PARAMETERS,
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
        # The use case and its schema file, for the error's next step (`tkp schema propose`).
        "use_case": component_spec.ExecutionParameter(type=str),
        "schema_file": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = specs.ExampleValidatorSpec.INPUTS
    OUTPUTS = specs.ExampleValidatorSpec.OUTPUTS


class StrictExampleValidator(base_component.BaseComponent):
    """ExampleValidator whose step fails on any schema anomaly and on drift from the previous
    span that passed (recorded under `<serving_root>/<model_name>/_statistics/`)."""

    SPEC_CLASS = StrictExampleValidatorSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(Executor)

    def __init__(
        self,
        statistics: types.BaseChannel,
        schema: types.BaseChannel,
        serving_root: str | Any,
        model_name: str | Any,
        use_case: str,
        schema_file: str,
    ):
        super().__init__(
            spec=StrictExampleValidatorSpec(
                statistics=statistics,
                schema=schema,
                use_case=use_case,
                schema_file=schema_file,
                serving_root=serving_root,
                model_name=model_name,
                exclude_splits=json_utils.dumps([]),
                anomalies=types.Channel(type=standard_artifacts.ExampleAnomalies),
            )
        )
