"""`tkp bench-tuning`: what parallel trials buy on this machine, and what a search finds.

On the newest local Transform output (`make run` first), the same search (random, one seed,
`trials` trials of `trial_steps` steps each) runs once per parallelism in `parallels`, side by
side in one command, each in an empty folder of its own, so every figure comes from this run:
the wall time of each search, the ratio to the first, and the best trial's objective. Then the
defaults' model (the use case's hyperparameters and the config's) trains the same steps, and its
objective is set beside the best trial's. Figures go to the console and to RESULTS_PATH.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from components.base.config import WORK_DIR, PipelineConfig

RESULTS_PATH = WORK_DIR / "bench" / "tuning.json"
SEARCHES = WORK_DIR / "bench" / "tuning"


def run(config: PipelineConfig, trials: int, parallels: list[int], trial_steps: int,
        say: Callable[[str], None]) -> dict:  # fmt: skip
    from tfx.proto import trainer_pb2
    from tfx.types import standard_artifacts
    from tfx.utils import proto_utils

    from components.base.use_case import load as load_use_case
    from components.training import search, search_space, trial
    from pipelines.bench.bench_training import data_classes, transform_outputs
    from pipelines.pipeline import trainer_config

    examples_dir, graph_dir = transform_outputs(config)
    examples = standard_artifacts.Examples()
    examples.uri, examples.split_names = examples_dir, '["train", "eval"]'
    graph = standard_artifacts.TransformGraph()
    graph.uri = graph_dir
    inputs = {"examples": [examples], "transform_graph": [graph]}
    use_case = load_use_case(config.use_case)
    custom_config = {**trainer_config(config), "epochs": config.epochs,
                     "max_train_minutes": config.max_train_minutes}  # fmt: skip
    if data_classes(config):
        custom_config["class_names"] = data_classes(config)
    properties = {
        "train_args": proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=trial_steps)),
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=config.eval_steps)),
        "custom_config": json.dumps(custom_config),
    }
    pinned = json.loads(config.hyperparameters)
    space = search_space.declared(use_case, pinned)
    epochs = min(config.epochs, trial_steps)
    objective = config.tuner_objective or f"val_{use_case.quality_metric}"
    shutil.rmtree(SEARCHES, ignore_errors=True)
    results: dict = {"use_case": config.use_case, "trials": trials, "trial_steps": trial_steps,
                     "objective": objective, "searches": []}  # fmt: skip
    for parallel in parallels:
        settings = search.SearchSettings(
            algorithm="random", objective=objective, max_trials=trials,
            parallel_trials=parallel, max_minutes=24 * 60, steps=trial_steps, epochs=epochs,
            eval_steps=config.eval_steps,
        )  # fmt: skip
        say(f"Search of {trials} trials, {parallel} at once ...")
        started = time.monotonic()
        found = search.run_search(inputs, properties, custom_config, settings, space,
                                  str(SEARCHES / f"parallel-{parallel}"))  # fmt: skip
        wall = time.monotonic() - started
        results["searches"].append({
            "parallel": parallel, "wall_seconds": round(wall, 1),
            "completed": sum(1 for r in found.records if r.get("status") == "COMPLETED"),
            "best_trial": found.best_trial, "best_value": found.best_value,
            "best_values": search_space.decode(use_case, found.best_values),
            "trial_seconds": [r.get("seconds") for r in found.records],
        })  # fmt: skip
    say(f"The defaults' model, {trial_steps} steps ...")
    work = Path(tempfile.mkdtemp(prefix="bench-tuning-"))
    try:
        fn_args = trial.fn_args_for(inputs, properties, work)
        deadline = {"steps": trial_steps, "epochs": epochs, "eval_steps": config.eval_steps,
                    "objective": objective, "deadline": time.time() + 24 * 3600}  # fmt: skip
        defaults = trial.train_trial(fn_args, custom_config, {}, deadline)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["defaults_value"] = defaults["metrics"][objective]
    first = results["searches"][0]["wall_seconds"]
    for entry in results["searches"]:
        entry["wall_ratio_to_first"] = round(entry["wall_seconds"] / first, 3)
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(results, indent=2))
    return results


def table(results: dict) -> str:
    objective = results["objective"]
    header = f"  {'at once':>7}  {'wall s':>7}  {'x first':>7}  {'completed':>9}  best"
    lines = [f"{results['trials']} trials of {results['trial_steps']} steps "
             f"({results['use_case']}), objective {objective}:", header]  # fmt: skip
    for s in results["searches"]:
        lines.append(f"  {s['parallel']:>7}  {s['wall_seconds']:>7.1f}  "
                     f"{s['wall_ratio_to_first']:>7.3f}  {s['completed']:>9}  "
                     f"{s['best_value']:.4f} (trial {s['best_trial']})")  # fmt: skip
    best = max(s["best_value"] for s in results["searches"])
    lines.append(f"  the defaults' model: {objective} {results['defaults_value']:.4f}; the best "
                 f"trial's {best:.4f} ({best - results['defaults_value']:+.4f})")  # fmt: skip
    lines.append(f"Figures written to {RESULTS_PATH}")
    return "\n".join(lines)
