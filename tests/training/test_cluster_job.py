"""Multi-worker training on Kubeflow (components/training/cluster_job.py): the Trainer step as a
TrainJob (Kubeflow Trainer v2, the default) and as a TFJob (Training Operator v1).

The Kubernetes API server and the controllers are the one stand-in
(tests/stand_ins/kube_stand_in.py says what it plays and from which sources). The step's code,
the `kubernetes` client, the replica entry point, TensorFlow's collectives between the replicas,
and the object store (SeaweedFS) are real. Each stand-in rule that is not a plain success is
shown catching the product code it exists for: a field the API server would drop, a duplicate
name, a namespace mismatch, replicas that never schedule or cannot start, a deadline, and a
cluster with neither kind of job.
"""

import os
import signal
import threading
import time

import pytest

from components.base import storage
from components.training import cluster_job, kube_client
from components.training.tfjob import TFJobKind
from components.training.trainjob import TrainJobKind
from tests.stand_ins.kube_pods import Node, default_nodes
from tests.training.cluster_step import (
    NAMESPACE,
    allowed_requests,
    make_step,
    replica_processes,
    staging_left,
)

KINDS = {"trainjob": TrainJobKind, "tfjob": TFJobKind}


@pytest.fixture(params=list(KINDS))
def step(request, transformed, object_store, tmp_path, monkeypatch):
    made = make_step(request.param, transformed, object_store, tmp_path, monkeypatch)
    made.kind = KINDS[request.param]()
    yield made
    made.stand_in.close()


def _api(step) -> kube_client.Kubernetes:
    return kube_client.Kubernetes(step.kind)


def test_the_trainer_step_trains_as_a_cluster_job_and_outputs_the_chiefs_model(step, caplog):
    stand_in, kind = step.stand_in, step.kind
    # An earlier attempt of this step was killed outright: its job still trains (Argo keeps the
    # dead pod, so the owner reference does not fire) and its staging folder is there.
    stale = kind.manifest("trainer-earlier", NAMESPACE, step.settings, 2, ["sleep", "600"], None,
                          600, cluster_job._step_id(step.outputs))  # fmt: skip
    kube_client.create(_api(step), stale)
    stale_staging = f"{step.folder}/{cluster_job.STAGING_FOLDER}/trainer-earlier/job.json"
    storage.write_bytes(stale_staging, b"{}")

    with caplog.at_level("INFO", logger="components.training.cluster_job"):
        step.run()

    assert f"Deleting {kind.kind} trainer-earlier of an earlier attempt" in caplog.text
    created = stand_in.created[-1]
    name = created["metadata"]["name"]
    assert created["kind"] == kind.kind
    assert created["metadata"]["ownerReferences"][0]["uid"] == os.environ["KFP_POD_UID"]
    assert created["metadata"]["namespace"] == NAMESPACE
    assert stand_in.deleted == ["trainer-earlier", name]  # never left behind
    assert not stand_in.pods and not staging_left(step) and not replica_processes()
    # The chief's model is in the step's output artifact, where the launcher uploads it from.
    serving = os.path.join(step.outputs["model"][0].uri, "Format-Serving", "saved_model.pb")
    assert os.path.exists(serving)
    model_run = step.outputs["model_run"][0]
    assert model_run.get_int_custom_property("workers") == 2
    assert model_run.get_int_custom_property("replicas") == 2
    assert model_run.get_int_custom_property("steps") == 20
    # Progress: the states it went through, with the chief's latest line.
    assert f"{kind.kind} {name}: Running after" in caplog.text
    assert f"{kind.kind} {name}: Succeeded after" in caplog.text
    # Every API call the step made is one kubeflow/training-rbac.yaml allows.
    assert stand_in.requests <= allowed_requests(), stand_in.requests - allowed_requests()
    assert not stand_in.warnings  # nothing the API server would have dropped


def test_a_failed_replica_fails_the_step_with_its_exit_and_log(step):
    stand_in = step.stand_in
    killed = {}

    def kill_a_worker_once_it_trains():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            for pod in list(stand_in.pods.values()):
                if step.kind.replica(_as_pod(pod)) != "worker-0" or pod.process is None:
                    continue
                if "Training:" in pod.log_path.read_text(errors="replace"):
                    pod.process.send_signal(signal.SIGKILL)  # as an OOM kill or a bad node
                    killed["at"] = time.monotonic()
            time.sleep(0.2)

    threading.Thread(target=kill_a_worker_once_it_trains, daemon=True).start()
    with pytest.raises(cluster_job.TrainingJobFailed) as failure:
        step.run()
    assert "at" in killed, "the worker never started training"
    assert time.monotonic() - killed["at"] < 60
    message = str(failure.value)
    expected = {
        "TrainJob": "(FailedJobs): jobset failed due to one or more job failures",
        "TFJob": "has failed because 1 Worker replica(s) failed.",
    }
    assert expected[step.kind.kind] in message
    assert "Replica worker-0 (pod trainer-" in message and "exited with code 137" in message
    assert "components.training.loop: Training: strategy=" in message  # its last log lines
    assert "the retry resumes from the training's backup, as does the next run" in message
    assert len(stand_in.deleted) == 1 and not stand_in.objects_of(step.kind.plural)
    assert not replica_processes() and not staging_left(step)
    assert not os.listdir(step.outputs["model"][0].uri)  # nothing half-written for the launcher


def _as_pod(pod):
    """A stand-in pod as the kubernetes client's V1Pod, for the kind's naming."""
    from kubernetes.client import ApiClient

    class Response:
        data = __import__("json").dumps(pod.as_json())

    return ApiClient().deserialize(Response(), "V1Pod")


def _fails(step, *expected: str, within: float = 60) -> str:
    """Runs the step, which must fail within `within` seconds with every `expected` text and
    leave nothing behind."""
    started = time.monotonic()
    with pytest.raises(cluster_job.TrainingJobFailed) as failure:
        step.run()
    message = str(failure.value)
    assert time.monotonic() - started < within, message
    for text in expected:
        assert text in message, message
    assert not step.stand_in.objects_of(step.kind.plural) and not step.stand_in.pods
    assert not replica_processes() and not staging_left(step)
    return message


def test_the_job_is_created_with_strict_field_validation_so_no_field_is_dropped(step, monkeypatch):
    """The API server's default (Warn) drops a field it does not know: a misspelled `resources`
    would silently lose the replicas' GPU limits. The step asks for Strict."""
    manifest = type(step.kind).manifest

    def misspelled(self, *args, **kwargs):
        body = manifest(self, *args, **kwargs)
        container = (
            body["spec"]["trainer"]
            if step.kind.kind == "TrainJob"
            else body["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
        )
        key = "resourcesPerNode" if step.kind.kind == "TrainJob" else "resources"
        container[key + "s"] = container.pop(key)
        return body

    monkeypatch.setattr(type(step.kind), "manifest", misspelled)
    _fails(step, "(400)", "strict decoding error: unknown field", "resources")
    # Without Strict the same job is accepted, the limits dropped with only a warning.
    body = misspelled(
        step.kind, "trainer-warned", NAMESPACE, step.settings, 2, ["sleep", "1"], None, 60, "s"
    )
    resource = step.stand_in.resource(step.kind.group, step.kind.version, step.kind.plural)
    warnings = step.stand_in.create(resource, body, NAMESPACE)
    assert warnings and "unknown field" in warnings[0]
    stored = step.stand_in.objects_of(step.kind.plural)[0]
    assert "limits" not in str(stored)  # no CPU, memory or GPU limits: the pods take any node


def test_replicas_that_never_schedule_fail_the_step_at_its_start_timeout(
    transformed, object_store, tmp_path, monkeypatch, request
):
    for kind in KINDS:
        gpus_busy = [n if n.name != "gpu-node" else Node(n.name, dict(n.capacity, **{
            "nvidia.com/gpu": "0"}), n.labels, n.taints) for n in default_nodes()]  # fmt: skip
        made = make_step(kind, transformed, object_store, tmp_path / kind, monkeypatch,
                         nodes=gpus_busy)  # fmt: skip
        made.kind = KINDS[kind]()
        made.set(start_timeout_minutes=0.05)
        try:
            message = _fails(made, "2 of 2 replicas had not started after",
                             "Unschedulable: 0/2 nodes are available: 1 Insufficient "
                             "nvidia.com/gpu, 1 node(s) didn't match Pod's node affinity/selector.",
                             "add nodes or lower gpu_count")  # fmt: skip
            assert message.count("  pod trainer-") == 2
        finally:
            made.stand_in.close()


def test_a_missing_secret_fails_the_step_naming_it(step, monkeypatch):
    step.stand_in.secrets.clear()
    step.set(start_timeout_minutes=0.05)
    _fails(
        step,
        f'CreateContainerConfigError: secret "{step.settings["secret"]}" not found',
        "create what it names (the credentials Secret, in this namespace)",
    )


def test_a_job_past_its_deadline_fails_the_step_naming_the_deadline(step):
    api = _api(step)
    body = step.kind.manifest("trainer-late", NAMESPACE, step.settings, 2, ["sleep", "600"], None,
                              2, "s")  # fmt: skip
    kube_client.create(api, body)
    timeouts = cluster_job.Timeouts(start=60, finish=600, replicas=2)
    with pytest.raises(cluster_job.TrainingJobFailed) as failure:
        cluster_job._wait(api, "trainer-late", 0.2, timeouts)
    expected = {
        "TrainJob": "(DeadlineExceeded): TrainJob exceeded its active deadline",
        "TFJob": "has failed because it was active longer than specified deadline",
    }
    assert expected[step.kind.kind] in str(failure.value)
    assert "No replica failed: the job hit its deadline" in str(failure.value)
    assert not step.stand_in.pods  # the controller deleted them


def test_a_duplicate_name_or_another_namespace_is_refused(step):
    api = _api(step)
    body = step.kind.manifest("trainer-twice", NAMESPACE, step.settings, 2, ["sleep", "600"],
                              None, 600, "s")  # fmt: skip
    kube_client.create(api, body)
    with pytest.raises(cluster_job.TrainingJobFailed, match=r"\(409\): .*already exists"):
        kube_client.create(api, dict(body))
    assert len(step.stand_in.objects_of(step.kind.plural)) == 1  # the first one untouched
    elsewhere = step.kind.manifest("trainer-other", "other-namespace", step.settings, 2,
                                   ["sleep", "600"], None, 600, "s")  # fmt: skip
    with pytest.raises(
        cluster_job.TrainingJobFailed,
        match=r"\(400\): the namespace of the "
        "provided object does not match the namespace sent on the request",
    ):
        kube_client.create(api, elsewhere)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_cluster_without_the_jobs_api_or_controller_fails_before_training(
    kind, transformed, object_store, tmp_path, monkeypatch
):
    other = {"trainjob": "tfjob", "tfjob": "trainjob"}[kind]
    # Only the other kind is installed: the API server has no such resource.
    made = make_step(kind, transformed, object_store, tmp_path / "none", monkeypatch,
                     operators=(other,))  # fmt: skip
    made.kind = KINDS[kind]()
    try:
        _fails(made, f"This cluster has no {made.kind.kind} API", f"multi_worker_job={other}",
               within=10)  # fmt: skip
    finally:
        made.stand_in.close()
    # The CRD is there but its controller's pod is down, webhook and all.
    made = make_step(kind, transformed, object_store, tmp_path / "down", monkeypatch,
                     webhook_down=(kind,))  # fmt: skip
    made.kind = KINDS[kind]()
    try:
        _fails(made, "(500): Internal error occurred: failed calling webhook",
               "The controller's webhook does not answer", within=10)  # fmt: skip
    finally:
        made.stand_in.close()
    # Admitted, but nothing makes its pods: ended by the start timeout.
    made = make_step(kind, transformed, object_store, tmp_path / "idle", monkeypatch,
                     without_pods=(kind,))  # fmt: skip
    made.kind = KINDS[kind]()
    made.set(start_timeout_minutes=0.05)
    try:
        _fails(made, "has no pods after", "the controller that makes them does not act on it")
    finally:
        made.stand_in.close()


def test_a_trainjob_without_the_runtime_is_refused_naming_the_file_to_apply(
    transformed, object_store, tmp_path, monkeypatch
):
    made = make_step("trainjob", transformed, object_store, tmp_path, monkeypatch, runtime=False)
    made.kind = TrainJobKind()
    try:
        _fails(made, "(403): admission webhook", "specified clusterTrainingRuntime must be "
               "created before the TrainJob is created", "kubectl apply -f "
               "kubeflow/trainjob-runtime.yaml", within=10)  # fmt: skip
    finally:
        made.stand_in.close()


def test_a_service_account_without_the_role_fails_the_step_naming_the_file(
    transformed, object_store, tmp_path, monkeypatch
):
    """The stand-in refuses, as RBAC does, every call kubeflow/training-rbac.yaml does not allow;
    with the Role's pod listing left out, the step names the file to apply."""
    for kind, missing in (("trainjob", ("trainer.kubeflow.org", "trainjobs", "list")),
                          ("tfjob", ("", "pods", "list"))):  # fmt: skip
        made = make_step(kind, transformed, object_store, tmp_path / kind, monkeypatch,
                         rbac=allowed_requests() - {missing})  # fmt: skip
        made.kind = KINDS[kind]()
        try:
            _fails(made, "(kubeflow/README.md, multi-worker training)",
                   "Apply kubeflow/training-rbac.yaml", "is forbidden", within=30)  # fmt: skip
        finally:
            made.stand_in.close()


def test_a_job_its_controller_never_ends_fails_at_the_steps_own_finish_timeout(step):
    api = _api(step)
    body = step.kind.manifest("trainer-stuck", NAMESPACE, step.settings, 2, ["sleep", "600"],
                              None, 600, "s")  # fmt: skip
    kube_client.create(api, body)
    timeouts = cluster_job.Timeouts(start=60, finish=3, replicas=2)
    with pytest.raises(cluster_job.TrainingJobFailed, match="has not ended after [3-9] s, past "
                       "its own deadline"):  # fmt: skip
        cluster_job._wait(api, "trainer-stuck", 0.2, timeouts)
