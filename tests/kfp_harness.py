"""Plays the open-source Kubeflow Pipelines v2 backend (2.5) for a compiled spec, without a cluster.

A test of the compiled artifact, not an orchestrator. It does what the backend's driver and
launcher do for each task (kubeflow/pipelines backend/src/v2: driver.go provisionOutputs and
resolveInputs, component/launcher_v2.go), and nothing more:
- refuses what the backend cannot run: resolver executors, `lifecycle.preCacheCheck` hooks (never
  executed there), `runtimeValue.constantValue`, root parameters with neither value nor default;
- builds each task's ExecutorInput: parameter values from the run's values or defaults and from
  constants; input artifacts from the producers' executor outputs, as the driver passes them
  (name = an artifact id, type with an empty instanceSchema, uri, metadata); output URIs
  `<pipeline_root>/<pipeline>/<run id>/<task>/<uuid>/<output key>`; the output metadata file;
- stages artifacts as the launcher does: downloads inputs to their local paths (/s3/bucket/key,
  rooted at `local_root` instead of / here), runs exactly the container's command and args with
  `{{$}}` replaced, in its own OS process, then merges the step's ExecutorOutput (its uri wins,
  metadata keys merge) and uploads the outputs from their local paths.
The container's Python is this project's virtual environment (first on PATH).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from pipelines import storage
from pipelines.kfp_entrypoint import local_path


class UnsupportedByKubeflow(AssertionError):
    """The spec uses something open-source Kubeflow Pipelines 2.5 cannot run."""


def load_strictly(spec: dict) -> pipeline_spec_pb2.PipelineSpec:
    """As the KFP client does before upload: unknown fields are errors."""
    return json_format.ParseDict(
        spec, pipeline_spec_pb2.PipelineSpec(), ignore_unknown_fields=False
    )


def check_supported(spec: dict, parameter_values: dict) -> None:
    for label, executor in spec["deploymentSpec"]["executors"].items():
        if "resolver" in executor:
            raise UnsupportedByKubeflow(f"{label}: resolver executors are not implemented")
        if "container" not in executor and "importer" not in executor:
            raise UnsupportedByKubeflow(f"{label}: only container and importer executors run")
        if "lifecycle" in executor.get("container", {}):
            raise UnsupportedByKubeflow(f"{label}: lifecycle hooks (preCacheCheck) are never run")
    for name, parameter in spec["root"]["inputDefinitions"].get("parameters", {}).items():
        if name not in parameter_values and "defaultValue" not in parameter:
            if not parameter.get("isOptional"):
                raise UnsupportedByKubeflow(f"parameter {name} has neither value nor default")
    for task_name, task in spec["root"]["dag"]["tasks"].items():
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if "constantValue" in source.get("runtimeValue", {}):
                raise UnsupportedByKubeflow(f"{task_name}.{name}: runtimeValue.constantValue")


def _topological(tasks: dict) -> list[str]:
    order, done = [], set()
    while len(order) < len(tasks):
        ready = sorted(n for n, t in tasks.items()
                       if n not in done and set(t.get("dependentTasks", [])) <= done)  # fmt: skip
        if not ready:
            raise UnsupportedByKubeflow(f"cycle among {sorted(set(tasks) - done)}")
        order.extend(ready)
        done.update(ready)
    return order


def launcher_download(uri: str, path: str) -> None:
    """The launcher's recursive download by prefix (a single object maps to the path itself)."""
    prefix = uri.rstrip("/")
    storage.copy_tree(prefix, path)
    if storage.list_files(prefix) == [prefix]:
        storage.write_bytes(path, storage.read_bytes(prefix))


def launcher_upload(path: str, uri: str) -> None:
    """The launcher's recursive upload; a missing local path uploads nothing."""
    if os.path.isfile(path):
        storage.write_bytes(uri, Path(path).read_bytes())
    elif os.path.isdir(path):
        storage.copy_tree(path, uri)


def run(
    spec: dict,
    parameter_values: dict,
    pipeline_root: str,
    local_root: Path,
    log_dir: Path,
) -> dict[str, dict[str, dict]]:
    """Runs every task; returns task -> output key -> RuntimeArtifact dict as recorded."""
    load_strictly(spec)
    check_supported(spec, parameter_values)
    root_parameters = {
        name: parameter_values.get(name, parameter.get("defaultValue"))
        for name, parameter in spec["root"]["inputDefinitions"].get("parameters", {}).items()
    }
    run_id = uuid.uuid4().hex
    pipeline_name = spec["pipelineInfo"]["name"]
    tasks = spec["root"]["dag"]["tasks"]
    recorded: dict[str, dict[str, dict]] = {}
    artifact_ids = iter(range(1, 10_000))
    environment = dict(os.environ, KFP_LOCAL_ARTIFACT_ROOT=str(local_root))
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"

    for task_name in _topological(tasks):
        task = tasks[task_name]
        component = spec["components"][task["componentRef"]["name"]]
        executor = spec["deploymentSpec"]["executors"][component["executorLabel"]]
        if "importer" in executor:
            raise UnsupportedByKubeflow(f"{task_name}: importer tasks are not exercised here")
        inputs = {"parameterValues": {}, "artifacts": {}}
        for name, source in task.get("inputs", {}).get("parameters", {}).items():
            if "componentInputParameter" in source:
                inputs["parameterValues"][name] = root_parameters[source["componentInputParameter"]]
            elif "constant" in source.get("runtimeValue", {}):
                inputs["parameterValues"][name] = source["runtimeValue"]["constant"]
            else:
                raise UnsupportedByKubeflow(f"{task_name}.{name}: parameter source {source}")
        for name, source in task.get("inputs", {}).get("artifacts", {}).items():
            producer = source["taskOutputArtifact"]
            artifact = recorded[producer["producerTask"]][producer["outputArtifactKey"]]
            inputs["artifacts"][name] = {"artifacts": [artifact]}
            launcher_download(artifact["uri"], local_path(artifact["uri"], str(local_root)))
        outputs = {"artifacts": {}, "outputFile": str(log_dir / task_name / "output_metadata.json")}
        for key, definition in component.get("outputDefinitions", {}).get("artifacts", {}).items():
            uri = f"{pipeline_root}/{pipeline_name}/{run_id}/{task_name}/{uuid.uuid4()}/{key}"
            outputs["artifacts"][key] = {
                "artifacts": [{"name": "", "type": definition["artifactType"], "uri": uri}]
            }
        executor_input = json.dumps({"inputs": inputs, "outputs": outputs})

        container = executor["container"]
        command = container["command"] + [
            a.replace("{{$}}", executor_input) for a in container["args"]
        ]
        if any("{{$" in part for part in command):
            raise UnsupportedByKubeflow(f"{task_name}: a placeholder other than {{{{$}}}}")
        (log_dir / task_name).mkdir(parents=True, exist_ok=True)
        with open(log_dir / task_name / "log.txt", "w") as log:
            result = subprocess.run(command, env=environment, stdout=log, stderr=subprocess.STDOUT)
        if result.returncode != 0:
            tail = (log_dir / task_name / "log.txt").read_text()[-3000:]
            raise RuntimeError(f"task {task_name} exited {result.returncode}:\n{tail}")

        reported = {}
        if Path(outputs["outputFile"]).exists():
            reported = json.loads(Path(outputs["outputFile"]).read_text()).get("artifacts", {})
        recorded[task_name] = {}
        for key, slot in outputs["artifacts"].items():
            artifact = dict(slot["artifacts"][0], metadata={})
            mine = reported.get(key, {}).get("artifacts", [{}])[0]
            artifact["uri"] = mine.get("uri") or artifact["uri"]  # mergeRuntimeArtifacts
            artifact["metadata"].update(mine.get("metadata", {}))
            path = local_path(artifact["uri"], str(local_root))
            if path is None:
                raise UnsupportedByKubeflow(f"{task_name}.{key}: output URI {artifact['uri']}")
            launcher_upload(path, artifact["uri"])
            # What the next task's driver passes on: an id for a name, an empty instance schema.
            recorded[task_name][key] = {
                "name": str(next(artifact_ids)),
                "type": {"instanceSchema": ""},
                "uri": artifact["uri"],
                "metadata": artifact["metadata"],
            }
    return recorded
