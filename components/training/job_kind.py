"""What the jobs a multi-worker Trainer runs on Kubeflow have in common
(components/training/cluster_job.py runs them): the kind's interface (a TrainJob,
components/training/trainjob.py, or a TFJob, components/training/tfjob.py), the job's state, and
what every replica's pod and job gets."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from components.base.errors import ActionableError

# The same on every attempt of one step (a hash of its model output's URI, which a retry keeps):
# an attempt deletes the jobs of the attempts before it, whose pods Argo keeps, so their owner
# references never fire.
STEP_LABEL = "tfx-pipeline/trainer-step"


class TrainingJobFailed(ActionableError, RuntimeError):
    """The job failed or never ran; the message names the job and what to do next."""


@dataclass
class State:
    phase: str  # Pending, Running, Succeeded, Failed
    message: str = ""  # the controller's, for Failed
    deadline: bool = False  # Failed because the job outlived its activeDeadlineSeconds


class JobKind(Protocol):
    """What differs between a TrainJob and a TFJob."""

    kind: str
    group: str
    version: str
    plural: str
    container: str  # the replicas' container
    install_hint: str  # what a cluster needs for this kind, for an error when it has none
    pod_refused_event: str  # the event reason its controller records for a pod it cannot create

    def manifest(
        self,
        name: str,
        namespace: str,
        settings: dict,
        workers: int,
        command: list[str],
        owner: dict | None,
        deadline_seconds: int,
        step: str,
    ) -> dict: ...  # fmt: skip

    def state(self, job: dict) -> State: ...

    def pod_selector(self, name: str) -> str: ...

    def replica(self, pod) -> str:
        """The replica a pod runs, as a person names it: chief-0, worker-1."""
        ...


# What Pod Security's "restricted" profile asks of every pod (a Kubeflow profile namespace may
# enforce it; KFP 2.16+ gives its own step pods the same): the image runs as a numeric non-root
# user (kubeflow/Dockerfile: USER 1000:1000), which is how the kubelet checks runAsNonRoot.
POD_SECURITY = {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


@dataclass
class ReplicaPod:
    """What every replica's pod gets, whichever the job: what the single-pod Trainer gets
    (pipelines/kubeflow/kubeflow_runner.py), and the restricted profile's security context."""

    resources: dict  # limits and the same requests: CPU, memory, GPUs
    placement: dict  # pod spec fields: the GPU node selector and toleration (none without GPUs)
    env: list[dict]  # the credentials Secret's keys
    security: dict = field(default_factory=lambda: dict(POD_SECURITY))  # the pod's
    container_security: dict = field(default_factory=lambda: dict(CONTAINER_SECURITY))


def replica_pod(settings: dict) -> ReplicaPod:
    limits: dict[str, str] = {"cpu": settings["cpu"], "memory": settings["memory"]}
    placement: dict = {}
    if settings["gpus"]:
        limits[settings["gpu_resource"]] = str(settings["gpus"])
        label, _, value = settings["node_selector"].partition("=")
        placement["nodeSelector"] = {label: value}
        placement["tolerations"] = [
            {"key": settings["toleration_key"], "operator": "Exists", "effect": "NoSchedule"}
        ]
    env = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": settings["secret"], "key": key}}}
        for key in settings["secret_keys"]
    ]
    return ReplicaPod({"limits": limits, "requests": dict(limits)}, placement, env)


def job_metadata(name: str, namespace: str, owner: dict | None, step: str) -> dict:
    metadata: dict = {"name": name, "namespace": namespace,
                      "labels": {"app": "tfx-trainer", STEP_LABEL: step}}  # fmt: skip
    if owner:
        metadata["ownerReferences"] = [owner]
    return metadata
