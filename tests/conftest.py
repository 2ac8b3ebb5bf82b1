"""Shared pytest fixtures."""

import os

# Transform and TFMA need Keras 2 (tf_keras); this must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

from collections.abc import Callable  # noqa: E402

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_transform as tft  # noqa: E402
import tensorflow_transform.beam as tft_beam  # noqa: E402
from tensorflow_transform.tf_metadata import (  # noqa: E402
    dataset_metadata,
    metadata_io,
    schema_utils,
)

from components import features, preprocessing  # noqa: E402
from pipelines.object_store import EmbeddedObjectStore  # noqa: E402

# --------------------------------------------------------------------------------------------
# Raw taxi-trip data as tf.Transform sees it (used by test_preprocessing.py and test_model.py)
# --------------------------------------------------------------------------------------------

# The columns the generator leaves blank; the pipeline decodes them as VarLen features.
VARLEN_KEYS = frozenset({"company", "pickup_community_area"})
assert VARLEN_KEYS <= set(features.RAW_COLUMNS), "features.py renamed a column"


def raw_feature_spec_from(frame: pd.DataFrame) -> dict:
    """The feature spec CsvExampleGen + schema would give for `frame`'s columns."""
    spec = {}
    for key in features.RAW_COLUMNS:
        kind = frame[key].dtype.kind
        dtype = tf.float32 if kind == "f" else tf.int64 if kind in "iu" else tf.string
        spec[key] = (
            tf.io.VarLenFeature(dtype) if key in VARLEN_KEYS else tf.io.FixedLenFeature([], dtype)
        )
    return spec


def frame_to_instances(frame: pd.DataFrame) -> list[dict]:
    """tf.Transform instance dicts: scalars for fixed columns, 0- or 1-item lists for VarLen."""
    instances = []
    for row in frame.to_dict("records"):
        instance = {}
        for key, value in row.items():
            value = None if pd.isna(value) else value.item() if hasattr(value, "item") else value
            instance[key] = ([] if value is None else [value]) if key in VARLEN_KEYS else value
        instances.append(instance)
    return instances


def frame_to_examples(frame: pd.DataFrame, with_label: bool = True) -> list[bytes]:
    """Serialized raw tf.Examples as CsvExampleGen writes them: a missing value is no feature."""
    serialized = []
    for row in frame.to_dict("records"):
        feature = {}
        for key, value in row.items():
            if pd.isna(value) or (key == features.LABEL_KEY and not with_label):
                continue
            if isinstance(value, str):
                feature[key] = tf.train.Feature(
                    bytes_list=tf.train.BytesList(value=[value.encode()])
                )
            elif isinstance(value, float):
                feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
            else:
                feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        example = tf.train.Example(features=tf.train.Features(feature=feature))
        serialized.append(example.SerializeToString())
    return serialized


def analyze_and_transform(
    frames: list[pd.DataFrame], transform_graph_dir: str, temp_dir: str
) -> list[list[dict]]:
    """Runs `preprocessing_fn` on Beam as the Transform component does.

    Analyzes `frames[0]`, transforms every frame and writes the transform graph (transform_fn,
    transformed_metadata and the raw metadata) to `transform_graph_dir`. Returns the transformed
    rows of each frame.
    """
    spec = raw_feature_spec_from(frames[0])
    metadata = dataset_metadata.DatasetMetadata(schema_utils.schema_from_feature_spec(spec))
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
