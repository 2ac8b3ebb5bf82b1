"""The TFJob the multi-worker Trainer creates with multi_worker_job=tfjob (Training Operator v1,
components/training/tfjob.py), admitted by the stand-in as the API server and the operator's
webhook would (tests/stand_ins/tfjob_operator.py); its runs are in test_cluster_job.py."""

import json

import pytest

from components.base.config import SECRET_KEYS, PipelineConfig
from components.base.launcher_paths import local_path, remote_uri
from components.training import job_kind
from components.training.cluster_job import replica_command
from components.training.tfjob import TFJobKind
from pipelines.kubeflow import kubeflow_runner
from pipelines.pipeline import cluster_job_settings
from tests.stand_ins.kube_api import ApiError
from tests.stand_ins.kube_stand_in import KubeStandIn

NAMESPACE = "kubeflow-user"
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "run-1-trainer-pod", "uid": "a-uid"}


def _manifest(**overrides) -> dict:
    settings = cluster_job_settings(
        PipelineConfig(num_workers=3, multi_worker_job="tfjob", **overrides)
    )
    return TFJobKind().manifest(
        "trainer-abc",
        NAMESPACE,
        settings,
        3,
        replica_command("s3://b/job.json"),
        OWNER,
        3600,
        "step",
    )


@pytest.fixture
def api(tmp_path):
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets={}, operators=("tfjob",))
    yield stand_in
    stand_in.close()


def test_the_tfjob_is_valid_against_the_training_operator_crd_and_webhook(api):
    body = _manifest(gpu_count=2)
    assert api.create(api.tfjobs.resource, body, NAMESPACE, "Strict") == []
    specs = body["spec"]["tfReplicaSpecs"]
    assert (specs["Chief"]["replicas"], specs["Worker"]["replicas"]) == (1, 2)
    pod = specs["Worker"]["template"]["spec"]
    (container,) = pod["containers"]
    config = PipelineConfig.load(environ={})
    assert container["image"] == config.gpu_image  # the Trainer's image, the Trainer's GPUs
    assert container["resources"]["limits"] == {
        "cpu": config.trainer_cpu, "memory": config.trainer_memory, "nvidia.com/gpu": "2"
    }  # fmt: skip
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert pod["tolerations"][0]["key"] == config.gpu_toleration_key
    assert {e["name"] for e in container["env"]} == set(SECRET_KEYS)
    # Pod Security "restricted" (the stand-in's namespace enforces it: else no pods at all)
    assert pod["securityContext"] == job_kind.POD_SECURITY
    assert container["securityContext"] == job_kind.CONTAINER_SECURITY
    assert len(api.pods) == 3
    assert all(
        e["valueFrom"]["secretKeyRef"]["name"] == config.credentials_secret
        for e in container["env"]
    )
    assert body["metadata"]["ownerReferences"] == [OWNER]
    # No backoffLimit: with one, the operator deletes the failed replica's pod and its log
    # before the step can read them (common/job.go ReconcileJobs).
    assert "backoffLimit" not in body["spec"]["runPolicy"]
    assert body["spec"]["runPolicy"]["activeDeadlineSeconds"] == 3600
    assert specs["Chief"]["restartPolicy"] == "Never"
    annotations = specs["Worker"]["template"]["metadata"]["annotations"]
    assert annotations == {"sidecar.istio.io/inject": "false"}
    # Without GPUs no GPU request, node selector or toleration.
    cpu_only = _manifest(gpu_count=0)["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]
    assert "nodeSelector" not in cpu_only and "nvidia.com/gpu" not in json.dumps(cpu_only)


@pytest.mark.parametrize(
    "change, code, reason",
    [
        (lambda b: b["spec"]["tfReplicaSpecs"]["Chief"].update(replicas="1"), 422, "not of type"),
        (lambda b: b["spec"].update(tfReplicaSpec={}), 400,
         'strict decoding error: unknown field "spec.tfReplicaSpec"'),  # a misspelled field
        (lambda b: b["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
         .update(resource={}), 400, 'unknown field "spec.tfReplicaSpecs.Chief.template.spec.'
         'containers[0].resource"'),  # one deep in the pod template
        (lambda b: b["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
         .update(name="trainer"), 403, "no container named tensorflow"),
        (lambda b: b["metadata"].update(name="Trainer_1"), 403, "DNS-1035"),
    ],
)  # fmt: skip
def test_an_invalid_tfjob_is_refused_by_the_stand_in_as_by_the_api_server(
    api, change, code, reason
):
    """The checks above can fail: each of these is refused, naming the field."""
    body = _manifest()
    change(body)
    with pytest.raises(ApiError, match=reason.replace("[", r"\[").replace("]", r"\]")) as refused:
        api.create(api.tfjobs.resource, body, NAMESPACE, "Strict")
    assert refused.value.code == code


def test_multi_worker_compiles_into_a_light_step_that_carries_the_cluster_job_settings():
    config = PipelineConfig(num_workers=2)
    spec, platform = kubeflow_runner.compile_documents(config)
    label = spec["components"]["Trainer"]["executorLabel"]
    container = spec["deploymentSpec"]["executors"][label]["container"]
    defaults = PipelineConfig.load(environ={})
    assert container["image"] == defaults.cpu_image and "accelerator" not in container["resources"]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert "nodeSelector" not in executors[label]  # the step's pod waits; the replicas train
    parameters = spec["root"]["dag"]["tasks"]["trainer"]["inputs"]["parameters"]
    custom_config = json.loads(parameters["custom_config"]["runtimeValue"]["constant"])
    assert custom_config["num_workers"] == 2
    assert custom_config["cluster_job"] == cluster_job_settings(config)
    assert custom_config["cluster_job"]["kind"] == "trainjob"  # the default


def test_remote_uri_is_the_inverse_of_the_launchers_local_path():
    uri = "s3://bucket/root/taxi/run/trainer/1/model"
    assert remote_uri(local_path(uri, "/tmp/l"), "/tmp/l") == uri
    assert remote_uri("/elsewhere/model", "/tmp/l") is None
