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

import copy
import os
import signal
import threading
import time

import pytest

from components.base import storage
from components.training import cluster_job, job_kind, kube_client
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


def test_the_trainer_step_trains_as_a_cluster_job_and_outputs_the_chiefs_model(
    step, caplog, monkeypatch
):
    stand_in, kind = step.stand_in, step.kind
    # An earlier attempt of this step was killed outright: its job still trains (Argo keeps the
    # dead pod, so the owner reference does not fire) and its staging folder is there.
    stale = kind.manifest("trainer-earlier", NAMESPACE, step.settings, 2, ["sleep", "600"], None,
                          600, cluster_job.step_id(step.outputs))  # fmt: skip
    kube_client.create(_api(step), stale)
    stale_staging = f"{step.folder}/{cluster_job.STAGING_FOLDER}/trainer-earlier/job.json"
    storage.write_bytes(stale_staging, b"{}")

    # Replicas whose step beats (every poll, 5 s) stay alive: with a 10 s timeout (900 s on a
    # cluster) they would stop in the middle of this training if the waiting step did not beat.
    monkeypatch.setattr(cluster_job, "HEARTBEAT_SECONDS", 1)
    monkeypatch.setattr(cluster_job, "HEARTBEAT_TIMEOUT_SECONDS", 10)
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
    message = _fails(step, "(400)", "strict decoding error: unknown field", "resources")
    assert "needs Kubeflow" not in message  # the product's own mistake: nothing to install
    # Without Strict the same job is accepted, the limits dropped with only a warning.
    body = misspelled(
        step.kind, "trainer-warned", NAMESPACE, step.settings, 2, ["sleep", "1"], None, 60, "s"
    )
    resource = step.stand_in.resource(step.kind.group, step.kind.version, step.kind.plural)
    warnings = step.stand_in.create(resource, body, NAMESPACE)
    assert warnings and "unknown field" in warnings[0]
    stored = step.stand_in.objects_of(step.kind.plural)[0]
    assert "limits" not in str(stored)  # no CPU, memory or GPU limits: the pods take any node


def test_an_older_trainer_is_named_with_what_to_install(transformed, object_store, tmp_path,
                                                        monkeypatch):  # fmt: skip
    """Trainer v2.1 (Kubeflow 1.11) has neither activeDeadlineSeconds nor runtimePatches
    (v2.1.0 pkg/apis/trainer/v1alpha1/trainjob_types.go): its CRD, played by removing both."""
    made = make_step("trainjob", transformed, object_store, tmp_path, monkeypatch)
    made.kind = TrainJobKind()
    trainjobs = made.stand_in.trainer.trainjobs
    trainjobs.schema = copy.deepcopy(trainjobs.schema)  # crd_schema's is shared
    spec = trainjobs.schema["properties"]["spec"]["properties"]
    for field in ("activeDeadlineSeconds", "runtimePatches"):
        spec.pop(field)
    try:
        _fails(made, 'unknown field "spec.activeDeadlineSeconds"', "v2.2 or later",
               "multi_worker_job=tfjob", within=10)  # fmt: skip
    finally:
        made.stand_in.close()


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


def test_replica_pods_pass_pod_security_restricted_and_without_it_the_step_says_why(
    step, monkeypatch
):
    """The stand-in's namespace enforces Pod Security "restricted" (every other test here trains
    under it). A job whose pods lack the security context gets no pods at all, only its
    controller's events (the Job controller's FailedCreate, the Training Operator's
    FailedCreatePod), and the step's start timeout names the command that shows them."""
    monkeypatch.setattr(job_kind, "POD_SECURITY", {})
    monkeypatch.setattr(job_kind, "CONTAINER_SECURITY", {})
    step.set(start_timeout_minutes=0.05)
    reason = step.kind.pod_refused_event
    _fails(step, "has no pods after", "Pod Security admission",
           f"kubectl -n {NAMESPACE} get events --field-selector reason={reason}`")  # fmt: skip
    refused = [e for e in step.stand_in.events if f": Warning {reason}: Error creating: " in e]
    assert refused, step.stand_in.events
    assert (
        'violates PodSecurity "restricted:latest": allowPrivilegeEscalation != false'
        in (refused[0])
    )


def test_a_step_killed_outright_leaves_no_replica_training(step, monkeypatch):
    """A step SIGKILLed, or ended with its container by a cancelled run, deletes nothing: its
    replicas stop on their own once its heartbeat stops, and their controller fails the job
    (components/training/heartbeat.py)."""

    class Killed(BaseException):
        pass

    def killed_once_running(*args, **kwargs):
        started = time.monotonic()
        pods = step.stand_in.pods
        while not (pods and all(p.phase() == "Running" for p in list(pods.values()))):
            assert time.monotonic() - started < 120, "the replicas never ran"
            time.sleep(0.2)
        raise Killed  # no more heartbeats, and no clean-up either

    monkeypatch.setattr(cluster_job, "HEARTBEAT_TIMEOUT_SECONDS", 5)
    monkeypatch.setattr(cluster_job, "_wait", killed_once_running)
    monkeypatch.setattr(cluster_job, "_clean_up", lambda *args, **kwargs: None)
    with pytest.raises(Killed):
        step.run()
    (job,) = step.stand_in.objects_of(step.kind.plural)
    started = time.monotonic()
    while replica_processes():
        assert time.monotonic() - started < 60, "the replicas trained on without their step"
        time.sleep(0.5)
    # The controller sees the replicas' exits on its own time (the real one too): wait for it.
    while (
        state := step.kind.state(kube_client.get(_api(step), job["metadata"]["name"]))
    ).phase in ("Pending", "Running"):
        assert time.monotonic() - started < 90, f"the job never failed: {state}"
        time.sleep(0.5)
    assert state.phase == "Failed", state
    logs = " ".join(p.read_text() for p in step.stand_in.work.glob("trainer-*.log"))
    assert "The Trainer step that started this job has not been heard from" in logs


def test_a_job_whose_creation_answer_is_lost_is_deleted(step, monkeypatch):
    """The job may exist although its create call failed (a read timeout, SIGTERM): the step
    deletes it all the same."""
    from urllib3.exceptions import ReadTimeoutError

    create = kube_client.create

    def answer_lost(api, body):
        create(api, body)
        raise ReadTimeoutError(None, "/apis", "Read timed out. (read timeout=60)")

    monkeypatch.setattr(kube_client, "create", answer_lost)
    with pytest.raises(ReadTimeoutError):
        step.run()
    assert step.stand_in.deleted and not step.stand_in.objects_of(step.kind.plural)
    time.sleep(1)  # a pod a controller was making
    assert not step.stand_in.pods and not replica_processes() and not staging_left(step)


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


def test_a_label_the_api_server_would_refuse_is_refused(step, monkeypatch):
    """Label values are at most 63 characters of [A-Za-z0-9-_.]: the step labels its jobs with
    a hash of its output's URI because the URI itself is no label value."""
    monkeypatch.setattr(cluster_job, "step_id", lambda outputs: outputs["model"][0].uri)
    with pytest.raises(Exception, match=r"\(400\)[\s\S]*unable to parse requirement: .*"
                       "Invalid value: .*must be no more than 63 characters"):  # fmt: skip
        step.run()
    body = step.kind.manifest("trainer-labelled", NAMESPACE, step.settings, 2, ["sleep", "1"],
                              None, 600, "s3://bucket/root/taxi/run-1/trainer/model")  # fmt: skip
    with pytest.raises(
        cluster_job.TrainingJobFailed,
        match=r"\(422\): .*metadata\.labels: "
        'Invalid value: "s3://bucket/root/taxi/run-1/trainer/model": a valid label',
    ):
        kube_client.create(_api(step), body)
    assert not step.stand_in.objects_of(step.kind.plural)


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
