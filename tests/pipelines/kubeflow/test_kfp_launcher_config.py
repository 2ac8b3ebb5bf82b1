"""kubeflow/kfp-launcher.yaml, the ConfigMap an operator applies in each run namespace, read as
the KFP backend reads it (tests/stand_ins/kfp_launcher_config.py). The spec's end-to-end runs
(test_kubeflow_spec.py) take their pipeline root and store session from this file too."""

from __future__ import annotations

import pytest
import yaml

from components.base.config import REPO_ROOT, SECRET_KEYS, PipelineConfig
from pipelines.kubeflow import kubeflow_runner
from tests.pipelines.serving.test_serving_manifests import load_documents, schema_errors
from tests.stand_ins import kfp_harness
from tests.stand_ins.kfp_launcher_config import (
    LauncherConfigError,
    credentials,
    pipeline_root,
    session_info,
)
from tests.stand_ins.kfp_versions import V2_5_0, VERSIONS

MANIFEST = REPO_ROOT / "kubeflow" / "kfp-launcher.yaml"
DEFAULTS = PipelineConfig.load(environ={})
SECRET = {DEFAULTS.credentials_secret: {key: f"value of {key}" for key in SECRET_KEYS}}


def shipped() -> dict:
    (document,) = load_documents(MANIFEST)
    return document


def test_the_shipped_configmap_is_valid_and_names_the_configs_root_and_secret():
    document = shipped()
    assert schema_errors(document) == ""
    assert document["metadata"]["name"] == "kfp-launcher"  # config/env.go configMapName
    assert "namespace" not in document["metadata"]  # applied with -n, in each run namespace
    data = document["data"]
    assert pipeline_root(data) == DEFAULTS.kfp_pipeline_root
    for version in VERSIONS.values():
        session = session_info(data, pipeline_root(data), version)
        params = session["Params"]
        assert session["Provider"] == "s3" and params["fromEnv"] == "false"
        assert params["endpoint"] == "seaweedfs.kubeflow:8333"  # KFP 2.15+'s store, no scheme
        assert (params["disableSSL"], params["forcePathStyle"]) == ("true", "true")
        assert params["secretName"] == DEFAULTS.credentials_secret
        assert {params["accessKeyKey"], params["secretKeyKey"]} <= set(SECRET_KEYS)
        assert ("maxRetries" in params) == version.session_max_retries
        # The launcher finds both keys in the Secret of section 4.
        assert credentials(session, SECRET, "ns") == ("value of AWS_ACCESS_KEY_ID",
                                                      "value of AWS_SECRET_ACCESS_KEY")  # fmt: skip


def _with(providers: str, root: str = "s3://tfx-pipeline/pipeline_root") -> dict[str, str]:
    return {"defaultPipelineRoot": root, "providers": providers}


@pytest.mark.parametrize(
    "data, message",
    [
        (_with("s3:\n  default:\n    endpoint: a:1\n"), "missing default credentials"),
        (
            _with(
                "s3:\n  default:\n    endpoint: a:1\n    credentials:\n      fromEnv: false\n"
                "      secretref: {secretName: x}\n"
            ),
            r"unknown field\(s\) \['secretref'\] in credentials",
        ),  # fmt: skip
        (
            _with("s3:\n  default:\n    endpoint: a:1\n    credentials: {fromEnv: false}\n"),
            "fromEnv false without a secretRef",
        ),  # fmt: skip
        (_with("s3: [\n"), "failed to unmarshall kfp bucket providers"),
        (_with("s3:\n  default: {}\n"), "missing default credentials"),
        (
            _with("s3:\n  default:\n    maxRetries: 3\n    credentials: {fromEnv: true}\n"),
            "maxRetries is not read before KFP 2.15",
        ),  # fmt: skip
        (_with("", root="gs://bucket/root"), "only an s3:// root is played"),
    ],
)
def test_a_configmap_the_backend_would_fail_on_is_refused_naming_why(data, message):
    with pytest.raises(LauncherConfigError, match=message):
        session_info(data, pipeline_root(data), V2_5_0)


def test_without_providers_or_with_a_query_the_session_is_the_pods_environment():
    assert pipeline_root(None) == "minio://mlpipeline/v2/artifacts"  # no ConfigMap at all
    for data in ({"defaultPipelineRoot": "s3://b/r"},
                 {**shipped()["data"], "defaultPipelineRoot": "s3://b/r?region=x"}):  # fmt: skip
        session = session_info(data, pipeline_root(data), V2_5_0)
        assert session == {"Provider": "s3", "Params": {"fromEnv": "true"}}
        assert credentials(session, {}, "ns") is None


def test_a_run_whose_secret_lacks_the_keys_fails_at_its_first_task(tmp_path):
    """object_store.go getS3BucketCredential, in the launcher of the first task."""
    spec, platform = kubeflow_runner.load_documents()
    data = yaml.safe_load(MANIFEST.read_text())["data"]
    cases = {
        'secrets "tfx-pipeline-s3" not found': {},
        "could not find specified keys 'AWS_ACCESS_KEY_ID' or 'AWS_SECRET_ACCESS_KEY'": {
            DEFAULTS.credentials_secret: {"AWS_ACCESS_KEY_ID": "a"}
        },
    }
    for message, secrets in cases.items():
        backend = kfp_harness.Backend(None, {}, secrets, tmp_path, launcher_config=data)
        with pytest.raises(kfp_harness.TaskFailed, match=message) as failed:
            backend.run(spec, platform, {})
        task = str(failed.value).split()[1]  # a task with nothing upstream: the run's first
        assert not spec["root"]["dag"]["tasks"][task].get("dependentTasks")
        assert str(failed.value).startswith(f"task {task} failed: Failed to get Bucket")
