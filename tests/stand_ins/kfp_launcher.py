"""One task's pod as the KFP backend makes it, and the launcher that runs inside it.

Part of the launcher-contract harness (`tests/stand_ins/kfp_harness.py`). Every rule names the file
of kubeflow/pipelines at tag 2.5.0 (backend/src/v2/...) that it follows; what later versions
change is switched by kfp_versions.py. The pod's "/" is a fresh
folder per task (`Pod.root`), told to the container through KFP_LOCAL_ARTIFACT_ROOT: the one thing
that differs from a real pod, where the launcher's paths are literally /s3, /gcs, /minio.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

from components.base import storage
from components.base.object_store import s3_client
from pipelines.kubeflow import images
from tests.stand_ins.kfp_versions import NEWEST, KfpBackend

# component/launcher_v2.go OutputMetadataFilepath.
OUTPUT_METADATA_FILE = "/tmp/kfp_outputs/output_metadata.json"
# driver/driver.go provisionOutputs adds this output when publish_logs is "true", which is the
# default of cmd/driver/main.go and what the standard manifests set (PUBLISH_LOGS).
EXECUTOR_LOGS = "executor-logs"
# component/launcher_v2.go LocalPathForURI.
_LOCAL_FOLDERS = {"gs://": "gcs", "minio://": "minio", "s3://": "s3"}
# What a Docker/OCI image has on PATH before its Dockerfile changes it.
# The image's virtual environment; the harness stands this project's .venv in for it.
IMAGE_VENV = "/opt/venv"
OOM_KILLED = 137
# The pod's emptyDir volumes (compiler/argocompiler/container.go): the launcher's artifact
# folders and the folders a non-root user's tools write to.
EMPTY_DIRS = ("s3", "gcs", "minio", ".local", ".cache", ".config")


class TaskFailed(RuntimeError):
    """The task's container failed (or was killed); the run fails with it."""


def local_path(uri: str, root: Path) -> Path | None:
    """component/launcher_v2.go LocalPathForURI, rooted at the pod's "/"."""
    for prefix, folder in _LOCAL_FOLDERS.items():
        if uri.startswith(prefix):
            return root / folder / uri[len(prefix) :]
    return None


def image_environment(dockerfile: Path) -> dict[str, str]:
    return images.dockerfile_env(dockerfile)


def pod_environment(container_env: dict[str, str], secret_env: dict[str, str]) -> dict[str, str]:
    """What the pod's container gets on top of its image's ENV."""
    name = f"pod-{uuid.uuid4().hex[:10]}"
    return {
        **container_env,  # the spec's container.env (driver.go initPodSpecPatch)
        **secret_env,  # platform spec secretAsEnv (driver.go extendPodSpecPatch)
        # compiler/argocompiler/common.go: commonEnvs and the metadata-grpc-configmap envFrom
        # (manifests/kustomize/base/metadata/base/metadata-grpc-configmap.yaml).
        "KFP_POD_NAME": name,
        "KFP_POD_UID": str(uuid.uuid4()),
        "METADATA_GRPC_SERVICE_HOST": "metadata-grpc-service",
        "METADATA_GRPC_SERVICE_PORT": "8080",
        "HOSTNAME": name,
    }


@dataclass
class Pod:
    """A task's pod: a fresh root (empty /s3, /gcs, /minio emptyDir volumes,
    compiler/argocompiler/container.go; /tmp is the container's own file system, also new per
    pod), and only the environment Kubernetes gives it."""

    root: Path
    environment: dict[str, str]
    memory_limit_bytes: float | None

    @classmethod
    def create(
        cls,
        root: Path,
        image_env: dict[str, str],
        container_env: dict[str, str],
        secret_env: dict[str, str],
        memory_limit_gb: float | None,
    ) -> Pod:
        for folder in (*EMPTY_DIRS, "tmp"):
            (root / folder).mkdir(parents=True)
        environment = {}
        for key, value in image_env.items():
            # The image's venv is this project's .venv here; absolute paths live under the root.
            value = value.replace(IMAGE_VENV, sys.prefix)
            if key == "HOME":
                (root / value.lstrip("/")).mkdir(parents=True, exist_ok=True)
                value = str(root / value.lstrip("/"))
            environment[key] = value
        environment.update(pod_environment(container_env, secret_env))
        environment.update(
            TMPDIR=str(root / "tmp"),  # harness only: the pod's own /tmp
            KFP_LOCAL_ARTIFACT_ROOT=str(root),  # harness only: where the pod's "/" is
        )
        # driver.go getPodResource (from initPodSpecPatch): memoryLimit renders as "%vG", a
        # decimal quantity.
        limit = memory_limit_gb * 1e9 if memory_limit_gb else None
        return cls(root, environment, limit)

    def path(self, absolute: str) -> Path:
        return self.root / absolute.lstrip("/")

    def step_path(self, absolute: str) -> str:
        """A launcher path as the step sees it: under its root here (KFP_LOCAL_ARTIFACT_ROOT)."""
        return str(self.path(absolute))

    def run(self, command: list[str], log_path: Path, cwd: Path, kill_when=None) -> int:
        """Runs the container's process; kills it (exit 137, as the kernel's OOM killer does to a
        container over its cgroup limit) when the RSS of its process tree exceeds the limit, and
        with SIGKILL once `kill_when()` is true (a process killed mid-step, by a test)."""
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                command, env=self.environment, cwd=cwd, stdout=log, stderr=subprocess.STDOUT
            )
            watched = psutil.Process(process.pid)
            while process.poll() is None:
                if self.memory_limit_bytes and _tree_rss(watched) > self.memory_limit_bytes:
                    _kill_tree(watched, process)
                    log.write(f"\nOOMKilled: over {self.memory_limit_bytes:.0f} bytes\n".encode())
                    return OOM_KILLED
                if kill_when is not None and kill_when():
                    _kill_tree(watched, process)
                    log.write(b"\nKilled: SIGKILL (interrupted by the test)\n")
                    return process.returncode
                time.sleep(0.1)
            return process.returncode


def _kill_tree(watched: psutil.Process, process: subprocess.Popen) -> None:
    for member in watched.children(recursive=True) + [watched]:
        try:
            member.kill()
        except psutil.NoSuchProcess:
            pass
    process.wait()


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    for member in [process, *process.children(recursive=True)]:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def _keys_under(uri: str):
    """(client, bucket, key prefix, object keys): every object whose key starts with the URI's
    key, a string prefix as the launcher lists it."""
    bucket, prefix = storage.split_s3(uri)
    client = s3_client()
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return client, bucket, prefix, keys


def download(uri: str, destination: Path, exact_prefix: bool = False) -> None:
    """objectstore/object_store.go DownloadBlob: every object under the URI's key, to its
    relative path; a prefix with no objects downloads nothing. Until 2.17.0 "under" is a string
    prefix (`.../model` also takes `.../model-2/x`); 2.17.0 takes the key itself and `<key>/...`
    only (kfp_versions.py download_exact_prefix)."""
    client, bucket, prefix, keys = _keys_under(uri)
    if exact_prefix:
        keys = [key for key in keys if key == prefix or key.startswith(prefix.rstrip("/") + "/")]
    for key in keys:
        relative = os.path.relpath(key, prefix)
        target = destination if relative == "." else destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        client.download_file(bucket, key, str(target))


def delete_prefix(uri: str) -> int:
    """Deletes every object under the URI's key; returns how many."""
    client, bucket, _, keys = _keys_under(uri)
    for key in keys:
        client.delete_object(Bucket=bucket, Key=key)
    return len(keys)


def upload(source: Path, uri: str) -> None:
    """objectstore/object_store.go UploadBlob: a file to the URI's key, a folder file by file;
    component/launcher_v2.go uploadOutputArtifacts: a missing local path is only a warning."""
    bucket, key = storage.split_s3(uri)
    client = s3_client()
    if source.is_file():
        client.upload_file(str(source), bucket, key)
        return
    for path in sorted(source.rglob("*")) if source.is_dir() else []:
        if path.is_file():
            client.upload_file(str(path), bucket, f"{key}/{path.relative_to(source).as_posix()}")


def launch(
    pod: Pod,
    executor_input: dict,
    component: dict,
    container: dict,
    run_root: str,
    log_path: Path,
    cwd: Path,
    kill_when=None,
    attempt: int = 0,
    output_file: str = OUTPUT_METADATA_FILE,
    version: KfpBackend = NEWEST,
) -> dict[str, dict]:
    """component/launcher_v2.go executeV2 and execute, for one task: returns output key ->
    runtime artifact (URI and metadata as merged), after uploading each output. Nothing is
    uploaded for a step that fails, except (2.16+) its log file. `output_file` is the
    ExecutorOutput's path as the launcher knows it (kfp_versions.py output_file_in_task_root)."""
    outputs = executor_input["outputs"]
    if version.executor_logs_per_retry and EXECUTOR_LOGS in outputs.get("artifacts", {}):
        # qualifyExecutorLogsURI: `-<retry index>` once on the URI, before anything else.
        executor_input = json.loads(json.dumps(executor_input))
        outputs = executor_input["outputs"]
        logs = outputs["artifacts"][EXECUTOR_LOGS]["artifacts"][0]
        logs["uri"] = f"{logs['uri']}-{attempt}"
    # addDefaultParams: component input defaults fill parameters the driver left out.
    resolved = json.loads(json.dumps(executor_input))
    parameters = resolved["inputs"].setdefault("parameterValues", {})
    for name, definition in component.get("inputDefinitions", {}).get("parameters", {}).items():
        if name not in parameters and "defaultValue" in definition:
            parameters[name] = definition["defaultValue"]
    # getPlaceholders: {{$}} is the ExecutorInput as JSON (the harness emulates no other).
    placeholder = json.dumps(resolved)
    command = container.get("command", []) + container.get("args", [])
    command = [part.replace("{{$}}", placeholder) for part in command]

    for listed in executor_input["inputs"].get("artifacts", {}).values():  # downloadArtifacts
        artifact = listed["artifacts"][0]
        path = local_path(artifact["uri"], pod.root)
        if path is not None:
            download(artifact["uri"], path, version.download_exact_prefix)
    for listed in outputs.get("artifacts", {}).values():  # prepareOutputFolders: parents
        local_path(listed["artifacts"][0]["uri"], pod.root).parent.mkdir(
            parents=True, exist_ok=True
        )
    if EXECUTOR_LOGS in outputs.get("artifacts", {}):
        # getLogWriter: os.Create at the log artifact's local path; stdout and stderr go there.
        log_file = local_path(outputs["artifacts"][EXECUTOR_LOGS]["artifacts"][0]["uri"], pod.root)
        log_file.touch()
    else:
        log_file = pod.path("/tmp/harness-task.log")

    returncode = pod.run(command, log_file, cwd, kill_when)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab" if attempt else "wb") as log:  # every attempt's log, in order
        log.write(f"--- attempt {attempt + 1} ---\n".encode() if attempt else b"")
        log.write(log_file.read_bytes())
    if returncode != 0:
        if version.executor_logs_per_retry and EXECUTOR_LOGS in outputs.get("artifacts", {}):
            upload(log_file, outputs["artifacts"][EXECUTOR_LOGS]["artifacts"][0]["uri"])
        tail = log_path.read_text(errors="replace")[-4000:]
        raise TaskFailed(f"exited {returncode}; log {log_path}:\n{tail}")

    # getExecutorOutputFile: a missing file is an empty ExecutorOutput.
    written = pod.path(output_file)
    reported = {}
    if written.exists():
        reported = json.loads(written.read_text()).get("artifacts", {})
    results = {}
    for name, listed in outputs.get("artifacts", {}).items():  # uploadOutputArtifacts
        artifact = dict(listed["artifacts"][0])
        artifact["metadata"] = dict(artifact.get("metadata") or {})
        mine = (reported.get(name, {}).get("artifacts") or [{}])[0]
        if name == EXECUTOR_LOGS and version.executor_logs_per_retry:
            mine = {}  # 2.16.1+: what the step reports for the log is ignored
        if mine.get("uri"):  # mergeRuntimeArtifacts: the step's URI wins, metadata merges
            artifact["uri"] = mine["uri"]
        artifact["metadata"].update(mine.get("metadata") or {})
        path = local_path(artifact["uri"], pod.root)
        if path is not None:  # an unrecognised scheme (a local path) is skipped with a warning
            # objectstore/config.go KeyFromURI: the bucket and prefix are the run's root.
            if not artifact["uri"].startswith(run_root):
                raise TaskFailed(
                    f"failed to upload output artifact {name!r}: URI {artifact['uri']} does not "
                    f"have expected bucket prefix {run_root}"
                )
            upload(path, artifact["uri"])
        results[name] = artifact
    return results
