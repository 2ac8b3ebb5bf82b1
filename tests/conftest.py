"""Shared pytest fixtures."""

import os

# Transform and TFMA need Keras 2 (tf_keras); this must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from collections.abc import Callable  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
import tensorflow_transform.beam as tft_beam  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402
from tensorflow_transform.tf_metadata import (  # noqa: E402
    dataset_metadata,
    metadata_io,
    schema_utils,
)
from tfx.utils import io_utils  # noqa: E402

from components.base.config import REPO_ROOT  # noqa: E402
from components.base.object_store import EmbeddedObjectStore  # noqa: E402
from components.use_cases.taxi import USE_CASE, features, preprocessing  # noqa: E402
from pipelines.pipeline import schema_path  # noqa: E402
from tests.retraining_loop import loop  # noqa: E402, F401  (shared fixtures)
from tests.trained_model import trained, transformed  # noqa: E402, F401  (shared fixtures)

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
# End of the taxi-trip data section.
# --------------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------------
# A real SeaweedFS server on loopback (used by the end-to-end and Kubeflow-spec tests)
# --------------------------------------------------------------------------------------------


class _TestObjectStore(EmbeddedObjectStore):
    _buckets = 0

    def new_bucket(self, prefix: str) -> str:
        """A fresh bucket, so that tests sharing the server never see each other's objects."""
        _TestObjectStore._buckets += 1
        bucket = f"{prefix}-{_TestObjectStore._buckets}"
        self.create_bucket(bucket)
        return bucket


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """SeaweedFS on free loopback ports; its endpoint and made-up credentials in os.environ."""
    store = _TestObjectStore(tmp_path_factory.mktemp("seaweedfs") / "data").start()
    yield store
    store.stop()


@pytest.fixture
def cli_in_background(tmp_path):
    """Starts `python -m pipelines.cli ARGS...` with tmp_path as its work folder; whatever still
    runs at the end of the test is killed, so a failed test leaves no command or store behind."""
    from tests.cli_process import Background

    started: list[Background] = []

    def start(*args: str, **extra_env: str) -> Background:
        started.append(Background(tmp_path, *args, **extra_env))
        return started[-1]

    yield start
    for command in started:
        command.__exit__(None, None, None)
