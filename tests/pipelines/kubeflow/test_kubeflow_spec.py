"""The compiled Kubeflow spec: in sync, shaped for open-source KFP, and proven by running it.

The tests of a spec take `documents`: each shipped use case's committed spec in turn (IDs
`[<name>]`), beside its config (`spec_config`); the runs write spans with that use case's
generator and take its bars from its test settings (tests/use_cases/<name>/fixtures.py).
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
import urllib.parse

import pytest
import yaml
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2

from components.base import serving_state, storage, use_case
from components.base.config import (
    REPO_ROOT,
    RULES,
    RUN_PARAMETER_HELP,
    RUN_PARAMETERS,
    SECRET_KEYS,
    ConfigError,
    PipelineConfig,
    spec_path,
)
from components.base.object_store import s3_client
from components.base.registry import complete_versions as pushed_versions
from components.base.registry import versions_dir as serving_model_dir
from components.steps.auc_text import accuracy_of
from components.steps.evaluation import ROC_THRESHOLDS, VERDICT_FILE
from components.training.cluster_job import deadline_seconds
from pipelines import data
from pipelines.kubeflow import kubeflow_runner
from tests.stand_ins import kfp_harness
from tests.use_cases import kit


@pytest.fixture(scope="module", params=use_case.shipped())
def spec_config(request) -> PipelineConfig:
    """Each shipped use case's config as a user of it gets it (its defaults), which its
    committed spec is compiled with."""
    return kit.of(request.param).config()


@pytest.fixture(scope="module")
def documents(spec_config) -> tuple[dict, dict]:
    """The use case's committed spec (kubeflow/pipeline-<name>.yaml, the defaults' compile),
    which test_committed_spec_matches_the_pipeline_definition keeps equal to its compile."""
    return kubeflow_runner.load_documents(spec_path(spec_config.use_case))


@pytest.mark.parametrize("name", use_case.shipped())
def test_committed_spec_matches_the_pipeline_definition(name):
    """One committed spec per shipped use case, each as `make specs` writes it."""
    expected = kubeflow_runner.render(PipelineConfig.load({"use_case": name}, environ={}))
    assert spec_path(name).read_text() == expected, "stale: run `make specs`"


def test_each_spec_file_is_a_shipped_use_case():
    """No spec left behind by a use case that was renamed or removed."""
    committed = {path.name for path in (REPO_ROOT / "kubeflow").glob("pipeline-*.yaml")}
    assert committed == {spec_path(name).name for name in use_case.shipped()}


def test_spec_loads_strictly_and_has_nothing_open_source_kfp_rejects(documents, spec_config):
    spec, _ = documents
    kfp_harness.load_strictly(spec)
    kfp_harness.check_supported(spec, parameter_values={})  # every parameter has a default
    assert not any("resolver" in e for e in spec["deploymentSpec"]["executors"].values())
    defaults = {
        n: p["defaultValue"] for n, p in spec["root"]["inputDefinitions"]["parameters"].items()
    }
    assert defaults["span"] == -1 and defaults["train_steps"] == spec_config.train_steps
    tasks = spec["root"]["dag"]["tasks"]
    for step in kubeflow_runner.UNCACHED_STEPS:
        assert tasks[kubeflow_runner.task_name(step)]["cachingOptions"] == {"enableCache": False}
    assert tasks["trainer"]["cachingOptions"] == {"enableCache": True}
    assert json.loads(defaults["beam_args"]) == list(spec_config.beam_args)
    for task in spec["root"]["dag"]["tasks"].values():
        assert task["inputs"]["parameters"]["beam_args"] == {"componentInputParameter": "beam_args"}
    for executor in spec["deploymentSpec"]["executors"].values():
        assert not any(a.startswith("--direct_") for a in executor["container"]["args"])


def test_trainer_requests_a_gpu_and_every_step_has_limits_and_pinned_images(documents, spec_config):
    spec, _ = documents
    config = spec_config
    for label, executor in spec["deploymentSpec"]["executors"].items():
        container = executor["container"]
        assert container["command"] == kubeflow_runner.ENTRYPOINT
        assert {"cpuLimit", "memoryLimit"} <= set(container["resources"]), label
        assert not container["image"].endswith(":latest")
        if label == "Trainer_executor":
            assert container["image"] == config.gpu_image
            assert container["resources"]["accelerator"] == {
                "type": "nvidia.com/gpu",
                "count": str(config.gpu_count),
            }
        else:
            assert container["image"] == config.cpu_image
            assert "accelerator" not in container["resources"]


def test_platform_section_secret_env_on_every_step_and_gpu_placement(documents):
    spec, platform = documents
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert set(executors) == set(spec["deploymentSpec"]["executors"])
    for config in executors.values():
        known = {k: v for k, v in config.items() if k != "tolerations"}  # not in kfp-kubernetes 1.0
        json_format.ParseDict(known, kubernetes_executor_config_pb2.KubernetesExecutorConfig())
        (secret,) = config["secretAsEnv"]
        assert secret["secretName"] == "tfx-pipeline-s3"
        assert {e["envVar"] for e in secret["keyToEnv"]} == set(SECRET_KEYS)
    trainer = executors["Trainer_executor"]
    assert trainer["nodeSelector"] == {"labels": {"nvidia.com/gpu.present": "true"}}
    assert trainer["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    ]
    assert "nodeSelector" not in executors["Transform_executor"]


@pytest.mark.parametrize(
    ("mutate", "complaint"),
    [
        (
            lambda s: s["deploymentSpec"]["executors"]["Pusher_executor"].update(resolver={}),
            "resolver",
        ),
        (lambda s: s["root"]["inputDefinitions"]["parameters"]["span"].pop("defaultValue"), "span"),
        (
            lambda s: s["deploymentSpec"]["executors"]["ExampleGen_executor"]["container"].update(
                lifecycle={"preCacheCheck": {"command": ["python"]}}
            ),
            "preCacheCheck",
        ),
    ],
)
def test_harness_refuses_what_open_source_kfp_cannot_run(documents, mutate, complaint):
    spec = copy.deepcopy(documents[0])
    mutate(spec)
    with pytest.raises(kfp_harness.UnsupportedByKubeflow, match=complaint):
        kfp_harness.check_supported(spec, parameter_values={})


def test_task_names_are_dns_labels_and_every_reference_follows_the_rename(documents):
    spec, _ = documents
    tasks = spec["root"]["dag"]["tasks"]
    assert sorted(tasks) == sorted(kubeflow_runner.task_name(n) for n in spec["components"])
    assert kubeflow_runner.task_name("LatestPushedModel") == "latest-pushed-model"
    for name, task in tasks.items():
        assert kfp_harness.DNS_1123_LABEL.match(name) and task["taskInfo"]["name"] == name
        assert set(task.get("dependentTasks", [])) <= set(tasks)
        for source in task.get("inputs", {}).get("artifacts", {}).values():
            assert source["taskOutputArtifact"]["producerTask"] in tasks


def test_task_names_that_collide_or_are_not_labels_stop_the_compile():
    for clash in ({"FooBar": {}, "Foo_Bar": {}}, {"Evaluator.v2": {}}):
        spec = {"root": {"dag": {"tasks": {n: {"taskInfo": {"name": n}} for n in clash}}}}
        with pytest.raises(ValueError, match="taken twice or not a DNS-1123 label"):
            kubeflow_runner._tasks_as_dns_labels(spec)


def _throttled(check, seconds: float = 1.0):
    """`check()` at most every `seconds` (the harness polls every 0.1 s)."""
    last = [0.0]

    def throttled() -> bool:
        if time.monotonic() - last[0] < seconds:
            return False
        last[0] = time.monotonic()
        return check()

    return throttled


def _launcher_config(bucket: str) -> dict[str, str]:
    """kubeflow/kfp-launcher.yaml as an operator edits it for a store: the root in its bucket,
    the endpoint its host:port (tests/pipelines/kubeflow/test_kfp_launcher_config.py)."""
    data = yaml.safe_load((REPO_ROOT / "kubeflow" / "kfp-launcher.yaml").read_text())["data"]
    shipped = "endpoint: seaweedfs.kubeflow:8333"
    assert shipped in data["providers"]
    store = urllib.parse.urlparse(s3_client().meta.endpoint_url).netloc
    return {"defaultPipelineRoot": f"s3://{bucket}/pipeline_root",
            "providers": data["providers"].replace(shipped, f"endpoint: {store}")}  # fmt: skip


def _backend(bucket: str, work_dir, config: PipelineConfig) -> kfp_harness.Backend:
    """The newest KFP backend (tests/stand_ins/kfp_versions.py) in namespace `kubeflow`: the
    compiled images' Dockerfiles, the credentials Secret, the shipped kfp-launcher ConfigMap
    (the pipeline root and the store session)."""
    return kfp_harness.Backend(
        pipeline_root=None,
        launcher_config=_launcher_config(bucket),
        images={
            config.cpu_image: REPO_ROOT / "kubeflow" / "Dockerfile",
            config.gpu_image: REPO_ROOT / "kubeflow" / "Dockerfile.gpu",
        },
        secrets={config.credentials_secret: {k: os.environ[k] for k in SECRET_KEYS}},
        work_dir=work_dir,
    )


@pytest.mark.parametrize("case", kit.TABULAR)
def test_compiled_spec_on_the_newest_kfp_trains_on_new_data_only_and_pushes_only_a_blessed_model(
    case, object_store, tmp_path
):
    """The tabular use cases' spec through preemption, a retried pod, a run without new data
    and a run whose first run's artifacts expired. The Trainer, its backups and the KFP glue
    are the same for every use case; the image use case's spec runs its own, shorter scenario
    (test_image_spec_on_the_newest_kfp_...)."""
    config = kit.of(case).config()
    documents = kubeflow_runner.load_documents(spec_path(case))
    settings = kit.of(case).settings
    bucket = object_store.new_bucket("kfp")
    data_root, serving_root = f"s3://{bucket}/data", f"s3://{bucket}/serving"
    model_dir = serving_model_dir(serving_root, config.model_name)
    data.write_span(data_root, 0, settings.span_rows, use_case=case)
    # What a user would set in the run's form; everything else keeps its compiled default.
    parameters = {
        "data_root": data_root,
        "serving_root": serving_root,
        "train_steps": 300,
        "epochs": 3,  # a backup per epoch: preempted after 1, done after 3
        # Far below what this training reaches (the use case's SETTINGS say what it measured; a
        # resumed training clears the same bound as an uninterrupted one,
        # tests/training/test_training.py), so only a broken step can fail the first run's gate.
        **settings.run_bars,
    }
    backend = _backend(bucket, tmp_path, config)
    # The Trainer's node is preempted once its first epoch is backed up. A deleted pod is an
    # errored node, which 2.17's Argo defaults retry (a failed one they would not: the killed
    # pod of test_kfp_harness.py); the Trainer's retryPolicy sets the wait, and its
    # backoffMaxDuration keeps the retry from being refused at once. The retry resumes from
    # the backup, keyed by content on the pipeline root.
    backups = f"s3://{bucket}/pipeline_root/{config.pipeline_name}/_checkpoints/*/chief/checkpoint"
    backend.preempt["trainer"] = _throttled(lambda: bool(storage.list_files(backups)))
    first = backend.run(*documents, parameters)

    assert {t.state for t in first.tasks.values()} == {"executed"}
    assert backend.retry_waits == [("trainer", 30)]
    # The harness's log of the task holds every attempt; the launcher uploads the last one's.
    killed, retried = first.tasks["trainer"].log_path.read_text().split("--- attempt 2 ---")
    assert "Killed: SIGKILL" in killed and "(resuming)" not in killed
    assert "(resuming)" in retried
    assert first.outputs("trainer")["model_run"]["metadata"]["resumed"] == 1
    assert not storage.list_files(backups)  # the finished training removed its backup
    examples = first.outputs("example-gen")["examples"]
    assert examples["metadata"]["span"] == 0 and examples["uri"].startswith(first.run_root)
    assert storage.list_files(first.outputs("transform")["transform_graph"]["uri"] + "/**")
    assert storage.read_bytes(first.outputs("trainer")["executor-logs"]["uri"])  # the step's log
    versions = pushed_versions(model_dir)
    assert list(versions) == [1]
    assert "Pushed: version 1" in _check_run_report(backend, first, pushed_version=1)
    assert serving_state.read(model_dir, config.model_name).stable == 1
    # The use case's SETTINGS say what its models measured on these rows; an untrained model's
    # are about 0 apart.
    assert kit.of(case).separation(versions[1], data_root, 0, 200) > settings.separation

    # A scheduled run with no new span: select-spans finds the span's fingerprint in the
    # registry, the driver evaluates every other task's triggerPolicy to false (the first of
    # them is skipped, the rest omitted) and the run succeeds without training or pushing.
    second = backend.run(*documents, parameters)
    states = {name: t.state for name, t in second.tasks.items()}
    assert states.pop("select-spans") == "executed"
    # Tasks right after select-spans are skipped by their condition; the rest (example-gen too:
    # it reads curated-schema's schema) are omitted.
    assert states["curated-schema"] == "skipped" and states["example-gen"] == "omitted"
    assert set(states.values()) == {"skipped", "omitted"} and states["pusher"] == "omitted"
    decision = second.outputs("select-spans")["decision"]["metadata"]
    assert decision["train"] == 0 and "no new data since span 0" in decision["reason"]
    assert list(pushed_versions(model_dir)) == [1]

    # The first run's artifacts are deleted (a lifecycle rule on the pipeline root), a new span
    # lands, and the pipeline runs with a bar no model reaches (the use case's unreachable_auc:
    # its SETTINGS say why). Nothing may be served from KFP's cache that points at the deleted
    # files (every conditioned task reads this run's own decision artifact, so no cache key can
    # repeat): every step runs, the Evaluator compares with the served version 1, refuses, and
    # nothing is pushed.
    assert backend.expire(first) > 0
    data.write_span(data_root, 1, settings.span_rows, use_case=case)
    third = backend.run(*documents, dict(parameters, min_auc=settings.unreachable_auc))
    assert {name: t.state for name, t in third.tasks.items()} == {
        name: "executed" for name in first.tasks
    }
    assert third.outputs("example-gen")["examples"]["metadata"]["span"] == 1
    baseline = third.outputs("latest-pushed-model")["baseline_model"]["metadata"]
    assert baseline["baseline_version"] == 1
    assert third.outputs("evaluator")["blessing"]["metadata"]["blessed"] == 0
    assert third.outputs("pusher")["pushed_model"]["metadata"]["pushed"] == 0
    page = _check_run_report(backend, third, pushed_version=0)
    assert "Not pushed: not blessed" in page and "auc" in page
    assert list(pushed_versions(model_dir)) == [1]


@pytest.mark.parametrize("case", [n for n in use_case.shipped() if n not in kit.TABULAR])
def test_image_spec_on_the_newest_kfp_trains_pushes_and_then_skips_a_run_without_new_data(
    case, object_store, tmp_path
):
    """An image use case's committed spec: a first run reads the images, trains, evaluates
    with its multi-class metrics, pushes version 1 and reports an N x N confusion matrix; a
    second run on the same span executes select-spans only."""
    config, kit_of = kit.of(case).config(), kit.of(case)
    documents = kubeflow_runner.load_documents(spec_path(case))
    settings = kit_of.settings
    bucket = object_store.new_bucket("kfp-images")
    data_root, serving_root = f"s3://{bucket}/data", f"s3://{bucket}/serving"
    model_dir = serving_model_dir(serving_root, config.model_name)
    data.write_span(data_root, 0, settings.span_rows, use_case=case)
    parameters = {"data_root": data_root, "serving_root": serving_root, "train_steps": 200,
                  "epochs": 2, **settings.run_bars}  # fmt: skip
    backend = _backend(bucket, tmp_path, config)

    first = backend.run(*documents, parameters)

    assert {t.state for t in first.tasks.values()} == {"executed"}
    examples = first.outputs("example-gen")["examples"]["metadata"]
    assert json.loads(examples["class_names"]) == kit_of.class_names
    versions = pushed_versions(model_dir)
    assert list(versions) == [1]
    page = _check_run_report(backend, first, pushed_version=1, classes=len(kit_of.class_names))
    assert "Pushed: version 1" in page and page.count("data:image/jpeg;base64,") == 8
    # The served model learned (an untrained one's separation is about 0). Half the kit's bar:
    # 200 steps on one small span measured 0.167 and 0.207 in two runs (TensorFlow on CPU is
    # not deterministic); the Evaluator's bars, which blessed it, are the quality gate.
    assert kit_of.separation(versions[1], data_root, 0, 200) > settings.separation / 2

    second = backend.run(*documents, parameters)
    states = {name: t.state for name, t in second.tasks.items()}
    assert states.pop("select-spans") == "executed"
    assert set(states.values()) == {"skipped", "omitted"}
    assert list(pushed_versions(model_dir)) == [1]


def _check_run_report(backend, run, pushed_version: int, classes: int = 2) -> str:
    """The run-report task's outputs as KFP 2.5 records them: the MLMD types the UI draws, the
    metrics equal to the Evaluator's, the ROC points and confusion matrix in the shapes the UI
    reads (MetricsVisualizations.tsx: `confidenceMetrics.list`, `confusionMatrix.struct`); returns
    the HTML page, read from the object at the report's URI as the UI's /artifacts/get does."""
    outputs = run.outputs("run-report")
    recorded = {key: backend.metadata.find(outputs[key]["uri"])
                for key in ("metrics", "classification_metrics", "report")}  # fmt: skip
    assert {key: a.type_name for key, a in recorded.items()} == {
        "metrics": "system.Metrics",
        "classification_metrics": "system.ClassificationMetrics",
        "report": "system.HTML",
    }
    # The Evaluator's metrics as it recorded them in its blessing (TFMA's own files are read
    # through TensorFlow's s3 client, which fails against this store: kubeflow/README.md).
    blessing = run.outputs("evaluator")["blessing"]["uri"]
    overall = json.loads(storage.read_bytes(f"{blessing}/{VERDICT_FILE}"))["metrics"]["overall"]
    metrics = recorded["metrics"].custom_properties
    # Nothing but metrics in the UI's table (besides the launcher's own two keys).
    assert set(metrics) - {"display_name", "store_session_info"} <= {
        "auc", "accuracy", "example_count", "baseline_auc", "auc_change", "blessed",
        "pushed_version", "span", *(["top_2_accuracy"] if classes > 2 else []),
    }  # fmt: skip
    if classes > 2:
        assert metrics["top_2_accuracy"] == pytest.approx(overall["top_2_accuracy"])
    assert metrics["auc"] == pytest.approx(overall["auc"])
    assert metrics["accuracy"] == pytest.approx(accuracy_of(overall))
    assert metrics["example_count"] == overall["example_count"]
    assert metrics["pushed_version"] == pushed_version
    curves = recorded["classification_metrics"].custom_properties
    if classes == 2:  # a binary model's ROC curve; a multi-class one has one per class: none
        points = curves["confidenceMetrics"]["list"]
        assert len(points) == ROC_THRESHOLDS + 2 and all(
            isinstance(p[k], float) for p in points
            for k in ("confidenceThreshold", "recall", "falsePositiveRate")
        )  # fmt: skip
    else:
        assert "confidenceMetrics" not in curves
    rows = [row["row"] for row in curves["confusionMatrix"]["struct"]["rows"]]
    assert len(rows) == classes and all(len(row) == classes for row in rows)
    assert sum(map(sum, rows)) == overall["example_count"]
    right = sum(rows[i][i] for i in range(classes))
    assert right / overall["example_count"] == pytest.approx(accuracy_of(overall))
    return storage.read_bytes(outputs["report"]["uri"]).decode()


# What each text rule's "Allowed:" excludes, one example each.
REFUSED = {"data_root": "http://host/data", "serving_root": "", "model_name": "..",
           "beam_args": ("direct_num_workers=2",)}  # fmt: skip


def test_every_run_parameter_says_what_it_does_its_range_and_default(documents):
    """The spec's ParameterSpec.description (pipeline_spec.proto field 5, which the strict load
    above accepts); each stated range is the one the config's rules enforce, and
    kubeflow/README.md's table says the same."""
    parameters = documents[0]["root"]["inputDefinitions"]["parameters"]
    assert set(parameters) == set(RUN_PARAMETER_HELP)
    for name, parameter in parameters.items():
        default = parameter["defaultValue"]
        shown = default if name == "beam_args" else json.dumps(default)
        assert parameter["description"] == f"{RUN_PARAMETER_HELP[name]} Default: {shown}."
        allowed = RUN_PARAMETER_HELP[name].rsplit("Allowed: ", 1)[1].rstrip(".")
        kind, rule = RUN_PARAMETERS.get(name, str), RULES[name]
        bounds = re.fullmatch(r"(-?[\d.]+) (to|or) (-?[\d.]+|more)", allowed)
        if bounds is None:  # a text rule: its example of what it refuses is refused
            assert rule(name, REFUSED[name]) is not None, name
            continue
        low, high = kind(bounds.group(1)), bounds.group(3)
        step = 1 if kind is int else 0.01
        assert rule(name, low) is None and rule(name, low - step) is not None, name
        if high != "more":
            assert rule(name, kind(high)) is None and rule(name, kind(high) + step), name
    readme = (REPO_ROOT / "kubeflow" / "README.md").read_text()
    table = readme.split("<!-- run-parameters:", 1)[1].split("\n\n", 1)[0]
    rows = dict(re.findall(r"^\| `(\w+)` \| (.*) \|$", table, flags=re.M))
    assert rows == RUN_PARAMETER_HELP


def test_harness_evaluates_trigger_conditions_as_the_2_5_driver_does():
    """CEL over the task's inputs with numbers as doubles; a missing key or a result that is not
    a bool fails the task (v2/expression/expression.go)."""
    executor_input = {
        "inputs": {
            "parameterValues": {"force": 1, "model_name": "taxi-tips"},
            "artifacts": {"d": {"artifacts": [{"name": "7", "metadata": {"train": 1}}]}},
        }
    }
    condition = "(inputs.artifacts['d'].artifacts[0].metadata['train'] == 1.0)"
    assert kfp_harness.evaluate_condition(executor_input, condition) is True
    assert kfp_harness.evaluate_condition(executor_input, "inputs.parameter_values['force'] > 0.5")
    assert not kfp_harness.evaluate_condition(
        executor_input, "inputs.parameter_values['model_name'] == 'other'"
    )
    with pytest.raises(kfp_harness.TaskFailed, match="no such key"):
        kfp_harness.evaluate_condition(executor_input, condition.replace("train", "missing"))
    with pytest.raises(kfp_harness.TaskFailed, match="not bool"):
        kfp_harness.evaluate_condition(executor_input, "inputs.parameter_values['model_name']")


def test_a_run_parameter_breaking_a_rule_stops_the_step_that_receives_it(
    documents, spec_config, object_store, tmp_path
):
    """A run from the UI or a schedule never passes through the CLI's checks: the step itself
    refuses the value, naming it, before reading anything. (Cut down to the step involved.)"""
    spec = copy.deepcopy(documents[0])
    tasks = spec["root"]["dag"]["tasks"]
    spec["root"]["dag"]["tasks"] = {"select-spans": tasks["select-spans"]}
    bucket = object_store.new_bucket("kfp-rule")
    data.write_span(f"s3://{bucket}/data", 0, 100, use_case=spec_config.use_case)
    backend = _backend(bucket, tmp_path, spec_config)
    with pytest.raises(kfp_harness.TaskFailed, match="invalid run parameter: span must be -1"):
        backend.run(spec, documents[1], {"data_root": f"s3://{bucket}/data", "span": -2})


def test_a_run_without_its_credentials_secret_waits_until_a_deadline_naming_it(
    documents, spec_config, object_store, tmp_path
):
    """The compiled tasks take the store's keys from the Secret the config names: in a
    namespace without it (another name, or not created yet) the pod waits in
    CreateContainerConfigError and the run hangs, failing nothing; the harness's deadline then
    names the Secret. (Cut down to the first step.)"""
    spec = copy.deepcopy(documents[0])
    tasks = spec["root"]["dag"]["tasks"]
    spec["root"]["dag"]["tasks"] = {"select-spans": tasks["select-spans"]}
    bucket = object_store.new_bucket("kfp-secret")
    backend = _backend(bucket, tmp_path, spec_config)
    backend.secrets = {"tfx-pipeline-credentials": backend.secrets[spec_config.credentials_secret]}
    backend.pending_deadline_s = 2
    with pytest.raises(kfp_harness.TaskFailed, match=re.escape(
        "still Pending after 2 s: CreateContainerConfigError: secret "
        f'"{spec_config.credentials_secret}" not found'
    )):  # fmt: skip
        backend.run(spec, documents[1], {"data_root": f"s3://{bucket}/data"})


def test_trainer_task_carries_the_retry_policy_argo_needs(documents, spec_config):
    spec, _ = documents
    tasks = spec["root"]["dag"]["tasks"]
    policy = tasks["trainer"]["retryPolicy"]
    # KFP 2.14+ reads an unset backoffMaxDuration as 0 (no retry at all) and parses the factor
    # as an integer (tests/stand_ins/kfp_versions.py retry_values_as_parameters); the duration
    # counts from the first attempt and must outlast every attempt of the longest training a
    # run may ask for (max_train_minutes is a run parameter, bounded by the config's check).
    assert isinstance(policy["backoffFactor"], int) and policy["backoffDuration"] == "30s"
    assert policy["maxRetryCount"] == spec_config.trainer_retries
    with pytest.raises(ConfigError):
        PipelineConfig(max_train_minutes=7 * 24 * 60 + 1)
    # the job's deadline at the longest budget (its replicas' start included), + an hour for the
    # step's own start and copies
    longest_attempt_s = deadline_seconds(7 * 24 * 60, spec_config.replica_start_timeout_minutes)
    longest_attempt_s += 3600
    attempts = spec_config.trainer_retries + 1
    assert int(policy["backoffMaxDuration"].rstrip("s")) >= attempts * longest_attempt_s
    assert [name for name, task in tasks.items() if "retryPolicy" in task] == ["trainer"]
    five = kubeflow_runner.trainer_retry_policy(PipelineConfig(trainer_retries=5))
    assert int(five["backoffMaxDuration"].rstrip("s")) >= 6 * longest_attempt_s
    patient = kubeflow_runner.trainer_retry_policy(
        PipelineConfig(replica_start_timeout_minutes=24 * 60)
    )  # replicas that may wait a day to start: each attempt's deadline a day longer
    assert int(patient["backoffMaxDuration"].rstrip("s")) >= (
        PipelineConfig().trainer_retries + 1
    ) * (deadline_seconds(7 * 24 * 60, 24 * 60) + 3600)
