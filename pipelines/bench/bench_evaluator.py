"""What bounds the Evaluator: the step's TFMA evaluation on the largest end-to-end run's eval
split, as the pipeline configures it and with parts of its work taken away, each in a process of
its own (`python -m pipelines.bench.bench_evaluator ROOT VARIANT OUT` prints its seconds).

TFMA 0.47 computes metrics one example at a time in Python (its extractors unbatch the model's
batched predictions, slicing fans each example out per slice, and every metric's combiner takes
one example per call): a variant with one counting metric and no slice shows the rate TFMA's
per-example path allows before any of the step's metrics; the gap to the next variants is what
the metrics and the slices add; the last shows whether a second worker process helps.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

IN_MEMORY = "--direct_running_mode=in_memory,--direct_num_workers=1,--pickle_library=cloudpickle"
TWO_PROCESSES = (
    "--direct_running_mode=multi_processing,--direct_num_workers=2,--pickle_library=cloudpickle"
)
# name: (the use case's slices?, the step's metrics? (else ExampleCount alone), Beam options)
VARIANTS = {
    "as the pipeline runs it": (True, True, IN_MEMORY),
    "without the slices": (False, True, IN_MEMORY),
    "ExampleCount alone, no slice": (False, False, IN_MEMORY),
    "as the pipeline runs it, 2 worker processes": (True, True, TWO_PROCESSES),
}


def evaluate(pipeline_root: Path, variant: str, out: Path, use_case_name: str) -> float:
    """Seconds of TFX's Evaluator executor (the step's base, without its verdict) on the run's
    examples and model, with the step's EvalConfig changed as `variant` says."""
    from tfx.components.evaluator import executor as evaluator_executor
    from tfx.dsl.components.base.base_beam_executor import BaseBeamExecutor
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.base.use_case import load as load_use_case
    from components.steps.evaluation import eval_config

    slices, metrics, beam_args = VARIANTS[variant]
    use_case = load_use_case(use_case_name)

    def artifact(kind, folder: Path):
        found = kind()
        found.uri = str(max(folder.iterdir(), key=lambda p: int(p.name)))  # the run's only one
        return found

    examples = artifact(standard_artifacts.Examples, pipeline_root / "ExampleGen" / "examples")
    examples.split_names = json.dumps(["train", "eval"])
    model = artifact(standard_artifacts.Model, pipeline_root / "Trainer" / "model")
    outputs = {}
    for name, kind in (("evaluation", standard_artifacts.ModelEvaluation),
                       ("blessing", standard_artifacts.ModelBlessing)):  # fmt: skip
        outputs[name] = [kind()]
        outputs[name][0].uri = str(out / name)
        (out / name).mkdir(parents=True)
    config = eval_config(0.0, 0.0, 1.0, use_case.label_key,
                         use_case.slice_keys if slices else ())  # fmt: skip
    if not metrics:
        del config.metrics_specs[:]
        config.metrics_specs.add().metrics.add(class_name="ExampleCount")
    properties = {"eval_config": proto_utils.proto_to_json(config),
                  "example_splits": json.dumps(["eval"]),
                  "fairness_indicator_thresholds": "null"}  # fmt: skip
    context = BaseBeamExecutor.Context(beam_pipeline_args=beam_args.split(","),
                                       tmp_dir=str(out / "tmp"), unique_id="bench")  # fmt: skip
    started = time.monotonic()
    evaluator_executor.Executor(context).Do({"examples": [examples], "model": [model]},
                                            outputs, properties)  # fmt: skip
    return time.monotonic() - started


if __name__ == "__main__":
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    root, variant, out, use_case_name = sys.argv[1:5]
    seconds = evaluate(Path(root), variant, Path(out), use_case_name)
    print(json.dumps({"seconds": seconds}))
