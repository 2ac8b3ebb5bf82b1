"""preprocessing_fn run through tf.Transform's real Beam implementation on generated trips."""

import datetime
import io

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_transform as tft
from tensorflow_transform.tf_metadata import schema_utils
from tfx.components.transform import executor as transform_executor
from tfx.proto import example_gen_pb2
from tfx.types import standard_artifacts
from tfx.utils import io_utils

from components.base.config import PipelineConfig
from components.steps.schema import CuratedSchemaExecutor
from components.use_cases.taxi import data as taxi_data
from components.use_cases.taxi import features, preprocessing

xf = features.transformed_name
NUM_ROWS = 200


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return taxi_data.generate_span(NUM_ROWS, span=0)


@pytest.fixture(scope="module")
def transformed(frame, transform_frames, tmp_path_factory):
    """(transformed rows as a dict of numpy columns, transform graph dir)."""
    tmp = tmp_path_factory.mktemp("transform")
    graph_dir = str(tmp / "transform_graph")
    (rows,) = transform_frames([frame], graph_dir, temp_dir=str(tmp / "tmp"))
    assert len(rows) == NUM_ROWS
    return {key: np.array([row[key] for row in rows]) for key in rows[0]}, graph_dir


@pytest.mark.parametrize(
    "tensor",
    [
        tf.constant([3, 0, 5], tf.int64),  # FixedLenFeature([])
        tf.constant([[3], [0], [5]], tf.int64),  # FixedLenFeature([1]), as the curated schema has
        tf.SparseTensor([[0, 0], [2, 0]], tf.constant([3, 5], tf.int64), [3, 1]),  # VarLen
        tf.RaggedTensor.from_row_lengths(tf.constant([3, 5], tf.int64), [1, 0, 1]),
    ],
    ids=["dense", "dense_1", "sparse", "ragged"],
)
def test_to_dense_fills_missing_rows(tensor):
    np.testing.assert_array_equal(preprocessing.to_dense(tensor, 0).numpy(), [3, 0, 5])


def test_outputs_are_exactly_the_model_features_and_label(transformed):
    columns, transform_dir = transformed
    expected = set(preprocessing.NUMERIC_FEATURES) | set(preprocessing.CATEGORICAL_FEATURES)
    assert set(columns) == expected | {features.LABEL_KEY}
    # The Trainer reads the transformed schema: every feature is a dense scalar per example.
    spec = tft.TFTransformOutput(transform_dir).transformed_feature_spec()
    for key in preprocessing.NUMERIC_FEATURES:
        assert spec[key] == tf.io.FixedLenFeature([], tf.float32), key
    for key in [*preprocessing.CATEGORICAL_FEATURES, features.LABEL_KEY]:
        assert spec[key] == tf.io.FixedLenFeature([], tf.int64), key


@pytest.mark.parametrize("key", features.NUMERIC_FEATURE_KEYS)
def test_numeric_features_are_z_scored(transformed, frame, key):
    values = transformed[0][xf(key)]
    assert abs(values.mean()) < 1e-4
    assert values.std() == pytest.approx(1.0, abs=1e-3)
    # Scaling is monotone: the order of the raw values is kept.
    np.testing.assert_array_equal(
        np.argsort(values, kind="stable"), np.argsort(frame[key].to_numpy(), kind="stable")
    )


def test_trip_miles_quantile_buckets(transformed, frame):
    buckets = transformed[0][xf(preprocessing.BUCKET_KEY)]
    assert buckets.min() == 0 and buckets.max() == features.NUM_BUCKETS - 1
    # Quantile buckets hold roughly equal shares and grow with the distance.
    assert np.bincount(buckets).max() < 2 * NUM_ROWS / features.NUM_BUCKETS
    miles = frame[features.BUCKET_FEATURE_KEY].to_numpy()
    assert all(np.diff([miles[buckets == b].mean() for b in range(features.NUM_BUCKETS)]) > 0)


def test_vocabularies(transformed, frame):
    columns, transform_dir = transformed
    output = tft.TFTransformOutput(transform_dir)
    for key in features.CATEGORICAL_STRING_KEYS:
        ids = columns[xf(key)]
        assert ids.min() >= 0 and ids.max() < features.VOCAB_SIZE + features.OOV_SIZE
        # The asset is findable by name and ordered by frequency.
        vocab = [t.decode() for t in output.vocabulary_by_name(preprocessing.vocab_filename(key))]
        counts = frame[key].value_counts()
        assert set(vocab) == set(counts.index)
        assert all(np.diff(counts[vocab].to_numpy()) <= 0), "not ordered by frequency"
        known = frame[key].notna().to_numpy()
        np.testing.assert_array_equal(ids[known], [vocab.index(v) for v in frame[key][known]])
    payment_ids = columns[xf("payment_type")]
    top_payment = frame["payment_type"].value_counts().index[0]
    assert set(payment_ids[(frame["payment_type"] == top_payment).to_numpy()]) == {0}


def test_missing_company_goes_to_oov_and_missing_area_to_zero(transformed, frame):
    columns, _ = transformed
    missing_company = frame["company"].isna().to_numpy()
    assert missing_company.any()
    num_companies = frame["company"].nunique()  # OOV ids start after the real vocabulary
    assert set(columns[xf("company")][missing_company]) == {num_companies}

    area = columns[xf("pickup_community_area")]
    missing_area = frame["pickup_community_area"].isna().to_numpy()
    assert missing_area.any()
    assert set(area[missing_area]) == {0}
    np.testing.assert_array_equal(
        area[~missing_area], frame["pickup_community_area"][~missing_area].astype(int)
    )
    assert area.max() < features.COMMUNITY_AREAS


def test_hour_and_day_match_python_datetime(transformed, frame):
    columns, _ = transformed
    for i in range(0, NUM_ROWS, 17):
        when = datetime.datetime.fromtimestamp(
            int(frame[features.TIMESTAMP_KEY][i]), tz=datetime.timezone.utc
        )
        assert columns[xf(preprocessing.HOUR_KEY)][i] == when.hour
        assert columns[xf(preprocessing.DAY_KEY)][i] == when.weekday()
    assert set(columns[xf(preprocessing.DAY_KEY)]) == set(range(features.DAYS))


def test_label_passes_through_unchanged(transformed, frame):
    labels = transformed[0][features.LABEL_KEY]
    np.testing.assert_array_equal(labels, frame[features.LABEL_KEY].to_numpy())


def test_transform_layer_on_label_less_examples_matches_beam(transformed, frame, to_examples):
    """Serving applies the same graph to serialized examples without a label: same features."""
    columns, transform_dir = transformed
    output = tft.TFTransformOutput(transform_dir)
    spec = output.raw_feature_spec()
    spec.pop(features.LABEL_KEY)
    raw = tf.io.parse_example(tf.constant(to_examples(frame, with_label=False)), spec)
    served = output.transform_features_layer()(raw)
    assert features.LABEL_KEY not in served
    for key, values in served.items():
        np.testing.assert_allclose(values.numpy(), columns[key], rtol=1e-5, err_msg=key)


@pytest.fixture(scope="module")
def pipeline_raw_feature_spec(tmp_path_factory) -> dict:
    """The raw feature spec the pipeline's Transform step decodes with, from the pipeline itself.

    Runs the pipeline's CuratedSchema step into a Schema artifact, takes the file from it as
    Transform's Executor.Do does and reads it with the TransformProcessor's own _ReadMetadata.
    """
    from pipelines.pipeline import create_pipeline  # heavy (TFMA, Kubeflow); only this test

    (node,) = [
        c
        for c in create_pipeline(PipelineConfig.load(environ={})).components
        if c.id == "CuratedSchema"
    ]
    schema = standard_artifacts.Schema()
    schema.uri = str(tmp_path_factory.mktemp("curated_schema"))
    CuratedSchemaExecutor().Do({}, {"schema": [schema]}, dict(node.exec_properties))
    metadata = transform_executor.TransformProcessor()._ReadMetadata(
        example_gen_pb2.PayloadFormat.FORMAT_TF_EXAMPLE, io_utils.get_only_uri_in_dir(schema.uri)
    )
    return schema_utils.schema_as_feature_spec(metadata.schema).feature_spec


def test_tests_use_the_pipelines_raw_feature_spec(
    pipeline_raw_feature_spec, raw_feature_spec, serving_feature_spec, transformed
):
    assert raw_feature_spec == pipeline_raw_feature_spec
    # The transform graph the tests build records the same raw spec as the pipeline's does, so
    # the exported serving signature parses requests exactly as in production.
    _, transform_dir = transformed
    assert tft.TFTransformOutput(transform_dir).raw_feature_spec() == pipeline_raw_feature_spec
    # The schema's SERVING environment drops exactly what the serving signature drops: the label.
    assert serving_feature_spec == {
        k: v for k, v in pipeline_raw_feature_spec.items() if k != features.LABEL_KEY
    }


def test_examples_take_the_schema_types_not_the_pandas_dtypes(
    transformed, frame, to_examples, raw_feature_spec
):
    """The CSV as pandas reads it back: a missing area makes the column float, and whole-dollar
    fares would be ints. The examples still hold INT areas and FLOAT fares, as the schema says."""
    columns, transform_dir = transformed
    buffer = io.StringIO()
    frame.to_csv(buffer, index=False, na_rep="")  # as data.write_span writes a span
    csv_frame = pd.read_csv(io.StringIO(buffer.getvalue()))
    assert csv_frame["pickup_community_area"].dtype.kind == "f"
    raw = tf.io.parse_example(tf.constant(to_examples(csv_frame)), raw_feature_spec)
    served = tft.TFTransformOutput(transform_dir).transform_features_layer()(raw)
    for key, values in served.items():
        np.testing.assert_allclose(values.numpy(), columns[key], rtol=1e-5, err_msg=key)

    whole = csv_frame.assign(fare=csv_frame["fare"].round().astype("int64"))
    fare_spec = {"fare": raw_feature_spec["fare"]}
    parsed = tf.io.parse_example(tf.constant(to_examples(whole)), fare_spec)["fare"]
    assert parsed.dtype == tf.float32
    np.testing.assert_array_equal(parsed.numpy()[:, 0], whole["fare"].to_numpy(np.float32))
