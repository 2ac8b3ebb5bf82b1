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
from pipelines.config import PipelineConfig
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
    assert spec["root"]["dag"]["tasks"]["ExampleGen"]["cachingOptions"] == {"enableCache": False}
    assert spec["root"]["dag"]["tasks"]["Trainer"]["cachingOptions"] == {"enableCache": True}
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


def test_no_credential_value_is_compiled_in(object_store):
    text = kubeflow_runner.render(PipelineConfig())
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert os.environ[name] not in text


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


def test_compiled_spec_runs_task_by_task_and_pushes_a_model_that_predicts(
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
    recorded = kfp_harness.run(
        documents[0],
        parameters,
        pipeline_root=f"s3://{bucket}/pipeline_root",
        local_root=tmp_path / "launcher",
        log_dir=tmp_path / "tasks",
    )

    assert recorded["ExampleGen"]["examples"]["metadata"]["span"] == 0
    assert recorded["ExampleGen"]["examples"]["uri"].startswith(f"s3://{bucket}/pipeline_root/")
    assert storage.list_files(recorded["Transform"]["transform_graph"]["uri"] + "/**")
    versions = pushed_versions(serving_model_dir(serving_root, "taxi-tips"))
    assert list(versions) == [1]
    rows = serving.read_rows(storage.list_files(data_root + "/span-0/*.csv")[0], 200)
    probabilities = np.array(serving.predict(versions[1], rows))
    assert ((probabilities > 0) & (probabilities < 1)).all()
    labels = np.array([int(r["big_tipper"]) for r in rows])
    assert probabilities[labels == 1].mean() > probabilities[labels == 0].mean() + 0.2
