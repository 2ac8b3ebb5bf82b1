"""The Tuner step: the hyperparameters the Trainer trains with, searched or carried over.

tune=1 runs a search (components/training/search.py) over the use case's search space, its
trials in parallel; tune=0 takes the served version's searched values from its registry
record (each pushed version records its hyperparameters and the search they came from), so a
nightly run does not search again, else the use case's defaults (no values: the Trainer keeps
its config). Names pinned by the config's `hyperparameters` are never searched nor carried
over. The step always runs, so its run parameter `tune` can change per run.

Outputs are TFX's Tuner's: `best_hyperparameters` (best_hyperparameters.txt, KerasTuner's
HyperParameters config) and `tuner_results` (tuner_results.json: the completed trials as TFX
writes them, and trials.json: every trial's record). The best_hyperparameters artifact also
says where the values came from (SOURCE_KEY, SEARCH_KEY), for the Trainer and the registry.
TFX's own Tuner executor refuses parallel trials outside Google Cloud (tune_args), hence this
one.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.utils import proto_utils

from components.base import registry, serving_state, storage
from components.base.config import check_run_parameters
from components.base.use_case import load as load_use_case
from components.steps import training_inputs
from components.steps.span_selection import SpanSelection
from components.steps.step_outputs import SEARCH_KEY  # JSON: the search (SearchSummary)

BEST_FILE = "best_hyperparameters.txt"  # TFX's name (tfx/components/tuner/executor.py)
RESULTS_FILE = "tuner_results.json"  # TFX's
TRIALS_FILE = "trials.json"
SOURCE_KEY = "source"  # "search", "served" (version N's), "defaults"
SEARCH_FOLDER = "_tuner"
RUN_PARAMETER_NAMES = ("tune", "tuner_parallel_trials", "tuner_max_trials", "tuner_max_minutes")
_log = logging.getLogger(__name__)


def search_summary(values: dict, **facts: Any) -> dict:
    """What a registry record keeps of the search behind its values."""
    return {"values": values, **facts}


class HyperparameterSearchExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        properties = dict(exec_properties)
        check_run_parameters("Tuner", {n: properties[n] for n in RUN_PARAMETER_NAMES})
        pinned = json.loads(properties["pinned"] or "{}")
        if int(properties["tune"]):
            values, source, summary = _searched(input_dict, output_dict, properties, pinned)
        else:
            values, source, summary = _carried_over(properties, pinned)
        best = artifact_utils.get_single_instance(output_dict["best_hyperparameters"])
        # KerasTuner's HyperParameters config, as TFX's Tuner writes it (the searched values
        # as KerasTuner gives them: a list hyperparameter as its JSON text).
        config = {"space": summary.get("space", {}).get("space", []),
                  "values": summary.get("raw_values", values)}  # fmt: skip
        storage.write_bytes(storage.join(best.uri, BEST_FILE), json.dumps(config).encode())
        best.set_string_custom_property(SOURCE_KEY, source)
        best.set_string_custom_property(SEARCH_KEY, json.dumps(
            {k: v for k, v in summary.items() if k not in ("space", "records", "raw_values")},
            sort_keys=True))  # fmt: skip
        results = artifact_utils.get_single_instance(output_dict["tuner_results"])
        records = summary.get("records", [])
        completed = sorted(  # best first, as TFX's Tuner writes them
            ({"trial_id": r["trial_id"], "score": r["metrics"][summary["objective"]],
              **r["values"]} for r in records if r.get("status") == "COMPLETED"),
            key=lambda r: -r["score"],
        )  # fmt: skip
        for name, value in ((RESULTS_FILE, completed), (TRIALS_FILE, records)):
            storage.write_bytes(storage.join(results.uri, name), json.dumps(value).encode())
        _log.info("Hyperparameters (%s): %s", source if source != "defaults" else
                  "the defaults", json.dumps(values, sort_keys=True) or "{}")  # fmt: skip


def _carried_over(properties: dict, pinned: dict) -> tuple[dict, str, dict]:
    """The served version's searched values (not those pinned now), else none."""
    folder = registry.versions_dir(properties["serving_root"], properties["model_name"])
    stable = serving_state.read(folder, properties["model_name"]).stable
    record = registry.read_record(folder, stable) if stable is not None else None
    search = (record or {}).get("search") or {}
    if not search.get("searched"):
        return {}, "defaults", {}
    values = {name: value for name, value in (record.get("hyperparameters") or {}).items()
              if name in search["searched"] and name not in pinned}  # fmt: skip
    return values, f"served version {stable}", {**search, "from_version": stable}


def _searched(input_dict, output_dict, properties: dict,
              pinned: dict) -> tuple[dict, str, dict]:  # fmt: skip
    from components.training import cluster_job, search, search_space

    custom_config = json.loads(properties["custom_config"])
    use_case = load_use_case(custom_config["use_case"])
    space = search_space.declared(use_case, pinned)  # SearchSpaceError before any trial
    custom_config = training_inputs.with_class_names(input_dict, custom_config)
    trial_steps = int(properties["tuner_trial_steps"]) or int(properties["train_steps"])
    epochs = min(int(properties["epochs"]), trial_steps)
    settings = search.SearchSettings(
        algorithm=properties["tuner_algorithm"],
        objective=properties["tuner_objective"] or f"val_{use_case.quality_metric}",
        max_trials=int(properties["tuner_max_trials"]),
        parallel_trials=int(properties["tuner_parallel_trials"]),
        max_minutes=float(properties["tuner_max_minutes"]),
        steps=trial_steps,
        epochs=epochs,
        eval_steps=int(properties["eval_steps"]),
    )
    trainer_properties = {
        "train_args": proto_utils.proto_to_json(trainer_pb2.TrainArgs(num_steps=trial_steps)),
        "eval_args": proto_utils.proto_to_json(trainer_pb2.EvalArgs(num_steps=settings.eval_steps)),
        "custom_config": json.dumps(custom_config),
    }
    folder = _search_folder(input_dict, properties, custom_config, settings, space)
    step = cluster_job.step_id(output_dict, "best_hyperparameters")  # its pods' label
    result = search.run_search(input_dict, trainer_properties, custom_config, settings, space,
                               folder, step)  # fmt: skip
    values = search_space.decode(use_case, result.best_values)
    summary = search_summary(
        values,
        folder=folder,
        algorithm=settings.algorithm,
        objective=settings.objective,
        best_trial=result.best_trial,
        best_value=result.best_value,
        trials=len(result.records),
        completed=sum(1 for r in result.records if r.get("status") == "COMPLETED"),
        searched=result.searched,
        records=result.records,
        space=result.space,
        raw_values=result.best_values,
    )
    _log.info("Search: best trial %s, %s %.4f", result.best_trial, settings.objective,
              result.best_value)  # fmt: skip
    return values, "search", summary


def _search_folder(input_dict, properties: dict, custom_config: dict, settings, space) -> str:
    """`<pipeline root>/_tuner/<key>`: the key says what defines the search (as a training's
    backup is keyed)."""
    extra = {"search": {**settings.identity(), "space": space.get_config()}}
    return training_inputs.keyed_folder(input_dict, custom_config, extra,
                                        properties["search_root"], SEARCH_FOLDER,
                                        "search")  # fmt: skip


class HyperparameterSearchSpec(types.ComponentSpec):
    PARAMETERS = {
        "tune": component_spec.ExecutionParameter(type=int),
        "tuner_parallel_trials": component_spec.ExecutionParameter(type=int),
        "tuner_max_trials": component_spec.ExecutionParameter(type=int),
        "tuner_max_minutes": component_spec.ExecutionParameter(type=float),
        "tuner_algorithm": component_spec.ExecutionParameter(type=str),
        "tuner_objective": component_spec.ExecutionParameter(type=str, optional=True),
        "tuner_trial_steps": component_spec.ExecutionParameter(type=int),
        "train_steps": component_spec.ExecutionParameter(type=int),
        "epochs": component_spec.ExecutionParameter(type=int),
        "eval_steps": component_spec.ExecutionParameter(type=int),
        # The Trainer's custom_config (JSON), and the hyperparameters the config pins (JSON).
        "custom_config": component_spec.ExecutionParameter(type=str),
        "pinned": component_spec.ExecutionParameter(type=str, optional=True),
        "search_root": component_spec.ExecutionParameter(type=str),
        "serving_root": component_spec.ExecutionParameter(type=str),
        "model_name": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {
        "examples": component_spec.ChannelParameter(type=standard_artifacts.Examples),
        "transform_graph": component_spec.ChannelParameter(type=standard_artifacts.TransformGraph),
        "schema": component_spec.ChannelParameter(type=standard_artifacts.Schema),
        "selection": component_spec.ChannelParameter(type=SpanSelection),
        "raw_examples": component_spec.ChannelParameter(
            type=standard_artifacts.Examples, optional=True
        ),
    }
    OUTPUTS = {
        "best_hyperparameters": component_spec.ChannelParameter(
            type=standard_artifacts.HyperParameters
        ),
        "tuner_results": component_spec.ChannelParameter(type=standard_artifacts.TunerResults),
    }


class HyperparameterSearch(base_component.BaseComponent):
    SPEC_CLASS = HyperparameterSearchSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(HyperparameterSearchExecutor)

    def __init__(self, **kwargs: Any):
        super().__init__(
            spec=HyperparameterSearchSpec(
                best_hyperparameters=types.Channel(type=standard_artifacts.HyperParameters),
                tuner_results=types.Channel(type=standard_artifacts.TunerResults),
                **kwargs,
            )
        )
