"""`create_pipeline(config)`: the one pipeline definition every runner uses."""

from __future__ import annotations

import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")  # Transform and TFMA need tf_keras, not Keras 3

import tensorflow_model_analysis as tfma  # noqa: E402
from tfx import v1 as tfx  # noqa: E402

from components import features  # noqa: E402
from components.baseline import BaselineAwareEvaluator, LatestPushedModel  # noqa: E402
from components.example_gen import SpanCsvExampleGen  # noqa: E402
from components.pusher import VersionedPusher  # noqa: E402
from components.validation import StrictExampleValidator  # noqa: E402
from pipelines.config import PipelineConfig  # noqa: E402

# User code is referenced by import path, not by module_file: TFX would otherwise package it as a
# wheel and pip-install it in every step (uv environments have no pip), and compiling for Kubeflow
# would need write access to the pipeline root. The code is installed in the environment and image.
PREPROCESSING_FN = "components.preprocessing.preprocessing_fn"
RUN_FN = "components.model.run_fn"


def eval_config(config: PipelineConfig) -> tfma.EvalConfig:
    """AUC and accuracy must clear fixed bars, and AUC may not fall more than allowed below the
    last blessed model's. Metrics are computed overall and per payment type."""
    auc_threshold = tfma.MetricThreshold(
        value_threshold=tfma.GenericValueThreshold(lower_bound={"value": config.min_auc}),
        change_threshold=tfma.GenericChangeThreshold(
            direction=tfma.MetricDirection.HIGHER_IS_BETTER,
            absolute={"value": -config.max_auc_drop},
        ),
    )
    accuracy_threshold = tfma.MetricThreshold(
        value_threshold=tfma.GenericValueThreshold(lower_bound={"value": config.min_accuracy})
    )
    # Thresholds hold for the whole eval set; per-slice metrics are reported, not gated (small
    # slices such as "No Charge" are too noisy to block a release on).
    overall = [tfma.SlicingSpec()]
    return tfma.EvalConfig(
        model_specs=[
            tfma.ModelSpec(label_key=features.LABEL_KEY, signature_name="serving_default")
        ],
        slicing_specs=[tfma.SlicingSpec(), tfma.SlicingSpec(feature_keys=[features.SLICE_KEY])],
        metrics_specs=[
            tfma.MetricsSpec(
                metrics=[
                    tfma.MetricConfig(class_name="ExampleCount"),
                    tfma.MetricConfig(
                        class_name="AUC",
                        per_slice_thresholds=[
                            tfma.PerSliceMetricThreshold(
                                slicing_specs=overall, threshold=auc_threshold
                            )
                        ],
                    ),
                    tfma.MetricConfig(
                        class_name="BinaryAccuracy",
                        per_slice_thresholds=[
                            tfma.PerSliceMetricThreshold(
                                slicing_specs=overall, threshold=accuracy_threshold
                            )
                        ],
                    ),
                ]
            )
        ],
    )


def create_pipeline(config: PipelineConfig, metadata_connection_config=None) -> tfx.dsl.Pipeline:
    """The full DAG. `metadata_connection_config` is the local runner's; Kubeflow brings its own."""
    example_gen = SpanCsvExampleGen(input_base=config.data_root, span=config.span).with_id(
        "ExampleGen"
    )
    statistics_gen = tfx.components.StatisticsGen(examples=example_gen.outputs["examples"])
    schema_importer = tfx.dsl.Importer(
        source_uri=config.schema_dir, artifact_type=tfx.types.standard_artifacts.Schema
    ).with_id("SchemaImporter")
    example_validator = StrictExampleValidator(
        statistics=statistics_gen.outputs["statistics"], schema=schema_importer.outputs["result"]
    ).with_id("ExampleValidator")
    transform = tfx.components.Transform(
        examples=example_gen.outputs["examples"],
        schema=schema_importer.outputs["result"],
        preprocessing_fn=PREPROCESSING_FN,
    )
    # Transform must not start on data that failed validation.
    transform.add_upstream_node(example_validator)
    trainer = tfx.components.Trainer(
        run_fn=RUN_FN,
        examples=transform.outputs["transformed_examples"],
        transform_graph=transform.outputs["transform_graph"],
        schema=schema_importer.outputs["result"],
        train_args=tfx.proto.TrainArgs(num_steps=config.train_steps),
        eval_args=tfx.proto.EvalArgs(num_steps=config.eval_steps),
        custom_config={
            "epochs": config.epochs,
            "batch_size": config.batch_size,
            "learning_rate": config.learning_rate,
            "hidden_units": list(config.hidden_units),
            "mixed_precision": config.mixed_precision,
        },
    )
    baseline = LatestPushedModel(
        model=trainer.outputs["model"], serving_model_dir=config.serving_model_dir
    ).with_id("LatestPushedModel")
    evaluator = BaselineAwareEvaluator(
        examples=example_gen.outputs["examples"],
        model=trainer.outputs["model"],
        baseline_model=baseline.outputs["baseline_model"],
        eval_config=eval_config(config),
    ).with_id("Evaluator")
    pusher = VersionedPusher(
        model=trainer.outputs["model"],
        model_blessing=evaluator.outputs["blessing"],
        push_destination=tfx.proto.PushDestination(
            filesystem=tfx.proto.PushDestination.Filesystem(base_directory=config.serving_model_dir)
        ),
    ).with_id("Pusher")
    return tfx.dsl.Pipeline(
        pipeline_name=config.pipeline_name,
        pipeline_root=config.pipeline_root,
        components=[
            example_gen,
            statistics_gen,
            schema_importer,
            example_validator,
            transform,
            trainer,
            baseline,
            evaluator,
            pusher,
        ],  # fmt: skip
        enable_cache=True,
        metadata_connection_config=metadata_connection_config,
        beam_pipeline_args=list(config.beam_args),
    )
