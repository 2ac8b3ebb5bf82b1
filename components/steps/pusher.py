"""Pusher that writes numbered versions (1, 2, 3, ...) for TF Serving, releases the new one
(components/base/release.py), and keeps the registry (components/base/registry.py).

Stock Pusher names versions by Unix time, which two pushes in one second share, writes through
TensorFlow's gfile, which cannot reach SeaweedFS reliably (README.md, "Object storage notes"),
and takes its destination inside a proto that Kubeflow users could not set per run. Here a
version number is claimed race-free, the version's record is written, the serving state labels it
`stable` or `canary` (TF Serving switches at its next poll) unless another writer changed that
state since this run's baseline was read, old versions are pruned, and the input's
outcome is recorded whether or not the model was blessed, so the same data is not trained again.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import json
import logging
import tempfile
from pathlib import Path
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.utils import path_utils

from components.base import registry, release, serving_state, storage
from components.base.config import check_run_parameters
from components.steps.baseline import (
    BASELINE_VERSION_KEY,
    NO_BASELINE,
    QUALITY_KEY,
    serving_parameters,
)
from components.steps.span_selection import SpanSelection, read_selection
from components.steps.step_outputs import (
    HYPERPARAMETERS_KEY,
    NOT_PUSHED_REASON_KEY,
    SEARCH_KEY,
    read_verdict,
)

_log = logging.getLogger(__name__)
# The edge model of a version (config export_tflite): TF Serving ignores assets.extra/ apart
# from its warm-up file, and the model goes wherever its version goes (pruning included).
EDGE_MODEL_PATH = "assets.extra/model.tflite"


def push_version(
    model_path: str, versions_dir: str, version: int, extra_files: dict[str, bytes] | None = None
) -> str:
    """Copies the model under `model_path` to `<versions_dir>/<version>/`, with `extra_files`
    (relative path: content, e.g. the warm-up requests) beside it; returns that folder.

    Refuses, writing nothing, when the folder already holds any file: a version is never
    overwritten, since TF Serving may be serving it and clients may pin it.
    """
    serving_path = storage.join(versions_dir, str(version))
    existing = storage.list_files(serving_path + "/**")
    if existing:
        raise FileExistsError(
            f"{serving_path} already holds {len(existing)} file(s); a version is never "
            "overwritten: push to a new version number, or delete that folder by hand if it "
            "is a leftover that nothing serves."
        )
    for relative, content in (extra_files or {}).items():
        storage.write_bytes(storage.join(serving_path, relative), content)
    # saved_model.pb last: TF Serving treats a version as ready once it is there.
    count = storage.copy_tree(model_path, serving_path, last="saved_model.pb")
    count += len(extra_files or {})
    _log.info("Pushed version %d (%d files) to %s", version, count, serving_path)
    return serving_path


OUTCOME_FILE = "outcome.json"  # in pushed_model: what the registry records of this run


def _write_outcome(pushed_model, outcome: dict) -> None:
    """The outcome as a file of the artifact too: the next step's input must have files (on
    Kubeflow pipelines/kubeflow/kfp_entrypoint.py stops on an input without any), and it says
    why."""
    storage.write_bytes(storage.join(pushed_model.uri, OUTCOME_FILE), json.dumps(outcome).encode())


class TfxPusherContract(base_executor.BaseExecutor):
    """What TFX's own Pusher executor (tfx/components/pusher/executor.py, TFX 1.16) does that
    this step keeps: a model is pushed only when its blessing's `blessed` is 1
    (model_utils.is_model_blessed), from the serving model folder path_utils names, and
    pushed_model records `pushed`, `pushed_destination` and `pushed_version` under TFX's names
    (the run summary and the run report read them, as TFX's tools do). Rewritten, not
    subclassed: importing any tfx.components module imports every component, TFMA, TFDV and
    Beam among them, and doubled this step's start-up on Kubeflow."""

    def CheckBlessing(self, input_dict) -> bool:
        blessing = artifact_utils.get_single_instance(input_dict["model_blessing"])
        return blessing.get_int_custom_property("blessed") == 1

    def GetModelPath(self, input_dict) -> str:
        model = artifact_utils.get_single_instance(input_dict["model"])
        return path_utils.serving_model_path(model.uri, path_utils.is_old_model_artifact(model))

    def _MarkPushed(self, model_push, pushed_destination: str, pushed_version: str) -> None:
        model_push.set_int_custom_property("pushed", 1)
        model_push.set_string_custom_property("pushed_destination", pushed_destination)
        model_push.set_string_custom_property("pushed_version", pushed_version)

    def _MarkNotPushed(self, model_push) -> None:
        model_push.set_int_custom_property("pushed", 0)


class VersionedPusherExecutor(TfxPusherContract):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        pushed_model = artifact_utils.get_single_instance(output_dict["pushed_model"])
        check_run_parameters("Pusher", serving_parameters(exec_properties))
        folder = registry.versions_dir(
            exec_properties["serving_root"], exec_properties["model_name"]
        )
        selection = read_selection(artifact_utils.get_single_instance(input_dict["selection"]))
        blessing = artifact_utils.get_single_instance(input_dict["model_blessing"])
        verdict = read_verdict(blessing)
        outcome = {
            "time": _now(),
            "input_fingerprint": selection["fingerprint"],
            "spans": {str(n): s["fingerprint"] for n, s in selection["spans"].items()},
            "pushed_version": None,
        }
        if not self.CheckBlessing(input_dict):
            outcome["reason"] = "not blessed: " + ("; ".join(verdict["failures"]) or "see the "
                                                   "Evaluator's output")  # fmt: skip
            registry.record_trained(folder, selection["fingerprint"], outcome)
            self._MarkNotPushed(pushed_model, outcome)
            return
        # Another run may have pushed since this one's baseline was read (watch submits spans
        # side by side): a model never compared with what serves now must not replace it.
        baseline = artifact_utils.get_single_instance(input_dict["baseline_model"])
        compared_with = baseline.get_int_custom_property(BASELINE_VERSION_KEY)
        compared_with = None if compared_with == NO_BASELINE else compared_with
        model_name = exec_properties["model_name"]
        stable_now = serving_state.read(folder, model_name).stable
        if compared_with != stable_now:
            return self._not_released(folder, selection, pushed_model, outcome, (
                f"blessed against version {compared_with}, but version {stable_now} serves now "
                "(pushed by another run meanwhile): not pushed; run again with force=1 to "
                "compare with it"))  # fmt: skip
        model_path = self.GetModelPath(input_dict)
        # Built before a version number is claimed: a failure here publishes nothing.
        extra_files = self._extra_files(input_dict, exec_properties, model_path)
        version = registry.claim_version(folder)
        serving_path = push_version(model_path, folder, version, extra_files)
        record = self._record(input_dict, selection, verdict, outcome)
        registry.write_record(folder, version, record)
        policy = json.loads(exec_properties.get("release_policy") or '{"mode": "immediate"}')
        try:
            state = release.release_pushed(folder, model_name, version, compared_with, policy,
                                           why=f"blessed on span {selection['span']}")  # fmt: skip
        except serving_state.ConcurrentChange as e:
            # Its files go: a version no label names and no state loads is nothing to keep.
            storage.delete_files([storage.join(serving_path, "saved_model.pb")])
            storage.delete_tree(serving_path)
            return self._not_released(folder, selection, pushed_model, outcome, str(e))
        outcome["pushed_version"] = version
        outcome["labels"] = state.labels
        registry.record_trained(folder, selection["fingerprint"], outcome)
        _log.info("Version %d is %s now: %s (model config %s)", version,
                  "canary" if state.canary == version else "stable", state.describe(),
                  storage.join(folder, registry.MODEL_CONFIG_FILE))  # fmt: skip
        deleted = release.prune(folder, model_name, exec_properties["keep_versions"])
        if deleted:
            _log.info("Deleted versions %s (keep_versions=%d)", deleted,
                      exec_properties["keep_versions"])  # fmt: skip
        self._MarkPushed(pushed_model, pushed_destination=serving_path, pushed_version=str(version))
        _write_outcome(pushed_model, outcome)

    def _not_released(self, folder: str, selection: dict, pushed_model, outcome: dict,
                      reason: str) -> None:  # fmt: skip
        outcome["reason"] = reason
        _log.info("%s", reason)
        registry.record_trained(folder, selection["fingerprint"], outcome)
        self._MarkNotPushed(pushed_model, outcome)

    def _MarkNotPushed(self, model_push, outcome: dict) -> None:
        """TFX's mark, and why (the run report shows it)."""
        super()._MarkNotPushed(model_push)
        model_push.set_string_custom_property(NOT_PUSHED_REASON_KEY, outcome["reason"])
        _write_outcome(model_push, outcome)

    def _extra_files(self, input_dict, exec_properties, model_path: str) -> dict[str, bytes]:
        """TF Serving's warm-up requests from the eval split, and the TFLite edge model when
        `export_tflite` is 1."""
        # Here, not at the top: the model code it reads its signatures from imports TF Transform,
        # which a run whose model is not blessed never needs.
        from components.steps import warmup

        examples = artifact_utils.get_single_instance(input_dict["examples"])
        rows = warmup.eval_examples(examples.uri, exec_properties["label_key"])
        saved_model_pb = storage.read_bytes(storage.join(model_path, "saved_model.pb"))
        files = {warmup.WARMUP_PATH: warmup.warmup_records(exec_properties["model_name"],
                                                           saved_model_pb, rows)}  # fmt: skip
        if exec_properties.get("export_tflite"):
            from components.steps import edge

            with tempfile.TemporaryDirectory() as local:
                storage.copy_tree(model_path, local)
                quantization = exec_properties.get("tflite_quantization") or "none"
                files[EDGE_MODEL_PATH] = edge.export_tflite(local, quantization)
        return files

    def _record(self, input_dict, selection, verdict, outcome) -> dict:
        """What `tkp models show N` prints: where the version came from and how it scored."""
        model = artifact_utils.get_single_instance(input_dict["model"])
        baseline = artifact_utils.get_single_instance(input_dict["baseline_model"])
        baseline_version = baseline.get_int_custom_property(BASELINE_VERSION_KEY)
        return {
            "pushed_at": outcome["time"],
            "model_uri": model.uri,
            "data_root": selection.get("data_root"),
            "span": selection["span"],
            "spans": outcome["spans"],
            "input_fingerprint": selection["fingerprint"],
            "metrics": verdict["metrics"],
            # Not compared (the served model could not read this data): a new lineage starts
            # here, so the quality slide check never weighs indexes measured on other data.
            "baseline_version": (
                None
                if baseline_version == NO_BASELINE or verdict.get("not_compared")
                else baseline_version
            ),  # fmt: skip
            "not_compared": verdict.get("not_compared"),
            # What served when this version was pushed, compared with it or not.
            "replaced_version": None if baseline_version == NO_BASELINE else baseline_version,
            "auc_change": verdict["auc_change"],
            QUALITY_KEY: verdict[QUALITY_KEY],
            "code_version": code_version(),
            # What it was trained with, and the search those values came from (Tuner step).
            "hyperparameters": json.loads(
                model.get_string_custom_property(HYPERPARAMETERS_KEY) or "null"
            ),
            "search": json.loads(model.get_string_custom_property(SEARCH_KEY) or "null"),
        }


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def code_version() -> str:
    """The package version and a hash of the code and schema that shape a model."""
    root = Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    files = [*root.glob("components/**/*.py"), *root.glob("schemas/**/*.pbtxt")]
    for path in sorted(files):
        digest.update(str(path.relative_to(root)).encode() + path.read_bytes())
    try:
        version = importlib.metadata.version("tfx-kubeflow-pipeline")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{digest.hexdigest()[:12]}"


class VersionedPusherSpec(types.ComponentSpec):
    PARAMETERS = {
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
        "keep_versions": component_spec.ExecutionParameter(type=int),
        # PipelineConfig.release_policy() as JSON: how the version is released and judged.
        "release_policy": component_spec.ExecutionParameter(type=str, optional=True),
        "export_tflite": component_spec.ExecutionParameter(type=int),
        "tflite_quantization": component_spec.ExecutionParameter(type=str, optional=True),
        # The use case's label column, dropped from the warm-up requests' rows.
        "label_key": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {
        "examples": component_spec.ChannelParameter(type=standard_artifacts.Examples),
        "model": component_spec.ChannelParameter(type=standard_artifacts.Model),
        "model_blessing": component_spec.ChannelParameter(type=standard_artifacts.ModelBlessing),
        "baseline_model": component_spec.ChannelParameter(type=standard_artifacts.Model),
        "selection": component_spec.ChannelParameter(type=SpanSelection),
    }
    OUTPUTS = {"pushed_model": component_spec.ChannelParameter(type=standard_artifacts.PushedModel)}


class VersionedPusher(base_component.BaseComponent):
    SPEC_CLASS = VersionedPusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VersionedPusherExecutor)

    def __init__(
        self,
        model: types.BaseChannel,
        model_blessing: types.BaseChannel,
        baseline_model: types.BaseChannel,
        selection: types.BaseChannel,
        examples: types.BaseChannel,
        serving_root: str | Any,
        model_name: str | Any,
        keep_versions: int,
        label_key: str,
        release_policy: str = '{"mode": "immediate"}',
        export_tflite: int = 0,
        tflite_quantization: str = "none",
    ):
        super().__init__(
            spec=VersionedPusherSpec(
                examples=examples,
                label_key=label_key,
                export_tflite=export_tflite,
                tflite_quantization=tflite_quantization,
                model=model,
                model_blessing=model_blessing,
                baseline_model=baseline_model,
                selection=selection,
                serving_root=serving_root,
                model_name=model_name,
                keep_versions=keep_versions,
                release_policy=release_policy,
                pushed_model=types.Channel(type=standard_artifacts.PushedModel),
            )
        )
