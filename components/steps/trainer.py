"""TFX's Trainer with run parameters, a backup that survives a re-run, and more than one worker.

Kubeflow Pipelines can only set top-level step parameters from the UI or a recurring run; values
inside TrainArgs or custom_config are frozen at compile time. This executor folds the run
parameters (train_steps, epochs, max_train_minutes) back into those before the stock (generic)
Trainer executor runs. It also:
- names the training's backup folder by content (components/training/checkpoints.py), from the
  selected spans' fingerprint (the `selection` input), the curated schema and the training
  parameters, and removes backups abandoned longer than `checkpoint_max_age_hours`;
- with `num_workers` > 1 runs the training as that many workers: processes on this machine
  (components/training/local_workers.py), or a job of replicas when the step runs on Kubeflow
  (components/training/cluster_job.py: a Trainer v2 TrainJob or a TFJob);
- records what the training did (steps, replicas, examples/s, why it stopped) as custom
  properties of the model_run artifact, which the run summary prints.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types.standard_component_specs import TrainerSpec
from tfx.utils import proto_utils

from components.base import storage
from components.base.config import check_run_parameters
from components.base.launcher_paths import PIPELINE_FOLDER_ENV
from components.base.use_case import TRAINING_HYPERPARAMETERS
from components.base.use_case import load as load_use_case
from components.steps import training_inputs
from components.steps.span_selection import SpanSelection
from components.steps.step_outputs import HYPERPARAMETERS_KEY, SEARCH_KEY
from components.training import cluster_job, local_workers
from components.training.checkpoints import CHECKPOINTS_FOLDER
from components.training.tfjob import TFJobKind
from components.training.trainjob import TrainJobKind

JOB_KINDS = {"trainjob": TrainJobKind, "tfjob": TFJobKind}  # config multi_worker_job
RUN_PARAMETER_NAMES = ("train_steps", "epochs", "max_train_minutes")
SUMMARY_PROPERTIES = (
    "strategy", "steps", "replicas", "workers", "examples_per_second", "stopped", "resumed",
)  # fmt: skip

_log = logging.getLogger(__name__)


class TunableTrainerExecutor(trainer_executor.GenericExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        properties = dict(exec_properties)
        check_run_parameters("Trainer", {name: properties[name] for name in RUN_PARAMETER_NAMES})
        train_args = trainer_pb2.TrainArgs(num_steps=int(properties.pop("train_steps")))
        properties["train_args"] = proto_utils.proto_to_json(train_args)
        custom_config = json.loads(properties.get("custom_config") or "null") or {}
        custom_config["epochs"] = int(properties.pop("epochs"))
        custom_config["max_train_minutes"] = float(properties.pop("max_train_minutes"))
        custom_config = training_inputs.with_class_names(input_dict, custom_config)
        if input_dict.get("hyperparameters"):  # the Tuner step's: searched or carried over
            custom_config = _with_hyperparameters(input_dict, custom_config)
        if custom_config.get("checkpoint_root") and input_dict.get("selection"):
            custom_config["checkpoint_dir"] = _backup_dir(input_dict, custom_config, train_args)
        properties["custom_config"] = json.dumps(custom_config)
        workers = int(custom_config.get("num_workers", 1))
        if _on_a_cluster(custom_config):
            cluster_job.run(JOB_KINDS[custom_config["cluster_job"]["kind"]](), input_dict,
                            output_dict, properties, workers)  # fmt: skip
        elif workers > 1:
            local_workers.run(input_dict, output_dict, properties, workers)
        else:
            super().Do(input_dict, output_dict, properties)
        _record_summary(output_dict)
        _record_hyperparameters(output_dict, custom_config)


def _with_hyperparameters(input_dict, custom_config: dict) -> dict:
    """custom_config with the Tuner step's values in force, and where they came from."""
    from components.steps import tuner
    from components.training import search_space

    best = artifact_utils.get_single_instance(input_dict["hyperparameters"])
    values = json.loads(storage.read_bytes(storage.join(best.uri, tuner.BEST_FILE)))["values"]
    use_case = load_use_case(custom_config["use_case"])
    config = search_space.apply(custom_config, search_space.decode(use_case, values))
    search = json.loads(best.get_string_custom_property(tuner.SEARCH_KEY) or "{}")
    search.pop("records", None)
    # This run's source last: a carried-over search's own record says "search".
    config["search"] = {**search, "source": best.get_string_custom_property(tuner.SOURCE_KEY)}
    return config


def _record_hyperparameters(output_dict, custom_config: dict) -> None:
    """On the model: the hyperparameters it was trained with (build_model's, the learning
    rate, the batch size) and the search they came from; the Pusher records both."""
    use_case = load_use_case(custom_config["use_case"])
    values = {
        **use_case.resolved_hyperparameters(custom_config.get("hyperparameters") or {}),
        **{name: custom_config[name] for name in TRAINING_HYPERPARAMETERS},
    }
    model = artifact_utils.get_single_instance(output_dict["model"])
    model.set_string_custom_property(HYPERPARAMETERS_KEY, json.dumps(values, sort_keys=True))
    search = custom_config.get("search") or {}
    if search.get("searched"):
        model.set_string_custom_property(SEARCH_KEY, json.dumps(search, sort_keys=True))
    if search.get("source") == "search":  # this run's search, in TensorBoard's HParams
        from components.training import search as searches

        model_run = artifact_utils.get_single_instance(output_dict["model_run"])
        searches.write_hparams_logs(searches.read_records(search["folder"]),
                                    search["objective"],
                                    storage.join(model_run.uri, "logs", "hparams"))  # fmt: skip


def _backup_dir(input_dict, custom_config: dict, train_args: trainer_pb2.TrainArgs) -> str:
    # The replicas (strategy auto uses every GPU) set the global batch and learning rate; a
    # cluster job's replicas have the GPUs, not this step's pod.
    job_gpus = custom_config["cluster_job"]["gpus"] if _on_a_cluster(custom_config) else None
    extra = {
        "train_steps": train_args.num_steps,
        "gpus": local_workers.visible_gpus() if job_gpus is None else job_gpus,
    }
    return training_inputs.keyed_folder(input_dict, custom_config, extra,
                                        custom_config["checkpoint_root"], CHECKPOINTS_FOLDER,
                                        "training backup")  # fmt: skip


def _on_a_cluster(custom_config: dict) -> bool:
    """Several workers in a Kubeflow step (pipelines/kubeflow/kfp_entrypoint.py sets the folder)."""
    return int(custom_config.get("num_workers", 1)) > 1 and bool(
        os.environ.get(PIPELINE_FOLDER_ENV)
    )


def _record_summary(output_dict) -> None:
    from components.training.loop import TRAINING_SUMMARY  # TensorFlow: only once training ran

    model_run = artifact_utils.get_single_instance(output_dict["model_run"])
    path = storage.join(model_run.uri, TRAINING_SUMMARY)
    if not storage.list_files(path):
        return
    summary = json.loads(storage.read_bytes(path))
    for name in SUMMARY_PROPERTIES:
        value = summary.get(name)
        if isinstance(value, bool) or isinstance(value, int):
            model_run.set_int_custom_property(name, int(value))
        elif isinstance(value, float):
            model_run.set_float_custom_property(name, value)
        elif value is not None:
            model_run.set_string_custom_property(name, str(value))


class TunableTrainerSpec(types.ComponentSpec):
    PARAMETERS = {
        **TrainerSpec.PARAMETERS,
        "train_steps": component_spec.ExecutionParameter(type=int),
        "epochs": component_spec.ExecutionParameter(type=int),
        "max_train_minutes": component_spec.ExecutionParameter(type=float),
    }
    INPUTS = {
        **TrainerSpec.INPUTS,
        # The selected spans: their content fingerprint names the training's backup.
        "selection": component_spec.ChannelParameter(type=SpanSelection, optional=True),
        # TFX's Trainer input `hyperparameters` (the Tuner step's best_hyperparameters) is in
        # TrainerSpec.INPUTS; this executor applies it (the stock one only hands it to run_fn).
        # ExampleGen's examples, for the classes it found (image folders).
        "raw_examples": component_spec.ChannelParameter(
            type=standard_artifacts.Examples, optional=True
        ),
    }
    OUTPUTS = TrainerSpec.OUTPUTS


class TunableTrainer(base_component.BaseComponent):
    SPEC_CLASS = TunableTrainerSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(TunableTrainerExecutor)

    def __init__(
        self,
        examples: types.BaseChannel,
        transform_graph: types.BaseChannel,
        schema: types.BaseChannel,
        run_fn: str,
        train_steps: int | Any,
        epochs: int | Any,
        max_train_minutes: float | Any,
        eval_steps: int,
        custom_config: dict[str, Any],
        selection: types.BaseChannel | None = None,
        raw_examples: types.BaseChannel | None = None,
        hyperparameters: types.BaseChannel | None = None,
    ):
        super().__init__(
            spec=TunableTrainerSpec(
                raw_examples=raw_examples,
                examples=examples,
                transform_graph=transform_graph,
                schema=schema,
                selection=selection,
                hyperparameters=hyperparameters,
                run_fn=run_fn,
                train_args=trainer_pb2.TrainArgs(),
                eval_args=trainer_pb2.EvalArgs(num_steps=eval_steps),
                custom_config=json.dumps(custom_config, sort_keys=True),
                train_steps=train_steps,
                epochs=epochs,
                max_train_minutes=max_train_minutes,
                model=types.Channel(type=standard_artifacts.Model),
                model_run=types.Channel(type=standard_artifacts.ModelRun),
            )
        )
