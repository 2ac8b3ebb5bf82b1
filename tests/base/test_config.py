"""The config object: defaults, environment and --set overrides, and clear errors."""

import json
import os
import re
import subprocess
import sys

import pytest

from components.base.config import (
    ConfigError,
    PipelineConfig,
    check_run_parameters,
    kubernetes_quantity,
    parse_assignments,
)


def test_defaults_are_valid_and_serving_dir_joins_root_and_name():
    config = PipelineConfig.load(environ={})
    assert config.serving_model_dir == "s3://tfx-pipeline/serving/taxi-tips"
    assert config.span == -1


def test_environment_then_overrides_take_precedence():
    environ = {"PIPELINE_TRAIN_STEPS": "50", "PIPELINE_MIN_AUC": "0.6", "PIPELINE_SPAN": "3"}
    config = PipelineConfig.load(
        {"train_steps": "70", "hyperparameters": '{"hidden_units": [16, 8]}'}, environ=environ
    )
    assert config.train_steps == 70
    assert config.min_auc == 0.6
    assert config.span == 3
    assert json.loads(config.hyperparameters) == {"hidden_units": [16, 8]}


def test_the_use_case_sets_its_defaults_and_a_setting_overrides_them():
    """The taxi use case's bars and names (components/use_cases/taxi/__init__.py) are the
    defaults of a config that names it; an environment variable or --set still wins."""
    taxi = PipelineConfig.load(environ={})
    assert (taxi.use_case, taxi.model_name, taxi.min_auc, taxi.min_accuracy) == (
        "taxi", "taxi-tips", 0.75, 0.7,
    )  # fmt: skip
    assert PipelineConfig.load({"min_auc": "0.8"}, environ={}).min_auc == 0.8
    assert PipelineConfig().min_auc == 0.5  # without a use case's defaults: the generic bar


def test_pinned_images_by_tag_or_digest_are_accepted():
    config = PipelineConfig.load(
        {
            "cpu_image": "registry.example.com:5000/tfx:0.1.0",
            "gpu_image": "registry.example.com/tfx-gpu@sha256:" + "a" * 64,
        },
        environ={},
    )
    assert config.cpu_image.endswith(":0.1.0")


def test_beam_args_parse_from_json_list():
    config = PipelineConfig.load({"beam_args": '["--direct_num_workers=2"]'}, environ={})
    assert config.beam_args == ("--direct_num_workers=2",)


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"train_steps": "0"}, "train_steps"),
        ({"train_steps": "many"}, "train_steps"),
        ({"min_auc": "1.5"}, "min_auc"),
        ({"span": "-2"}, "span"),
        ({"mixed_precision": "maybe"}, "mixed_precision"),
        ({"model_name": "a/b"}, "model_name"),
        ({"trainsteps": "10"}, "trainsteps"),
        ({"epochs": "10", "train_steps": "5"}, "epochs"),
        ({"cpu_image": "registry.example.com/tfx:latest"}, "cpu_image"),
        ({"gpu_image": "registry.example.com:5000/tfx-gpu"}, "gpu_image"),
        # CI with its IMAGE_REPOSITORY variable unset, or in capitals: refused before building
        ({"cpu_image": "/tfx-pipeline:0123abc"}, "cpu_image is not an image reference"),
        ({"cpu_image": "ghcr.io/Acme/tfx-pipeline:0123abc"}, "cpu_image is not an image ref"),
        ({"gpu_count": "-1"}, "gpu_count"),
        ({"gpu_node_selector": "gpu"}, "gpu_node_selector"),
    ],
)
def test_bad_values_name_the_field(overrides, named):
    with pytest.raises(ConfigError, match=named):
        PipelineConfig.load(overrides, environ={})


def test_set_flag_without_equals_is_rejected():
    with pytest.raises(ConfigError, match="name=value"):
        parse_assignments(["train_steps"])


def test_cli_exits_non_zero_with_the_field_named_before_importing_tensorflow(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--set", "train_steps=-5"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PIPELINE_WORK_DIR": str(tmp_path), "TF_CPP_MIN_LOG_LEVEL": "0"},
    )
    assert result.returncode == 2
    # One line, no TensorFlow start-up chatter (cuFFT/cuDNN factories): TF was never imported.
    assert result.stderr.strip().splitlines() == [
        "error: invalid pipeline config: train_steps must be at least 1, got -5 "
        "(from --set train_steps)"
    ]
    assert result.stdout == ""
    assert not (tmp_path / "logs").exists()  # nothing ran, so no log to point to
    # And independently of how TensorFlow is built: it, TFX and Beam were never imported.
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from pipelines.cli import main; "
         "code = main(['run', '--set', 'train_steps=-5']); "
         "print(code, sorted({'tensorflow', 'tfx', 'apache_beam'} & set(sys.modules)))"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PIPELINE_WORK_DIR": str(tmp_path)},
    )  # fmt: skip
    assert probe.stdout.strip() == "2 []", probe.stderr


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"pipeline_name": "Taxi_Tips"}, "pipeline_name must be lower-case"),
        ({"pipeline_name": "x" * 64}, "pipeline_name must be lower-case"),
        ({"min_auc": "nan"}, "min_auc must be a finite number"),
        ({"learning_rate": "inf"}, "learning_rate must be a finite number"),
        ({"drift": "-0.5"}, "drift must be >= 0"),
        ({"hyperparameters": "[64, 32]"}, "hyperparameters must be a JSON object"),
        ({"hyperparameters": "{hidden_units: 3}"}, "hyperparameters must be a JSON object"),
        ({"hyperparameters": '{"hiden_units": [8]}'}, "'hiden_units' is not a hyperparameter"),
        ({"hyperparameters": '{"hidden_units": 8}'}, "'hidden_units' must be like [64, 32]"),
        ({"use_case": "no_such_case"}, "unknown use case 'no_such_case'"),
        ({"use_case": "../x"}, "use_case must be a use case's name"),
        ({"model_name": ".."}, "model_name must be one folder name"),
        ({"serving_root": ""}, "serving_root must not be empty"),
        ({"max_auc_drop": "-0.1"}, "max_auc_drop must be between 0 and 1"),
        ({"step_memory": "8Gb"}, "step_memory must be memory of at least 1M"),
        ({"step_memory": "500m"}, "step_memory must be memory of at least 1M"),
        ({"step_cpu": "8Gi"}, "step_cpu must be CPUs such as 2, 0.5 or 500m"),
        ({"trainer_cpu": "0"}, "trainer_cpu must be CPUs"),
        ({"kfp_pipeline_root": "/tmp/root"}, "kfp_pipeline_root must be s3://"),
        ({"beam_args": "direct_num_workers=2"}, "beam_args must be Beam options"),
    ],
)
def test_more_bad_values_name_the_field(overrides, named):
    with pytest.raises(ConfigError, match=re.escape(named)):
        PipelineConfig.load(overrides, environ={})


def test_every_problem_is_reported_at_once_with_the_variable_it_came_from():
    environ = {"PIPELINE_EPOCHS": "0", "PIPELINE_MIN_AUC": "1.5"}
    with pytest.raises(ConfigError) as raised:
        PipelineConfig.load({"batch_size": "0"}, environ=environ)
    message = str(raised.value)
    assert "epochs must be at least 1, got 0 (from PIPELINE_EPOCHS)" in message
    assert "min_auc must be between 0 and 1, got 1.5 (from PIPELINE_MIN_AUC)" in message
    assert "batch_size must be at least 1, got 0 (from --set batch_size)" in message


def test_a_rule_across_fields_names_where_each_value_came_from():
    with pytest.raises(
        ConfigError, match=r"cannot exceed train_steps \(2\) \(from --set train_steps\)"
    ):
        PipelineConfig.load({"train_steps": "2"}, environ={})


def test_unknown_pipeline_variable_is_reported_with_a_suggestion(capsys):
    PipelineConfig.load(environ={"PIPELINE_TRAIN_STEP": "5", "PIPELINE_WORK_DIR": "/tmp/x"})
    assert capsys.readouterr().err.strip() == (
        "warning: PIPELINE_TRAIN_STEP is not a config field and is ignored "
        "(did you mean PIPELINE_TRAIN_STEPS?)."
    )


def test_kubernetes_quantities_as_kubernetes_writes_them():
    config = PipelineConfig.load(
        {"step_cpu": "500m", "step_memory": "8Gi", "trainer_cpu": "1.5", "trainer_memory": "16G"},
        environ={},
    )
    assert kubernetes_quantity(config.step_cpu) == 0.5
    assert kubernetes_quantity(config.step_memory) == 8 * 2**30
    assert kubernetes_quantity("1e3") == kubernetes_quantity("1e+3") == 1000
    assert PipelineConfig.load({"step_cpu": "1e+3"}, environ={}).step_cpu == "1e+3"
    assert kubernetes_quantity(config.trainer_memory) == 16e9


def test_beam_args_keep_commas_inside_an_option():
    config = PipelineConfig.load(
        {"beam_args": "--direct_num_workers=2,--experiments=a,b, --runner=DirectRunner"},
        environ={},
    )
    assert config.beam_args == (
        "--direct_num_workers=2",
        "--experiments=a,b",
        "--runner=DirectRunner",
    )


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"model_name": "..", "serving_root": "s3://b/serving"}, "model_name"),
        ({"model_name": "m", "serving_root": ""}, "serving_root"),
        ({"min_auc": 5.0}, "min_auc"),
        ({"max_auc_drop": -0.01}, "max_auc_drop"),
        ({"span": -3}, "span"),
        ({"train_steps": 5, "epochs": 6}, "epochs"),
        ({"train_steps": "5"}, "train_steps must be a whole number"),
    ],
)
def test_run_parameters_follow_the_config_rules(values, named):
    with pytest.raises(ConfigError, match=f"Pusher: invalid run parameter: {named}"):
        check_run_parameters("Pusher", values)


def test_run_parameters_within_the_rules_pass():
    check_run_parameters("Evaluator", {"min_auc": 0, "min_accuracy": 1.0, "max_auc_drop": 0.0})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"strategy": "parameter_server"}, "strategy=parameter_server is not supported: "
         "parameter_server needs parameter-server tasks"),
        ({"strategy": "tpu"}, "strategy=tpu is not supported: tpu needs Cloud TPU nodes"),
        ({"strategy": "horovod"}, "strategy must be auto or one_device or mirrored or "
         "multi_worker, got 'horovod'"),
        ({"strategy": "multi_worker"}, "strategy=multi_worker needs num_workers of 2 or more"),
        ({"strategy": "mirrored", "num_workers": "3"}, "strategy=mirrored trains on one "
         "machine, but num_workers=3: use multi_worker (or auto)"),
        ({"num_workers": "0"}, "num_workers must be between 1 and 64, got 0"),
        ({"max_train_minutes": "0"}, "max_train_minutes must be between 0.1 and 10080"),
        ({"trainer_retries": "11"}, "trainer_retries must be between 0 and 10"),
    ],
)  # fmt: skip
def test_training_settings_are_refused_when_the_config_is_built(overrides, expected):
    """Nothing fails half-way through a run: a strategy that cannot work stops the config."""
    with pytest.raises(ConfigError) as error:
        PipelineConfig.load(overrides, environ={})
    assert expected in str(error.value)
    assert "(from --set" in str(error.value)


def test_multi_worker_settings_are_accepted():
    config = PipelineConfig.load({"strategy": "multi_worker", "num_workers": "2"}, environ={})
    assert (config.strategy, config.num_workers) == ("multi_worker", 2)
    assert PipelineConfig.load({"num_workers": "4"}, environ={}).strategy == "auto"
