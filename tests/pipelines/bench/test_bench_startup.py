"""Start-up bench of the Kubeflow steps (pipelines/bench/bench_startup.py), and the entry point's
copy of TFX's executor entry point that the start-up cut needed
(pipelines/kubeflow/kfp_entrypoint.py)."""

import copy
import json
from pathlib import Path

import pytest
import yaml
from tfx.dsl.components.base import base_executor

from components.base.config import SPEC_PATH
from components.steps import step_times
from pipelines.bench import bench_startup
from pipelines.kubeflow import tfx_v2_executor

SPEC = SPEC_PATH
# Its executor imports little beyond TensorFlow and Beam: the quickest real step to start.
CHEAP_STEP = "latest-pushed-model"


def test_measure_times_a_step_to_its_import_done_line_next_to_a_bare_tensorflow_import():
    results = bench_startup.measure(SPEC, repeats=1, say=lambda _: None, steps=[CHEAP_STEP])

    assert set(results) == {bench_startup.BARE, "steps"}
    assert set(results["steps"]) == {CHEAP_STEP}
    bare, step = results[bench_startup.BARE], results["steps"][CHEAP_STEP]
    assert bare["seconds"] > 0 and step["seconds"] > 0
    assert bare["rss_mb"] > 0 and step["rss_mb"] > 0
    assert step["ratio"] == round(step["seconds"] / bare["seconds"], 2)
    assert step["executor"] == "components.steps.baseline.LatestPushedModelExecutor"


def test_measure_runs_the_steps_of_another_checkout_when_given_its_source(tmp_path):
    """The bench's before side: the checkout's own entry point runs, not this one's. Here a
    checkout whose entry point imports nothing and says it is ready at once."""
    entry = tmp_path / "pipelines" / "kubeflow"
    entry.mkdir(parents=True)
    for package in (tmp_path / "pipelines", entry):
        (package / "__init__.py").write_text("")
    (entry / "kfp_entrypoint.py").write_text(
        f"import time\nprint('elsewhere {bench_startup.EXECUTOR_STARTS}', flush=True)\n"
        "time.sleep(60)\n"
    )

    results = bench_startup.measure(SPEC, repeats=1, say=lambda _: None, steps=[CHEAP_STEP],
                                    source=tmp_path, profile_imports=False)  # fmt: skip

    step = results["steps"][CHEAP_STEP]
    assert step["ratio"] < 0.5, results  # this checkout's step imports TensorFlow: above 1
    assert "imports_seconds" not in step and "imports_seconds" not in results[bench_startup.BARE]


def test_rounds_combine_into_medians_and_ratios_of_the_medians():
    def round_(bare: float, step: float, profiled: bool) -> dict:
        imports = {"imports_seconds": 1.0} if profiled else {}
        extra = {"imports_seconds": 2.0, "imports_beyond_bare": {"scipy": 0.3}} if profiled else {}
        return {bench_startup.BARE: {"seconds": bare, "rss_mb": 500, **imports},
                "steps": {"a": {"seconds": step, "rss_mb": 700, "ratio": step / bare,
                                "executor": "x.Y", **extra}}}  # fmt: skip

    combined = bench_startup.combine([round_(2.0, 5.0, True), round_(3.0, 4.0, False),
                                      round_(2.5, 9.0, False)])  # fmt: skip

    assert combined[bench_startup.BARE] == {"seconds": 2.5, "rss_mb": 500, "imports_seconds": 1.0}
    assert combined["steps"]["a"] == {"seconds": 5.0, "rss_mb": 700, "executor": "x.Y",
                                      "ratio": 2.0, "imports_seconds": 2.0,
                                      "imports_beyond_bare": {"scipy": 0.3}}  # fmt: skip


def test_a_step_that_crashes_before_its_import_done_line_fails_the_measurement(tmp_path):
    with open(SPEC) as f:
        spec, platform = yaml.safe_load_all(f)
    spec = copy.deepcopy(spec)
    container = spec["deploymentSpec"]["executors"]["LatestPushedModel_executor"]["container"]
    args = container["args"]
    args[args.index("--executor_class_path") + 1] = "components.steps.baseline.NoSuchExecutor"
    broken = tmp_path / "pipeline.yaml"
    broken.write_text(yaml.safe_dump_all([spec, platform]))

    with pytest.raises(bench_startup.StartupFailed, match="NoSuchExecutor"):
        bench_startup.measure(broken, repeats=1, say=lambda _: None, steps=[CHEAP_STEP])


class RecordingExecutor(base_executor.BaseExecutor):
    """Records what it is given and sets output properties of every kind."""

    seen: list = []

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        RecordingExecutor.seen.append(
            {
                "inputs": {k: [str(a.mlmd_artifact) for a in v] for k, v in input_dict.items()},
                "outputs": {k: [str(a.mlmd_artifact) for a in v] for k, v in output_dict.items()},
                "exec_properties": {k: (type(v).__name__, v) for k, v in exec_properties.items()},
                "context": (self._context.get_tmp_path(), self._extra_flags),
            }
        )
        (examples,) = output_dict["examples"]
        examples.span = 7
        examples.split_names = '["train", "eval"]'
        examples.set_int_custom_property("rows", 3000)
        examples.set_float_custom_property("share", 0.25)
        examples.set_json_value_custom_property("spans", {"0": {"fingerprint": "abc"}})


def _invocation(tmp_path: Path) -> dict:
    return {
        "inputs": {
            "parameterValues": {
                "span": 3,
                "min_auc": 0.75,
                "name": "taxi",
                "force": True,
                "input_base_uri": "s3://b/data",
            },  # fmt: skip
            "artifacts": {
                "examples": {
                    "artifacts": [
                        {
                            "name": "projects/p/artifacts/41",
                            "type": {"instanceSchema": "title: tfx.Examples\ntype: object\n"},
                            "uri": str(tmp_path / "in" / "examples"),
                            "metadata": {
                                "span": 2.0,
                                "split_names": '["train"]',
                                "version": 1.0,
                                "custom:span": 5.0,
                                "extra": {"a": [1, "b"]},
                            },
                        }
                    ]
                },  # fmt: skip
                "decision": {
                    "artifacts": [
                        {
                            "name": "projects/p/artifacts/42",
                            "type": {"instanceSchema": "title: components.TrainingDecision\n"},
                            "uri": str(tmp_path / "in" / "decision"),
                            "metadata": {"train": 1.0},
                        }
                    ]
                },  # fmt: skip
            },
        },
        "outputs": {
            "artifacts": {
                "examples": {
                    "artifacts": [
                        {
                            "name": "projects/p/artifacts/43",
                            "type": {"schemaTitle": "tfx.Examples"},
                            "uri": str(tmp_path / "out" / "examples"),
                        }
                    ]
                },  # fmt: skip
            },
            "outputFile": str(tmp_path / "task" / "output_metadata.json"),
        },
    }


def _argv(invocation: dict) -> list[str]:
    inputs_spec = {"parameters": {"span": {"parameterType": "NUMBER_INTEGER"},
                                  "min_auc": {"parameterType": "NUMBER_DOUBLE"}}}  # fmt: skip
    return [
        "--executor_class_path", f"{__name__}.RecordingExecutor",
        "--json_serialized_invocation_args", json.dumps(invocation),
        "--json_serialized_inputs_spec_args", json.dumps(inputs_spec),
        "--direct_num_workers=1",
    ]  # fmt: skip


def test_the_entry_point_runs_an_executor_as_tfx_own_kubeflow_entry_point_does(tmp_path):
    """The start-up cut replaced TFX's kubeflow_v2_run_executor with a copy that imports less:
    the same executor input must reach the executor, and come back to the launcher, the same."""
    from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_run_executor as tfx_entry
    from tfx.types import standard_component_specs

    assert tfx_v2_executor._INPUT_BASE_KEY == standard_component_specs.INPUT_BASE_KEY
    written = []
    for run in (
        lambda argv: tfx_entry.main(tfx_entry._parse_flags(argv)),
        lambda argv: tfx_v2_executor.load_executor(argv)(),
    ):
        invocation = _invocation(tmp_path)
        output_file = Path(invocation["outputs"]["outputFile"])
        output_file.unlink(missing_ok=True)
        run(_argv(invocation))
        written.append(json.loads(output_file.read_text()))

    tfx_seen, ours_seen = RecordingExecutor.seen[-2:]
    assert ours_seen == tfx_seen
    assert tfx_seen["exec_properties"]["span"] == ("int", 3)
    assert tfx_seen["exec_properties"]["input_base"] == ("str", "s3://b/data")
    # Ours adds one thing: the step's time, handed down to the run report (step_times.py).
    for listed in written[1]["artifacts"].values():
        for artifact in listed["artifacts"]:
            times = json.loads(artifact["metadata"].pop(step_times.STEP_TIMES_KEY))
            assert list(times) == ["RecordingExecutor"] and times["RecordingExecutor"][1] >= 0
    assert written[1] == written[0]
    (examples,) = written[0]["artifacts"]["examples"]["artifacts"]
    assert examples["name"] == "projects/p/artifacts/43"
    assert examples["metadata"]["span"] == 7 and examples["metadata"]["rows"] == 3000
