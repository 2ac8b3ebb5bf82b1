"""Where the Kubeflow Pipelines v2 launcher puts its local copies of artifacts, and back.

The launcher downloads each input artifact from the pipeline root to a local path (`s3://b/k` to
`/s3/b/k`, `gs://` to `/gcs/`, `minio://` to `/minio/`) and uploads outputs from there. The step
container's entry point (pipelines/kubeflow/kfp_entrypoint.py) and the Trainer's cluster job
(components/training/cluster_job.py) both map between the two.
"""

from __future__ import annotations

import os

# Where the launcher mounts its local copies; "/" on Kubeflow. Overridable for a test harness that
# plays the launcher without root access to /s3.
LOCAL_ROOT_ENV = "KFP_LOCAL_ARTIFACT_ROOT"
SCHEME_FOLDERS = {"s3://": "s3", "gs://": "gcs", "minio://": "minio"}
# Set for the step: `<pipeline root>/<pipeline name>` of the run as it actually runs (the root
# may differ from the compiled one). The Trainer keeps its backups there
# (components/steps/trainer.py).
PIPELINE_FOLDER_ENV = "KFP_PIPELINE_FOLDER"


def local_path(uri: str, local_root: str | None = None) -> str | None:
    """The launcher's local path for a remote URI, or None for a URI it does not stage."""
    root = local_root or os.environ.get(LOCAL_ROOT_ENV, "/")
    for prefix, folder in SCHEME_FOLDERS.items():
        if uri.startswith(prefix):
            return os.path.join(root, folder, uri[len(prefix) :])
    return None


def remote_uri(path: str, local_root: str | None = None) -> str | None:
    """The remote URI of a launcher's local copy (the inverse of local_path), or None."""
    root = local_root or os.environ.get(LOCAL_ROOT_ENV, "/")
    for prefix, folder in SCHEME_FOLDERS.items():
        base = os.path.join(root, folder, "")
        if path.startswith(base):
            return prefix + path[len(base) :]
    return None
