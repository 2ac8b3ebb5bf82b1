"""What every shipped use case must provide, checked for each (components/use_cases/*): a new
use case copied from taxi joins these tests without a line of its own.

Its USE_CASE is complete and consistent with its curated schema; its generator writes spans
that the schema accepts (TFDV, as the ExampleValidator checks) and that carry both labels; its
three functions import; its config defaults and hyperparameters are valid config values. Its
preprocessing and model are exercised end to end by its own tests (tests/use_cases/<name>/).
"""

import json

import pytest
import tensorflow_data_validation as tfdv
from tensorflow_metadata.proto.v0 import schema_pb2

from components.base import use_case as use_cases
from components.base.config import PipelineConfig

SHIPPED = use_cases.shipped()


@pytest.fixture(params=SHIPPED)
def case(request) -> use_cases.UseCase:
    return use_cases.load(request.param)


def _schema(case) -> schema_pb2.Schema:
    return tfdv.load_schema_text(str(case.schema_path))


def test_taxi_is_shipped_and_names_match_folders():
    assert "taxi" in SHIPPED
    for name in SHIPPED:
        assert use_cases.load(name).name == name


def test_the_use_case_agrees_with_its_schema(case):
    schema = _schema(case)
    columns = {feature.name: feature for feature in schema.feature}
    label = columns[case.label_key]
    assert "SERVING" in label.not_in_environment  # requests carry no label
    assert set(case.slice_keys) <= set(columns) and set(case.sample_columns) <= set(columns)
    assert len(case.class_names) == 2  # the gate reads binary AUC and accuracy
    for part in ("preprocessing_fn", "build_model", "generate_span"):
        assert callable(case.function(part))


def test_its_config_defaults_and_hyperparameters_are_valid(case):
    config = PipelineConfig.load({"use_case": case.name}, environ={})
    for name, value in case.config_defaults.items():
        assert getattr(config, name) == value
    hyperparameters = json.dumps(case.hyperparameters)
    assert PipelineConfig.load({"use_case": case.name, "hyperparameters": hyperparameters},
                               environ={}).hyperparameters == hyperparameters  # fmt: skip


def test_its_generator_writes_what_its_schema_accepts(case, tmp_path):
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
