"""The Tuner step (components/steps/tuner.py) run on a use case's session data, as the pipeline
runs it: its input artifacts laid out as TFX's, its outputs in a folder. Also a script, for the
test that kills a search mid-way: python -m tests.training.search_step ROOT PROPERTIES_JSON
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tfx.types import standard_artifacts

from components.steps.span_selection import SELECTION_FILE, SpanSelection
from components.steps.tuner import TRIALS_FILE, HyperparameterSearchExecutor
from tests.use_cases import kit


def transformed_inputs(root: Path, use_case: str = "taxi") -> dict:
    """The Tuner's inputs on the use case's kit data, transformed once under `root`."""
    graph_dir, examples = root / "transform" / "transform_graph", root / "transform"
    if not graph_dir.exists():
        kit.of(use_case).transform(examples)
    transformed = standard_artifacts.Examples()
    transformed.uri = str(examples / "transformed_examples")
    transformed.split_names = '["train", "eval"]'
    graph = standard_artifacts.TransformGraph()
    graph.uri = str(graph_dir)
    schema = standard_artifacts.Schema()
    schema.uri = str(root / "schema")
    Path(schema.uri).mkdir(exist_ok=True)
    shutil.copy(kit.of(use_case).use_case.schema_path, schema.uri)  # fmt: skip
    selection = SpanSelection()
    selection.uri = str(root / "selection")
    Path(selection.uri).mkdir(exist_ok=True)
    Path(selection.uri, SELECTION_FILE).write_text(
        json.dumps({"spans": {"0": {}}, "span": 0, "fingerprint": "kit-span-0"})
    )
    return {"examples": [transformed], "transform_graph": [graph], "schema": [schema],
            "selection": [selection]}  # fmt: skip


def properties(root: Path, use_case: str = "taxi", **overrides) -> dict:
    """The step's parameters as the pipeline gives them (6 trials, 2 at once, 40 steps each)."""
    shipped = use_case if "." not in use_case else "taxi"  # a test's own: taxi's settings
    settings = kit.of(shipped).trainer_settings()
    settings["use_case"] = use_case
    values = dict(
        tune=1, tuner_parallel_trials=2, tuner_max_trials=6, tuner_max_minutes=10.0,
        tuner_algorithm="random", tuner_objective="", tuner_trial_steps=40, train_steps=300,
        epochs=2, eval_steps=5, custom_config=json.dumps(settings), pinned="{}",
        search_root=str(root / "_tuner"), serving_root=str(root / "serving"), model_name="m",
    )  # fmt: skip
    return {**values, **overrides}


def run(root: Path, props: dict, inputs: dict | None = None) -> dict:
    """Runs the step; returns its outputs' values: best (best_hyperparameters.txt), the
    artifact's custom properties, and every trial's record."""
    inputs = inputs or transformed_inputs(root)
    best = standard_artifacts.HyperParameters()
    results = standard_artifacts.TunerResults()
    for artifact, name in ((best, "best"), (results, "results")):
        artifact.uri = str(root / "outputs" / name)
        shutil.rmtree(artifact.uri, ignore_errors=True)
        Path(artifact.uri).mkdir(parents=True)
    HyperparameterSearchExecutor().Do(
        inputs, {"best_hyperparameters": [best], "tuner_results": [results]}, props
    )
    return {
        "best": json.loads(Path(best.uri, "best_hyperparameters.txt").read_text()),
        "source": best.get_string_custom_property("source"),
        "search": json.loads(best.get_string_custom_property("search")),
        "trials": json.loads(Path(results.uri, TRIALS_FILE).read_text()),
    }


def records_folder(root: Path) -> list[Path]:
    """The trial-record folders of the searches under `root`."""
    return sorted((root / "_tuner").glob("*/trials"))


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO)
    run(Path(sys.argv[1]), json.loads(sys.argv[2]))
