"""The first step of every run: which spans to read, and whether they are new to the model.

It resolves the span parameter (-1: the newest complete span) and the rolling window (the newest
`window_spans` complete spans up to it), fingerprints their content, and looks the fingerprint up
in the serving directory's record of trained inputs (components/registry.py). A run whose input
already produced a model, blessed or not, is not new data: the step's `decision` artifact says
`train = 0` and every later step is skipped, on every runner, through `tfx.dsl.Cond`
(pipelines/pipeline.py); the run parameter `force=1` trains anyway.

The decision is an artifact of its own, read only by the condition: TFX 1.16 compiles a step
inside a Cond that also consumes the predicate's channel into a reference Kubeflow cannot resolve.
"""

from __future__ import annotations

import hashlib
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

from components import registry, spans
from components.features import SPAN_PREFIX
from components.spans import ExampleGenInputError
from pipelines import storage
from pipelines.config import check_run_parameters

_log = logging.getLogger(__name__)

LATEST_SPAN = -1
SELECTION_FILE = "selection.json"
DECISION_FILE = "decision.json"
TRAIN_KEY = "train"  # decision's custom property, 1 or 0: the Cond reads it


class SpanSelection(types.Artifact):
    """The spans a run reads: `selection.json` lists each span's files and fingerprint."""

    TYPE_NAME = "components.SpanSelection"  # importable by this name: components/__init__.py


class TrainingDecision(types.Artifact):
    """Whether the run trains (custom property `train`), and why (`reason`)."""

    TYPE_NAME = "components.TrainingDecision"


def select(data_root: str, span: int, window_spans: int, marker: str) -> dict[str, Any]:
    """{"span": newest, "spans": {N: {"files": [...], "fingerprint": ...}}, "fingerprint": ...};
    ExampleGenInputError naming the data root, the spans and the fix when there is nothing to
    read."""
    folders = spans.span_dirs(data_root)
    if not folders:
        raise ExampleGenInputError(
            f"no {SPAN_PREFIX}N/ folders under {data_root}: write data there first "
            "(`make add-span` generates the next span)."
        )
    complete = spans.complete_spans(data_root, marker)
    chosen = max(complete, default=None) if span == LATEST_SPAN else span
    if chosen is None or chosen not in complete:
        what = "no span" if span == LATEST_SPAN else f"span {span}"
        if span != LATEST_SPAN and span not in folders:
            raise ExampleGenInputError(
                f"span {span} requested but {data_root} has spans {sorted(folders)}: "
                "set the span parameter to one of them or -1 for the newest."
            )
        raise ExampleGenInputError(
            f"{what} under {data_root} is complete: complete spans hold the marker file "
            f"{marker!r}, written last by the upload (spans without it: "
            f"{sorted(set(folders) - set(complete))}). Finish the upload with that file, or set "
            "success_marker to '' to read spans without markers."
        )
    window = [n for n in sorted(complete) if n <= chosen][-window_spans:]
    selected = {}
    for number in window:
        files = spans.span_files(complete[number])
        if not files:
            raise ExampleGenInputError(
                f"{complete[number]} holds no .csv or .csv.gz files: write the span's CSV files "
                "there, or remove the folder, or set the span parameter to another span."
            )
        tags = storage.content_tags(complete[number])
        content = "\n".join(f"{f.path[len(complete[number]):]}:{tags.get(f.path)}" for f in files)
        selected[number] = {
            "folder": complete[number],
            "files": [f.path for f in files],
            "fingerprint": hashlib.sha256(content.encode()).hexdigest()[:16],
        }
    whole = json.dumps({n: s["fingerprint"] for n, s in selected.items()}, sort_keys=True)
    return {
        "data_root": data_root,
        "span": chosen,
        "spans": selected,
        "fingerprint": hashlib.sha256(whole.encode()).hexdigest()[:16],
    }


def read_selection(selection: types.Artifact) -> dict[str, Any]:
    """The selection as `select` returned it (span numbers as ints)."""
    value = json.loads(storage.read_bytes(storage.join(selection.uri, SELECTION_FILE)))
    value["spans"] = {int(n): s for n, s in value["spans"].items()}
    return value


class SelectSpansExecutor(BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        names = ("data_root", "span", "window_spans", "force", "serving_root", "model_name")
        check_run_parameters("SelectSpans", {name: exec_properties[name] for name in names})
        selection = select(
            exec_properties["data_root"],
            exec_properties["span"],
            exec_properties["window_spans"],
            exec_properties["success_marker"],
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
            train, reason = 0, _no_new_data(selection, before)
        _log.info("%s", reason)

        out = artifact_utils.get_single_instance(output_dict["selection"])
        storage.write_bytes(storage.join(out.uri, SELECTION_FILE), json.dumps(selection).encode())
        out.set_int_custom_property("span", selection["span"])
        out.set_string_custom_property("spans", json.dumps(numbers))
        out.set_string_custom_property("input_fingerprint", selection["fingerprint"])
        decision = artifact_utils.get_single_instance(output_dict["decision"])
        # Every artifact this pipeline passes on holds a file (pipelines/kfp_entrypoint.py).
        body = {"train": train, "reason": reason, "previous": before}
        storage.write_bytes(storage.join(decision.uri, DECISION_FILE), json.dumps(body).encode())
        decision.set_int_custom_property(TRAIN_KEY, train)
        decision.set_string_custom_property("reason", reason)


def _no_new_data(selection: dict[str, Any], before: dict[str, Any]) -> str:
    outcome = (
        f"version {before['pushed_version']} was pushed from it"
        if before.get("pushed_version")
        else f"its model was not pushed ({before.get('reason') or 'not blessed'})"
    )
    return (
        f"no new data since span {selection['span']}: span(s) {sorted(selection['spans'])} "
        f"(fingerprint {selection['fingerprint']}) already trained a model on "
        f"{before.get('time', '?')}, and {outcome}. Nothing is trained or pushed; add a span, or "
        "set the run parameter force=1 to train on the same data again."
    )


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
                 model_name):  # fmt: skip
        super().__init__(
            spec=SelectSpansSpec(
                data_root=data_root,
                span=span,
                window_spans=window_spans,
                success_marker=success_marker,
                force=force,
                serving_root=serving_root,
                model_name=model_name,
                selection=types.Channel(type=SpanSelection),
                decision=types.Channel(type=TrainingDecision),
            )
        )
