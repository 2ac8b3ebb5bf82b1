"""The Training Operator v1.8.1's TFJob controller, on the Kubernetes stand-in (kube_api.py).

What it plays, each rule from the source it follows (kubeflow/training-operator v1.8.1):
- admission: the CRD's schema (manifests/base/crds/kubeflow.org_tfjobs.yaml, shipped in
  tests/stand_ins/crds/) and the webhook (pkg/webhooks/tensorflow/tfjob_webhook.go
  validateTFJob: DNS-1035 name, an image and a container named "tensorflow" in every replica,
  at most one Chief);
- pods: one per replica, named `<job>-<type>-<index>` with the operator's labels
  (pkg/core/utils.go GenGeneralName, common_types.go *Label); TF_CONFIG as genTFConfigJSONStr
  writes it (pkg/controller.v1/tensorflow/tensorflow.go), except that every address is
  127.0.0.1 with its own free port instead of `<pod>.<namespace>.svc:2222`;
- status (tfjob_controller.go UpdateJobStatus): Created; Running once the chief runs (a pending
  pod counts in no replica status, pkg/core/status.go UpdateJobReplicaStatuses); Succeeded when
  the chief exits 0; Failed with the operator's message when any replica fails; cleanPodPolicy
  Running deletes the pods still running or pending once the job has finished
  (common/job.go DeletePodsAndServices);
- deadline: `runPolicy.activeDeadlineSeconds` counted from the job's start time, which the first
  status update sets (tfjob_controller.go UpdateJobStatus), pending time included: past it the
  job fails with "Job <name> has failed because it was active longer than specified deadline"
  and every pod is deleted (common/job.go ReconcileJobs, pkg/core/job.go PastActiveDeadline);
  `runPolicy.backoffLimit` 0 with a failed replica deletes every pod, the failed one too, and
  fails the job as "reached the specified backoff limit" (same function, checked first);
- deletion stops every replica.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from components.training import local_workers, tfjob
from tests.stand_ins.kube_api import KubeApi
from tests.stand_ins.kube_pods import now_text
from tests.stand_ins.kube_schema import DNS_1035, Resource

CRD_PATH = Path(__file__).parent / "crds" / "kubeflow.org_tfjobs.yaml"  # v1.8.1, verbatim


def webhook(body: dict) -> list[str]:
    """tfjob_webhook.go validateTFJob."""
    errors = []
    name = body.get("metadata", {}).get("name", "")
    if not DNS_1035.match(name):
        errors.append(f"metadata.name: {name!r} is not a DNS-1035 label")
    specs = body.get("spec", {}).get("tfReplicaSpecs") or {}
    for kind, spec in specs.items():
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if not containers or any(not c.get("image") for c in containers):
            errors.append(f"spec.tfReplicaSpecs[{kind}]: every container needs an image")
        if tfjob.CONTAINER not in [c.get("name") for c in containers]:
            errors.append(f"spec.tfReplicaSpecs[{kind}]: no container named {tfjob.CONTAINER}")
    if sum(kind in ("Chief", "Master") for kind in specs) > 1:
        errors.append("spec.tfReplicaSpecs: more than one Chief or Master")
    # What the stand-in plays, refused otherwise rather than played as something else.
    if body.get("spec", {}).get("runPolicy", {}).get("cleanPodPolicy", "Running") != "Running":
        errors.append("the stand-in plays only cleanPodPolicy Running")
    if any(spec.get("restartPolicy", "Never") != "Never" for spec in specs.values()):
        errors.append("the stand-in plays only restartPolicy Never")
    return errors


def _condition(kind: str, reason: str, message: str) -> dict:
    now = now_text()
    return {"type": kind, "status": "True", "reason": f"TFJob{reason}", "message": message,
            "lastUpdateTime": now, "lastTransitionTime": now}  # fmt: skip


class TFJobOperator:
    def __init__(self, api: KubeApi):
        self.api = api
        self.make_pods = True  # False: jobs admitted, never given pods
        self.pods: dict[str, list[str]] = {}  # job -> its pods' names
        self.started: dict[str, float] = {}
        self.resource = api.serve(Resource(
            CRD_PATH, tfjob.VERSION, webhook="validator.tfjob.training-operator.kubeflow.org",
            admit=webhook, on_create=self._create,
            on_get=self._status, on_delete=self._delete,
        ))  # fmt: skip

    def _create(self, body: dict) -> None:
        name = body["metadata"]["name"]
        specs = body["spec"]["tfReplicaSpecs"]
        ports = {kind: local_workers.free_ports(spec["replicas"]) for kind, spec in specs.items()}
        cluster = {kind.lower(): [f"127.0.0.1:{p}" for p in ports[kind]] for kind in specs}
        names = []
        for kind, spec in specs.items() if self.make_pods else ():
            for index in range(spec["replicas"]):
                pod = f"{name}-{kind.lower()}-{index}"
                labels = {tfjob.JOB_NAME_LABEL: name, tfjob.REPLICA_TYPE_LABEL: kind.lower(),
                          tfjob.REPLICA_INDEX_LABEL: str(index)}  # fmt: skip
                template = json.loads(json.dumps(spec["template"]))
                manifest = {"metadata": {**template.get("metadata", {}), "name": pod,
                                         "labels": labels}, "spec": template["spec"]}  # fmt: skip
                tf_config = {"cluster": cluster, "task": {"type": kind.lower(), "index": index},
                             "environment": "cloud"}  # fmt: skip
                env = {"TF_CONFIG": json.dumps(tf_config)}
                if self.api.add_pod(manifest, env, f"TFJob/{name}", "FailedCreatePod"):
                    names.append(pod)
        body["status"] = {"conditions": [
            _condition("Created", "Created", f"TFJob {name} is created.")
        ]}  # fmt: skip
        self.pods[name], self.started[name] = names, time.monotonic()

    def _delete(self, body: dict) -> None:
        for pod in self.pods.pop(body["metadata"]["name"], []):
            self.api.delete_pod(pod)

    def _stop(self, job: str, which) -> None:
        for name in list(self.pods[job]):
            pod = self.api.pod(name)
            if pod is not None and which(pod):
                self.api.delete_pod(name)
                self.pods[job].remove(name)

    def _status(self, job: dict) -> dict:
        """UpdateJobStatus and ReconcileJobs for a TFJob with a Chief, recomputed now."""
        name, ns = job["metadata"]["name"], job["metadata"]["namespace"]
        status = job["status"]
        conditions = status["conditions"]
        if any(c["type"] in ("Succeeded", "Failed") for c in conditions):
            return job
        pods = [p for p in map(self.api.pod, self.pods[name]) if p is not None]
        counts: dict[str, dict[str, int]] = {}
        for pod in pods:
            kind = pod.labels[tfjob.REPLICA_TYPE_LABEL].capitalize()
            count = counts.setdefault(kind, {"active": 0, "succeeded": 0, "failed": 0})
            field = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}
            if pod.phase() in field:
                count[field[pod.phase()]] += 1
        status["replicaStatuses"] = counts
        failed = sum(count["failed"] for count in counts.values())
        run_policy = job["spec"].get("runPolicy", {})
        limit, deadline = run_policy.get("backoffLimit"), run_policy.get("activeDeadlineSeconds")
        over = None
        if failed and limit is not None and 1 > limit:  # previousRetry 0 + 1 > backoffLimit
            over = f"Job {name} has failed because it has reached the specified backoff limit"
        elif deadline is not None and time.monotonic() - self.started[name] >= deadline:
            over = f"Job {name} has failed because it was active longer than specified deadline"
        if over:  # not finished yet, so DeletePodsAndServices deletes every pod
            self._stop(name, lambda pod: True)
            conditions.append(_condition("Failed", "Failed", over))
            return job
        chief = counts.get("Chief", {})
        new = None
        if chief.get("active") and "Running" not in [c["type"] for c in conditions]:
            new = _condition("Running", "Running", f"TFJob {ns}/{name} is running.")
        if chief.get("succeeded"):
            new = _condition("Succeeded", "Succeeded", f"TFJob {ns}/{name} successfully completed.")
        for kind, count in counts.items():
            if count["failed"]:
                new = _condition("Failed", "Failed", f"TFJob {ns}/{name} has failed because "
                                 f"{count['failed']} {kind} replica(s) failed.")  # fmt: skip
        if new:
            for condition in conditions:
                if condition["type"] == "Running" and new["type"] != "Running":
                    condition["status"] = "False"
            conditions.append(new)
            if new["type"] in ("Succeeded", "Failed"):  # cleanPodPolicy Running
                self._stop(name, lambda pod: pod.phase() in ("Running", "Pending"))
        return job
