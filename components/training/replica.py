"""Entry point of a multi-worker Trainer's replica (components/training/cluster_job.py): python -m
components.training.replica JOB_URI

A TFJob's replicas get TF_CONFIG from the Training Operator; a TrainJob's build it from
TFX_REPLICA_HOSTS and JOB_COMPLETION_INDEX (components/training/trainjob.py). The replica
downloads the Trainer's inputs from the object store (boto3 through components.base.storage:
TensorFlow's `s3://` client is not reliable against S3-compatible stores) into local scratch
space, runs the same executor and run_fn as every other Trainer, and, on the chief only, uploads
the model and model_run to the staging URIs the job names; the other replicas' copies are
discarded.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

_log = logging.getLogger("components.training.replica")


def tf_config(environ) -> str:
    """TF_CONFIG as given (a TFJob's), or built for a TrainJob's replica: index 0 is the chief,
    index i > 0 worker i - 1 (the roles a TFJob's Chief and Workers have)."""
    from components.training.trainjob import HOSTS_ENV

    if environ.get("TF_CONFIG"):
        return environ["TF_CONFIG"]
    if not (environ.get(HOSTS_ENV) and environ.get("JOB_COMPLETION_INDEX")):
        raise SystemExit(f"A replica needs TF_CONFIG, or {HOSTS_ENV} and JOB_COMPLETION_INDEX "
                         "(a TrainJob's Indexed Job sets the index): neither is set")  # fmt: skip
    hosts = environ[HOSTS_ENV].split(",")
    index = int(environ["JOB_COMPLETION_INDEX"])
    if not 0 <= index < len(hosts):
        raise SystemExit(f"JOB_COMPLETION_INDEX {index} is not one of the {len(hosts)} replicas "
                         f"in {HOSTS_ENV}")  # fmt: skip
    cluster = {"chief": hosts[:1], **({"worker": hosts[1:]} if len(hosts) > 1 else {})}
    task = {"type": "chief", "index": 0} if index == 0 else {"type": "worker", "index": index - 1}
    return json.dumps({"cluster": cluster, "task": task, "environment": "cloud"})


def download_inputs(inputs: dict, folder: Path) -> int:
    """Copies each input artifact that is on an object store into `folder` (boto3 through
    components.base.storage, never TensorFlow's `s3://`) and points it there; returns how many
    files were copied."""
    from components.base import storage

    files = 0
    for key, artifacts in inputs.items():
        for index, artifact in enumerate(artifacts):
            if "://" not in artifact.uri:
                continue
            local = str(folder / key / str(index))
            files += storage.copy_tree(artifact.uri, local)
            artifact.uri = local
    return files


def main(job_uri: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)  # a line per feature per dataset
    from components.base import storage
    from components.training import heartbeat

    os.environ["TF_CONFIG"] = tf_config(os.environ)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    is_chief = task["type"] == "chief"
    job = json.loads(storage.read_bytes(job_uri))
    if "heartbeat" in job:  # stop when the step that waits for this job is gone
        heartbeat.watch(job["heartbeat"]["uri"], float(job["heartbeat"]["timeout_seconds"]))
    # TFX and TensorFlow after the watch: their imports take tens of seconds on a busy node,
    # during which a replica of a step already gone would otherwise not look.
    from tfx.types import artifact_utils

    from components.training.local_workers import run_executor

    work = Path(tempfile.mkdtemp(prefix="replica-"))
    try:
        started = time.monotonic()
        inputs = artifact_utils.parse_artifact_dict(job["inputs"])
        files = download_inputs(inputs, work / "inputs")
        _log.info("Replica %s-%s: downloaded %d input files in %.1f s", task["type"],
                  task["index"], files, time.monotonic() - started)  # fmt: skip
        outputs = artifact_utils.parse_artifact_dict(job["outputs"])
        staging_of: dict[str, str] = {}
        for key, artifacts in outputs.items():
            for index, artifact in enumerate(artifacts):
                local = str(work / "outputs" / key / str(index))
                os.makedirs(local)
                staging_of[local], artifact.uri = artifact.uri, local
        run_executor(inputs, outputs, job["exec_properties"])
        if is_chief:
            for local, staging in staging_of.items():
                storage.copy_tree(local, staging)
            _log.info("Chief: uploaded the model and model_run for the step")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
