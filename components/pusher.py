"""Pusher that writes numbered versions (1, 2, 3, ...) for TF Serving and never overwrites one.

Stock Pusher names versions by Unix time, which two pushes in one second share, writes through
TensorFlow's gfile, which cannot reach SeaweedFS reliably (README.md, "Object storage notes"),
and takes its destination inside a proto that Kubeflow users could not set per run.
"""

from __future__ import annotations

import logging
from typing import Any

from tfx import types
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts

from components.baseline import serving_model_dir, serving_parameters
from pipelines import storage
from pipelines.config import check_run_parameters

_log = logging.getLogger(__name__)


def push_version(model_path: str, versions_dir: str, version: int) -> str:
    """Copies the model under `model_path` to `<versions_dir>/<version>/`; returns that folder.

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
    # saved_model.pb last: TF Serving treats a version as ready once it is there.
    count = storage.copy_tree(model_path, serving_path, last="saved_model.pb")
    _log.info("Pushed version %d (%d files) to %s", version, count, serving_path)
    return serving_path


class VersionedPusherExecutor(pusher_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        pushed_model = artifact_utils.get_single_instance(output_dict["pushed_model"])
        check_run_parameters("Pusher", serving_parameters(exec_properties))
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(pushed_model)
            return
        model_path = self.GetModelPath(input_dict)
        versions_dir = serving_model_dir(
            exec_properties["serving_root"], exec_properties["model_name"]
        )
        # Half-written versions (no saved_model.pb yet) count too: their number is never reused.
        version = max(storage.numbered_children(versions_dir), default=0) + 1
        serving_path = push_version(model_path, versions_dir, version)
        self._MarkPushed(pushed_model, pushed_destination=serving_path, pushed_version=str(version))


class VersionedPusherSpec(types.ComponentSpec):
    PARAMETERS = {
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {
        "model": component_spec.ChannelParameter(type=standard_artifacts.Model),
        "model_blessing": component_spec.ChannelParameter(type=standard_artifacts.ModelBlessing),
    }
    OUTPUTS = {"pushed_model": component_spec.ChannelParameter(type=standard_artifacts.PushedModel)}


class VersionedPusher(base_component.BaseComponent):
    SPEC_CLASS = VersionedPusherSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VersionedPusherExecutor)

    def __init__(
        self,
        model: types.BaseChannel,
        model_blessing: types.BaseChannel,
        serving_root: str | Any,
        model_name: str | Any,
    ):
        super().__init__(
            spec=VersionedPusherSpec(
                model=model,
                model_blessing=model_blessing,
                serving_root=serving_root,
                model_name=model_name,
                pushed_model=types.Channel(type=standard_artifacts.PushedModel),
            )
        )
