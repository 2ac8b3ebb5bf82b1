"""Kubeflow Trainer v2.2.0's TrainJob controller, with the JobSet and Job controllers under it,
on the Kubernetes stand-in (kube_api.py). Refs are to kubeflow/trainer at v2.2.0 unless named;
JobSet's to v0.11 (Trainer v2.2.0's manifests deploy v0.11.0, its go.mod has v0.11.1: they
differ in status and indexing only).

What it plays:
- admission of a ClusterTrainingRuntime: its CRD (schema, CEL) and the runtime webhook
  (pkg/webhooks/clustertrainingruntime_webhook.go, trainingruntime_webhook.go): a replicated
  job labelled `trainer.kubeflow.org/trainjob-ancestor-step: trainer` has replicas 1 ("always
  must be 1") and a container `node` ("must contain the required container for the ancestor:
  trainer");
- admission of a TrainJob: its CRD and the TrainJob webhook (pkg/webhooks/trainjob_webhook.go):
  the runtime kind must be one Trainer serves ("unsupported runtime: <kind>.<group>"), the
  ClusterTrainingRuntime must exist (pkg/runtime/core/clustertrainingruntime.go: "... not found:
  specified clusterTrainingRuntime must be created before the TrainJob is created"), and
  runtimePatches follow the JobSet plugin's rules (plugins/jobset/jobset.go Validate: a
  domain-prefixed manager, replicated jobs and containers that exist, no env for `node`);
- the JobSet it builds (pkg/runtime/core/trainingruntime.go newRuntimeInfo, plugins/plainml,
  plugins/jobset/builder.go Trainer): the runtime's trainer replicated job with the patches'
  nodeSelector, tolerations, serviceAccountName, the pod's and the `node` container's
  securityContext and labels/annotations merged in (strategic merge: maps merge, lists
  replace), `spec.trainer` image, command, args and resourcesPerNode
  replacing the `node` container's, its env upserted, and numNodes pods; a JobSet whose names
  are too long for JobSet's webhook (pkg/webhooks/jobset_webhook.go: job and pod names must be
  DNS-1035 labels) is never created and the TrainJob gets no pods, only an event;
- the Indexed Job's pods (Kubernetes' Job controller): named `<job>-<index>-<5 letters>`,
  hostname `<job>-<index>` under the subdomain `<trainjob>` (JobSet's headless Service), with
  JOB_COMPLETION_INDEX and the JobSet's and Job's labels; the stand-in's DNS (kube_api.py)
  answers those names on loopback;
- status (plugins/jobset/jobset.go, JobSet's failure_policy.go, trainjob_controller.go): none
  until the job ends; Failed "FailedJobs" with "jobset failed due to one or more job failures
  (first failed job: <name>-node-0)" at the first failed pod (backoffLimit 0: the Job fails and
  its other pods are deleted); Complete "AllJobsCompleted" / "jobset completed successfully"
  when every index succeeded; Failed "DeadlineExceeded" / "TrainJob exceeded its active
  deadline" past `spec.activeDeadlineSeconds` from creation, with the JobSet (every pod)
  deleted;
- deletion deletes every pod (owner references: TrainJob -> JobSet -> Job -> pods).
What it cannot play it refuses at admission, saying so: a runtime with any key beyond those it
plays (_RUNTIME_KEYS: no JobSet failure, success or startup policy, network or managedBy, no
podGroupPolicy or mlPolicy framework, no Job deadline, parallelism or pod failure policy, no
affinity, volumes, init containers or scheduler name), whose trainer job restarts pods
(restartPolicy other than Never, backoffLimit other than 0) or is not Indexed, or with more than
one replicated job; TrainingRuntime (namespaced) runtimes; patch fields other than those above;
initializers; suspend.
"""

from __future__ import annotations

import json
import random
import re
import string
import time
from pathlib import Path

from tests.stand_ins.kube_api import KubeApi
from tests.stand_ins.kube_pods import now_text
from tests.stand_ins.kube_schema import DNS_1035, Resource

CRDS = Path(__file__).parent / "crds"
GROUP = "trainer.kubeflow.org"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
_DOMAIN_PATH = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)+[a-z]{2,}/[-A-Za-z0-9_.]+$")
_FRAMEWORKS = ("torch", "mpi", "jax", "xgboost", "flux")
_PATCHABLE_POD = {"nodeSelector", "tolerations", "serviceAccountName", "securityContext"}
_PATCHABLE_CONTAINER = {"name", "securityContext"}

TRAINJOB_CEL = {
    "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')":
        lambda v: bool(re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", v["metadata"]["name"])),
    "size(self.metadata.name) <= 63": lambda v: len(v["metadata"]["name"]) <= 63,
    "self in ['trainer.kubeflow.org/trainjob-controller', 'kueue.x-k8s.io/multikueue']":
        lambda v: v in ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue"),
    "has(self.lastUpdatedTime)": lambda v: "lastUpdatedTime" in v,
}  # fmt: skip
RUNTIME_CEL = {
    "[has(self.torch), has(self.mpi), has(self.jax), has(self.xgboost),has(self.flux)]"
    ".filter(x, x).size() <= 1": lambda v: sum(k in v for k in _FRAMEWORKS) <= 1,
    "self >= 1": lambda v: v >= 1,
    "!(has(self.startupPolicy) && self.startupPolicy.startupPolicyOrder == 'InOrder' && "
    "self.replicatedJobs.exists(x, has(x.dependsOn)))": lambda v: not (
        v.get("startupPolicy", {}).get("startupPolicyOrder") == "InOrder"
        and any("dependsOn" in j for j in v.get("replicatedJobs", []))
    ),
    "self.templates.all(t, !has(t.metadata.namespace) || size(t.metadata.namespace) == 0)":
        lambda v: all(not t.get("metadata", {}).get("namespace") for t in v.get("templates", [])),
}  # fmt: skip


def _trainer_job(spec: dict) -> dict | None:
    for job in spec.get("template", {}).get("spec", {}).get("replicatedJobs", []):
        if job.get("template", {}).get("metadata", {}).get("labels", {}).get(ANCESTOR) == "trainer":
            return job
    return None


def runtime_webhook(body: dict) -> list[str]:
    """clustertrainingruntime_webhook.go, plus what the stand-in cannot play."""
    errors = []
    jobs = body["spec"].get("template", {}).get("spec", {}).get("replicatedJobs", [])
    for i, job in enumerate(jobs):
        if job.get("template", {}).get("metadata", {}).get("labels", {}).get(ANCESTOR) != "trainer":
            continue
        where = f"spec.template.spec.replicatedJobs[{i}]"
        if job.get("replicas", 1) != 1:
            errors.append(f"{where}.replicas: Invalid value: {job['replicas']}: always must be 1")
        containers = job["template"].get("spec", {}).get("template", {}).get("spec", {}).get(
            "containers", [])  # fmt: skip
        if "node" not in [c.get("name") for c in containers]:
            errors.append(
                f"{where}.template.spec.template.spec.containers: Invalid value: "
                "must contain the required container for the ancestor: trainer"
            )
    return errors or _not_played_runtime(body)


# What the stand-in plays of a runtime, level by level; any other key is refused (a JobSet
# failurePolicy restarts Jobs, managedBy hands the JobSet to another controller, an affinity or
# volume changes where and how pods run: jobset v0.11 failure_policy.go, jobset_controller.go).
_RUNTIME_KEYS = {
    "spec": {"mlPolicy", "template"},
    "spec.mlPolicy": {"numNodes"},
    "spec.template": {"spec"},
    "spec.template.spec": {"replicatedJobs"},
    "replicatedJob": {"name", "replicas", "template", "groupName"},  # groupName: the default
    "job": {"metadata", "spec"},
    "job.spec": {"backoffLimit", "completionMode", "template"},
    "pod": {"metadata", "spec"},
    "pod.spec": {"containers", "restartPolicy", *_PATCHABLE_POD},
    "container": {"name", "image", "imagePullPolicy", "command", "args", "env", "resources",
                  "securityContext", "ports"},
}  # fmt: skip


def _not_played_runtime(body: dict) -> list[str]:
    spec = body["spec"]
    template = spec.get("template", {})
    levels = [
        ("spec", spec),
        ("spec.mlPolicy", spec.get("mlPolicy", {})),
        ("spec.template", template),
        ("spec.template.spec", template.get("spec", {})),
    ]
    jobs = template.get("spec", {}).get("replicatedJobs", [])
    for job in jobs:
        job_template = job.get("template", {})
        pod = job_template.get("spec", {}).get("template", {})
        levels += [
            ("replicatedJob", job),
            ("job", job_template),
            ("job.spec", job_template.get("spec", {})),
            ("pod", pod),
            ("pod.spec", pod.get("spec", {})),
        ]
        levels += [("container", c) for c in pod.get("spec", {}).get("containers", [])]
    why = [f"{level} {sorted(set(value) - _RUNTIME_KEYS[level])}" for level, value in levels
           if set(value) - _RUNTIME_KEYS[level]]  # fmt: skip
    job = _trainer_job(spec)
    if len(jobs) != 1 or not job:
        why.append("other than one replicated job, the trainer's")
    else:
        job_spec = job["template"].get("spec", {})
        if job_spec.get("backoffLimit", 6) != 0:  # Kubernetes' default: 6 retries
            why.append("a Job backoffLimit other than 0")
        if job.get("groupName", "default") != "default":
            why.append("a replicated job groupName")
        if job_spec.get("completionMode") != "Indexed":
            why.append("a Job completionMode other than Indexed")
        # JobSet's webhook defaults an empty restartPolicy to OnFailure (jobset_webhook.go).
        if job_spec.get("template", {}).get("spec", {}).get("restartPolicy") != "Never":
            why.append("a restartPolicy other than Never")
    return [f"the stand-in cannot play a runtime with {w}, so it refuses it" for w in why]


class TrainerV2:
    def __init__(self, api: KubeApi):
        self.api = api
        self.make_pods = True  # False: jobs admitted, never given pods
        self.pods: dict[str, list[str]] = {}
        self.started: dict[str, float] = {}
        self.runtimes = api.serve(Resource(
            CRDS / "trainer.kubeflow.org_clustertrainingruntimes.yaml.gz", "v1alpha1",
            webhook="validator.clustertrainingruntime.trainer.kubeflow.org", cel=RUNTIME_CEL,
            admit=runtime_webhook,
        ))  # fmt: skip
        self.trainjobs = api.serve(Resource(
            CRDS / "trainer.kubeflow.org_trainjobs.yaml.gz", "v1alpha1",
            webhook="validator.trainjob.trainer.kubeflow.org", cel=TRAINJOB_CEL,
            admit=self._webhook, on_create=self._create, on_get=self._status,
            on_delete=self._delete,
        ))  # fmt: skip

    def install_runtime(self, path: Path) -> None:
        """`kubectl apply -f` (strict field validation, kubectl's default) of a runtime file."""
        import yaml

        self.api.create(self.runtimes, yaml.safe_load(path.read_text()), None, "Strict")

    def _runtime(self, name: str) -> dict | None:
        with self.api.lock:
            return self.api.objects.get((self.runtimes.plural, name))

    # -- admission --------------------------------------------------------------------------

    def _webhook(self, body: dict) -> list[str]:
        spec = body["spec"]
        ref = spec["runtimeRef"]  # apiGroup and kind defaulted by the CRD
        if (ref["kind"], ref["apiGroup"]) != ("ClusterTrainingRuntime", GROUP):
            if (ref["kind"], ref["apiGroup"]) == ("TrainingRuntime", GROUP):
                return ["the stand-in cannot play a namespaced TrainingRuntime, so it refuses"]
            return [f"unsupported runtime: {ref['kind']}.{ref['apiGroup']}"]
        runtime = self._runtime(ref["name"])
        if runtime is None:
            return [
                f"spec.RuntimeRef: Invalid value: {json.dumps(ref)}: "
                f'clustertrainingruntimes.{GROUP} "{ref["name"]}" not found: specified '
                "clusterTrainingRuntime must be created before the TrainJob is created"
            ]
        errors = []
        job = _trainer_job(runtime["spec"])
        for i, patch in enumerate(spec.get("runtimePatches", [])):
            where = f"spec.runtimePatches[{i}]"
            if not _DOMAIN_PATH.match(patch["manager"]):
                errors.append(f'{where}.manager: Invalid value: "{patch["manager"]}": must be a '
                              'domain-prefixed path (such as "acme.io/foo")')  # fmt: skip
            jobs = (patch.get("trainingRuntimeSpec", {}).get("template", {}).get("spec", {})
                    .get("replicatedJobs", []))  # fmt: skip
            for patched in jobs:
                if patched["name"] != job["name"]:
                    errors.append(f"{where}: must not have replicated job that doesn't exist in "
                                  "the runtime job template")  # fmt: skip
                pod = patched.get("template", {}).get("spec", {}).get("template", {})
                for container in pod.get("spec", {}).get("containers", []):
                    if container["name"] != "node":
                        errors.append(f"{where}: must not have container that doesn't exist in "
                                      f"the runtime job {job['name']}")  # fmt: skip
                    elif container.get("env"):
                        errors.append(f"{where}: must not have envs for the dataset-initializer, "
                                      "model-initializer, node containers")  # fmt: skip
                    elif set(container) - _PATCHABLE_CONTAINER:
                        errors.append(
                            f"{where}: the stand-in cannot play container patches of "
                            f"{sorted(set(container) - _PATCHABLE_CONTAINER)}"
                        )
                unplayed = set(pod.get("spec", {})) - _PATCHABLE_POD - {"containers"}
                if unplayed:
                    errors.append(
                        f"{where}: the stand-in cannot play patches of {sorted(unplayed)}"
                    )
        if spec.get("initializer") or spec.get("suspend"):
            errors.append("the stand-in cannot play initializers or suspend, so it refuses")
        return errors

    # -- the controllers --------------------------------------------------------------------

    def _create(self, body: dict) -> None:
        name, spec = body["metadata"]["name"], body["spec"]
        runtime = self._runtime(spec["runtimeRef"]["name"])
        job = json.loads(json.dumps(_trainer_job(runtime["spec"])))
        pod = job["template"]["spec"]["template"]
        for patch in spec.get("runtimePatches", []):
            for patched in patch["trainingRuntimeSpec"]["template"]["spec"].get(
                "replicatedJobs", []
            ):
                template = patched.get("template", {}).get("spec", {}).get("template", {})
                for key in ("labels", "annotations"):
                    merged = pod.setdefault("metadata", {}).setdefault(key, {})
                    merged.update(template.get("metadata", {}).get(key, {}))
                for key, value in template.get("spec", {}).items():
                    if key in ("nodeSelector", "securityContext"):
                        _merge(pod["spec"].setdefault(key, {}), value)
                    elif key == "containers":
                        for patched_container in value:
                            for target in pod["spec"]["containers"]:
                                if target["name"] == patched_container["name"]:
                                    _merge(target, patched_container)
                    else:
                        pod["spec"][key] = value
        trainer = spec.get("trainer", {})
        (container,) = [c for c in pod["spec"]["containers"] if c["name"] == "node"]
        for key in ("image", "command", "args"):
            if trainer.get(key) is not None:
                container[key] = trainer[key]
        if trainer.get("resourcesPerNode") is not None:
            container["resources"] = trainer["resourcesPerNode"]
        env = {e["name"]: e for e in container.get("env", [])}
        env.update({e["name"]: e for e in trainer.get("env", [])})
        container["env"] = list(env.values())
        count = trainer.get("numNodes") or runtime["spec"].get("mlPolicy", {}).get("numNodes") or 1
        job_name = f"{name}-{job['name']}-0"
        self.pods[name], self.started[name] = [], time.monotonic()
        if not self.make_pods:
            return
        if not DNS_1035.match(job_name) or not DNS_1035.match(f"{job_name}-{count - 1}-abcde"):
            # JobSet's webhook refuses the JobSet; Trainer only records an event.
            self.api.events.append(
                f"TrainJob/{name}: Warning TrainJobResourcesCreationFailed: JobSet name is too "
                "long, pod names generated for this JobSet will exceed 63 characters"
            )
            return
        for index in range(count):
            labels = dict(pod.get("metadata", {}).get("labels", {}), **{
                "jobset.sigs.k8s.io/jobset-name": name,
                "jobset.sigs.k8s.io/replicatedjob-name": job["name"],
                "jobset.sigs.k8s.io/job-index": "0",
                "batch.kubernetes.io/job-name": job_name,
                "batch.kubernetes.io/job-completion-index": str(index),
            })  # fmt: skip
            suffix = "".join(random.choices(string.ascii_lowercase + string.digits, k=5))
            manifest = {
                "metadata": {"name": f"{job_name}-{index}-{suffix}", "labels": labels,
                             "annotations": pod.get("metadata", {}).get("annotations", {})},
                "spec": dict(json.loads(json.dumps(pod["spec"])),
                             hostname=f"{job_name}-{index}", subdomain=name),
            }  # fmt: skip
            env = {"JOB_COMPLETION_INDEX": str(index)}
            if self.api.add_pod(manifest, env, f"Job/{job_name}", "FailedCreate"):
                self.pods[name].append(manifest["metadata"]["name"])

    def _delete(self, body: dict) -> None:
        for pod in self.pods.pop(body["metadata"]["name"], []):
            self.api.delete_pod(pod)

    def _status(self, trainjob: dict) -> dict:
        name = trainjob["metadata"]["name"]
        status = trainjob.setdefault("status", {})
        conditions = status.setdefault("conditions", [])
        if any(c["type"] in ("Complete", "Failed") for c in conditions):
            return trainjob
        pods = [p for p in map(self.api.pod, self.pods.get(name, [])) if p is not None]
        deadline = trainjob["spec"].get("activeDeadlineSeconds")

        def end(kind: str, reason: str, message: str) -> dict:
            now = now_text()
            conditions.append({"type": kind, "status": "True", "reason": reason,
                               "message": message, "lastTransitionTime": now})  # fmt: skip
            return trainjob

        if deadline is not None and time.monotonic() - self.started[name] >= deadline:
            self._delete(trainjob)  # Trainer deletes the JobSet
            return end("Failed", "DeadlineExceeded", "TrainJob exceeded its active deadline")
        phases = [p.phase() for p in pods]
        job = f"{name}-node-0"
        status["jobsStatus"] = [{"name": "node", "active": int("Running" in phases or
                                 "Pending" in phases), "ready": 0, "succeeded": 0,
                                 "failed": 0, "suspended": 0}]  # fmt: skip
        if "Failed" in phases:  # backoffLimit 0: the Job fails and deletes its other pods
            for pod in pods:
                if pod.phase() in ("Running", "Pending"):
                    self.api.delete_pod(pod.name)
            status["jobsStatus"][0].update(active=0, failed=1)
            return end("Failed", "FailedJobs", "jobset failed due to one or more job failures "
                       f"(first failed job: {job})")  # fmt: skip
        if pods and all(phase == "Succeeded" for phase in phases):
            status["jobsStatus"][0].update(active=0, succeeded=1)
            return end("Complete", "AllJobsCompleted", "jobset completed successfully")
        return trainjob


def _merge(target: dict, patch: dict) -> None:
    """A strategic merge patch of what the stand-in patches (apimachinery strategicpatch, as
    trainingruntime.go mergeRuntimePatches applies it): maps merge key by key, lists without a
    patch strategy (tolerations, capabilities.drop) are replaced."""
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = json.loads(json.dumps(value))
