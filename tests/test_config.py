"""The config object: defaults, environment and --set overrides, and clear errors."""

import subprocess
import sys

import pytest

from pipelines.config import ConfigError, PipelineConfig, parse_assignments


def test_defaults_are_valid_and_serving_dir_joins_root_and_name():
    config = PipelineConfig()
    assert config.serving_model_dir == "s3://tfx-pipeline/serving/taxi-tips"
    assert config.span == -1


def test_environment_then_overrides_take_precedence():
    environ = {"PIPELINE_TRAIN_STEPS": "50", "PIPELINE_MIN_AUC": "0.6", "PIPELINE_SPAN": "3"}
    config = PipelineConfig.load({"train_steps": "70", "hidden_units": "16,8"}, environ=environ)
    assert config.train_steps == 70
    assert config.min_auc == 0.6
    assert config.span == 3
    assert config.hidden_units == (16, 8)


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


def test_cli_exits_non_zero_with_the_field_named():
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--set", "train_steps=-5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "train_steps must be at least 1" in result.stderr
