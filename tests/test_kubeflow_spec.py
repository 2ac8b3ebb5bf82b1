"""The compiled Kubeflow spec: in sync, shaped for open-source KFP, and proven by running it."""

from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest
from google.protobuf import json_format
from kfp.kubernetes import kubernetes_executor_config_pb2

from components.baseline import pushed_versions, serving_model_dir
from pipelines import data, kubeflow_runner, serving, storage
from pipelines.config import REPO_ROOT, PipelineConfig
from tests import kfp_harness


@pytest.fixture(scope="module")
def documents() -> tuple[dict, dict]:
    return kubeflow_runner.load_documents()


def test_committed_spec_matches_the_pipeline_definition():
    expected = kubeflow_runner.render(PipelineConfig.load(environ={}))
    assert kubeflow_runner.SPEC_PATH.read_text() == expected, "stale: run `make compile`"


def test_spec_loads_strictly_and_has_nothing_open_source_kfp_rejects(documents):
    spec, _ = documents
    kfp_harness.load_strictly(spec)
    kfp_harness.check_supported(spec, parameter_values={})  # every parameter has a default
    assert not any("resolver" in e for e in spec["deploymentSpec"]["executors"].values())
    defaults = {
        n: p["defaultValue"] for n, p in spec["root"]["inputDefinitions"]["parameters"].items()
    }
    assert defaults["span"] == -1 and defaults["train_steps"] == PipelineConfig().train_steps
    tasks = spec["root"]["dag"]["tasks"]
    for step in kubeflow_runner.UNCACHED_STEPS:
        assert tasks[kubeflow_runner.task_name(step)]["cachingOptions"] == {"enableCache": False}
    assert tasks["trainer"]["cachingOptions"] == {"enableCache": True}
    assert json.loads(defaults["beam_args"]) == list(PipelineConfig().beam_args)
    for task in spec["root"]["dag"]["tasks"].values():
        assert task["inputs"]["parameters"]["beam_args"] == {"componentInputParameter": "beam_args"}
    for executor in spec["deploymentSpec"]["executors"].values():
        assert not any(a.startswith("--direct_") for a in executor["container"]["args"])


def test_trainer_requests_a_gpu_and_every_step_has_limits_and_pinned_images(documents):
    spec, _ = documents
    config = PipelineConfig()
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
        assert {e["envVar"] for e in secret["keyToEnv"]} == set(kubeflow_runner.SECRET_KEYS)
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


def _backend(bucket: str, work_dir) -> kfp_harness.Backend:
    """KFP 2.5 in namespace `kubeflow`: the compiled images' Dockerfiles, the credentials Secret."""
    config = PipelineConfig()
    return kfp_harness.Backend(
        pipeline_root=f"s3://{bucket}/pipeline_root",
        images={
            config.cpu_image: REPO_ROOT / "kubeflow" / "Dockerfile",
            config.gpu_image: REPO_ROOT / "kubeflow" / "Dockerfile.gpu",
        },
        secrets={
            config.credentials_secret: {k: os.environ[k] for k in kubeflow_runner.SECRET_KEYS}
        },
        work_dir=work_dir,
    )


def test_compiled_spec_runs_twice_on_kfp_2_5_and_pushes_only_a_model_the_gate_blesses(
    documents, object_store, tmp_path
):
    bucket = object_store.new_bucket("kfp")
    data_root, serving_root = f"s3://{bucket}/data", f"s3://{bucket}/serving"
    data.write_span(data_root, 0, 3000)
    # What a user would set in the run's form; everything else keeps its compiled default.
    parameters = {
        "data_root": data_root,
        "serving_root": serving_root,
        "train_steps": 300,
        "epochs": 2,
        "min_auc": 0.7,
        "min_accuracy": 0.6,
    }
    backend = _backend(bucket, tmp_path)
    first = backend.run(*documents, parameters)

    assert {t.state for t in first.tasks.values()} == {"executed"}
    examples = first.outputs("example-gen")["examples"]
    assert examples["metadata"]["span"] == 0 and examples["uri"].startswith(first.run_root)
    assert storage.list_files(first.outputs("transform")["transform_graph"]["uri"] + "/**")
    assert storage.read_bytes(first.outputs("trainer")["executor-logs"]["uri"])  # the step's log
    versions = pushed_versions(serving_model_dir(serving_root, "taxi-tips"))
    assert list(versions) == [1]
    rows = serving.read_rows(storage.list_files(data_root + "/span-0/*.csv")[0], 200)
    probabilities = np.array(serving.predict(versions[1], rows))
    assert ((probabilities > 0) & (probabilities < 1)).all()
    labels = np.array([int(r["big_tipper"]) for r in rows])
    assert probabilities[labels == 1].mean() > probabilities[labels == 0].mean() + 0.2

    # The first run's artifacts are deleted (a lifecycle rule on the pipeline root), then the
    # pipeline runs again on the same span, with a bar no model reaches. Nothing may be served
    # from KFP's cache that points at the deleted files: every step runs, the Evaluator compares
    # with the served version 1, refuses, and nothing is pushed.
    assert backend.expire(first) > 0
    second = backend.run(*documents, dict(parameters, min_auc=0.99))
    assert {name: t.state for name, t in second.tasks.items()} == {
        name: "executed" for name in first.tasks
    }
    baseline = second.outputs("latest-pushed-model")["baseline_model"]["metadata"]
    assert baseline["baseline_version"] == 1
    assert second.outputs("evaluator")["blessing"]["metadata"]["blessed"] == 0
    assert second.outputs("pusher")["pushed_model"]["metadata"]["pushed"] == 0
    assert list(pushed_versions(serving_model_dir(serving_root, "taxi-tips"))) == [1]


def test_the_old_spec_that_cached_the_schema_step_fails_once_its_artifacts_are_gone(
    documents, object_store, tmp_path
):
    # The compiled spec as it was before: curated-schema cached. A later run reuses the first
    # run's schema artifact; once that is deleted, its first consumer stops with a named error.
    # (Cut down to the steps involved: a run of curated-schema alone makes the cache entry.)
    spec = copy.deepcopy(documents[0])
    tasks = spec["root"]["dag"]["tasks"]
    tasks["curated-schema"]["cachingOptions"] = {"enableCache": True}
    involved = {"example-gen", "statistics-gen", "curated-schema", "example-validator"}
    for name in set(tasks) - involved:
        del tasks[name]
    schema_only = copy.deepcopy(spec)
    schema_only["root"]["dag"]["tasks"] = {"curated-schema": tasks["curated-schema"]}
    bucket = object_store.new_bucket("kfp-old")
    data.write_span(f"s3://{bucket}/data", 0, 500)
    backend = _backend(bucket, tmp_path)
    first = backend.run(schema_only, documents[1], {})
    assert backend.expire(first) > 0
    with pytest.raises(kfp_harness.TaskFailed, match="input artifact 'schema' has no files"):
        backend.run(spec, documents[1], {"data_root": f"s3://{bucket}/data"})


def test_a_run_parameter_breaking_a_rule_stops_the_step_that_receives_it(
    documents, object_store, tmp_path
):
    """A run from the UI or a schedule never passes through the CLI's checks: the step itself
    refuses the value, naming it, before reading anything. (Cut down to the step involved.)"""
    spec = copy.deepcopy(documents[0])
    tasks = spec["root"]["dag"]["tasks"]
    spec["root"]["dag"]["tasks"] = {"example-gen": tasks["example-gen"]}
    bucket = object_store.new_bucket("kfp-rule")
    data.write_span(f"s3://{bucket}/data", 0, 100)
    backend = _backend(bucket, tmp_path)
    with pytest.raises(kfp_harness.TaskFailed, match="invalid run parameter: span must be -1"):
        backend.run(spec, documents[1], {"data_root": f"s3://{bucket}/data", "span": -2})
