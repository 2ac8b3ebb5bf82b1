"""Pusher that writes numbered versions (1, 2, 3, ...) for TF Serving and never overwrites one.

Stock Pusher names versions by Unix time, which two pushes in one second share, and writes through
TensorFlow's gfile, which cannot reach SeaweedFS reliably (STACK.md).
"""

from __future__ import annotations

import logging

from tfx.components import Pusher
from tfx.components.pusher import executor as pusher_executor
from tfx.dsl.components.base import executor_spec
from tfx.proto import pusher_pb2
from tfx.types import artifact_utils
from tfx.utils import proto_utils

from pipelines import storage

_log = logging.getLogger(__name__)


class VersionedPusherExecutor(pusher_executor.Executor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        pushed_model = artifact_utils.get_single_instance(output_dict["pushed_model"])
        if not self.CheckBlessing(input_dict):
            self._MarkNotPushed(pushed_model)
            return
        model_path = self.GetModelPath(input_dict)
        destination = pusher_pb2.PushDestination()
        proto_utils.json_to_proto(exec_properties["push_destination"], destination)
        serving_model_dir = destination.filesystem.base_directory
        # Half-written versions (no saved_model.pb yet) count too: their number is never reused.
        version = max(storage.numbered_children(serving_model_dir), default=0) + 1
        serving_path = storage.join(serving_model_dir, str(version))
        if storage.list_files(serving_path + "/**"):
            raise FileExistsError(
                f"{serving_path} already exists; refusing to overwrite a served version"
            )
        # saved_model.pb last: TF Serving treats a version as ready once it is there.
        count = storage.copy_tree(model_path, serving_path, last="saved_model.pb")
        _log.info("Pushed version %d (%d files) to %s", version, count, serving_path)
        self._MarkPushed(pushed_model, pushed_destination=serving_path, pushed_version=str(version))


class VersionedPusher(Pusher):
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(VersionedPusherExecutor)
