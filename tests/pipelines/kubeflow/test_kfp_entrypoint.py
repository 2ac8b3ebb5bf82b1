"""The Kubeflow container entry point's rewriting of the launcher's ExecutorInput and output."""

import json
import os
import subprocess
import sys

import pytest

from components.base.config import ConfigError
from pipelines.kubeflow import kfp_entrypoint


def _executor_input(tmp_path) -> dict:
    return {
        "inputs": {
            "parameterValues": {"span": -1, "beam_args": '["--direct_num_workers=2"]'},
            "artifacts": {
                "examples": {
                    "artifacts": [
                        {
                            "name": "7",
                            "type": {"instanceSchema": ""},
                            "uri": "s3://b/root/ExampleGen/u/examples",
                        }
                    ]
                },  # fmt: skip
            },
        },
        "outputs": {
            "artifacts": {
                "statistics": {"artifacts": [{"uri": "gs://g/root/StatisticsGen/u/statistics"}]}
            },
            "outputFile": str(tmp_path / "output_metadata.json"),
        },
    }


def test_artifacts_point_at_the_launchers_local_copies_and_outputs_get_folders(tmp_path):
    executor_input = _executor_input(tmp_path)
    (tmp_path / "s3/b/root/ExampleGen/u/examples").mkdir(parents=True)  # the launcher's download
    remote_of = kfp_entrypoint.localize(executor_input, local_root=str(tmp_path))

    examples = executor_input["inputs"]["artifacts"]["examples"]["artifacts"][0]["uri"]
    statistics = executor_input["outputs"]["artifacts"]["statistics"]["artifacts"][0]["uri"]
    assert examples == str(tmp_path / "s3/b/root/ExampleGen/u/examples")
    assert statistics == str(tmp_path / "gcs/g/root/StatisticsGen/u/statistics")
    assert (tmp_path / "gcs/g/root/StatisticsGen/u/statistics").is_dir()
    assert remote_of[statistics] == "gs://g/root/StatisticsGen/u/statistics"


def test_the_launchers_log_file_is_left_to_the_launcher(tmp_path):
    executor_input = _executor_input(tmp_path)
    (tmp_path / "s3/b/root/ExampleGen/u/examples").mkdir(parents=True)
    log_uri = "s3://b/root/StatisticsGen/u/executor-logs"
    log_file = tmp_path / "s3/b/root/StatisticsGen/u/executor-logs"
    log_file.parent.mkdir(parents=True)
    log_file.write_text("launcher output so far")  # created by the launcher before the step
    executor_input["outputs"]["artifacts"]["executor-logs"] = {
        "artifacts": [{"uri": log_uri, "type": {"schemaTitle": "system.Artifact"}}]
    }
    kfp_entrypoint.prepare(executor_input, local_root=str(tmp_path))

    assert set(executor_input["outputs"]["artifacts"]) == {"statistics"}  # what TFX sees
    assert log_file.read_text() == "launcher output so far"


def test_an_input_with_no_files_stops_the_step_naming_it(tmp_path):
    executor_input = _executor_input(tmp_path)
    with pytest.raises(kfp_entrypoint.MissingInputError) as failure:
        kfp_entrypoint.prepare(executor_input, local_root=str(tmp_path))
    assert "'examples' has no files at s3://b/root/ExampleGen/u/examples" in str(failure.value)
    assert "start a new run" in str(failure.value)


def test_reported_local_uris_are_turned_back_into_remote_ones(tmp_path):
    output_file = tmp_path / "output_metadata.json"
    output_file.write_text(json.dumps({"artifacts": {"statistics": {"artifacts": [
        {"uri": "/s3/b/k/statistics", "metadata": {"span": 3}}]}}}))  # fmt: skip
    kfp_entrypoint.restore_remote_uris(
        str(output_file), {"/s3/b/k/statistics": "s3://b/k/statistics"}
    )
    (artifact,) = json.loads(output_file.read_text())["artifacts"]["statistics"]["artifacts"]
    assert artifact == {"uri": "s3://b/k/statistics", "metadata": {"span": 3}}


def test_input_artifacts_get_their_declared_type(tmp_path):
    executor_input = _executor_input(tmp_path)
    declared = {"artifactType": {"instanceSchema": "title: tfx.Examples\ntype: object\n"}}
    kfp_entrypoint.add_input_types(executor_input, {"artifacts": {"examples": declared}})
    (artifact,) = executor_input["inputs"]["artifacts"]["examples"]["artifacts"]
    assert artifact["type"] == declared["artifactType"]


def test_beam_args_parameter_becomes_arguments_and_leaves_the_parameters(tmp_path):
    executor_input = _executor_input(tmp_path)
    assert kfp_entrypoint.take_beam_args(executor_input) == ["--direct_num_workers=2"]
    assert executor_input["inputs"]["parameterValues"] == {"span": -1}


def test_malformed_beam_args_name_the_parameter(tmp_path):
    executor_input = _executor_input(tmp_path)
    executor_input["inputs"]["parameterValues"]["beam_args"] = "--direct_num_workers=2"
    with pytest.raises(ValueError, match="beam_args must be a JSON list"):
        kfp_entrypoint.take_beam_args(executor_input)


def test_beam_args_that_are_not_options_are_refused_by_the_config_rule(tmp_path):
    executor_input = _executor_input(tmp_path)
    executor_input["inputs"]["parameterValues"]["beam_args"] = '["direct_num_workers=2"]'
    with pytest.raises(ConfigError, match="beam_args must be Beam options starting with '--'"):
        kfp_entrypoint.take_beam_args(executor_input)


def test_a_step_loads_no_stock_component_it_does_not_run_yet_the_package_stays_whole():
    # In a process of its own: the package is deferred only where nothing imported it yet.
    code = """
import sys
from pipelines.kubeflow.tfx_v2_executor import defer_stock_components_package
defer_stock_components_package()
import tfx.components.statistics_gen.executor
print(sorted(m for m in ("matplotlib", "kubernetes", "tfx.components.infra_validator")
             if m in sys.modules))
from tfx.components import Trainer, __all__ as names
import tfx.components
print(Trainer.__module__, len(names), tfx.components.Evaluator.__name__)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "TF_USE_LEGACY_KERAS": "1"}, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    loaded, names = done.stdout.strip().splitlines()[-2:]
    assert loaded == "[]"  # the InfraValidator (Kubernetes), the Evaluator's plots: not loaded
    # Taking a name of the package's own runs its __init__: all 16 stock components are there.
    assert names == "tfx.components.trainer.component 16 Evaluator"
