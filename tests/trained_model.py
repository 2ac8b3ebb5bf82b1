"""A model trained by run_fn on a tiny, really transformed data set, shared by the tests of the
model, of serving and of the edge export (one training per test session)."""

import os

import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tfx.components.trainer import fn_args_utils
from tfx.components.util import tfxio_utils
from tfx.types import artifact_utils, standard_artifacts

from components.base.config import PipelineConfig
from components.training import loop
from components.use_cases.taxi import data as taxi_data
from pipelines.pipeline import trainer_config

TRAIN_ROWS, EVAL_ROWS = 500, 300
# What these tests were tuned with, where the config's defaults differ (batch 128, patience 2).
TEST_SETTINGS = {"batch_size": 64, "early_stopping_patience": 0}


def trainer_settings(**overrides) -> dict:
    """The Trainer's custom_config as the pipeline builds it from the config's defaults
    (pipelines/pipeline.py trainer_config), with TEST_SETTINGS and `overrides` on top; without
    the config's checkpoint_root (the project's .work/), which a test gives where it wants one."""
    config = PipelineConfig.load(environ={})
    settings = trainer_config(config)
    settings.pop("checkpoint_root")
    # What the Trainer step adds from its run parameters (components/steps/trainer.py).
    settings.update(epochs=config.epochs, max_train_minutes=config.max_train_minutes)
    return {**settings, **TEST_SETTINGS, **overrides}


EPOCHS = 3


def _write_gzip_examples(rows: list[dict], coder, path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for row in rows:
            writer.write(coder.encode(row))


@pytest.fixture(scope="session")
def transformed(tmp_path_factory, transform_frames):
    """Generated trips transformed as the Transform component does: (graph dir, Examples, eval)."""
    tmp = tmp_path_factory.mktemp("transform")
    train_frame = taxi_data.generate_span(TRAIN_ROWS, span=0)
    eval_frame = taxi_data.generate_span(EVAL_ROWS, span=0, seed=7)
    graph_dir = str(tmp / "transform_graph")
    train_rows, eval_rows = transform_frames(
        [train_frame, eval_frame], graph_dir, temp_dir=str(tmp / "tft_tmp")
    )
    # Transformed examples laid out like Transform's output artifact: one folder per split.
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp / "transformed_examples")
    examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
    coder = tft.coders.ExampleProtoCoder(
        tft.TFTransformOutput(graph_dir).transformed_metadata.schema
    )
    for split, rows in (("train", train_rows), ("eval", eval_rows)):
        path = f"{examples.uri}/Split-{split}/transformed_examples-00000-of-00001.gz"
        _write_gzip_examples(rows, coder, path)
    return graph_dir, examples, eval_frame


def fn_args_for(transformed, run_dir, **overrides) -> fn_args_utils.FnArgs:
    """FnArgs as the Trainer executor fills them in for `transformed`'s artifacts."""
    graph_dir, examples, _ = transformed
    args = dict(
        train_files=[f"{examples.uri}/Split-train/*"],
        eval_files=[f"{examples.uri}/Split-eval/*"],
        transform_output=graph_dir,
        serving_model_dir=str(run_dir / "serving_model"),
        model_run_dir=str(run_dir / "model_run"),
        train_steps=30,
        eval_steps=5,
        custom_config=trainer_settings(epochs=EPOCHS, learning_rate=0.01),
        data_accessor=fn_args_utils.DataAccessor(
            tf_dataset_factory=tfxio_utils.get_tf_dataset_factory_from_artifact(
                [examples], ["Trainer"]
            ),
            record_batch_factory=None,
            data_view_decode_fn=None,
        ),
    )
    args.update(overrides)
    return fn_args_utils.FnArgs(**args)


@pytest.fixture(scope="session")
def trained(tmp_path_factory, transformed):
    """run_fn on the CPU with the default ('auto', so float32) precision; (FnArgs, eval trips)."""
    tf.keras.utils.set_random_seed(0)
    fn_args = fn_args_for(transformed, tmp_path_factory.mktemp("trainer"))
    loop.run_fn(fn_args)
    return fn_args, transformed[2]


def scalar_steps(model_run_dir: str) -> set[int]:
    """The steps of the per-batch scalars in a model_run's TensorBoard logs."""
    steps = set()
    for path in tf.io.gfile.glob(f"{model_run_dir}/logs/train/events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(path):
            if any(v.tag.startswith("batch_") for v in event.summary.value):
                steps.add(event.step)
    return steps
