"""`create_pipeline(config)`: the one pipeline definition every runner uses."""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Transform and TFMA need tf_keras, not Keras 3

from tfx import v1 as tfx  # noqa: E402

from components.base.config import (  # noqa: E402
    GPU_RESOURCE,
    REPO_ROOT,
    RUN_PARAMETERS,
    SECRET_KEYS,
    PipelineConfig,
)
from components.base.use_case import IMAGE_FOLDERS, UseCase  # noqa: E402
from components.base.use_case import load as load_use_case  # noqa: E402
from components.steps.baseline import LatestPushedModel  # noqa: E402
from components.steps.evaluation import ThresholdEvaluator  # noqa: E402
from components.steps.example_gen import SpanExampleGen  # noqa: E402
from components.steps.pusher import VersionedPusher  # noqa: E402
from components.steps.run_report import RunReport  # noqa: E402
from components.steps.schema import CuratedSchema  # noqa: E402
from components.steps.span_selection import TRAIN_KEY, SelectSpans  # noqa: E402
from components.steps.trainer import TunableTrainer  # noqa: E402
from components.steps.tuner import SEARCH_FOLDER, HyperparameterSearch  # noqa: E402
from components.steps.validation import StrictExampleValidator  # noqa: E402
from components.training import search_space  # noqa: E402
from components.training.checkpoints import CHECKPOINTS_FOLDER  # noqa: E402

# User code is referenced by import path, not by module_file: TFX would otherwise package it as a
# wheel and pip-install it in every step (uv environments have no pip), and compiling for Kubeflow
# would need write access to the pipeline root. The code is installed in the environment and image.
RUN_FN = "components.training.loop.run_fn"


def runtime_parameters(config: PipelineConfig) -> dict[str, tfx.dsl.experimental.RuntimeParameter]:
    """The run parameters (config.RUN_PARAMETERS), each defaulting to its config value."""
    values = run_parameter_values(config)
    return {
        name: tfx.dsl.experimental.RuntimeParameter(name=name, ptype=ptype, default=values[name])
        for name, ptype in RUN_PARAMETERS.items()
    }


def run_parameter_values(config: PipelineConfig) -> dict[str, str | int | float]:
    """The config's value of every run parameter, typed as its RuntimeParameter."""
    return {name: ptype(getattr(config, name)) for name, ptype in RUN_PARAMETERS.items()}


def trainer_config(config: PipelineConfig) -> dict:
    """The Trainer's custom_config: run_fn's settings that are not run parameters. The
    `hyperparameters` setting's learning_rate and batch_size win over the fields of that name."""
    settings = {
        "use_case": config.use_case,
        "initial_weights": config.initial_weights,
        "batch_size": config.batch_size,
        "learning_rate": config.learning_rate,
        "mixed_precision": config.mixed_precision,
        "strategy": config.strategy,
        "num_workers": config.num_workers,
        "early_stopping_patience": config.early_stopping_patience,
        "checkpoint_root": f"{config.pipeline_root.rstrip('/')}/{CHECKPOINTS_FOLDER}",
        "checkpoint_every_steps": config.checkpoint_every_steps,
        "checkpoint_max_age_hours": config.checkpoint_max_age_hours,
        "cache_training_data": config.cache_training_data,
        "tensorboard_every_steps": config.tensorboard_every_steps,
        **({"cluster_job": cluster_job_settings(config)} if config.num_workers > 1 else {}),
    }
    return search_space.apply(settings, json.loads(config.hyperparameters))


def cluster_job_settings(config: PipelineConfig) -> dict:
    """The job a multi-worker Trainer runs on Kubeflow (components/training/cluster_job.py), and
    what each replica's pod gets: what the single-pod Trainer gets
    (pipelines/kubeflow/kubeflow_runner.py)."""
    return {
        "kind": config.multi_worker_job,
        "runtime": config.trainjob_runtime,
        "start_timeout_minutes": config.replica_start_timeout_minutes,
        "image": config.gpu_image,
        "cpu": config.trainer_cpu,
        "memory": config.trainer_memory,
        "gpus": config.gpu_count,
        "gpu_resource": GPU_RESOURCE,
        "node_selector": config.gpu_node_selector,
        "toleration_key": config.gpu_toleration_key,
        "secret": config.credentials_secret,
        "secret_keys": list(SECRET_KEYS),
    }


def schema_path(use_case: UseCase) -> str:
    """The curated schema's path as the step takes it: relative to the project root when it is
    in the project (the same file in every image), else as it is."""
    path = use_case.schema_path.resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def create_pipeline(config: PipelineConfig, metadata_connection_config=None) -> tfx.dsl.Pipeline:
    """The full DAG. `metadata_connection_config` is the local runner's; Kubeflow brings its own."""
    param = runtime_parameters(config)
    use_case = load_use_case(config.use_case)
    images = use_case.input_format == IMAGE_FOLDERS
    select_spans = SelectSpans(
        data_root=param["data_root"],
        span=param["span"],
        window_spans=param["window_spans"],
        success_marker=config.success_marker,
        force=param["force"],
        serving_root=param["serving_root"],
        model_name=param["model_name"],
        input_format=use_case.input_format,
    ).with_id("SelectSpans")
    is_new_data = select_spans.outputs["decision"].future()[0].custom_property(TRAIN_KEY) == 1
    # Every later step runs only when the selected spans are new to the model (or force=1). On
    # Kubeflow this becomes each task's triggerPolicy.condition, evaluated by the 2.5 driver.
    with tfx.dsl.Cond(is_new_data):
        schema = CuratedSchema(schema_path(use_case)).with_id("CuratedSchema")
        example_gen = SpanExampleGen(
            selection=select_spans.outputs["selection"],
            input_base=param["data_root"],
            input_encoding=config.input_encoding,
            input_format=use_case.input_format,
            input_options=use_case.input_options,
            class_names=config.class_names,
            serving_root=param["serving_root"],
            model_name=param["model_name"],
            # A CSV span's column types: read in one pass (components/steps/csv_examples.py).
            schema=None if images else schema.outputs["schema"],
        ).with_id("ExampleGen")
        # Images: the schema marks the encoded image as bytes (image_domain), so TFDV gives it
        # byte-length statistics instead of counting every image as a distinct string
        # (tensorflow/tfx#1622). CSV statistics stay as they were (schema-less).
        statistics_gen = tfx.components.StatisticsGen(
            examples=example_gen.outputs["examples"],
            schema=schema.outputs["schema"] if images else None,
        )
        example_validator = StrictExampleValidator(
            statistics=statistics_gen.outputs["statistics"],
            schema=schema.outputs["schema"],
            serving_root=param["serving_root"],
            model_name=param["model_name"],
            use_case=config.use_case,
            schema_file=schema_path(use_case),
        ).with_id("ExampleValidator")
        transform = tfx.components.Transform(
            examples=example_gen.outputs["examples"],
            schema=schema.outputs["schema"],
            preprocessing_fn=use_case.preprocessing_fn,
        )
        # Transform must not start on data that failed validation.
        transform.add_upstream_node(example_validator)
        tuner = HyperparameterSearch(
            examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            schema=schema.outputs["schema"],
            selection=select_spans.outputs["selection"],
            raw_examples=example_gen.outputs["examples"] if images else None,
            tune=param["tune"],
            tuner_parallel_trials=param["tuner_parallel_trials"],
            tuner_max_trials=param["tuner_max_trials"],
            tuner_max_minutes=param["tuner_max_minutes"],
            tuner_algorithm=config.tuner_algorithm,
            tuner_objective=config.tuner_objective,
            tuner_trial_steps=config.tuner_trial_steps,
            train_steps=param["train_steps"],
            epochs=param["epochs"],
            eval_steps=config.eval_steps,
            # On Kubeflow each trial is a pod with the Trainer's settings (image, GPUs, ...).
            custom_config=json.dumps(
                {**trainer_config(config), "cluster_job": cluster_job_settings(config)},
                sort_keys=True,
            ),
            pinned=config.hyperparameters,
            search_root=f"{config.pipeline_root.rstrip('/')}/{SEARCH_FOLDER}",
            serving_root=param["serving_root"],
            model_name=param["model_name"],
        ).with_id("Tuner")
        trainer = TunableTrainer(
            run_fn=RUN_FN,
            examples=transform.outputs["transformed_examples"],
            transform_graph=transform.outputs["transform_graph"],
            schema=schema.outputs["schema"],
            train_steps=param["train_steps"],
            epochs=param["epochs"],
            max_train_minutes=param["max_train_minutes"],
            eval_steps=config.eval_steps,
            selection=select_spans.outputs["selection"],
            raw_examples=example_gen.outputs["examples"] if images else None,
            hyperparameters=tuner.outputs["best_hyperparameters"],
            custom_config=trainer_config(config),
        ).with_id("Trainer")
        baseline = LatestPushedModel(
            model=trainer.outputs["model"],
            serving_root=param["serving_root"],
            model_name=param["model_name"],
        ).with_id("LatestPushedModel")
        evaluator = ThresholdEvaluator(
            examples=example_gen.outputs["examples"],
            model=trainer.outputs["model"],
            baseline_model=baseline.outputs["baseline_model"],
            min_auc=param["min_auc"],
            min_accuracy=param["min_accuracy"],
            max_auc_drop=param["max_auc_drop"],
            label_key=use_case.label_key,
            slice_keys=use_case.slice_keys,
        ).with_id("Evaluator")
        pusher = VersionedPusher(
            model=trainer.outputs["model"],
            model_blessing=evaluator.outputs["blessing"],
            baseline_model=baseline.outputs["baseline_model"],
            selection=select_spans.outputs["selection"],
            examples=example_gen.outputs["examples"],
            serving_root=param["serving_root"],
            model_name=param["model_name"],
            keep_versions=config.keep_versions,
            release_policy=json.dumps(config.release_policy(), sort_keys=True),
            export_tflite=config.export_tflite,
            tflite_quantization=config.tflite_quantization,
            label_key=use_case.label_key,
        ).with_id("Pusher")
        # What the Kubeflow UI shows of the run (metrics, ROC curve, a report), and `tkp run`.
        run_report = RunReport(
            selection=select_spans.outputs["selection"],
            statistics=statistics_gen.outputs["statistics"],
            anomalies=example_validator.outputs["anomalies"],
            evaluation=evaluator.outputs["evaluation"],
            blessing=evaluator.outputs["blessing"],
            pushed_model=pusher.outputs["pushed_model"],
            class_names=use_case.class_names,
            best_hyperparameters=tuner.outputs["best_hyperparameters"],
            tuner_results=tuner.outputs["tuner_results"],
        ).with_id("RunReport")
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=config.pipeline_root,
        components=[
            select_spans,
            example_gen,
            statistics_gen,
            schema,
            example_validator,
            transform,
            tuner,
            trainer,
            baseline,
            evaluator,
            pusher,
            run_report,
        ],  # fmt: skip
        enable_cache=True,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(config.beam_args),
    )
