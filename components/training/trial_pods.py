"""A search's trial workers on Kubeflow: one pod each, made by the Tuner step's pod.

Plain pods, not a TrainJob or TFJob: those fail the whole job on the first failed replica and
delete the others (restartPolicy Never, backoffLimit 0: components/training/trainjob.py), and
their size is fixed, so a dead trial would end every trial and no replacement could join; an
Indexed Job's per-index retry would bring a worker back under the same KerasTuner id, which the
oracle hands the same unfinished trial. Here the step decides (components/training/search.py):
a pod that ends with an error has its trial recorded FAILED and a new pod takes its place.

Each pod gets what a multi-worker Trainer's replica gets (job_kind.replica_pod: the Trainer's
image, CPU, memory, GPUs, node selector, toleration, the credentials Secret's keys, the
restricted security context), `restartPolicy: Never` (the default, Always, would restart a
killed worker in place and the step would never see its exit), no Istio sidecar (as the step
pod, whose template KFP annotates `sidecar.istio.io/inject: "false"`), and reaches the oracle at
the step pod's IP, read from the step's own pod (KFP_POD_NAME; KFP sets no pod IP in a step's
env, backend/src/v2/compiler/argocompiler/common.go commonEnvs). A pod is not left behind: the
step deletes its pods on every exit it sees (SIGTERM included), its next attempt deletes an
earlier attempt's (TUNER_STEP_LABEL), the owner reference to the step's pod has Kubernetes
delete them with it, trials stop once the step's heartbeat stops (a step killed outright), and
`activeDeadlineSeconds` ends them past the search's budget.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time

from components.base import storage
from components.training import cluster_job, kube_client, replica_pods
from components.training.heartbeat import Heartbeat
from components.training.job_kind import TrainingJobFailed

TUNER_STEP_LABEL = "tfx-pipeline/tuner-step"  # every attempt of one Tuner step
ATTEMPT_LABEL = "tfx-pipeline/tuner-attempt"  # one attempt's pods
CONTAINER = "trial"
TRIAL_MODULE = "components.training.trial"
_log = logging.getLogger(__name__)


class TrialPodsFailed(TrainingJobFailed):
    """The trial pods cannot run (refused, never started); the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class TrialPodKind:
    """What replica_pods and kube_client's messages read of a kind of pod."""

    kind: str = "Pod"
    plural: str = "pods"
    container: str = CONTAINER
    install_hint: str = ""
    pod_refused_event: str = "FailedCreate"

    def replica(self, pod) -> str:
        return pod.metadata.name


class TrialPods:
    """The few core-API calls the Tuner step makes for its trial pods (the only part the tests
    stand in for: tests/stand_ins/kube_api.py)."""

    def __init__(self):
        from kubernetes import client

        api_client, self.namespace = kube_client.connect()
        self.core = client.CoreV1Api(api_client)
        self.kind = TrialPodKind()

    def create(self, body: dict) -> None:
        # As kube_client.Kubernetes._post: Strict, so a misspelled field is refused, not dropped.
        self.core.api_client.call_api(
            f"/api/v1/namespaces/{self.namespace}/pods", "POST",
            query_params=[("fieldValidation", "Strict")], body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
            _request_timeout=kube_client.REQUEST_TIMEOUT,
        )  # fmt: skip

    def read(self, name: str):
        return self.core.read_namespaced_pod(
            name, self.namespace, _request_timeout=kube_client.REQUEST_TIMEOUT
        )

    def list(self, selector: str) -> list:
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, _request_timeout=kube_client.REQUEST_TIMEOUT
        ).items

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            timeout = kube_client.REQUEST_TIMEOUT
            self.core.delete_namespaced_pod(name, self.namespace, _request_timeout=timeout)
        except ApiException as error:
            if error.status != 404:
                raise

    def log(self, pod: str, lines: int) -> str:
        return self.core.read_namespaced_pod_log(
            pod, self.namespace, container=CONTAINER, tail_lines=lines,
            _request_timeout=kube_client.REQUEST_TIMEOUT,
        )  # fmt: skip


def own_pod_ip(api: TrialPods) -> str:
    """The step pod's IP, from its own pod (KFP_POD_NAME, checked against KFP_POD_UID)."""
    from kubernetes.client.exceptions import ApiException

    name, uid = os.environ.get("KFP_POD_NAME"), os.environ.get("KFP_POD_UID")
    if not (name and uid):
        raise TrialPodsFailed("trial pods need the step's pod (KFP_POD_NAME, KFP_POD_UID, which "
                              "KFP sets in every step): none is set")  # fmt: skip
    try:
        pod = api.read(name)
    except ApiException as error:
        raise kube_client.refused(api, error, f"get pods ({name}, the step's own)") from None
    if pod.metadata.uid != uid or not (pod.status and pod.status.pod_ip):
        raise TrialPodsFailed(f"pod {name} is not this step's running pod (uid {uid}): "
                              "the trials could not reach its oracle")  # fmt: skip
    return pod.status.pod_ip


def trial_pod(name: str, namespace: str, settings: dict, command: list[str],
              env: dict[str, str], labels: dict[str, str],
              deadline_seconds: int) -> dict:  # fmt: skip
    """A trial worker's pod: the Trainer's resources and placement (job_kind.replica_pod)."""
    from components.training.job_kind import replica_pod

    replica = replica_pod(settings)
    owner = cluster_job.pod_owner()
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name, "namespace": namespace, "labels": {"app": "tfx-tuner-trial", **labels},
            "annotations": {"sidecar.istio.io/inject": "false"},
            **({"ownerReferences": [owner]} if owner else {}),
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": deadline_seconds,
            "automountServiceAccountToken": False,  # a trial calls no Kubernetes API
            "securityContext": replica.security,
            **replica.placement,
            "containers": [{
                "name": CONTAINER, "image": settings["image"], "command": command,
                "env": [{"name": k, "value": v} for k, v in sorted(env.items())] + replica.env,
                "resources": replica.resources,
                "securityContext": replica.container_security,
            }],
        },
    }  # fmt: skip


class ClusterTrialWorkers:
    """search.TrialWorkers as pods: the oracle listens on every address of the step's pod."""

    bind = "0.0.0.0"

    def __init__(self, settings: dict, step: str, folder: str, deadline_seconds: int,
                 api: TrialPods | None = None, refresh_seconds: float = 2.0):  # fmt: skip
        self.settings, self.step, self.deadline_seconds = settings, step, deadline_seconds
        self.api = api or TrialPods()
        self.attempt = "tuner-" + cluster_job.job_name(os.environ.get("KFP_POD_UID", ""))[8:]
        self.heartbeat = Heartbeat(storage.join(folder, "attempts", self.attempt, "heartbeat"),
                                   cluster_job.HEARTBEAT_SECONDS)  # fmt: skip
        self.logs = storage.join(folder, "logs", self.attempt)  # each pod's, once it is deleted
        self.refresh_seconds = refresh_seconds
        self.start_timeout = float(settings["start_timeout_minutes"]) * 60
        self._pods: dict[str, str] = {}  # tuner id -> pod name
        self._stopped: set[str] = set()
        self._seen: dict[str, object] = {}  # pod name -> as last listed; None: gone since
        self._listed_at = float("-inf")
        self._waiting_since: dict[str, float] = {}
        self._remove_earlier_attempts()
        self.address = own_pod_ip(self.api)

    def heartbeat_job(self) -> dict:
        return {"uri": self.heartbeat.uri, "timeout_seconds": cluster_job.HEARTBEAT_TIMEOUT_SECONDS}

    def _remove_earlier_attempts(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            earlier = self.api.list(f"{TUNER_STEP_LABEL}={self.step}")
        except ApiException as error:
            raise kube_client.refused(self.api, error, "list pods") from None
        for pod in earlier:
            _log.warning("Deleting trial pod %s of an earlier attempt of this step",
                         pod.metadata.name)  # fmt: skip
            self.api.delete(pod.metadata.name)

    def start(self, tuner_id: str, env: dict[str, str]) -> None:
        from kubernetes.client.exceptions import ApiException

        name = f"{self.attempt}-{tuner_id}"
        labels = {TUNER_STEP_LABEL: self.step, ATTEMPT_LABEL: self.attempt}
        command = ["python", "-m", TRIAL_MODULE, env["TFX_SEARCH_JOB"]]
        body = trial_pod(name, self.api.namespace, self.settings, command, env, labels,
                         self.deadline_seconds)  # fmt: skip
        self._pods[tuner_id] = name
        self.heartbeat.beat()
        try:
            self.api.create(body)
        except ApiException as error:
            message = kube_client._api_message(error)
            if error.status == 403 and "PodSecurity" not in message:
                raise kube_client.forbidden(self.api, "create pods", message) from None
            raise TrialPodsFailed(f"The API server refused trial pod {name} ({error.status}): "
                                  f"{message}") from None  # fmt: skip
        _log.info("Trial pod %s/%s: image %s, %s GPU(s)", self.api.namespace, name,
                  self.settings["image"], self.settings["gpus"])  # fmt: skip

    def exit_codes(self) -> dict[str, int | None]:
        self.heartbeat.beat()
        now = time.monotonic()
        if now - self._listed_at >= self.refresh_seconds:
            self._list()
            self._listed_at = now
        codes: dict[str, int | None] = {}
        for tuner_id, name in self._pods.items():
            if name in self._stopped:
                codes[tuner_id] = 143  # deleted by stop_all: SIGTERM, as the kubelet stops it
                continue
            if name not in self._seen:  # not listed yet: just created
                codes[tuner_id] = None
                continue
            pod = self._seen[name]
            if pod is None:  # listed before, gone now: deleted by someone, or its node lost
                codes[tuner_id] = 1
                continue
            terminated = replica_pods._terminated(self.api, pod)
            if terminated is not None:
                codes[tuner_id] = terminated.exit_code
            elif pod.status and pod.status.phase == "Failed":  # evicted, past its deadline
                codes[tuner_id] = 1
            else:
                codes[tuner_id] = None
        self._check_started(now)
        return codes

    def _list(self) -> None:
        from kubernetes.client.exceptions import ApiException

        try:
            pods = self.api.list(f"{ATTEMPT_LABEL}={self.attempt}")
        except ApiException as error:
            if error.status not in (429, 500, 502, 503, 504):
                raise kube_client.refused(self.api, error, "list pods") from None
            _log.warning("Kubernetes API call failed (HTTP %s); trying again", error.status)
            return  # the pods as last seen; the next poll asks again
        except OSError as error:
            _log.warning("Kubernetes API call failed (%r); trying again", error)
            return
        listed = {p.metadata.name: p for p in pods}
        for name in self._pods.values():
            if name in listed:
                self._seen[name] = listed[name]
            elif name in self._seen:  # listed before, gone now (a pod not listed yet is new)
                self._seen[name] = None

    def _check_started(self, now: float) -> None:
        waiting = {n: replica_pods.why_waiting(p) for n, p in self._seen.items()
                   if p is not None and replica_pods.is_waiting(p)}  # fmt: skip
        self._waiting_since = {n: self._waiting_since.get(n, now) for n in waiting}
        running = [p for p in self._seen.values()  # not the ended ones: still listed
                   if p is not None and p.status and p.status.phase == "Running"]  # fmt: skip
        longest = max((now - t for t in self._waiting_since.values()), default=0.0)
        # One pod queued while others run (fewer GPUs than parallel trials) is fine.
        if longest > self.start_timeout and not running:
            lines = "\n".join(f"  pod {n}: {why}" for n, why in sorted(waiting.items()))
            raise TrialPodsFailed(f"no trial pod started within {longest:.0f} s "
                                  f"(replica_start_timeout_minutes):\n{lines}"
                                  f"{replica_pods.IMAGE_PULL_HINT}")  # fmt: skip

    def how_it_ended(self, tuner_id: str) -> str:
        name = self._pods[tuner_id]
        pod = self._seen.get(name)
        if pod is None:
            return f"pod {name} was deleted before it ended"
        how = replica_pods._exit_of(self.api, pod)
        if pod.status and pod.status.reason:  # Evicted, DeadlineExceeded
            how += f" ({pod.status.reason}: {pod.status.message})"
        try:
            log = self.api.log(name, 15)
        except Exception as error:  # gone, or never started
            log = f"(no log: {error})"
        return f"(pod {name}) {how}; its last log lines:\n{log.rstrip()}"

    def _keep_log(self, name: str) -> None:
        """The pod's log, kept beside the search's records before the pod goes with it."""
        try:
            log = self.api.log(name, 2000)
            storage.write_bytes(storage.join(self.logs, f"{name}.log"), log.encode())
        except Exception as error:  # never started, or gone: nothing to keep
            _log.debug("No log kept of trial pod %s: %s", name, error)

    def stop_all(self) -> None:
        for name in self._pods.values():
            if name in self._stopped:
                continue
            self._stopped.add(name)
            self._keep_log(name)
            try:
                self.api.delete(name)
            except Exception as error:  # logged, not raised: the step's own error matters more
                _log.error("Could not delete trial pod %s (%s): `kubectl -n %s delete pods -l "
                           "%s=%s`", name, error, self.api.namespace, ATTEMPT_LABEL,
                           self.attempt)  # fmt: skip
        try:
            storage.delete_tree(self.heartbeat.uri.rsplit("/", 1)[0])
        except Exception as error:
            _log.error("Could not delete the heartbeat %s: %s", self.heartbeat.uri, error)


def search_on_a_cluster(custom_config: dict) -> bool:
    """Trials as pods: the step runs on Kubeflow (pipelines/kubeflow/kfp_entrypoint.py sets the
    pipeline folder) and has the Trainer's pod settings."""
    from components.base.launcher_paths import PIPELINE_FOLDER_ENV

    return bool(os.environ.get(PIPELINE_FOLDER_ENV)) and "cluster_job" in custom_config
