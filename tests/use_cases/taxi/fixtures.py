"""The taxi use case's test fixtures, all in one module: its raw data as tf.Transform and
ExampleGen see it (from the curated schema), and one model trained by run_fn on a tiny, really
transformed data set, shared by the tests of the model, of serving and of the edge export (one
training per test session). tests/conftest.py loads this module as a pytest plugin."""

import os
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_transform as tft
import tensorflow_transform.beam as tft_beam
from tensorflow_metadata.proto.v0 import schema_pb2
from tensorflow_transform.tf_metadata import dataset_metadata, metadata_io, schema_utils
from tfx.components.trainer import fn_args_utils
from tfx.components.util import tfxio_utils
from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import io_utils

from components.base.config import REPO_ROOT, PipelineConfig
from components.training import loop
from components.use_cases.taxi import USE_CASE, features, preprocessing
from components.use_cases.taxi import data as taxi_data
from pipelines.pipeline import schema_path, trainer_config

# --------------------------------------------------------------------------------------------
# Raw taxi-trip data as tf.Transform sees it (used by test_preprocessing.py and test_model.py)
# --------------------------------------------------------------------------------------------

# The curated schema the pipeline imports: CuratedSchemaExecutor copies
# REPO_ROOT / exec_properties["schema_path"], and the pipeline gives it the use case's path, so
# the path is read from the pipeline's step rather than written down a second time.
SCHEMA_PATH = REPO_ROOT / schema_path(USE_CASE)

# Transform's raw spec, derived as TFX 1.16's Transform derives it (tfx/components/transform/
# executor.py): TransformProcessor._GetSchema reads the schema with io_utils.SchemaReader,
# _ReadMetadata wraps it in a DatasetMetadata (also the raw metadata Transform writes to
# transform_graph/metadata), and the spec is schema_utils.schema_as_feature_spec(metadata.schema)
# .feature_spec, as in _RunInPlaceImpl and TFTransformOutput.raw_feature_spec. Features without a
# shape are VarLen; `shape { dim { size: 1 } }` gives FixedLenFeature([1]); the dtypes are the
# schema's, never pandas'.
RAW_METADATA = dataset_metadata.DatasetMetadata(io_utils.SchemaReader().read(str(SCHEMA_PATH)))
RAW_FEATURE_SPEC = schema_utils.schema_as_feature_spec(RAW_METADATA.schema).feature_spec
SERVING_ENVIRONMENT = "SERVING"


def in_environment(feature: schema_pb2.Feature, schema: schema_pb2.Schema, env: str) -> bool:
    """schema.proto's rule: `env` in in_environment or default_environment, not excluded."""
    listed = env in feature.in_environment or env in schema.default_environment
    return listed and env not in feature.not_in_environment


# What a serving request carries: the features of the SERVING environment (the label is not).
SERVING_FEATURE_SPEC = {
    feature.name: RAW_FEATURE_SPEC[feature.name]
    for feature in RAW_METADATA.schema.feature
    if in_environment(feature, RAW_METADATA.schema, SERVING_ENVIRONMENT)
}
assert set(RAW_FEATURE_SPEC) == set(features.RAW_COLUMNS), "schema and features.py disagree"


def _is_missing(value) -> bool:
    return pd.api.types.is_scalar(value) and pd.isna(value)


def _typed(key: str, value, dtype: tf.dtypes.DType):
    """`value` as the schema type of `key`, whatever pandas made of the column."""
    if dtype == tf.string:
        return value if isinstance(value, bytes) else str(value).encode()
    if dtype == tf.int64:
        if float(value) != int(value):
            raise ValueError(f"{key}: {value!r} is not an integer, but the schema says INT")
        return int(value)
    return float(value)


def _spec_values(key: str, value) -> list:
    """The 0 or 1 schema-typed values of one CSV cell; a missing one only for VarLen features."""
    spec = RAW_FEATURE_SPEC[key]
    if _is_missing(value):
        if isinstance(spec, tf.io.FixedLenFeature):
            raise ValueError(f"{key} is missing, but the schema requires it (FixedLenFeature)")
        return []
    return [_typed(key, value, spec.dtype)]


def frame_to_instances(frame: pd.DataFrame) -> list[dict]:
    """tf.Transform instance dicts for RAW_FEATURE_SPEC: lists of 0 or 1 values for VarLen
    features, an array of the feature's shape for FixedLen ones."""
    instances = []
    for row in frame[list(RAW_FEATURE_SPEC)].to_dict("records"):
        instance = {}
        for key, value in row.items():
            spec, values = RAW_FEATURE_SPEC[key], _spec_values(key, value)
            if isinstance(spec, tf.io.FixedLenFeature):
                instance[key] = np.array(values, spec.dtype.as_numpy_dtype).reshape(spec.shape)
            else:
                instance[key] = values
        instances.append(instance)
    return instances


def frame_to_examples(frame: pd.DataFrame, with_label: bool = True) -> list[bytes]:
    """Serialized raw tf.Examples as CsvExampleGen writes them: a missing value is no feature.

    Value lists follow the schema type (a FLOAT column is a float_list even when pandas holds
    ints). Without the label: only the SERVING environment's features, as a serving request has.
    """
    spec = RAW_FEATURE_SPEC if with_label else SERVING_FEATURE_SPEC
    serialized = []
    for row in frame[list(spec)].to_dict("records"):
        feature = {}
        for key, value in row.items():
            if _is_missing(value):
                continue
            values = _spec_values(key, value)
            if spec[key].dtype == tf.string:
                feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=values))
            elif spec[key].dtype == tf.int64:
                feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            else:
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=values))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        serialized.append(example.SerializeToString())
    return serialized


def analyze_and_transform(
    frames: list[pd.DataFrame], transform_graph_dir: str, temp_dir: str
) -> list[list[dict]]:
    """Runs `preprocessing_fn` on Beam as the Transform component does.

    Analyzes `frames[0]`, transforms every frame and writes the transform graph (transform_fn,
    transformed_metadata and the raw metadata, which is the curated schema) to
    `transform_graph_dir`. Returns the transformed rows of each frame.
    """
    metadata = RAW_METADATA
    with tft_beam.Context(temp_dir=temp_dir):
        (rows, _), transform_fn = (
            frame_to_instances(frames[0]),
            metadata,
        ) | tft_beam.AnalyzeAndTransformDataset(preprocessing.preprocessing_fn)
        outputs = [rows]
        for frame in frames[1:]:
            (more_rows, _) = (
                (frame_to_instances(frame), metadata),
                transform_fn,
            ) | tft_beam.TransformDataset()
            outputs.append(more_rows)
        _ = transform_fn | tft_beam.WriteTransformFn(transform_graph_dir)
    metadata_io.write_metadata(
        metadata, os.path.join(transform_graph_dir, tft.TFTransformOutput.RAW_METADATA_DIR)
    )
    return outputs


@pytest.fixture(scope="session")
def raw_feature_spec() -> dict:
    """The raw feature spec the tests transform and parse with (RAW_FEATURE_SPEC), a copy."""
    return dict(RAW_FEATURE_SPEC)


@pytest.fixture(scope="session")
def serving_feature_spec() -> dict:
    """The SERVING environment's part of RAW_FEATURE_SPEC (no label), a copy."""
    return dict(SERVING_FEATURE_SPEC)


@pytest.fixture(scope="session")
def to_examples() -> Callable[..., list[bytes]]:
    """`frame_to_examples`, for tests."""
    return frame_to_examples


@pytest.fixture(scope="session")
def transform_frames() -> Callable[..., list[list[dict]]]:
    """`analyze_and_transform`, for tests."""
    return analyze_and_transform


# --------------------------------------------------------------------------------------------
# A trained model
# --------------------------------------------------------------------------------------------

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
