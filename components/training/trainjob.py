"""A Kubeflow Trainer v2 TrainJob (`trainer.kubeflow.org/v1alpha1`, Trainer v2.2) as the job of
a multi-worker Trainer (components/training/cluster_job.py runs it).

Trainer ships no TensorFlow runtime (kubeflow/trainer#2699); this project ships a plain one,
kubeflow/trainjob-runtime.yaml: a ClusterTrainingRuntime whose replicated job `node` runs the
container `node` with restartPolicy Never and backoffLimit 0. The TrainJob puts the Trainer's
image, command, resources and the number of replicas in `spec.trainer`, and the GPU node
selector, tolerations and security context (job_kind.POD_SECURITY) in a runtime patch. What each
pod gets (Trainer v2.2.0 and JobSet v0.11 sources):

- the TrainJob's JobSet has the TrainJob's name; its one Job `<name>-node-0` is Indexed with
  parallelism = completions = numNodes (pkg/runtime/framework/plugins/jobset/jobset.go Build,
  plainml.go); pod i's hostname is `<name>-node-0-<i>` under the subdomain `<name>`, a headless
  Service (jobset_controller.go; Trainer's own endpoints, jobset.go, are "%s-%s-%d-%d.%s");
- the Job controller gives each pod JOB_COMPLETION_INDEX; nothing gives it the cluster, so the
  step passes every replica's address in TFX_REPLICA_HOSTS and the replica builds TF_CONFIG
  from the two (components/training/replica.py): index 0 is the chief;
- status: no Created or Running condition; `Complete` (AllJobsCompleted) or `Failed`
  (FailedJobs: "jobset failed due to one or more job failures (first failed job: ...)", or
  DeadlineExceeded past `activeDeadlineSeconds`, after which Trainer deletes the JobSet);
- pods are selected by `jobset.sigs.k8s.io/jobset-name=<name>`; deleting the TrainJob deletes
  its JobSet, Job and pods (owner references).
"""

from __future__ import annotations

from components.training.job_kind import State, job_metadata, replica_pod

GROUP, VERSION, PLURAL, KIND = "trainer.kubeflow.org", "v1alpha1", "trainjobs", "TrainJob"
CONTAINER = "node"  # the trainer container a runtime must have (pkg/webhooks: required container)
REPLICATED_JOB = "node"  # kubeflow/trainjob-runtime.yaml's replicated job
PORT = 2222  # TensorFlow's gRPC server in each replica; a headless Service needs no port list
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
INDEX_LABEL = "batch.kubernetes.io/job-completion-index"  # the Job controller's (k8s >= 1.28)
HOSTS_ENV = "TFX_REPLICA_HOSTS"
# runtimePatches are keyed by who patches (a domain-prefixed path, jobset.go Validate).
PATCH_MANAGER = "tfx-pipeline.io/trainer-step"
RUNTIME_FILE = "kubeflow/trainjob-runtime.yaml"


def replica_hosts(name: str, workers: int) -> list[str]:
    """Each replica's address, by JOB_COMPLETION_INDEX: `<jobset>-<replicated job>-<job
    index>-<pod index>.<subdomain>` (Trainer's jobset.go endpoints; the subdomain defaults to
    the JobSet's name, which is the TrainJob's)."""
    return [f"{name}-{REPLICATED_JOB}-0-{i}.{name}:{PORT}" for i in range(workers)]


class TrainJobKind:
    kind, group, version, plural, container = KIND, GROUP, VERSION, PLURAL, CONTAINER
    pod_refused_event = "FailedCreate"  # the Job controller's (pkg/controller/job)
    install_hint = (
        "multi_worker_job=trainjob needs Kubeflow Trainer v2 (v2.2 or later, with JobSet) "
        f"running in the cluster and the ClusterTrainingRuntime in {RUNTIME_FILE} applied; on a "
        "cluster with the Training Operator v1 instead, set multi_worker_job=tfjob "
        "(kubeflow/README.md, multi-worker training)."
    )

    def manifest(self, name: str, namespace: str, settings: dict, workers: int, command: list[str],
                 owner: dict | None, deadline_seconds: int, step: str) -> dict:  # fmt: skip
        pod = replica_pod(settings)
        env = [{"name": HOSTS_ENV, "value": ",".join(replica_hosts(name, workers))}, *pod.env]
        spec: dict = {
            "runtimeRef": {
                "apiGroup": GROUP,
                "kind": "ClusterTrainingRuntime",
                "name": settings["runtime"],
            },  # fmt: skip
            # Trainer fails the job past it and deletes its pods (trainjob_controller.go).
            "activeDeadlineSeconds": deadline_seconds,
            "trainer": {
                "image": settings["image"],
                "command": command,
                "numNodes": workers,
                "env": env,
                "resourcesPerNode": pod.resources,
            },  # fmt: skip
        }
        # spec.trainer has no placement or security context: a runtime patch sets them (Trainer
        # merges it into the runtime's pod template, trainingruntime.go mergeRuntimePatches).
        pod_patch = {
            **pod.placement,
            "securityContext": pod.security,
            "containers": [{"name": CONTAINER, "securityContext": pod.container_security}],
        }
        spec["runtimePatches"] = [{
            "manager": PATCH_MANAGER,
            "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
                {"name": REPLICATED_JOB, "template": {"spec": {"template": {"spec": pod_patch}}}},
            ]}}},
        }]  # fmt: skip
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": KIND,
                "metadata": job_metadata(name, namespace, owner, step), "spec": spec}  # fmt: skip

    def state(self, job: dict) -> State:
        status = job.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions", []) if c["status"] == "True"}
        if "Failed" in conditions:
            failed = conditions["Failed"]
            return State("Failed", f"TrainJob {job['metadata']['name']} failed "
                         f"({failed.get('reason')}): {failed.get('message', '')}.",
                         deadline=failed.get("reason") == "DeadlineExceeded")  # fmt: skip
        if "Complete" in conditions:
            return State("Succeeded")
        return State("Pending")

    def pod_selector(self, name: str) -> str:
        return f"{JOBSET_NAME_LABEL}={name}"

    def replica(self, pod) -> str:
        # The label is Kubernetes 1.28+'s; the annotation of the same name is older.
        known = {**(pod.metadata.annotations or {}), **(pod.metadata.labels or {})}
        if INDEX_LABEL not in known:
            return f"pod {pod.metadata.name}"
        index = int(known[INDEX_LABEL])
        return "chief-0" if index == 0 else f"worker-{index - 1}"
