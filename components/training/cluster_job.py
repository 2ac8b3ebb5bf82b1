"""Multi-worker training on Kubeflow: the Trainer step runs its training as a job of replicas.

The step's pod (a light CPU pod) creates a job whose replicas run `components.training.replica`
in the Trainer's image, with its GPU resources, node selector and tolerations: a Kubeflow
Trainer v2 TrainJob (components/training/trainjob.py, the default) or a Training Operator v1
TFJob (components/training/tfjob.py, for clusters that still run it). What this module does is
the same for both:

- the replicas cannot see the step's local artifact copies: they read the inputs from the object
  store and the chief uploads the model and model_run to a staging folder there (boto3 through
  components.base.storage, never TensorFlow's `s3://`); the step then copies them into its output
  artifacts' local paths, which the launcher uploads as it does for any step;
- the job is created with `fieldValidation=Strict`: the API server's default (Warn,
  k8s.io/apiserver pkg/endpoints/handlers/rest.go fieldValidation) drops a field it does not know
  and accepts the job, so a misspelled `resources` would silently drop the GPU limits;
- the wait has timeouts of its own: replicas that have not all started within
  `replica_start_timeout_minutes` (a GPU nobody has, a missing Secret) fail the step naming each
  waiting pod and why it waits; a job still unfinished past its deadline plus a margin (an
  operator that does not run) fails it naming the job;
- a failed replica fails the step with its exit and last log lines; the Trainer task's
  retryPolicy then runs the step again, and its new job resumes from the training's backup
  (components/training/checkpoints.py);
- a job is not left behind: the step deletes it on every exit it sees (SIGTERM, when the step
  outlives the launcher long enough); a step killed outright cannot, so its replicas stop once
  its heartbeat stops (components/training/heartbeat.py), each attempt first deletes the jobs
  of the step's earlier attempts (STEP_LABEL), and the owner reference to the step's pod has
  Kubernetes delete the job once that pod is deleted.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from components.base import storage
from components.training import checkpoints, kube_client, local_workers, replica_pods
from components.training.heartbeat import Heartbeat
from components.training.job_kind import STEP_LABEL, JobKind, TrainingJobFailed
from components.training.kube_client import Kubernetes

STAGING_FOLDER = "_training_jobs"  # under <pipeline root>/<pipeline name>/
REPLICA_MODULE = "components.training.replica"
FINISH_MARGIN_SECONDS = 300  # past the job's own deadline, the operator should have ended it
HEARTBEAT_SECONDS = 60  # how often the waiting step rewrites its heartbeat
HEARTBEAT_TIMEOUT_SECONDS = 900  # replicas stop once it has not changed for this long

_log = logging.getLogger(__name__)


def job_name(pod_uid: str) -> str:
    """One job per step attempt (a retry is a new pod, so a new UID). Short enough that the
    controllers' pod and service names stay DNS-1123 labels."""
    return "trainer-" + hashlib.sha256(pod_uid.encode()).hexdigest()[:12]


def pod_owner() -> dict | None:
    """An owner reference to the step's pod (KFP gives every step KFP_POD_NAME and KFP_POD_UID,
    backend/src/v2/compiler/argocompiler/common.go). No blockOwnerDeletion: the
    OwnerReferencesPermissionEnforcement admission plugin would then ask for permission to update
    the pod's finalizers, more RBAC than creating jobs."""
    name, uid = os.environ.get("KFP_POD_NAME"), os.environ.get("KFP_POD_UID")
    if not (name and uid):
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def deadline_seconds(max_train_minutes: float, start_timeout_minutes: float) -> int:
    """A backstop only: run_fn stops training on its budget, which starts when a replica does.
    The controllers count the deadline from the job's creation (Trainer v2.2
    trainjob_controller.go reconcileDeadline), so the time replicas may wait to start comes on
    top, and set-up, data download and export a quarter of the budget, at least 30 minutes."""
    budget = max_train_minutes * 60
    return int(start_timeout_minutes * 60 + budget + max(1800, budget / 4))


def replica_command(job_uri: str) -> list[str]:
    return ["python", "-m", REPLICA_MODULE, job_uri]


def run(
    kind: JobKind, input_dict, output_dict, exec_properties: dict, workers: int,
    poll_seconds: float = 5.0, kubernetes: Kubernetes | None = None,
) -> None:  # fmt: skip
    """Trains as a job of `workers` replicas, waits for it, and puts the chief's model and
    model_run into the step's output artifacts (their local paths, which the launcher uploads)."""
    from tfx.types import artifact_utils

    from components.base.launcher_paths import PIPELINE_FOLDER_ENV

    custom_config = json.loads(exec_properties["custom_config"])
    settings = custom_config["cluster_job"]
    name = job_name(os.environ.get("KFP_POD_UID") or os.urandom(8).hex())
    staging_root = storage.join(os.environ[PIPELINE_FOLDER_ENV], STAGING_FOLDER)
    staging = storage.join(staging_root, name)
    remote_outputs = local_workers.with_uris(
        output_dict, lambda key, index, _: storage.join(staging, "outputs", key, str(index))
    )
    heartbeat = Heartbeat(storage.join(staging, "heartbeat"), HEARTBEAT_SECONDS)
    job = {
        "inputs": artifact_utils.jsonify_artifact_dict(remote_inputs(input_dict)),
        "outputs": artifact_utils.jsonify_artifact_dict(remote_outputs),
        "exec_properties": exec_properties,
        "heartbeat": {"uri": heartbeat.uri, "timeout_seconds": HEARTBEAT_TIMEOUT_SECONDS},
    }
    step = step_id(output_dict)
    api = kubernetes or Kubernetes(kind)
    job_uri = storage.join(staging, "job.json")
    deadline = deadline_seconds(float(custom_config["max_train_minutes"]),
                                float(settings["start_timeout_minutes"]))  # fmt: skip
    body = kind.manifest(name, api.namespace, settings, workers, replica_command(job_uri),
                         pod_owner(), deadline, step)  # fmt: skip
    timeouts = Timeouts(start=float(settings["start_timeout_minutes"]) * 60,
                        finish=deadline + FINISH_MARGIN_SECONDS, replicas=workers)  # fmt: skip
    stop_on_sigterm = threading.current_thread() is threading.main_thread()
    if stop_on_sigterm:  # a cancelled run: Argo sends SIGTERM, and `finally` must still run
        previous = signal.signal(signal.SIGTERM, _raise_stopped)
    created = False
    try:
        _remove_earlier_attempts(api, step, staging_root)
        max_age = float(custom_config.get("checkpoint_max_age_hours", 72))
        checkpoints.remove_abandoned(staging_root, max_age, keep=name, what="job staging folder")
        storage.write_bytes(job_uri, json.dumps(job).encode())
        heartbeat.beat()
        # Set before the call: a job whose answer is lost (a timeout, SIGTERM) is deleted too.
        created = True
        try:
            kube_client.create(api, body)
        except TrainingJobFailed as refused:  # a 4xx: nothing created; a 5xx may have stored it
            created = getattr(refused, "status", 500) >= 500
            raise
        _log.info("Created %s %s/%s: %d replicas, image %s, %s GPU(s) each", kind.kind,
                  api.namespace, name, workers, settings["image"], settings["gpus"])  # fmt: skip
        _wait(api, name, poll_seconds, timeouts, heartbeat)
        for key, artifacts in output_dict.items():
            for local, remote in zip(artifacts, remote_outputs[key], strict=True):
                copied = storage.copy_tree(remote.uri, local.uri)
                _log.info("Copied the chief's %s (%d files) into the step's output", key, copied)
    finally:
        if stop_on_sigterm:  # the clean-up is not interrupted by a second SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _clean_up(api, name, staging, delete_job=created)
        if stop_on_sigterm:
            signal.signal(signal.SIGTERM, previous)


@dataclass
class Timeouts:
    start: float  # seconds a replica may wait to start (not scheduled, no container yet)
    finish: float  # seconds for the job to end
    replicas: int  # how many pods the job has once its controller made them
    api_errors: float = 300  # seconds of consecutive failing API calls (an upgrade) tolerated


def step_id(output_dict, key: str = "model") -> str:
    """The same for every attempt of a step: a hash of its output `key`'s remote URI."""
    from components.base.launcher_paths import remote_uri

    local = output_dict[key][0].uri
    uri = remote_uri(local) or local
    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def _remove_earlier_attempts(api: Kubernetes, step: str, staging_root: str) -> None:
    """Deletes the jobs (and staging folders) of this step's earlier attempts: a step pod that
    was killed could not delete its job, which would train on next to this one."""
    from kubernetes.client.exceptions import ApiException

    try:
        earlier = api.list(f"{STEP_LABEL}={step}")
    except ApiException as error:
        if error.status == 404:  # no such API: _create says so
            return
        raise kube_client.refused(api, error, f"list {api.kind.plural}") from None
    for name in earlier:
        _log.warning("Deleting %s %s of an earlier attempt of this step", api.kind.kind, name)
        _clean_up(api, name, storage.join(staging_root, name))


def _clean_up(api: Kubernetes, name: str, staging: str, delete_job: bool = True) -> None:
    """Deletes the job and its staging folder; a failure is logged, not raised, so that it
    neither hides the step's own error nor stops the other half."""
    if delete_job:
        try:
            api.delete(name)
        except Exception as error:
            _log.error("Could not delete %s %s (%s): delete it with `kubectl -n %s delete %s %s`",
                       api.kind.kind, name, error, api.namespace, api.kind.kind.lower(),
                       name)  # fmt: skip
    try:
        storage.delete_tree(staging)
    except Exception as error:
        _log.error("Could not delete the staging folder %s: %s", staging, error)


def _raise_stopped(signum, frame) -> None:
    raise TrainingJobFailed("the step was stopped (SIGTERM): its training job is deleted")


def remote_inputs(input_dict) -> dict:
    """Copies of the input artifacts with their object-store URIs instead of the launcher's local
    paths (pipelines/kubeflow/kfp_entrypoint.py made them local)."""
    from components.base.launcher_paths import remote_uri

    def remote(key: str, _: int, artifact) -> str:
        uri = remote_uri(artifact.uri) if "://" not in artifact.uri else artifact.uri
        if uri is None:
            raise TrainingJobFailed(
                f"input {key!r} is at {artifact.uri}, a local path the job's replicas (or "
                "trial pods) cannot read: multi-worker training and trial pods on Kubeflow need "
                "the pipeline root on an object store (s3://, gs://)"
            )
        return uri

    return local_workers.with_uris(input_dict, remote)


def _wait(api: Kubernetes, name: str, poll_seconds: float, timeouts: Timeouts,
          heartbeat: Heartbeat | None = None, report_seconds: float = 30) -> None:  # fmt: skip
    """Polls the job until it succeeds or fails; logs its state, its replicas and the chief's
    latest log line when the state changes and every `report_seconds`. Each replica is timed
    from when it is first seen waiting (or missing), so a pod that comes later (a replacement)
    is timed too."""
    kind = api.kind.kind
    started, reported, last = time.monotonic(), 0.0, None
    waiting_since: dict[str, float] = {}
    missing_since: float | None = None
    ever_running = False
    while True:
        if heartbeat:
            heartbeat.beat()
        job, pods = _observe(api, name, timeouts, heartbeat)
        state = api.kind.state(job)
        waiting = {
            p.metadata.name: replica_pods.why_waiting(p) for p in pods if replica_pods.is_waiting(p)
        }
        now = time.monotonic()
        missing = max(0, timeouts.replicas - len(pods))
        waiting_since = {n: waiting_since.get(n, now) for n in waiting}
        # Pods not made yet (at the start, or a replacement): timed from when first missed.
        missing_since = (missing_since or now) if missing else None
        if missing_since is not None:
            waiting_since[""] = missing_since
        ever_running = ever_running or (bool(pods) and not waiting and not missing)
        shown = "Running" if state.phase == "Pending" and ever_running else state.phase
        if (shown, tuple(waiting)) != last or now - reported >= report_seconds:
            _log.info("%s %s: %s after %.0f s; replicas: %s; chief: %s", kind, name, shown,
                      now - started, replica_pods.replica_counts(pods, waiting),
                      replica_pods.chief_line(api, pods))  # fmt: skip
            reported, last = now, (shown, tuple(waiting))
        if state.phase == "Succeeded":
            return
        if state.phase == "Failed":
            raise TrainingJobFailed(replica_pods.failure(api, name, state, pods))
        longest = max((now - since for since in waiting_since.values()), default=0)
        if longest > timeouts.start:
            raise TrainingJobFailed(
                replica_pods.not_started(api, name, longest, waiting, pods, missing)
            )
        if now - started > timeouts.finish:
            raise TrainingJobFailed(
                f"{kind} {name} has not ended after {now - started:.0f} s, past its own deadline "
                f"of {timeouts.finish - FINISH_MARGIN_SECONDS:.0f} s: the controller that should "
                f"end it does not act on it. {api.kind.install_hint}"
            )
        time.sleep(poll_seconds)


def _observe(api: Kubernetes, name: str, timeouts: Timeouts,
             heartbeat: Heartbeat | None = None) -> tuple[dict, list]:  # fmt: skip
    """The job and its pods. A failing call (the API server restarting, a dropped connection)
    is tried again for `timeouts.api_errors` seconds: an hours-long training must not fail on
    one; RBAC and a deleted job fail at once."""
    from kubernetes.client.exceptions import ApiException

    failing_since = None
    while True:
        try:
            return kube_client.get(api, name), api.pods(name)
        except ApiException as error:
            if error.status not in (429, 500, 502, 503, 504):
                raise kube_client.refused(api, error, "list pods") from None
            problem = f"HTTP {error.status} {error.reason}"
        except OSError as error:  # urllib3's connection errors are OSErrors
            problem = repr(error)
        except Exception as error:  # urllib3.exceptions (MaxRetryError, ProtocolError)
            if not type(error).__module__.startswith("urllib3"):
                raise
            problem = repr(error)
        now = time.monotonic()
        failing_since = failing_since or now
        if now - failing_since > timeouts.api_errors:
            raise TrainingJobFailed(f"the Kubernetes API failed for {now - failing_since:.0f} s "
                                    f"while {api.kind.kind} {name} ran: {problem}")  # fmt: skip
        _log.warning("Kubernetes API call failed (%s); trying again", problem)
        if heartbeat:  # still waiting: the replicas must not take the step for gone
            heartbeat.beat()
        time.sleep(5)
