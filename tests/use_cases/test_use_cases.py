"""What every shipped use case must provide, checked for each (components/use_cases/*): a new
use case copied from taxi joins these tests without a line of its own.

Its USE_CASE is complete and consistent with its curated schema; its generator writes spans
that the schema accepts (TFDV, as the ExampleValidator checks) and that carry both labels; its
three functions import; its config defaults and hyperparameters are valid config values. Its
preprocessing and model are exercised end to end by its own tests (tests/use_cases/<name>/).
"""

import json

import pytest
import tensorflow as tf
import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import schema_pb2

from components.base import storage
from components.base import use_case as use_cases
from components.base.config import PipelineConfig
from components.base.image_features import FEATURES as IMAGE_FEATURES
from components.steps import image_input

SHIPPED = use_cases.shipped()
IMAGE_CASES = [n for n in SHIPPED if use_cases.load(n).input_format == use_cases.IMAGE_FOLDERS]
CSV_CASES = [n for n in SHIPPED if n not in IMAGE_CASES]


@pytest.fixture(params=SHIPPED)
def case(request) -> use_cases.UseCase:
    return use_cases.load(request.param)


def _schema(case) -> schema_pb2.Schema:
    return tfdv.load_schema_text(str(case.schema_path))


def test_taxi_and_images_are_shipped_and_names_match_folders():
    assert "taxi" in CSV_CASES and "images" in IMAGE_CASES
    for name in SHIPPED:
        assert use_cases.load(name).name == name


def test_the_use_case_agrees_with_its_schema(case):
    schema = _schema(case)
    columns = {feature.name: feature for feature in schema.feature}
    label = columns[case.label_key]
    assert "SERVING" in label.not_in_environment  # requests carry no label
    assert set(case.slice_keys) <= set(columns) and set(case.sample_columns) <= set(columns)
    if case.input_format == use_cases.IMAGE_FOLDERS:
        assert case.class_names == ()  # from the data: the class folders
        assert {f.name for f in schema.feature} == set(IMAGE_FEATURES)  # what ExampleGen writes
        image_input.image_options(case.input_options)  # known options only
    else:
        assert len(case.class_names) == 2  # tabular use cases: a binary label
    for part in ("preprocessing_fn", "build_model", "generate_span"):
        assert callable(case.function(part))
    if case.prepare_batch:
        assert callable(case.function("prepare_batch"))


def test_its_config_defaults_and_hyperparameters_are_valid(case):
    config = PipelineConfig.load({"use_case": case.name}, environ={})
    for name, value in case.config_defaults.items():
        assert getattr(config, name) == value
    hyperparameters = json.dumps(case.hyperparameters)
    assert PipelineConfig.load({"use_case": case.name, "hyperparameters": hyperparameters},
                               environ={}).hyperparameters == hyperparameters  # fmt: skip


@pytest.mark.parametrize("name", IMAGE_CASES)
def test_its_image_generator_writes_what_its_schema_accepts(name, tmp_path):
    case = use_cases.load(name)
    files = case.function("generate_span")(300, 0, seed=3)
    assert files == case.function("generate_span")(300, 0, seed=3)  # deterministic
    span_dir = f"{tmp_path}/span-0/"
    infos = [storage.FileInfo(span_dir + name, len(data), 0.0) for name, data in files]
    classes = image_input.check_layout(span_dir, infos)  # the layout ExampleGen reads
    assert len(classes) >= 3
    path = tmp_path / "examples.tfrecord"
    bounds = image_input.image_options(case.input_options)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for name, data in files:
            info, why = image_input.inspect_image(data, bounds)
            assert info is not None, f"{name}: {why}"
            label = sorted(classes).index(name.split("/")[0])
            writer.write(image_input.to_example(data, info, label, name.split("/")[0],
                                                span_dir + name).SerializeToString())  # fmt: skip
    schema = _schema(case)
    options = tfdv.StatsOptions(schema=schema)  # as StatisticsGen gets it for images
    statistics = tfdv.generate_statistics_from_tfrecord(str(path), stats_options=options)
    image = next(f for f in statistics.datasets[0].features if f.path.step == ["image"])
    assert image.HasField("bytes_stats")  # bytes, not 300 distinct strings (tfx#1622)
    anomalies = tfdv.validate_statistics(statistics, schema)
    assert dict(anomalies.anomaly_info) == {}


@pytest.mark.parametrize("name", CSV_CASES)
def test_its_generator_writes_what_its_schema_accepts(name, tmp_path):
    case = use_cases.load(name)
    frame = case.function("generate_span")(2000, 0, seed=3)
    assert frame.equals(case.function("generate_span")(2000, 0, seed=3))  # deterministic
    assert set(frame[case.label_key].unique()) == {0, 1}
    schema = _schema(case)
    assert set(frame.columns) == {feature.name for feature in schema.feature}
    path = tmp_path / "part-00000.csv"
    frame.to_csv(path, index=False, na_rep="")  # as pipelines/data.py writes a span
    statistics = tfdv.generate_statistics_from_csv(str(path))
    anomalies = tfdv.validate_statistics(statistics, schema)
    assert dict(anomalies.anomaly_info) == {}
