"""The Tuner step's search as it runs on Kubeflow: its trials as pods of the Trainer's image and
GPU settings, against the Kubernetes stand-in (tests/stand_ins/kube_stand_in.py: pods are real
processes on loopback addresses of their own), inputs on SeaweedFS with the launcher's local
copies, the step pod's env as KFP gives it. A trial pod killed mid-trial is recorded failed,
a new pod takes its place and the search completes; no pod is left, and every API call is one
kubeflow/training-rbac.yaml allows."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest
from tfx.types import standard_artifacts

from components.base import storage
from components.base.config import SECRET_KEYS, PipelineConfig
from components.base.launcher_paths import LOCAL_ROOT_ENV, PIPELINE_FOLDER_ENV, local_path
from components.training import trial_pods
from pipelines.pipeline import cluster_job_settings
from tests.pipelines.serving.test_serving_manifests import kubernetes_validator, schema_errors
from tests.stand_ins.kube_stand_in import KubeStandIn
from tests.training import processes, search_step
from tests.training.cluster_step import NAMESPACE, allowed_requests

STEP_POD = "run-1-tuner-pod"


@pytest.fixture(scope="module")
def transformed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trial-pods")
    return folder, search_step.transformed_inputs(folder)


def _staged(inputs: dict, folder: str, launcher_root: Path) -> dict:
    """Each input on the object store, the step seeing the launcher's local copy."""
    staged = {}
    for key, (artifact,) in inputs.items():
        uri = f"{folder}/run-1/{key}"
        storage.copy_tree(artifact.uri, uri)
        copy = type(artifact)()
        copy.uri = local_path(uri, str(launcher_root))
        storage.copy_tree(uri, copy.uri)
        if key == "examples":
            copy.split_names = artifact.split_names
        staged[key] = [copy]
    return staged


def test_a_trial_pod_killed_mid_trial_is_recorded_failed_and_the_search_completes(
    transformed, object_store, tmp_path, monkeypatch
):
    root, inputs = transformed
    bucket = object_store.new_bucket("trial-pods")
    folder = f"s3://{bucket}/root/taxi"
    launcher = tmp_path / "launcher"
    staged = _staged(inputs, folder, launcher)
    config = PipelineConfig(gpu_count=1)
    settings = json.loads(search_step.properties(tmp_path)["custom_config"])
    settings["cluster_job"] = cluster_job_settings(config)
    props = search_step.properties(tmp_path, custom_config=json.dumps(settings))
    secrets = {config.credentials_secret: {key: os.environ[key] for key in SECRET_KEYS}}
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets=secrets, operators=(),
                           rbac=allowed_requests())  # fmt: skip
    uid = str(uuid.uuid4())
    step_ip = stand_in.add_step_pod(STEP_POD, uid)
    for name, value in {LOCAL_ROOT_ENV: str(launcher), PIPELINE_FOLDER_ENV: folder,
                        "KFP_POD_NAME": STEP_POD, "KFP_POD_UID": uid,
                        "KUBECONFIG": str(stand_in.kubeconfig)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    outputs = {}
    for key, kind in (("best_hyperparameters", standard_artifacts.HyperParameters),
                      ("tuner_results", standard_artifacts.TunerResults)):  # fmt: skip
        artifact = kind()
        artifact.uri = local_path(f"{folder}/run-1/tuner/{key}", str(launcher))
        os.makedirs(artifact.uri)
        outputs[key] = [artifact]
    killed = []

    def kill_a_trial_pod_mid_trial() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not killed:
            records = storage.list_files(f"{folder}/_tuner/*/trials/*.json")
            if records:  # a trial has ended: both pods are warm, each in a trial
                time.sleep(1.0)
                with stand_in.lock:
                    pods = [p for p in stand_in.pods.values()
                            if p.process and p.exit_code() is None and not p.external]  # fmt: skip
                pods[0].process.send_signal(signal.SIGKILL)
                killed.append(pods[0].name)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_trial_pod_mid_trial, daemon=True)
    killer.start()
    try:
        from components.steps.tuner import HyperparameterSearchExecutor

        HyperparameterSearchExecutor().Do(staged, outputs, props)
        killer.join()
        # Before the stand-in closes (which stops every pod's process): the step left none.
        assert not [p for p in stand_in.pods.values() if not p.external]
        assert not processes.running(trial_pods.TRIAL_MODULE)
    finally:
        stand_in.close()

    assert killed
    trials = json.loads(Path(outputs["tuner_results"][0].uri, "trials.json").read_text())
    failed = [t for t in trials if t["status"] == "FAILED"]
    assert len(trials) == 6 and len(failed) == 1, trials
    assert failed[0]["error"].startswith(f"its worker (pod {killed[0]}) exited with code 137")
    completed = [t for t in trials if t["status"] == "COMPLETED"]
    best = max(completed, key=lambda t: t["metrics"]["val_auc"])
    assert outputs["best_hyperparameters"][0].get_string_custom_property("search")
    assert json.loads(outputs["best_hyperparameters"][0].get_string_custom_property(
        "search"))["best_trial"] == best["trial_id"]  # fmt: skip

    created = [b for b in stand_in.created if b.get("kind") == "Pod"]
    assert len(created) == 3  # two, and the one that took the killed one's place
    pod_schema = kubernetes_validator("io.k8s.api.core.v1.Pod")  # Kubernetes 1.29's, strict
    for body in created:
        assert not schema_errors(body, pod_schema), schema_errors(body, pod_schema)
        spec, (container,) = body["spec"], body["spec"]["containers"]
        assert body["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Pod", "name": STEP_POD, "uid": uid}
        ]
        assert spec["restartPolicy"] == "Never"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
        assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert body["metadata"]["annotations"] == {"sidecar.istio.io/inject": "false"}
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["KERASTUNER_ORACLE_IP"] == step_ip
        assert container["image"] == config.gpu_image
    # Each pod's log kept beside the records once its pod was deleted; the killed one's too.
    kept = storage.list_files(f"{folder}/_tuner/*/logs/*/*.log")
    assert sorted(p.rsplit("/", 1)[1] for p in kept) == sorted(
        f"{b['metadata']['name']}.log" for b in created
    )
    assert stand_in.requests <= allowed_requests(), stand_in.requests - allowed_requests()


def test_trial_pods_need_the_step_s_pod(monkeypatch, tmp_path):
    monkeypatch.delenv("KFP_POD_NAME", raising=False)
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets={}, operators=())
    monkeypatch.setenv("KUBECONFIG", str(stand_in.kubeconfig))
    try:
        with pytest.raises(trial_pods.TrialPodsFailed, match="need the step's pod"):
            trial_pods.ClusterTrialWorkers(cluster_job_settings(PipelineConfig()), "step",
                                           "s3://bucket/x", 600)  # fmt: skip
    finally:
        stand_in.close()


def test_a_trial_pod_past_its_deadline_is_ended_and_a_misspelled_field_refused(
    monkeypatch, tmp_path
):
    """The two pod rules of the API server and kubelet the search counts on: a pod past
    `activeDeadlineSeconds` (the search's budget) is killed and says why, and a field the
    Pod does not have is refused (fieldValidation=Strict), not dropped."""
    from kubernetes.client.exceptions import ApiException

    config = PipelineConfig()
    secrets = {config.credentials_secret: {key: "unused" for key in SECRET_KEYS}}
    stand_in = KubeStandIn(tmp_path, NAMESPACE, secrets=secrets, operators=())
    uid = str(uuid.uuid4())
    stand_in.add_step_pod(STEP_POD, uid)
    for name, value in {"KFP_POD_NAME": STEP_POD, "KFP_POD_UID": uid,
                        "KUBECONFIG": str(stand_in.kubeconfig)}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    try:
        workers = trial_pods.ClusterTrialWorkers(cluster_job_settings(config), "step",
                                                 str(tmp_path / "search"), deadline_seconds=2,
                                                 refresh_seconds=0.1)  # fmt: skip
        # A FIFO no one writes: the trial's read of its job blocks, so the pod is still running
        # at its deadline however fast the machine (a missing file ended it first in 2 s on CI).
        job = tmp_path / "job-never-written.json"
        os.mkfifo(job)
        workers.start("tuner0", {"TFX_SEARCH_JOB": str(job)})
        deadline = time.monotonic() + 30
        while workers.exit_codes()["tuner0"] is None:
            assert time.monotonic() < deadline, "the pod outlived its deadline"
            time.sleep(0.2)
        how = workers.how_it_ended("tuner0")
        assert "(DeadlineExceeded: Pod was active on the node longer than the specified " \
               "deadline)" in how, how  # fmt: skip
        assert not processes.running(trial_pods.TRIAL_MODULE)

        body = trial_pods.trial_pod("misspelled", NAMESPACE, cluster_job_settings(config),
                                    ["python", "-c", "pass"], {}, {}, 60)  # fmt: skip
        body["spec"]["containers"][0]["imagePullPolicyy"] = "IfNotPresent"
        with pytest.raises(ApiException) as refused:
            workers.api.create(body)
        assert refused.value.status == 400
        message = json.loads(refused.value.body)["message"]
        assert message.endswith(
            'strict decoding error: unknown field "spec.containers[0].imagePullPolicyy"'
        ), message
        assert "misspelled" not in stand_in.pods
    finally:
        stand_in.close()
