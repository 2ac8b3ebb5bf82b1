"""The TrainJob the multi-worker Trainer creates (the default, multi_worker_job=trainjob;
components/training/trainjob.py) and the ClusterTrainingRuntime this project ships
(kubeflow/trainjob-runtime.yaml), admitted by the stand-in as Kubeflow Trainer v2.2.0's CRDs
(vendored in tests/stand_ins/crds/) and webhooks would (tests/stand_ins/trainer_v2.py), and
the pods Trainer, JobSet and the Job controller would make of them. Runs: test_cluster_job.py."""

import gzip
import hashlib
import json
import re
import time

import pytest
import yaml

from components.base.config import SECRET_KEYS, PipelineConfig
from components.training import cluster_job, job_kind, replica, trainjob
from components.training.cluster_job import replica_command
from components.training.trainjob import TrainJobKind
from pipelines.pipeline import cluster_job_settings
from tests.stand_ins.kube_api import ApiError
from tests.stand_ins.kube_stand_in import KubeStandIn
from tests.training.cluster_step import RUNTIME_FILE

NAMESPACE = "kubeflow-user"
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "run-1-trainer-pod", "uid": "a-uid"}
CRDS_README = RUNTIME_FILE.parents[1] / "tests" / "stand_ins" / "crds" / "README.md"


def _manifest(name: str = "trainer-abc", workers: int = 3, **overrides) -> dict:
    settings = cluster_job_settings(PipelineConfig(num_workers=workers, **overrides))
    return TrainJobKind().manifest(
        name, NAMESPACE, settings, workers, replica_command("s3://b/job.json"), OWNER, 3600, "step"
    )


@pytest.fixture
def api(tmp_path):
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets={}, operators=("trainjob",))
    stand_in.trainer.install_runtime(RUNTIME_FILE)
    yield stand_in
    stand_in.close()


def test_the_vendored_crds_are_the_upstream_files():
    table = dict(re.findall(r"\| `([^`]+)` \|[^|]+\| `([0-9a-f]{64})` \|", CRDS_README.read_text()))
    assert len(table) == 3
    for name, digest in table.items():
        data = (CRDS_README.parent / name).read_bytes()
        data = gzip.decompress(data) if name.endswith(".gz") else data
        assert hashlib.sha256(data).hexdigest() == digest, name


def test_the_trainjob_is_admitted_and_its_pods_get_the_trainers_image_gpus_and_addresses(api):
    body = _manifest(gpu_count=2)
    assert api.create(api.trainer.trainjobs, body, NAMESPACE, "Strict") == []
    spec = body["spec"]
    assert spec["runtimeRef"]["name"] == "tfx-tensorflow-distributed"
    assert spec["trainer"]["numNodes"] == 3 and spec["activeDeadlineSeconds"] == 3600
    assert body["metadata"]["ownerReferences"] == [OWNER]
    # What Trainer, JobSet and the Job controller make of it: 3 pods of the runtime's `node`
    # container with the Trainer's image, resources, GPU placement and credentials.
    pods = sorted(api.pods.values(), key=lambda p: p.name)
    assert [p.labels["batch.kubernetes.io/job-completion-index"] for p in pods] == ["0", "1", "2"]
    config = PipelineConfig.load(environ={})
    for pod in pods:
        assert pod.name.startswith(f"trainer-abc-node-0-{pod.labels[trainjob.INDEX_LABEL]}-")
        assert pod.labels[trainjob.JOBSET_NAME_LABEL] == "trainer-abc"
        assert pod.container["name"] == "node" and pod.container["image"] == config.gpu_image
        assert pod.container["command"] == replica_command("s3://b/job.json")
        assert pod.container["resources"]["limits"] == {
            "cpu": config.trainer_cpu, "memory": config.trainer_memory, "nvidia.com/gpu": "2"
        }  # fmt: skip
        assert pod.spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert pod.spec["tolerations"][0]["key"] == config.gpu_toleration_key
        assert pod.spec["restartPolicy"] == "Never"  # the runtime's: the first failure ends it
        assert pod.manifest["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        # Pod Security "restricted" (the stand-in's namespace enforces it: else no pods at all)
        assert pod.spec["securityContext"] == job_kind.POD_SECURITY
        assert pod.container["securityContext"] == job_kind.CONTAINER_SECURITY
        secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"]
                   for e in pod.container["env"] if "valueFrom" in e}  # fmt: skip
        assert secrets == dict.fromkeys(SECRET_KEYS, config.credentials_secret)
    # Each replica's address is its pod's DNS name under the JobSet's headless Service.
    hosts = {e["name"]: e["value"] for e in pods[0].container["env"] if "value" in e}
    assert hosts[trainjob.HOSTS_ENV].split(",") == [
        f"{p.spec['hostname']}.{p.spec['subdomain']}:{trainjob.PORT}" for p in pods
    ]
    # Without GPUs no GPU request, node selector or toleration.
    cpu_only = _manifest("trainer-cpu", gpu_count=0)
    assert "nvidia.com/gpu" not in json.dumps(cpu_only)
    (patch,) = cpu_only["spec"]["runtimePatches"]
    pod_patch = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]
    assert set(pod_patch["spec"]["template"]["spec"]) == {"securityContext", "containers"}


def test_each_replica_builds_tf_config_from_its_index(api):
    hosts = ",".join(trainjob.replica_hosts("trainer-abc", 3))
    configs = [json.loads(replica.tf_config({trainjob.HOSTS_ENV: hosts,
                                              "JOB_COMPLETION_INDEX": str(i)}))
               for i in range(3)]  # fmt: skip
    assert [c["task"] for c in configs] == [
        {"type": "chief", "index": 0}, {"type": "worker", "index": 0},
        {"type": "worker", "index": 1},
    ]  # fmt: skip
    assert configs[0]["cluster"] == {
        "chief": ["trainer-abc-node-0-0.trainer-abc:2222"],
        "worker": [
            "trainer-abc-node-0-1.trainer-abc:2222",
            "trainer-abc-node-0-2.trainer-abc:2222",
        ],
    }
    with pytest.raises(SystemExit, match="JOB_COMPLETION_INDEX 3 is not one of the 3"):
        replica.tf_config({trainjob.HOSTS_ENV: hosts, "JOB_COMPLETION_INDEX": "3"})
    with pytest.raises(SystemExit, match="needs TF_CONFIG, or TFX_REPLICA_HOSTS"):
        replica.tf_config({})


@pytest.mark.parametrize(
    "change, code, reason",
    [
        (lambda b: b["spec"]["trainer"].update(resourcePerNode={}), 400,
         'strict decoding error: unknown field "spec.trainer.resourcePerNode"'),
        (lambda b: b["spec"]["trainer"].update(numNodes="3"), 422, "not of type 'integer'"),
        (lambda b: b["spec"]["trainer"]["env"].append(b["spec"]["trainer"]["env"][0]), 422,
         'Duplicate value: ["TFX_REPLICA_HOSTS"]'),  # a list-map key twice
        (lambda b: b["metadata"].update(name="Trainer-1"), 422,
         "metadata.name must match RFC 1035 DNS label format"),
        (lambda b: b["spec"].update(managedBy="someone"), 422, "ManagedBy must be"),
        (lambda b: b["spec"]["runtimeRef"].update(name="tensorflow"), 403,
         "specified clusterTrainingRuntime must be created before the TrainJob is created"),
        (lambda b: b["spec"]["runtimePatches"][0].update(manager="trainer-step"), 403,
         "must be a domain-prefixed path"),
        (lambda b: b["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]
         ["replicatedJobs"][0].update(name="worker"), 403, "replicated job that doesn't exist"),
    ],
)  # fmt: skip
def test_an_invalid_trainjob_is_refused_as_trainer_v2_refuses_it(api, change, code, reason):
    body = _manifest(gpu_count=1)
    change(body)
    with pytest.raises(ApiError, match=re.escape(reason)) as refused:
        api.create(api.trainer.trainjobs, body, NAMESPACE, "Strict")
    assert refused.value.code == code
    assert not api.pods


def _job(runtime_spec: dict) -> dict:
    return runtime_spec["template"]["spec"]["replicatedJobs"][0]


def _pod(runtime_spec: dict) -> dict:
    return _job(runtime_spec)["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda spec: _pod(spec)["containers"][0].update(name="trainer"),
         "must contain the required container for the ancestor: trainer"),
        (lambda spec: _job(spec).update(replicas=2), "always must be 1"),
        (lambda spec: _pod(spec).pop("restartPolicy"),
         "cannot play a runtime with a restartPolicy other than Never"),
        # What the stand-in does not play it refuses: a JobSet failure policy restarts the Jobs
        # (jobset failure_policy.go), an affinity or a pod failure policy changes the pods'
        # fate.
        (lambda spec: spec["template"]["spec"].update(failurePolicy={"maxRestarts": 3}),
         "cannot play a runtime with spec.template.spec ['failurePolicy']"),
        (lambda spec: _pod(spec).update(affinity={}), "cannot play a runtime with pod.spec "
         "['affinity']"),
        (lambda spec: _job(spec)["template"]["spec"].update(podFailurePolicy={"rules": []}),
         "cannot play a runtime with job.spec ['podFailurePolicy']"),
    ],
)  # fmt: skip
def test_the_shipped_runtime_is_valid_and_a_broken_one_is_refused(tmp_path, change, reason):
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets={}, operators=("trainjob",))
    try:
        runtime = yaml.safe_load(RUNTIME_FILE.read_text())
        assert stand_in.create(stand_in.trainer.runtimes, json.loads(json.dumps(runtime)),
                               None, "Strict") == []  # fmt: skip
        runtime["metadata"]["name"] = "broken"
        change(runtime["spec"])
        with pytest.raises(ApiError, match=re.escape(reason)):
            stand_in.create(stand_in.trainer.runtimes, runtime, None, "Strict")
    finally:
        stand_in.close()


def test_a_name_too_long_for_jobset_gets_no_pods(api):
    """JobSet's webhook refuses the JobSet, not the TrainJob: the TrainJob sits without pods
    (the step's start timeout names it, test_cluster_job.py)."""
    name = "t" * 50
    api.create(api.trainer.trainjobs, _manifest(name), NAMESPACE, "Strict")
    time.sleep(0.1)
    assert not api.pods and "JobSet name is too long" in api.events[-1]
    # The product's names leave room: JobSet's pod-name rule at the most replicas allowed.
    name = cluster_job.job_name("a-pod-uid")
    assert re.fullmatch(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", f"{name}-node-0-63-abcde")


def test_pod_security_refuses_as_pod_security_admission_writes_it():
    """The texts of kubernetes/pod-security-admission v0.29.9 (policy/check_*.go, joined as
    checks.go's ForbiddenDetail, baseline checks before restricted ones as registry.go orders
    them); the product's security context passes."""
    from tests.stand_ins.pod_security import refusal

    bare = {"containers": [{"name": "node"}]}
    assert refusal("p", {}, bare) == (
        'pods "p" is forbidden: violates PodSecurity "restricted:latest": '
        'allowPrivilegeEscalation != false (container "node" must set securityContext.'
        'allowPrivilegeEscalation=false), unrestricted capabilities (container "node" must set '
        'securityContext.capabilities.drop=["ALL"]), runAsNonRoot != true (pod or container '
        '"node" must set securityContext.runAsNonRoot=true), seccompProfile (pod or container '
        '"node" must set securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost")'
    )
    product = {"securityContext": job_kind.POD_SECURITY, "containers": [
        {"name": "node", "securityContext": job_kind.CONTAINER_SECURITY}]}  # fmt: skip
    assert refusal("p", {}, product) is None
    host = dict(product, hostNetwork=True, volumes=[{"name": "h", "hostPath": {"path": "/"}}])
    assert refusal("p", {}, host).endswith(
        '"restricted:latest": host namespaces (hostNetwork=true), restricted volume types '
        '(volume "h" uses restricted volume type "hostPath")'
    )  # hostPath once: restrictedVolumes overrides baseline's hostPathVolumes
    with pytest.raises(ValueError, match="cannot play"):  # AppArmor: refused, not ignored
        annotation = "container.apparmor.security.beta.kubernetes.io/node"
        refusal("p", {"annotations": {annotation: "unconfined"}}, product)
