"""The first step of every run: which spans to read, and whether they are new to the model.

It resolves the span parameter (-1: the newest complete span) and the rolling window (the newest
`window_spans` complete spans up to it), fingerprints their content, and looks the fingerprint up
in the serving directory's record of trained inputs (components/base/registry.py). A run whose input
already produced a model, blessed or not, is not new data: the step's `decision` artifact says
`train = 0` and every later step is skipped, on every runner, through `tfx.dsl.Cond`
(pipelines/pipeline.py); the run parameter `force=1` trains anyway.

The decision is an artifact of its own, read only by the condition: TFX 1.16 compiles a step
inside a Cond that also consumes the predicate's channel into a reference Kubeflow cannot resolve.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_driver, executor_spec
from tfx.dsl.components.base.base_executor import BaseExecutor
from tfx.orchestration import data_types_utils
from tfx.orchestration.portable import base_driver as portable_base_driver
from tfx.proto.orchestration import driver_output_pb2
from tfx.types import artifact_utils, component_spec

from components.base import registry, spans, storage
from components.base.config import check_run_parameters
from components.base.spans import LATEST_SPAN, ExampleGenInputError  # noqa: F401 (their home)

_log = logging.getLogger(__name__)

SELECTION_FILE = "selection.json"
DECISION_FILE = "decision.json"
TRAIN_KEY = "train"  # decision's custom property, 1 or 0: the Cond reads it


class SpanSelection(types.Artifact):
    """The spans a run reads: `selection.json` lists each span's files and fingerprint."""

    TYPE_NAME = "components.SpanSelection"  # importable by this name: components/__init__.py


class TrainingDecision(types.Artifact):
    """Whether the run trains (custom property `train`), and why (`reason`)."""

    TYPE_NAME = "components.TrainingDecision"


def read_selection(selection: types.Artifact) -> dict[str, Any]:
    """The selection as `select` returned it (span numbers as ints)."""
    value = json.loads(storage.read_bytes(storage.join(selection.uri, SELECTION_FILE)))
    value["spans"] = {int(n): s for n, s in value["spans"].items()}
    return value


class SelectSpansExecutor(BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        names = ("data_root", "span", "window_spans", "force", "serving_root", "model_name")
        check_run_parameters("SelectSpans", {name: exec_properties[name] for name in names})
        selection = spans.select(
            exec_properties["data_root"],
            exec_properties["span"],
            exec_properties["window_spans"],
            exec_properties["success_marker"],
            exec_properties.get("input_format") or spans.CSV,
        )
        numbers = sorted(selection["spans"])
        _log.info("Spans %s (newest %d), fingerprint %s", numbers, selection["span"],
                  selection["fingerprint"])  # fmt: skip
        folder = registry.versions_dir(
            exec_properties["serving_root"], exec_properties["model_name"]
        )
        before = registry.trained_outcome(folder, selection["fingerprint"])
        if before is None:
            train, reason = 1, f"new data: span(s) {numbers}"
        elif exec_properties["force"]:
            train, reason = 1, f"span(s) {numbers} trained before; training again (force=1)"
        else:
            train, reason = 0, spans.no_new_data_reason(selection, before)
        _log.info("%s", reason)

        out = artifact_utils.get_single_instance(output_dict["selection"])
        storage.write_bytes(storage.join(out.uri, SELECTION_FILE), json.dumps(selection).encode())
        out.set_int_custom_property("span", selection["span"])
        out.set_string_custom_property("spans", json.dumps(numbers))
        out.set_string_custom_property("input_fingerprint", selection["fingerprint"])
        decision = artifact_utils.get_single_instance(output_dict["decision"])
        # Every artifact this pipeline passes on holds a file
        # (pipelines/kubeflow/kfp_entrypoint.py).
        body = {"train": train, "reason": reason, "previous": before}
        storage.write_bytes(storage.join(decision.uri, DECISION_FILE), json.dumps(body).encode())
        decision.set_int_custom_property(TRAIN_KEY, train)
        decision.set_string_custom_property("reason", reason)


class NeverCachedDriver(base_driver.BaseDriver, portable_base_driver.BaseDriver):
    """Runs the step every time under runners that run drivers (the local one): its result
    depends on the data root and the serving directory, which TFX's cache key does not see.
    Kubeflow runs no driver; there the compiled step has caching turned off (kubeflow/)."""

    def run(self, execution_info) -> driver_output_pb2.DriverOutput:
        properties = dict(execution_info.exec_properties, run_nonce=uuid.uuid4().hex)
        result = driver_output_pb2.DriverOutput()
        for key, value in properties.items():
            if value is not None:
                data_types_utils.set_metadata_value(result.exec_properties[key], value)
        for key, artifacts in execution_info.output_dict.items():
            result.output_artifacts[key].artifacts.extend(a.mlmd_artifact for a in artifacts)
        return result


class SelectSpansSpec(types.ComponentSpec):
    PARAMETERS = {
        "data_root": component_spec.ExecutionParameter(type=str),
        "span": component_spec.ExecutionParameter(type=int),
        "window_spans": component_spec.ExecutionParameter(type=int),
        "success_marker": component_spec.ExecutionParameter(type=str),
        # How a span holds its data (components/base/spans.py INPUT_FORMATS): the use case's.
        "input_format": component_spec.ExecutionParameter(type=str, optional=True),
        "force": component_spec.ExecutionParameter(type=int),
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {}
    OUTPUTS = {
        "selection": component_spec.ChannelParameter(type=SpanSelection),
        "decision": component_spec.ChannelParameter(type=TrainingDecision),
    }


class SelectSpans(base_component.BaseComponent):
    SPEC_CLASS = SelectSpansSpec
    DRIVER_CLASS = NeverCachedDriver
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(SelectSpansExecutor)

    def __init__(self, data_root, span, window_spans, success_marker: str, force, serving_root,
                 model_name, input_format: str = spans.CSV):  # fmt: skip
        super().__init__(
            spec=SelectSpansSpec(
                data_root=data_root,
                span=span,
                window_spans=window_spans,
                success_marker=success_marker,
                input_format=input_format,
                force=force,
                serving_root=serving_root,
                model_name=model_name,
                selection=types.Channel(type=SpanSelection),
                decision=types.Channel(type=TrainingDecision),
            )
        )
