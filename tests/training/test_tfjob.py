"""Multi-worker training on Kubeflow as a TFJob (components/training/tfjob.py).

The Kubernetes API server and the Training Operator are the one stand-in
(tests/stand_ins/kube_stand_in.py
says what it plays and from which source). The step's code, the `kubernetes` client, the replica
entry point, TensorFlow's collectives between the replicas, and the object store (SeaweedFS) are
real.
"""

import json
import os
import signal
import threading
import time
import uuid

import psutil
import pytest
import yaml
from tfx.proto import trainer_pb2
from tfx.types import standard_artifacts
from tfx.utils import proto_utils

from components.base import storage
from components.base.config import REPO_ROOT, SECRET_KEYS, PipelineConfig
from components.base.launcher_paths import (
    LOCAL_ROOT_ENV,
    PIPELINE_FOLDER_ENV,
    local_path,
    remote_uri,
)
from components.steps.trainer import TunableTrainerExecutor
from components.training import loop, tfjob
from pipelines.kubeflow import kubeflow_runner
from pipelines.pipeline import tfjob_settings
from tests.stand_ins.kube_stand_in import KubeStandIn, validate_tfjob
from tests.use_cases.taxi.fixtures import trainer_settings

NAMESPACE = "kubeflow-user"
OWNER = {"apiVersion": "v1", "kind": "Pod", "name": "run-1-trainer-pod", "uid": "a-uid"}


def _manifest(**overrides) -> dict:
    settings = tfjob_settings(PipelineConfig(num_workers=3, **overrides))
    return tfjob.manifest("trainer-abc", NAMESPACE, settings, 3, "s3://b/job.json", OWNER, 3600)


def test_the_tfjob_is_valid_against_the_training_operator_crd_and_webhook():
    body = _manifest(gpu_count=2)
    validate_tfjob(body)
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
    assert all(
        e["valueFrom"]["secretKeyRef"]["name"] == config.credentials_secret
        for e in container["env"]
    )
    assert body["metadata"]["ownerReferences"] == [OWNER]
    # No backoffLimit: with one, the operator deletes the failed replica's pod and its log
    # before the step can read them (common/job.go ReconcileJobs).
    assert "backoffLimit" not in body["spec"]["runPolicy"]
    assert specs["Chief"]["restartPolicy"] == "Never"
    annotations = specs["Worker"]["template"]["metadata"]["annotations"]
    assert annotations == {"sidecar.istio.io/inject": "false"}
    # Without GPUs no GPU request, node selector or toleration.
    cpu_only = _manifest(gpu_count=0)["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]
    assert "nodeSelector" not in cpu_only and "nvidia.com/gpu" not in json.dumps(cpu_only)


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda b: b["spec"]["tfReplicaSpecs"]["Chief"].update(replicas="1"), "not of type"),
        (lambda b: b["spec"].update(tfReplicaSpec={}), "tfReplicaSpec"),  # a misspelled field
        (lambda b: b["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
         .update(resource={}), "resource"),  # one deep in the pod template
        (lambda b: b["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
         .update(name="trainer"), "no container named tensorflow"),
        (lambda b: b["metadata"].update(name="Trainer_1"), "DNS-1035"),
    ],
)  # fmt: skip
def test_an_invalid_tfjob_is_refused_by_the_stand_in_as_by_the_api_server(change, reason):
    """The checks above can fail: each of these is refused, naming the field."""
    body = _manifest()
    change(body)
    with pytest.raises(ValueError, match=reason):
        validate_tfjob(body)


def test_multi_worker_compiles_into_a_light_step_that_carries_the_tfjob_settings():
    spec, platform = kubeflow_runner.compile_documents(PipelineConfig(num_workers=2))
    label = spec["components"]["Trainer"]["executorLabel"]
    container = spec["deploymentSpec"]["executors"][label]["container"]
    config = PipelineConfig.load(environ={})
    assert container["image"] == config.cpu_image and "accelerator" not in container["resources"]
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert "nodeSelector" not in executors[label]  # the step's pod waits; the replicas train
    parameters = spec["root"]["dag"]["tasks"]["trainer"]["inputs"]["parameters"]
    custom_config = json.loads(parameters["custom_config"]["runtimeValue"]["constant"])
    assert custom_config["num_workers"] == 2
    assert custom_config["tfjob"] == tfjob_settings(PipelineConfig(num_workers=2))


def test_remote_uri_is_the_inverse_of_the_launchers_local_path():
    uri = "s3://bucket/root/taxi/run/trainer/1/model"
    assert remote_uri(local_path(uri, "/tmp/l"), "/tmp/l") == uri
    assert remote_uri("/elsewhere/model", "/tmp/l") is None


@pytest.fixture
def trainer_step(transformed, object_store, tmp_path, monkeypatch):
    """The Trainer step as the launcher runs it on Kubeflow: input artifacts on the object store
    with local copies under the launcher's root, local output folders, the step's pod env, and
    the stand-in API server in KUBECONFIG. Yields (stand-in, executor call, folder)."""
    bucket = object_store.new_bucket("tfjob")
    folder = f"s3://{bucket}/root/taxi"
    launcher_root = tmp_path / "launcher"
    graph_dir, examples, _ = transformed

    def staged(kind, source: str, name: str):
        uri = f"{folder}/run-1/{name}"
        storage.copy_tree(source, uri)
        storage.copy_tree(uri, local_path(uri, str(launcher_root)))
        artifact = kind()
        artifact.uri = local_path(uri, str(launcher_root))
        return artifact

    remote_examples = staged(standard_artifacts.Examples, examples.uri, "transform/examples")
    remote_examples.split_names = examples.split_names
    inputs = {
        "examples": [remote_examples],
        "transform_graph": [staged(standard_artifacts.TransformGraph, graph_dir, "graph")],
    }
    outputs = {}
    kinds = {"model": standard_artifacts.Model, "model_run": standard_artifacts.ModelRun}
    for key, kind in kinds.items():
        artifact = kind()
        artifact.uri = local_path(f"{folder}/run-1/trainer/{key}", str(launcher_root))
        os.makedirs(artifact.uri)
        outputs[key] = [artifact]
    config = PipelineConfig(num_workers=2, gpu_count=1)
    custom_config = trainer_settings(batch_size=32, learning_rate=0.01, num_workers=2, epochs=1,
                                     tfjob=tfjob_settings(config))  # fmt: skip
    properties = {
        "run_fn": "components.training.loop.run_fn",
        "train_steps": 20,
        "epochs": 1,
        "max_train_minutes": 10.0,
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=0)),
        "custom_config": json.dumps(custom_config),
    }
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets={
        config.credentials_secret: {key: os.environ[key] for key in SECRET_KEYS},
    })  # fmt: skip
    for name, value in {
        LOCAL_ROOT_ENV: str(launcher_root), PIPELINE_FOLDER_ENV: folder,
        "KFP_POD_NAME": "run-1-trainer-pod", "KFP_POD_UID": str(uuid.uuid4()),
        "KUBECONFIG": str(stand_in.kubeconfig),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    yield stand_in, (inputs, outputs, properties), folder
    stand_in.close()


def _rbac_role() -> dict:
    documents = list(yaml.safe_load_all((REPO_ROOT / "kubeflow" / "tfjob-rbac.yaml").read_text()))
    (role,) = [d for d in documents if d["kind"] == "Role"]
    return role


def _replica_processes() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "components.training.tfjob_replica" in " ".join(p.cmdline())]  # fmt: skip


def test_the_trainer_step_trains_as_a_tfjob_and_outputs_the_chiefs_model(trainer_step, caplog):
    stand_in, (inputs, outputs, properties), folder = trainer_step
    # An earlier attempt of this step was killed outright: its TFJob still trains (Argo keeps
    # the dead pod, so the owner reference does not fire) and its staging folder is there.
    settings = json.loads(properties["custom_config"])["tfjob"]
    stale = tfjob.manifest("trainer-earlier", NAMESPACE, settings, 2, "s3://b/j.json", None, 600,
                           tfjob._step_id(outputs))  # fmt: skip
    for spec in stale["spec"]["tfReplicaSpecs"].values():
        spec["template"]["spec"]["containers"][0]["command"] = ["sleep", "600"]
    stand_in._create(stale)
    stale_staging = f"{folder}/{tfjob.STAGING_FOLDER}/trainer-earlier/job.json"
    storage.write_bytes(stale_staging, b"{}")

    with caplog.at_level("INFO", logger="components.training.tfjob"):
        TunableTrainerExecutor().Do(inputs, outputs, properties)

    assert "Deleting TFJob trainer-earlier of an earlier attempt" in caplog.text
    created = stand_in.created[-1]
    name = created["metadata"]["name"]
    assert created["metadata"]["ownerReferences"][0]["uid"] == os.environ["KFP_POD_UID"]
    assert created["metadata"]["namespace"] == NAMESPACE
    assert stand_in.deleted == ["trainer-earlier", name]  # never left behind
    assert not storage.list_files(f"{folder}/{tfjob.STAGING_FOLDER}/**")  # staging removed
    assert not _replica_processes()
    # The chief's model is in the step's output artifact, where the launcher uploads it from.
    serving = os.path.join(outputs["model"][0].uri, "Format-Serving", "saved_model.pb")
    assert os.path.exists(serving)
    summary = json.loads(
        open(os.path.join(outputs["model_run"][0].uri, loop.TRAINING_SUMMARY)).read()
    )
    assert (summary["strategy"], summary["workers"], summary["replicas"]) == ("multi_worker", 2, 2)
    assert summary["steps"] == 20
    assert outputs["model_run"][0].get_int_custom_property("workers") == 2
    # Progress: the states it went through, with the chief's latest line.
    assert f"TFJob {name}: Running after" in caplog.text
    assert f"TFJob {name}: Succeeded after" in caplog.text
    # Every API call the step made is one kubeflow/tfjob-rbac.yaml allows its service account.
    allowed = {
        (group, resource, verb)
        for rule in _rbac_role()["rules"]
        for group in rule["apiGroups"] for resource in rule["resources"] for verb in rule["verbs"]
    }  # fmt: skip
    assert stand_in.requests and stand_in.requests <= allowed, stand_in.requests - allowed
    # Both replicas read their inputs from the object store with the Secret's credentials.
    for pod in (f"{name}-chief-0", f"{name}-worker-0"):
        log = (stand_in.work / f"{pod}.log").read_text()
        assert "downloaded" in log and "input files" in log, log[-2000:]


def test_a_failed_replica_fails_the_step_with_its_exit_and_log(trainer_step):
    stand_in, (inputs, outputs, properties), folder = trainer_step
    killed = {}

    def kill_the_worker_once_it_trains():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            for replica in list(stand_in.replicas.values())[:1]:
                worker = next(r for r in replica if r.kind == "worker")
                if "Training:" in worker.log_path.read_text(errors="replace"):
                    worker.process.send_signal(signal.SIGKILL)  # as an OOM kill or a bad node
                    killed["at"] = time.monotonic()
            time.sleep(0.2)

    threading.Thread(target=kill_the_worker_once_it_trains, daemon=True).start()
    with pytest.raises(tfjob.TFJobFailed) as failure:
        TunableTrainerExecutor().Do(inputs, outputs, properties)
    assert "at" in killed, "the worker never started training"
    assert time.monotonic() - killed["at"] < 60
    message = str(failure.value)
    assert "has failed because 1 Worker replica(s) failed." in message
    assert "Replica worker-0 (pod trainer-" in message and "exited with code 137" in message
    assert "components.training.loop: Training: strategy=" in message  # its last log lines
    assert "retry policy runs the step again" in message
    assert len(stand_in.deleted) == 1 and not stand_in.jobs
    assert not _replica_processes()
    assert not storage.list_files(f"{folder}/{tfjob.STAGING_FOLDER}/**")
    assert not os.listdir(outputs["model"][0].uri)  # nothing half-written for the launcher
