"""Reading a job's pods for a person: which replicas wait and why (as `kubectl describe` says
it), their counts, the chief's latest line, and the first failed replica's exit and log."""

from __future__ import annotations

from components.training.job_kind import State
from components.training.kube_client import Kubernetes

LOG_LINES = 20
IMAGE_PULL_HINT = (
    " If the image cannot be pulled (ErrImagePull, ImagePullBackOff), check gpu_image's tag; "
    "for a private registry the replicas pull with the namespace's `default` ServiceAccount, "
    "which needs the pull secret too (kubeflow/README.md, section 1)."
)


def is_waiting(pod) -> bool:
    return pod.status is None or pod.status.phase in (None, "Pending")


def why_waiting(pod) -> str:
    """A pending pod's reason as `kubectl describe` shows it: a container's waiting reason
    (CreateContainerConfigError: secret "x" not found), else why it is not scheduled."""
    status = pod.status
    for container in (status.container_statuses if status else None) or []:
        waiting = container.state and container.state.waiting
        if waiting and waiting.reason not in (None, "ContainerCreating"):
            return f"{waiting.reason}: {waiting.message}" if waiting.message else waiting.reason
    for condition in (status.conditions if status else None) or []:
        if condition.type == "PodScheduled" and condition.status == "False":
            return f"{condition.reason}: {condition.message}"
    return "not scheduled yet" if not status or not status.conditions else "starting"


def replica_counts(pods: list, waiting: dict[str, str]) -> str:
    """`2 Running, 1 waiting (Unschedulable: 0/3 nodes are available: ...)`."""
    phases: dict[str, int] = {}
    for pod in pods:
        if not is_waiting(pod):
            phases[pod.status.phase] = phases.get(pod.status.phase, 0) + 1
    counts = [f"{n} {phase}" for phase, n in sorted(phases.items())]
    if waiting:
        counts.append(f"{len(waiting)} waiting ({next(iter(waiting.values()))})")
    return ", ".join(counts) or "none yet"


def not_started(api: Kubernetes, name: str, seconds: float, waiting: dict, pods: list,
                missing: int = 0) -> str:  # fmt: skip
    kind = api.kind.kind
    if not pods:
        return (f"{kind} {name} has no pods after {seconds:.0f} s. Either the namespace "
                "refuses them (Pod Security admission, a ResourceQuota: `kubectl -n "
                f"{api.namespace} get events --field-selector "
                f"reason={api.kind.pod_refused_event}` says which), or the controller that makes "
                f"them does not act on it (`kubectl -n {api.namespace} describe {kind.lower()} "
                f"{name}` shows its events): {api.kind.install_hint}")  # fmt: skip
    lines = [f"  pod {pod}: {why}" for pod, why in sorted(waiting.items())]
    if missing:
        lines.append(f"  {missing} replica pod(s) not created yet (`kubectl describe "
                     f"{kind.lower()} {name}` and its Job's events say why)")  # fmt: skip
    return (
        f"{kind} {name}: {len(waiting) + missing} of {len(pods) + missing} replicas had not "
        f"started after {seconds:.0f} s (replica_start_timeout_minutes):\n"
        + "\n".join(lines)
        + "\nIf a pod is not scheduled, the cluster lacks what it asks for (GPUs, the node "
        "selector's nodes, tolerated taints): add nodes or lower gpu_count; if it cannot start "
        "its container, create what it names (the credentials Secret, in this namespace)."
        + (IMAGE_PULL_HINT if any("Image" in why for why in waiting.values()) else "")
    )


def chief_line(api: Kubernetes, pods: list) -> str:
    chiefs = [p for p in pods if api.kind.replica(p) == "chief-0"]
    if not chiefs or is_waiting(chiefs[0]):
        return "not started"
    try:
        lines = api.log(chiefs[0].metadata.name, 1).strip().splitlines()
    except Exception:  # just started (ApiException 400/404): nothing to report
        return "not started"
    return lines[-1] if lines else "no output yet"


def failure(api: Kubernetes, name: str, state: State, pods: list) -> str:
    """The controller's message, then the first failed replica's exit and last log lines."""
    message = state.message
    # A pod being deleted (the controller stopping the others, a deadline) ends as Failed with
    # 143 too: it did not cause the failure, nor does any pod when the deadline did.
    failed = [p for p in pods if p.status and p.status.phase == "Failed"
              and not p.metadata.deletion_timestamp and not state.deadline]  # fmt: skip
    if not failed:
        return (f"{message} No replica failed: the job hit its deadline or was stopped; see "
                f"`kubectl describe {api.kind.kind.lower()} {name}` while it exists")  # fmt: skip
    # The first to fail; of those in the same second, not one the controller stopped (SIGTERM).
    failed.sort(key=lambda p: (_finished_at(api, p) or 0, _exit_code(api, p) == 143))
    pod = failed[0]
    try:
        log = api.log(pod.metadata.name, LOG_LINES)
    except Exception as error:  # the node is gone with its logs
        log = f"(its log cannot be read: {error})"
    return (
        f"{message} Replica {api.kind.replica(pod)} (pod {pod.metadata.name}) "
        f"{_exit_of(api, pod)}. Its last log lines:\n{log.rstrip()}\nWhere the backend retries "
        "a failed Trainer (KFP up to 2.16; on 2.17 only with Argo's retryPolicy changed, "
        'kubeflow/README.md "Supported versions") the retry resumes from the training\'s '
        "backup, as does the next run; if the same error comes back, fix what the log names."
    )


def _terminated(api: Kubernetes, pod):
    for container in pod.status.container_statuses or []:
        if container.name == api.kind.container and container.state and container.state.terminated:
            return container.state.terminated
    return None


def _finished_at(api: Kubernetes, pod):
    terminated = _terminated(api, pod)
    return terminated.finished_at.timestamp() if terminated and terminated.finished_at else None


def _exit_code(api: Kubernetes, pod) -> int | None:
    terminated = _terminated(api, pod)
    return terminated.exit_code if terminated else None


def _exit_of(api: Kubernetes, pod) -> str:
    terminated = _terminated(api, pod)
    if terminated is None:
        return "failed"
    reason = f" ({terminated.reason})" if terminated.reason else ""
    return f"exited with code {terminated.exit_code}{reason}"
