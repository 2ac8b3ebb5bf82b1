"""Multi-worker training on Kubeflow: the Trainer step runs its training as a TFJob.

The step's pod (a light CPU pod) creates a TFJob (Kubeflow Training Operator v1.8,
`kubeflow.org/v1`) whose Chief and Workers run `components.training.tfjob_replica` in the Trainer's
image, with its GPU resources, node selector and tolerations. The operator gives each replica its
TF_CONFIG (pkg/controller.v1/tensorflow/tensorflow.go genTFConfigJSONStr), so the same run_fn
trains under MultiWorkerMirroredStrategy. The replicas cannot see the step's local artifact copies:
they read the inputs from the object store and the chief uploads the model and model_run to a
staging folder there (boto3 through components.base.storage, never TensorFlow's `s3://`); the step
then copies them into its output artifacts' local paths, which the launcher uploads as it does for
any step.

Failure: replicas run with restartPolicy Never, so the first failed replica fails the TFJob
(tfjob_controller.go UpdateJobStatus: "has failed because N Worker replica(s) failed") and the
step fails with that replica's exit reason and last log lines. The Trainer task's retryPolicy
then runs the step again, and its new TFJob resumes from the training's backup
(components/training/checkpoints.py). A TFJob is not left behind: the step deletes it on every exit
it sees (SIGTERM included); a step killed outright cannot, so each attempt first deletes the TFJobs
of the step's earlier attempts (STEP_LABEL), and the owner reference to the step's pod has
Kubernetes delete it once that pod is deleted (a preempted node, the run deleted).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

from components.base import storage
from components.base.errors import ActionableError
from components.training import checkpoints, local_workers

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "tfjobs", "TFJob"
# The operator finds the TensorFlow container and its port by these names (v1.8.1
# pkg/apis/kubeflow.org/v1/tensorflow_types.go TFJobDefaultContainerName, ...PortName, ...Port).
CONTAINER, PORT_NAME, PORT = "tensorflow", "tfjob-port", 2222
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # common_types.go JobNameLabel
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"  # lower-case type: "chief", "worker"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"
STAGING_FOLDER = "_tfjobs"  # under <pipeline root>/<pipeline name>/
# The same on every attempt of one step (a hash of its model output's URI, which a retry keeps):
# an attempt deletes the TFJobs of the attempts before it, whose pods Argo keeps, so their owner
# references never fire.
STEP_LABEL = "tfx-pipeline/trainer-step"
SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
LOG_LINES = 20

_log = logging.getLogger(__name__)


class TFJobFailed(ActionableError, RuntimeError):
    """The TFJob failed; the message names the failing replica and holds its last log lines."""


def job_name(pod_uid: str) -> str:
    """One TFJob per step attempt (a retry is a new pod, so a new UID). Short enough that the
    operator's pod and service names (`<job>-worker-<i>`) stay DNS-1123 labels."""
    return "trainer-" + hashlib.sha256(pod_uid.encode()).hexdigest()[:12]


def manifest(
    name: str, namespace: str, settings: dict, workers: int, job_uri: str,
    owner: dict | None, deadline_seconds: int, step: str = "",
) -> dict:  # fmt: skip
    """The TFJob: one Chief and `workers - 1` Workers, each running the replica entry point."""
    limits: dict[str, str] = {"cpu": settings["cpu"], "memory": settings["memory"]}
    pod_spec: dict = {}
    if settings["gpus"]:
        limits[settings["gpu_resource"]] = str(settings["gpus"])
        label, _, value = settings["node_selector"].partition("=")
        pod_spec["nodeSelector"] = {label: value}
        pod_spec["tolerations"] = [
            {"key": settings["toleration_key"], "operator": "Exists", "effect": "NoSchedule"}
        ]
    env = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": settings["secret"], "key": key}}}
        for key in settings["secret_keys"]
    ]
    container = {
        "name": CONTAINER,
        "image": settings["image"],
        "command": ["python", "-m", "components.training.tfjob_replica", job_uri],
        "env": env,
        "ports": [{"name": PORT_NAME, "containerPort": PORT}],
        "resources": {"limits": limits, "requests": dict(limits)},
    }
    pod_spec["containers"] = [container]

    # Istio's sidecar (injected in Kubeflow profile namespaces) would keep a finished replica's
    # pod Running, so the operator would never see the chief succeed; KFP's own pods opt out too.
    template = {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}, "spec": pod_spec}

    def replica(count: int) -> dict:
        return {"replicas": count, "restartPolicy": "Never", "template": template}

    replicas = {"Chief": replica(1)}
    if workers > 1:
        replicas["Worker"] = replica(workers - 1)
    labels = {"app": "tfx-trainer", STEP_LABEL: step}
    metadata: dict = {"name": name, "namespace": namespace, "labels": labels}
    if owner:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            # No backoffLimit: restartPolicy Never already fails the job on the first failed
            # replica (tfjob_controller.go UpdateJobStatus), and cleanPodPolicy Running then
            # deletes only the replicas still running, keeping the failed one's log. With a
            # backoffLimit the operator deletes every pod, the failed one too, and reports only
            # "reached the specified backoff limit" (common/job.go ReconcileJobs).
            "runPolicy": {
                "cleanPodPolicy": "Running",
                "activeDeadlineSeconds": deadline_seconds,
            },
            "tfReplicaSpecs": replicas,
        },
    }


def pod_owner() -> dict | None:
    """An owner reference to the step's pod (KFP 2.5 gives every step KFP_POD_NAME and
    KFP_POD_UID, backend/src/v2/compiler/argocompiler/common.go). No blockOwnerDeletion: the
    OwnerReferencesPermissionEnforcement admission plugin would then ask for permission to update
    the pod's finalizers, more RBAC than creating TFJobs."""
    name, uid = os.environ.get("KFP_POD_NAME"), os.environ.get("KFP_POD_UID")
    if not (name and uid):
        return None
    return {"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid}


def deadline_seconds(max_train_minutes: float) -> int:
    """A backstop only: run_fn stops training on its budget; set-up, data download and export
    come on top, so the TFJob gets the budget plus a quarter of it, at least 30 minutes."""
    budget = max_train_minutes * 60
    return int(budget + max(1800, budget / 4))


class Kubernetes:
    """The few Kubernetes API calls the step makes (the only part tests stand in for)."""

    def __init__(self):
        from kubernetes import client, config

        try:
            config.load_incluster_config()
            self.namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
        except config.ConfigException:
            # KUBECONFIG, e.g. a developer's cluster. Read here: the client reads it at import.
            kubeconfig = os.environ.get("KUBECONFIG") or None
            config.load_kube_config(config_file=kubeconfig)
            _, context = config.list_kube_config_contexts(config_file=kubeconfig)
            self.namespace = context["context"].get("namespace", "default")
        self.custom = client.CustomObjectsApi()
        self.core = client.CoreV1Api()

    def create(self, body: dict) -> None:
        self.custom.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, body)

    def get(self, name: str) -> dict:
        return self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, name
        )

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, self.namespace, PLURAL, name, propagation_policy="Background"
            )
        except ApiException as error:
            if error.status != 404:
                raise

    def list(self, label_selector: str) -> list[str]:
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, label_selector=label_selector
        )
        return [item["metadata"]["name"] for item in found.get("items", [])]

    def pods(self, name: str) -> list:
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{JOB_NAME_LABEL}={name}"
        ).items

    def log(self, pod: str, lines: int) -> str:
        return self.core.read_namespaced_pod_log(
            pod, self.namespace, container=CONTAINER, tail_lines=lines
        )


def run(
    input_dict, output_dict, exec_properties: dict, workers: int,
    poll_seconds: float = 5.0, kubernetes: Kubernetes | None = None,
) -> None:  # fmt: skip
    """Trains as a TFJob of `workers` replicas, waits for it, and puts the chief's model and
    model_run into the step's output artifacts (their local paths, which the launcher uploads)."""
    from tfx.types import artifact_utils

    from components.base.launcher_paths import PIPELINE_FOLDER_ENV

    custom_config = json.loads(exec_properties["custom_config"])
    settings = custom_config["tfjob"]
    name = job_name(os.environ.get("KFP_POD_UID") or os.urandom(8).hex())
    staging_root = storage.join(os.environ[PIPELINE_FOLDER_ENV], STAGING_FOLDER)
    staging = storage.join(staging_root, name)
    remote_outputs = local_workers.with_uris(
        output_dict, lambda key, index, _: storage.join(staging, "outputs", key, str(index))
    )
    job = {
        "inputs": artifact_utils.jsonify_artifact_dict(_remote_inputs(input_dict)),
        "outputs": artifact_utils.jsonify_artifact_dict(remote_outputs),
        "exec_properties": exec_properties,
    }
    step = _step_id(output_dict)
    api = kubernetes or Kubernetes()
    job_uri = storage.join(staging, "job.json")
    deadline = deadline_seconds(float(custom_config["max_train_minutes"]))
    body = manifest(name, api.namespace, settings, workers, job_uri, pod_owner(), deadline, step)
    stop_on_sigterm = threading.current_thread() is threading.main_thread()
    if stop_on_sigterm:  # a cancelled run: Argo sends SIGTERM, and `finally` must still run
        previous = signal.signal(signal.SIGTERM, _raise_stopped)
    try:
        _remove_earlier_attempts(api, step, staging_root)
        max_age = float(custom_config.get("checkpoint_max_age_hours", 72))
        checkpoints.remove_abandoned(staging_root, max_age, keep=name, what="TFJob staging folder")
        storage.write_bytes(job_uri, json.dumps(job).encode())
        api.create(body)
        _log.info("Created TFJob %s/%s: 1 chief + %d worker(s), image %s, %s GPU(s) each",
                  api.namespace, name, workers - 1, settings["image"],
                  settings["gpus"])  # fmt: skip
        _wait(api, name, poll_seconds)
        for key, artifacts in output_dict.items():
            for local, remote in zip(artifacts, remote_outputs[key], strict=True):
                copied = storage.copy_tree(remote.uri, local.uri)
                _log.info("Copied the chief's %s (%d files) into the step's output", key, copied)
    finally:
        if stop_on_sigterm:  # the clean-up is not interrupted by a second SIGTERM
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _clean_up(api, name, staging)
        if stop_on_sigterm:
            signal.signal(signal.SIGTERM, previous)


def _step_id(output_dict) -> str:
    from components.base.launcher_paths import remote_uri

    local = output_dict["model"][0].uri
    uri = remote_uri(local) or local
    return hashlib.sha256(uri.encode()).hexdigest()[:16]


def _remove_earlier_attempts(api: Kubernetes, step: str, staging_root: str) -> None:
    """Deletes the TFJobs (and staging folders) of this step's earlier attempts: a step pod that
    was killed could not delete its TFJob, which would train on next to this one."""
    for earlier in api.list(f"{STEP_LABEL}={step}"):
        _log.warning("Deleting TFJob %s of an earlier attempt of this step", earlier)
        _clean_up(api, earlier, storage.join(staging_root, earlier))


def _clean_up(api: Kubernetes, name: str, staging: str) -> None:
    """Deletes the TFJob and its staging folder; a failure is logged, not raised, so that it
    neither hides the step's own error nor stops the other half."""
    try:
        api.delete(name)
    except Exception as error:
        _log.error("Could not delete TFJob %s (%s): delete it with `kubectl -n %s delete tfjob "
                   "%s`", name, error, api.namespace, name)  # fmt: skip
    try:
        storage.delete_tree(staging)
    except Exception as error:
        _log.error("Could not delete the staging folder %s: %s", staging, error)


def _raise_stopped(signum, frame) -> None:
    raise TFJobFailed("the step was stopped (SIGTERM): its TFJob is deleted")


def _remote_inputs(input_dict) -> dict:
    """Copies of the input artifacts with their object-store URIs instead of the launcher's local
    paths (pipelines/kubeflow/kfp_entrypoint.py made them local)."""
    from components.base.launcher_paths import remote_uri

    def remote(key: str, _: int, artifact) -> str:
        uri = remote_uri(artifact.uri) if "://" not in artifact.uri else artifact.uri
        if uri is None:
            raise TFJobFailed(
                f"input {key!r} is at {artifact.uri}, a local path the TFJob's replicas cannot "
                "read: multi-worker training on Kubeflow needs the pipeline root on an object "
                "store (s3://, gs://)"
            )
        return uri

    return local_workers.with_uris(input_dict, remote)


def _wait(api: Kubernetes, name: str, poll_seconds: float, report_seconds: float = 30) -> None:
    """Polls the TFJob's conditions until it succeeds or fails; logs its state and the chief's
    latest log line when the state changes and every `report_seconds`."""
    started, reported, last_state = time.monotonic(), 0.0, None
    while True:
        status = _status(api, name)
        conditions = {c["type"]: c for c in status.get("conditions", []) if c["status"] == "True"}
        state = next(
            (s for s in ("Failed", "Succeeded", "Restarting", "Running", "Created")
             if s in conditions), "Pending",
        )  # fmt: skip
        now = time.monotonic()
        if state != last_state or now - reported >= report_seconds:
            _log.info("TFJob %s: %s after %.0f s; replicas %s; chief: %s", name, state,
                      now - started, _replica_counts(status), _chief_line(api, name))  # fmt: skip
            reported, last_state = now, state
        if state == "Succeeded":
            return
        if state == "Failed":
            raise TFJobFailed(_failure(api, name, conditions["Failed"].get("message", "")))
        time.sleep(poll_seconds)


def _status(api: Kubernetes, name: str) -> dict:
    from kubernetes.client.exceptions import ApiException

    try:
        return api.get(name).get("status") or {}
    except ApiException as error:
        if error.status == 404:
            raise TFJobFailed(
                f"TFJob {name} was deleted while it ran (by someone else: the "
                "step deletes it only when it ends); run the step again"
            ) from None
        raise


def _replica_counts(status: dict) -> str:
    counts = status.get("replicaStatuses") or {}
    return (
        ", ".join(
            f"{kind}: " + " ".join(f"{n} {what}" for what, n in sorted(c.items()) if n)
            for kind, c in sorted(counts.items())
        )
        or "none yet"
    )


def _chief_line(api: Kubernetes, name: str) -> str:
    try:
        lines = api.log(f"{name}-chief-0", 1).strip().splitlines()
    except Exception:  # not started yet (ApiException 400/404): nothing to report
        return "not started"
    return lines[-1] if lines else "no output yet"


def _failure(api: Kubernetes, name: str, message: str) -> str:
    """The operator's message, then the first failed replica's exit and last log lines."""
    failed = [p for p in api.pods(name) if p.status and p.status.phase == "Failed"]
    if not failed:
        return (f"{message} No replica failed: the TFJob hit its deadline or was stopped; see "
                f"`kubectl describe tfjob {name}` while it exists")  # fmt: skip
    # The first to fail; of those in the same second, not one the operator stopped (SIGTERM).
    failed.sort(key=lambda p: (_finished_at(p) or 0, _exit_code(p) == 143))
    pod = failed[0]
    labels = pod.metadata.labels or {}
    replica = f"{labels.get(REPLICA_TYPE_LABEL)}-{labels.get(REPLICA_INDEX_LABEL)}"
    try:
        log = api.log(pod.metadata.name, LOG_LINES)
    except Exception as error:  # the node is gone with its logs
        log = f"(its log cannot be read: {error})"
    return (
        f"{message} Replica {replica} (pod {pod.metadata.name}) {_exit_of(pod)}. Its last log "
        f"lines:\n{log.rstrip()}\nThe Trainer's retry policy runs the step again, resuming "
        "from the training's backup; if the same error comes back, fix what the log names."
    )


def _terminated(pod):
    for container in pod.status.container_statuses or []:
        if container.name == CONTAINER and container.state and container.state.terminated:
            return container.state.terminated
    return None


def _finished_at(pod):
    terminated = _terminated(pod)
    return terminated.finished_at.timestamp() if terminated and terminated.finished_at else None


def _exit_code(pod) -> int | None:
    terminated = _terminated(pod)
    return terminated.exit_code if terminated else None


def _exit_of(pod) -> str:
    terminated = _terminated(pod)
    if terminated is None:
        return "failed"
    reason = f" ({terminated.reason})" if terminated.reason else ""
    return f"exited with code {terminated.exit_code}{reason}"
