"""TFX's Trainer with training steps and epochs as top-level parameters.

Kubeflow Pipelines can only set top-level step parameters from the UI or a recurring run; values
inside TrainArgs or custom_config are frozen at compile time. This executor folds the two
parameters back into those before the stock (generic) Trainer executor runs.
"""

from __future__ import annotations

import json
from typing import Any

from tfx import types
from tfx.components.trainer import executor as trainer_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import trainer_pb2
from tfx.types import component_spec, standard_artifacts
from tfx.types.standard_component_specs import TrainerSpec
from tfx.utils import proto_utils

from pipelines.config import check_run_parameters


class TunableTrainerExecutor(trainer_executor.GenericExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        properties = dict(exec_properties)
        check_run_parameters(
            "Trainer", {name: properties[name] for name in ("train_steps", "epochs")}
        )
        train_args = trainer_pb2.TrainArgs(num_steps=int(properties.pop("train_steps")))
        properties["train_args"] = proto_utils.proto_to_json(train_args)
        custom_config = json.loads(properties.get("custom_config") or "null") or {}
        custom_config["epochs"] = int(properties.pop("epochs"))
        properties["custom_config"] = json.dumps(custom_config)
        super().Do(input_dict, output_dict, properties)


class TunableTrainerSpec(types.ComponentSpec):
    PARAMETERS = {
        **TrainerSpec.PARAMETERS,
        "train_steps": component_spec.ExecutionParameter(type=int),
        "epochs": component_spec.ExecutionParameter(type=int),
    }
    INPUTS = TrainerSpec.INPUTS
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
        eval_steps: int,
        custom_config: dict[str, Any],
    ):
        super().__init__(
            spec=TunableTrainerSpec(
                examples=examples,
                transform_graph=transform_graph,
                schema=schema,
                run_fn=run_fn,
                train_args=trainer_pb2.TrainArgs(),
                eval_args=trainer_pb2.EvalArgs(num_steps=eval_steps),
                custom_config=json.dumps(custom_config, sort_keys=True),
                train_steps=train_steps,
                epochs=epochs,
                model=types.Channel(type=standard_artifacts.Model),
                model_run=types.Channel(type=standard_artifacts.ModelRun),
            )
        )
