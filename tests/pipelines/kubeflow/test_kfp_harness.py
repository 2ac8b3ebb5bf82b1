"""Each rule the KFP harness plays catches the failure it exists for, at each backend version
where the rule differs (tests/stand_ins/kfp_versions.py).

Small specs whose steps are a few lines of Python (run as the harness runs any container), so
every rule is shown in seconds against the real SeaweedFS store; the compiled pipeline itself
runs under the same harness in test_kubeflow_spec.py.
"""

from __future__ import annotations

import copy
import json
import os
import threading
import time

import pytest

from components.base import storage
from components.base.config import PipelineConfig
from pipelines.kubeflow import kubeflow_runner
from tests.stand_ins import kfp_harness
from tests.stand_ins.kfp_harness import TaskFailed, UnsupportedByKubeflow
from tests.stand_ins.kfp_versions import NEWEST, V2_5_0, V2_16_1, V2_17_0, VERSIONS

IMAGE = "registry.example.com/steps:1.0"
SECRET = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
# Every step: the ExecutorInput, the launcher's local paths, and an output writer.
PRELUDE = """
import json, os, sys
from components.base.launcher_paths import local_path
executor_input = json.loads(sys.argv[1])
inputs = {k: v["artifacts"][0] for k, v in executor_input["inputs"].get("artifacts", {}).items()}
outputs = {k: v["artifacts"][0] for k, v in executor_input["outputs"]["artifacts"].items()}
parameters = executor_input["inputs"].get("parameterValues", {})
def write(key, text):
    os.makedirs(local_path(outputs[key]["uri"]), exist_ok=True)
    open(os.path.join(local_path(outputs[key]["uri"]), "data.txt"), "w").write(text)
def read(key):
    return open(os.path.join(local_path(inputs[key]["uri"]), "data.txt")).read()
def report(artifacts):
    os.makedirs(os.path.dirname(executor_input["outputs"]["outputFile"]), exist_ok=True)
    json.dump({"artifacts": artifacts}, open(executor_input["outputs"]["outputFile"], "w"))
"""


def spec_of(steps: dict[str, dict]) -> dict:
    """A PipelineSpec: step name -> {script, inputs {key: (producer, output key)}, outputs,
    cache, memory (GB)}; one root parameter `message` (default "hello")."""
    spec = {
        "pipelineInfo": {"name": "harness-rules"},
        "schemaVersion": "2.1.0",
        "sdkVersion": "kfp-2.5.0",
        "components": {},
        "deploymentSpec": {"executors": {}},
        "root": {
            "inputDefinitions": {
                "parameters": {"message": {"parameterType": "STRING", "defaultValue": "hello"}}
            },
            "dag": {"tasks": {}},
        },
    }
    for name, step in steps.items():
        artifact_type = {"artifactType": {"schemaTitle": "system.Dataset"}}
        spec["components"][f"comp-{name}"] = {
            "executorLabel": f"exec-{name}",
            "inputDefinitions": {
                "parameters": {"message": {"parameterType": "STRING"}},
                "artifacts": {key: artifact_type for key in step.get("inputs", {})},
            },
            "outputDefinitions": {
                "artifacts": {key: artifact_type for key in step.get("outputs", [])}
            },
        }
        container = {"image": IMAGE, "command": ["python", "-c", PRELUDE + step["script"], "{{$}}"]}
        if "memory" in step:
            container["resources"] = {"memoryLimit": step["memory"]}
        spec["deploymentSpec"]["executors"][f"exec-{name}"] = {"container": container}
        spec["root"]["dag"]["tasks"][name] = {
            "taskInfo": {"name": name},
            "componentRef": {"name": f"comp-{name}"},
            "cachingOptions": {"enableCache": step.get("cache", False)},
            "dependentTasks": sorted({producer for producer, _ in step.get("inputs", {}).values()}),
            "inputs": {
                "parameters": {"message": {"componentInputParameter": "message"}},
                "artifacts": {
                    key: {"taskOutputArtifact": {"producerTask": task, "outputArtifactKey": out}}
                    for key, (task, out) in step.get("inputs", {}).items()
                },
            },
        }
    return spec


PLATFORM = {
    "platforms": {
        "kubernetes": {
            "deploymentSpec": {
                "executors": {
                    f"exec-{name}": {
                        "secretAsEnv": [
                            {
                                "secretName": "store",
                                "keyToEnv": [{"secretKey": k, "envVar": k} for k in SECRET],
                            }
                        ]
                    }
                    for name in ("producer", "consumer")
                }
            }
        }
    }
}


def make_backend(object_store, tmp_path, version=NEWEST, **options) -> kfp_harness.Backend:
    """A backend whose one image sets PATH to its venv and HOME, as the project's images do."""
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        "FROM scratch\nENV VIRTUAL_ENV=/opt/venv \\\n    PATH=/opt/venv/bin:$PATH\nENV HOME=/home/step\n"  # noqa: E501
    )
    secrets = {"store": {k: os.environ[k] for k in SECRET}}
    bucket = object_store.new_bucket("rules")
    return kfp_harness.Backend(
        f"s3://{bucket}/root", {IMAGE: dockerfile}, secrets, tmp_path / "backend",
        version=version, **options,
    )  # fmt: skip


@pytest.fixture
def backend(object_store, tmp_path):
    """The newest backend: the rules every version shares."""
    return make_backend(object_store, tmp_path)


@pytest.fixture
def backend_2_5(object_store, tmp_path):
    return make_backend(object_store, tmp_path, V2_5_0)


@pytest.fixture(params=list(VERSIONS.values()), ids=list(VERSIONS))
def each_backend(request, object_store, tmp_path):
    return make_backend(object_store, tmp_path, request.param)


def _written(run: kfp_harness.PipelineRun):
    """The JSON the producer step wrote to its `out` artifact (PRELUDE's write)."""
    return json.loads(storage.read_bytes(run.outputs("producer")["out"]["uri"] + "/data.txt"))


PRODUCER = {"script": "write('out', parameters['message'])", "outputs": ["out"]}
CONSUMER = {
    "script": "print('consumed', read('data')); write('copy', read('data'))",
    "inputs": {"data": ("producer", "out")},
    "outputs": ["copy"],
}


def test_the_launchers_log_file_is_an_output_of_every_task_and_holds_the_steps_output(backend):
    run = backend.run(spec_of({"producer": PRODUCER, "consumer": CONSUMER}), PLATFORM, {})
    log_uri = run.outputs("consumer")["executor-logs"]["uri"]
    assert storage.read_bytes(log_uri).decode().strip() == "consumed hello"


def test_a_step_that_makes_folders_over_every_output_fails_on_the_log_file(backend):
    # What pipelines/kubeflow/kfp_entrypoint.py did before: os.makedirs on every output path.
    makes_folders = {
        "script": "[os.makedirs(local_path(o['uri']), exist_ok=True) for o in outputs.values()]",
        "outputs": ["out"],
    }
    spec = spec_of({"producer": makes_folders})
    with pytest.raises(TaskFailed, match="FileExistsError"):
        backend.run(spec, PLATFORM, {})
    backend.publish_logs = False  # a cluster with PUBLISH_LOGS=false: the same step passes
    backend.run(spec, PLATFORM, {})


def test_each_task_starts_in_an_empty_pod_and_sees_only_its_inputs(backend):
    leaves_a_file = {
        "script": "write('out', 'x'); open(local_path(outputs['out']['uri'] + '-side'), 'w')",
        "outputs": ["out"],
    }
    reads_it = {
        "script": "open(local_path(inputs['data']['uri'] + '-side')).read()",
        "inputs": {"data": ("producer", "out")},
    }
    with pytest.raises(TaskFailed, match="FileNotFoundError"):
        backend.run(spec_of({"producer": leaves_a_file, "consumer": reads_it}), PLATFORM, {})


def test_an_output_reported_at_a_local_path_is_not_uploaded_and_its_consumer_says_so(backend):
    # A step that reports the launcher's local path instead of the remote URI (what the entry
    # point's restore_remote_uris prevents): the launcher skips the upload.
    reports_local = {
        "script": "write('out', 'x'); report({'out': {'artifacts': "
        "[{'uri': local_path(outputs['out']['uri'])}]}})",
        "outputs": ["out"],
    }
    checks_inputs = {
        "script": "from pipelines.kubeflow.kfp_entrypoint import prepare; prepare(executor_input)",
        "inputs": {"data": ("producer", "out")},
    }
    with pytest.raises(TaskFailed, match="MissingInputError: input artifact 'data' has no files"):
        backend.run(spec_of({"producer": reports_local, "consumer": checks_inputs}), PLATFORM, {})


def test_a_pod_gets_the_image_env_the_secret_and_kfps_variables_not_the_test_process_env(
    backend, monkeypatch
):
    monkeypatch.setenv("ONLY_IN_THE_TEST_PROCESS", "1")
    shows_env = {
        "script": "write('out', json.dumps(dict(os.environ)))",
        "outputs": ["out"],
    }
    run = backend.run(spec_of({"producer": shows_env}), PLATFORM, {})
    environment = _written(run)
    assert "ONLY_IN_THE_TEST_PROCESS" not in environment
    assert set(SECRET) | {"KFP_POD_NAME", "KFP_POD_UID", "VIRTUAL_ENV"} <= set(environment)
    assert environment["HOME"].endswith("/home/step")
    relies_on_it = {"script": "os.environ['ONLY_IN_THE_TEST_PROCESS']"}
    with pytest.raises(TaskFailed, match="KeyError: 'ONLY_IN_THE_TEST_PROCESS'"):
        backend.run(spec_of({"producer": relies_on_it}), PLATFORM, {})
    backend.secrets["store"].pop("AWS_ACCESS_KEY_ID")
    backend.pending_deadline_s = 0.5
    with pytest.raises(TaskFailed, match="couldn't find key AWS_ACCESS_KEY_ID in Secret "
                       "kubeflow/store"):  # fmt: skip
        backend.run(spec_of({"producer": PRODUCER}), PLATFORM, {})


def test_memory_limits_are_decimal_and_a_step_over_its_limit_is_killed(backend):
    # 505 MB (plus the interpreter) fits 0.5 GiB but not 0.5 G = 500,000,000 bytes.
    allocates = {"script": "import time; block = b'x' * 505_000_000; time.sleep(1.5)"}
    with pytest.raises(TaskFailed, match="exited 137"):
        backend.run(spec_of({"producer": dict(allocates, memory=0.5)}), PLATFORM, {})
    backend.run(spec_of({"producer": dict(allocates, memory=0.6)}), PLATFORM, {})


def test_a_cache_hit_hands_on_the_earlier_runs_artifacts_even_after_they_were_deleted(backend):
    spec = spec_of({"producer": dict(PRODUCER, cache=True), "consumer": CONSUMER})
    first = backend.run(spec, PLATFORM, {})
    second = backend.run(spec, PLATFORM, {})
    assert first.tasks["producer"].state == "executed"
    assert second.tasks["producer"].state == "cached"
    assert second.tasks["consumer"].state == "executed"  # caching off for it
    assert second.outputs("producer")["out"] == first.outputs("producer")["out"]
    assert first.run_id in second.outputs("producer")["out"]["uri"]
    # Another parameter value, or another image, is another cache key.
    other = backend.run(spec, PLATFORM, {"message": "other"})
    assert other.tasks["producer"].state == "executed"
    retagged = copy.deepcopy(spec)
    retagged["deploymentSpec"]["executors"]["exec-producer"]["container"]["image"] = IMAGE + "b"
    backend.images[IMAGE + "b"] = backend.images[IMAGE]
    assert backend.run(retagged, PLATFORM, {}).tasks["producer"].state == "executed"

    backend.expire(first)  # e.g. an object-store lifecycle rule on the pipeline root
    checks_inputs = dict(CONSUMER, script="from pipelines.kubeflow.kfp_entrypoint import prepare\n"
                         "prepare(executor_input)")  # fmt: skip
    spec["deploymentSpec"]["executors"]["exec-consumer"] = spec_of({"consumer": checks_inputs})[
        "deploymentSpec"
    ]["executors"]["exec-consumer"]
    with pytest.raises(TaskFailed, match="input artifact 'data' has no files at s3://"):
        backend.run(spec, PLATFORM, {})


def test_metadata_comes_back_from_ml_metadata_converted(backend):
    reports = {
        "script": "write('out', 'x'); report({'out': {'artifacts': [{'metadata': "
        "{'count': 3, 'ok': True, 'tags': ['a'], 'nested': {'k': 'v'}}}]}})",
        "outputs": ["out"],
    }
    run = backend.run(spec_of({"producer": reports}), PLATFORM, {})
    received = run.outputs("producer")["out"]
    assert received["type"] == {"instanceSchema": ""} and received["name"].isdigit()
    metadata = dict(received["metadata"])
    assert json.loads(metadata.pop("store_session_info"))["Provider"] == "s3"
    assert type(metadata["count"]) is float and type(metadata["ok"]) is float
    assert metadata == {
        "count": 3.0,
        "ok": 1.0,
        "tags": {"list": ["a"]},
        "nested": {"struct": {"k": "v"}},
        "display_name": "out",
    }
    reports_null = dict(reports, script=reports["script"].replace("'count': 3", "'count': None"))
    with pytest.raises(TaskFailed, match="unsupported value type"):
        backend.run(spec_of({"producer": reports_null}), PLATFORM, {})


def test_a_false_trigger_condition_skips_the_task_and_omits_its_dependents(backend):
    """The condition reads the producer's metadata as ML Metadata returns it (a double); a task
    skipped by it leaves the tasks after it omitted, and the run succeeds."""
    decides = {
        "script": "write('out', 'x'); report({'out': {'artifacts': [{'metadata': "
        "{'train': int(parameters['message'] == 'train')}}]}})",
        "outputs": ["out"],
    }
    condition = "inputs.artifacts['data'].artifacts[0].metadata['train'] == 1.0"
    last = {"script": "print('last')", "inputs": {"c": ("consumer", "copy")}}
    spec = spec_of({"producer": decides, "consumer": CONSUMER, "last": last})
    spec["root"]["dag"]["tasks"]["consumer"]["triggerPolicy"] = {"condition": condition}

    skipped = backend.run(spec, PLATFORM, {})
    states = {name: task.state for name, task in skipped.tasks.items()}
    assert states == {"producer": "executed", "consumer": "skipped", "last": "omitted"}
    trained = backend.run(spec, PLATFORM, {"message": "train"})
    assert {task.state for task in trained.tasks.values()} == {"executed"}

    missing_key = condition.replace("'train'", "'trained'")
    spec["root"]["dag"]["tasks"]["consumer"]["triggerPolicy"] = {"condition": missing_key}
    with pytest.raises(TaskFailed, match="no such key"):
        backend.run(spec, PLATFORM, {})


def test_a_killed_pod_is_retried_as_argo_does_and_fails_the_task_without_a_policy(backend_2_5):
    """2.5.0: Argo's default OnFailure policy retries a failed pod up to maxRetryCount times,
    waiting backoffDuration x int(backoffFactor)^n; without a retryPolicy the task fails."""
    backend = backend_2_5
    slow = {"script": "import time; time.sleep(20); write('out', 'x')", "outputs": ["out"]}
    spec = spec_of({"producer": slow})
    spec["root"]["dag"]["tasks"]["producer"]["retryPolicy"] = {
        "maxRetryCount": 2, "backoffDuration": "3s", "backoffFactor": 2.9,
    }  # fmt: skip
    backend.interrupt["producer"] = lambda: True  # the first pod dies at once
    run = backend.run(spec, PLATFORM, {})
    assert run.tasks["producer"].state == "executed"
    assert backend.retry_waits == [("producer", 3)]
    log = run.tasks["producer"].log_path.read_text()
    assert "Killed: SIGKILL" in log.split("--- attempt 2 ---")[0]

    del spec["root"]["dag"]["tasks"]["producer"]["retryPolicy"]
    backend.interrupt["producer"] = lambda: True
    with pytest.raises(TaskFailed, match="task producer failed"):
        backend.run(spec, PLATFORM, {})

    # A pod deleted with its preempted node is an errored node to Argo, which OnFailure does
    # not retry, retry policy or not: the task fails and the run with it.
    spec["root"]["dag"]["tasks"]["producer"]["retryPolicy"] = {"maxRetryCount": 2}
    waits = len(backend.retry_waits)
    backend.preempt["producer"] = lambda: True
    with pytest.raises(TaskFailed, match="task producer failed: pod deleted: its node was "):
        backend.run(spec, PLATFORM, {})
    assert len(backend.retry_waits) == waits


def test_harness_backoff_is_argos():
    policy = {"maxRetryCount": 3, "backoffDuration": "30s", "backoffFactor": 2.7}
    assert [kfp_harness._backoff(policy, n) for n in range(3)] == [30, 60, 120]


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (lambda t: t.update(parameterIterator={"itemInput": "x"}), "parameterIterator"),
        (
            lambda t: t.update(triggerPolicy={"strategy": "ALL_UPSTREAM_TASKS_COMPLETED"}),
            "beyond a condition",
        ),
        (
            lambda t: t.update(
                triggerPolicy={
                    "condition": "parseJson(inputs.parameter_values" "['message'])['k'] == 'v'"
                }
            ),  # fmt: skip
            "more than parameter values and artifact metadata",
        ),
        (
            lambda t: t["inputs"]["parameters"].update(
                message={"taskOutputParameter": {"producerTask": "x", "outputParameterKey": "y"}}
            ),
            "taskOutputParameter",
        ),
        (lambda t: t["taskInfo"].update(name="Producer"), "taskInfo.name differs"),
    ],
)
def test_what_the_harness_does_not_play_is_refused(mutate, complaint):
    spec = spec_of({"producer": PRODUCER})
    mutate(spec["root"]["dag"]["tasks"]["producer"])
    with pytest.raises(UnsupportedByKubeflow, match=complaint):
        kfp_harness.check_supported(copy.deepcopy(spec), {})


def test_an_upper_case_task_name_is_refused_by_2_5_and_an_underscore_by_every_version(
    backend_2_5, backend
):
    spec = spec_of({"Producer": PRODUCER})
    with pytest.raises(UnsupportedByKubeflow, match="DNS-1123"):  # 2.5: the pod's name
        backend_2_5.run(spec, None, {})
    kfp_harness.check_supported(spec, {}, None, backend.version)  # 2.14+: shared templates
    with pytest.raises(UnsupportedByKubeflow, match="not a valid Argo task name"):
        kfp_harness.check_supported(spec_of({"producer_1": PRODUCER}), {}, None, backend.version)


def test_parameters_are_checked_and_converted_as_the_25_driver_does(backend):
    shows = {"script": "write('out', json.dumps(parameters))", "outputs": ["out"]}
    spec = spec_of({"producer": shows})
    inputs = spec["components"]["comp-producer"]["inputDefinitions"]["parameters"]
    # An input the task does not pass, with a component default: 2.5 hands the step "" (the
    # default is lost), which is why every step parameter is wired from the root here.
    inputs["greeting"] = {"parameterType": "STRING", "defaultValue": "hi"}
    spec["root"]["inputDefinitions"]["parameters"]["count"] = {
        "parameterType": "NUMBER_INTEGER",
        "defaultValue": 3,
    }
    inputs["count"] = {"parameterType": "STRING"}
    task = spec["root"]["dag"]["tasks"]["producer"]
    task["inputs"]["parameters"]["count"] = {"componentInputParameter": "count"}
    # 2.5 checks only that a NUMBER_INTEGER value is a number, and prints it in full as text.
    run = backend.run(spec, PLATFORM, {"count": 1e-05})
    received = _written(run)
    assert received == {"message": "hello", "greeting": "", "count": "0.00001"}
    with pytest.raises(UnsupportedByKubeflow, match="count requires type NUMBER_INTEGER"):
        backend.run(spec, PLATFORM, {"count": "3"})
    with pytest.raises(UnsupportedByKubeflow, match="not required by pipeline"):
        backend.run(spec, PLATFORM, {"spam": 1})


def test_an_output_reported_outside_the_runs_root_fails_the_upload(backend):
    moves_output = {
        "script": "write('out', 'x'); report({'out': {'artifacts': "
        "[{'uri': outputs['out']['uri'].replace('/root/', '/elsewhere/')}]}})",
        "outputs": ["out"],
    }
    with pytest.raises(TaskFailed, match="does not have expected bucket prefix"):
        backend.run(spec_of({"producer": moves_output}), PLATFORM, {})


# ------------------------------------------------- what differs between backend versions


# A step that writes its ExecutorOutput where KFP 2.5 put it, whatever its ExecutorInput says.
WRITES_25_PATH = """
path = os.environ["KFP_LOCAL_ARTIFACT_ROOT"] + "/tmp/kfp_outputs/output_metadata.json"
os.makedirs(os.path.dirname(path), exist_ok=True)
write('out', 'x')
json.dump({"artifacts": {"out": {"artifacts": [{"metadata": {"seen": 1}}]}}}, open(path, "w"))
print("output file", executor_input["outputs"]["outputFile"])
"""


def test_the_output_file_is_where_each_version_puts_it_and_the_25_path_is_lost_later(
    each_backend,
):
    """2.15.0+ (driver.go provisionOutputs): the ExecutorOutput goes to the task's folder on
    /s3; a step that writes to 2.5's /tmp/kfp_outputs loses what it reports."""
    reports = {"script": "write('out', 'x'); report({'out': {'artifacts': [{'metadata': "
               "{'seen': 1}}]}}); print('output file', executor_input['outputs']"
               "['outputFile']); print('named', outputs['out'].get('name'))",
               "outputs": ["out"]}  # fmt: skip
    run = each_backend.run(spec_of({"producer": reports}), PLATFORM, {})
    out = run.outputs("producer")["out"]
    assert out["metadata"]["seen"] == 1  # the launcher read what the step reported
    log = run.tasks["producer"].log_path.read_text()
    if each_backend.version.output_file_in_task_root:
        task_root = out["uri"].removesuffix("/out").removeprefix("s3://")
        assert f"/s3/{task_root}/output_metadata.json\n" in log
        assert "named out" in log  # outputs carry their key
    else:
        assert "/tmp/kfp_outputs/output_metadata.json\n" in log and "named None" in log
    fixed = each_backend.run(spec_of({"producer": {"script": WRITES_25_PATH,
                                                   "outputs": ["out"]}}), PLATFORM, {})  # fmt: skip
    seen = fixed.outputs("producer")["out"].get("metadata", {}).get("seen")
    assert seen == (None if each_backend.version.output_file_in_task_root else 1)


def test_the_log_artifact_of_each_version_and_a_failed_steps_log(each_backend):
    """2.16.1+: executor-logs-<retry index>, uploaded when the step fails too."""
    run = each_backend.run(spec_of({"producer": PRODUCER}), PLATFORM, {})
    uri = run.outputs("producer")[kfp_harness.EXECUTOR_LOGS]["uri"]
    per_retry = each_backend.version.executor_logs_per_retry
    assert uri.endswith("/executor-logs-0" if per_retry else "/executor-logs")
    failing = {"script": "print('about to fail'); sys.exit(3)", "outputs": ["out"]}
    with pytest.raises(TaskFailed, match="exited 3"):
        each_backend.run(spec_of({"producer": failing}), PLATFORM, {})
    logs = [key for key in storage.list_files(each_backend.pipeline_root + "/**")
            if "executor-logs" in key and not key.startswith(uri.rsplit("/", 2)[0])]  # fmt: skip
    if per_retry:
        (log,) = logs
        assert b"about to fail" in storage.read_bytes(log)
    else:
        assert logs == []


def test_2_16_retries_need_an_integer_factor_and_a_max_duration_and_see_their_index(
    object_store, tmp_path
):
    backend = make_backend(object_store, tmp_path, V2_16_1)
    slow = {"script": "import time; print('retry index', os.environ.get('KFP_RETRY_INDEX'), "
            "flush=True); time.sleep(20); write('out', 'x')", "outputs": ["out"]}  # fmt: skip
    spec = spec_of({"producer": slow})
    task = spec["root"]["dag"]["tasks"]["producer"]
    task["retryPolicy"] = {"maxRetryCount": 2, "backoffDuration": "3s", "backoffFactor": 2.9,
                           "backoffMaxDuration": "3600s"}  # fmt: skip
    backend.interrupt["producer"] = lambda: True
    with pytest.raises(TaskFailed, match="cannot parse the backoff factor '2.9'"):
        backend.run(spec, PLATFORM, {})
    del task["retryPolicy"]["backoffMaxDuration"]
    task["retryPolicy"]["backoffFactor"] = 2
    backend.interrupt["producer"] = lambda: True
    with pytest.raises(TaskFailed, match=r"Max duration limit exceeded \(backoffMaxDuration unset"):
        backend.run(spec, PLATFORM, {})
    task["retryPolicy"]["backoffMaxDuration"] = "3600s"  # what the Trainer's policy sets
    started = time.monotonic()
    backend.interrupt["producer"] = lambda: time.monotonic() - started > 6  # once it printed
    run = backend.run(spec, PLATFORM, {})
    assert backend.retry_waits == [("producer", 3)]
    first, second = run.tasks["producer"].log_path.read_text().split("--- attempt 2 ---")
    assert "retry index 0" in first and "retry index 1" in second


def test_2_17_retries_errors_on_every_task_and_no_failure(object_store, tmp_path):
    """2.17.0's default manifests (Argo templateDefaults: limit 2, OnError): a preempted pod is
    retried, policy or not; a killed one (a failed pod) is not, even with a policy."""
    backend = make_backend(object_store, tmp_path, V2_17_0)
    slow = {"script": "import time; time.sleep(20); write('out', 'x')", "outputs": ["out"]}
    spec = spec_of({"producer": slow})
    backend.preempt["producer"] = lambda: True  # no retryPolicy
    run = backend.run(spec, PLATFORM, {})
    assert run.tasks["producer"].state == "executed" and backend.retry_waits == [("producer", 0)]
    spec["root"]["dag"]["tasks"]["producer"]["retryPolicy"] = {
        "maxRetryCount": 2, "backoffDuration": "3s", "backoffFactor": 2,
        "backoffMaxDuration": "3600s",
    }  # fmt: skip
    backend.interrupt["producer"] = lambda: True
    with pytest.raises(TaskFailed, match="task producer failed: exited"):
        backend.run(spec, PLATFORM, {})
    assert len(backend.retry_waits) == 1


def test_a_missing_secret_leaves_the_task_pending_until_it_appears_or_the_deadline(
    object_store, tmp_path
):
    """Every version: the pod waits in CreateContainerConfigError; nothing fails it."""
    backend = make_backend(object_store, tmp_path, pending_deadline_s=2)
    stored = backend.secrets.pop("store")
    started = time.monotonic()
    with pytest.raises(TaskFailed, match='still Pending after 2 s: CreateContainerConfigError: '
                       'secret "store" not found'):  # fmt: skip
        backend.run(spec_of({"producer": PRODUCER}), PLATFORM, {})
    assert time.monotonic() - started >= 2
    threading.Timer(1, lambda: backend.secrets.update(store=stored)).start()
    run = backend.run(spec_of({"producer": PRODUCER}), PLATFORM, {})  # it starts once it exists
    assert run.tasks["producer"].state == "executed"


def test_2_17_downloads_an_artifact_without_its_neighbours(each_backend):
    """Before 2.17.0 an input's download also took every object whose key string-starts with
    its key: `.../out` brought `.../out-2` along (object_store.go DownloadBlob)."""
    two = {"script": "write('out', 'a'); write('out-2', 'b')", "outputs": ["out", "out-2"]}
    looks = {"script": "print('neighbour', os.path.exists(os.path.join(local_path(inputs['data']"
             "['uri']), '..', 'out-2', 'data.txt'))); write('copy', read('data'))",
             "inputs": {"data": ("producer", "out")}, "outputs": ["copy"]}  # fmt: skip
    run = each_backend.run(spec_of({"producer": two, "consumer": looks}), PLATFORM, {})
    log = run.tasks["consumer"].log_path.read_text()
    exact = each_backend.version.download_exact_prefix
    assert f"neighbour {not exact}" in log


@pytest.mark.parametrize("version", [V2_5_0, V2_16_1], ids=["2.5.0", "2.16.1"])
def test_the_trainers_compiled_retry_policy_retries_a_killed_pod(version, object_store, tmp_path):
    """The policy the compiler gives the Trainer (kubeflow_runner.trainer_retry_policy), on the
    versions whose Argo retries a failed pod: the killed attempt is retried after 30 s."""
    backend = make_backend(object_store, tmp_path, version)
    slow = {"script": "import time; time.sleep(20); write('out', 'x')", "outputs": ["out"]}
    spec = spec_of({"producer": slow})
    policy = kubeflow_runner.trainer_retry_policy(PipelineConfig(max_train_minutes=7 * 24 * 60))
    spec["root"]["dag"]["tasks"]["producer"]["retryPolicy"] = policy
    backend.interrupt["producer"] = lambda: True
    run = backend.run(spec, PLATFORM, {})
    assert run.tasks["producer"].state == "executed"
    assert backend.retry_waits == [("producer", 30)]
