"""A Training Operator v1 TFJob (`kubeflow.org/v1`, operator v1.8) as the job of a multi-worker
Trainer (components/training/cluster_job.py runs it): one Chief and `workers - 1` Workers. Kept
for clusters that still run the Training Operator; Kubeflow's distribution removed it after
26.03.1, and TrainJob (components/training/trainjob.py) is the default.

The operator gives each replica its TF_CONFIG (pkg/controller.v1/tensorflow/tensorflow.go
genTFConfigJSONStr). Replicas run with restartPolicy Never, so the first failed replica fails the
TFJob (tfjob_controller.go UpdateJobStatus: "has failed because N Worker replica(s) failed").
"""

from __future__ import annotations

from components.training.job_kind import State, job_metadata, replica_pod

GROUP, VERSION, PLURAL, KIND = "kubeflow.org", "v1", "tfjobs", "TFJob"
# The operator finds the TensorFlow container and its port by these names (v1.8.1
# pkg/apis/kubeflow.org/v1/tensorflow_types.go TFJobDefaultContainerName, ...PortName, ...Port).
CONTAINER, PORT_NAME, PORT = "tensorflow", "tfjob-port", 2222
JOB_NAME_LABEL = "training.kubeflow.org/job-name"  # common_types.go JobNameLabel
REPLICA_TYPE_LABEL = "training.kubeflow.org/replica-type"  # lower-case type: "chief", "worker"
REPLICA_INDEX_LABEL = "training.kubeflow.org/replica-index"


def pod_template(settings: dict, command: list[str], container: dict) -> dict:
    """The replicas' pod: the Trainer's image, resources, GPU nodes, credentials and security
    context."""
    pod = replica_pod(settings)
    spec = dict(pod.placement, securityContext=pod.security, containers=[{
        **container, "image": settings["image"], "command": command, "env": pod.env,
        "resources": pod.resources, "securityContext": pod.container_security,
    }])  # fmt: skip
    # Istio's sidecar (injected in Kubeflow profile namespaces) would keep a finished replica's
    # pod Running, so the controller would never see the chief succeed; KFP's own pods opt out.
    return {"metadata": {"annotations": {"sidecar.istio.io/inject": "false"}}, "spec": spec}


class TFJobKind:
    kind, group, version, plural, container = KIND, GROUP, VERSION, PLURAL, CONTAINER
    pod_refused_event = "FailedCreatePod"  # v1.8.1 pkg/controller.v1/control/pod_control.go
    install_hint = (
        "multi_worker_job=tfjob needs Kubeflow's Training Operator v1 (kubeflow.org/v1 TFJob) "
        "running in the cluster; on a cluster with Kubeflow Trainer v2 use multi_worker_job="
        "trainjob (kubeflow/README.md, multi-worker training)."
    )

    def manifest(self, name: str, namespace: str, settings: dict, workers: int, command: list[str],
                 owner: dict | None, deadline_seconds: int, step: str) -> dict:  # fmt: skip
        container = {"name": CONTAINER, "ports": [{"name": PORT_NAME, "containerPort": PORT}]}
        template = pod_template(settings, command, container)

        def replica(count: int) -> dict:
            return {"replicas": count, "restartPolicy": "Never", "template": template}

        replicas = {"Chief": replica(1)}
        if workers > 1:
            replicas["Worker"] = replica(workers - 1)
        return {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": KIND,
            "metadata": job_metadata(name, namespace, owner, step),
            "spec": {
                # No backoffLimit: restartPolicy Never already fails the job on the first failed
                # replica (tfjob_controller.go UpdateJobStatus), and cleanPodPolicy Running then
                # deletes only the replicas still running, keeping the failed one's log. With a
                # backoffLimit the operator deletes every pod, the failed one too, and reports
                # only "reached the specified backoff limit" (common/job.go ReconcileJobs).
                "runPolicy": {
                    "cleanPodPolicy": "Running",
                    "activeDeadlineSeconds": deadline_seconds,
                },
                "tfReplicaSpecs": replicas,
            },
        }

    def state(self, job: dict) -> State:
        status = job.get("status") or {}
        conditions = {c["type"]: c for c in status.get("conditions", []) if c["status"] == "True"}
        for phase in ("Failed", "Succeeded", "Running"):
            if phase in conditions:
                message = conditions[phase].get("message", "")
                # common/job.go: "Job <name> has failed because it was active longer than
                # specified deadline"
                return State(phase, message, deadline="longer than specified deadline" in message)
        return State("Pending")

    def pod_selector(self, name: str) -> str:
        return f"{JOB_NAME_LABEL}={name}"

    def replica(self, pod) -> str:
        labels = pod.metadata.labels or {}
        return f"{labels.get(REPLICA_TYPE_LABEL)}-{labels.get(REPLICA_INDEX_LABEL)}"
