"""`tkp schema propose` (pipelines/schema_proposal.py) on real spans in a local data root, with real
TFDV: what the user reads, what lands in the schema file, and what the validator then says.

- A new use case (no schema file): the schema inferred from a gzip-compressed span with a UTF-8
  byte-order mark and a quoted comma is written; it names the columns as ExampleGen reads them,
  keeps the label out of SERVING, and validates the span with no anomalies.
- The curated taxi schema (a copy) and a span with a new payment type and a trip far above the
  curated maximum: the curated schema finds both anomalies, the printed diff names both, --write
  writes a schema that keeps the curated comparators and finds none; a second run has nothing to
  change.
- A required column with empty cells becomes optional (value_count 0..1, no shape), which
  Transform then reads as a VarLen feature; a column ExampleGen now types differently is
  retyped. Both warn that the next run may not be compared with the served model.
- Unseen values that min_domain_mass tolerates, and a column the span lacks, are reported but
  change nothing.
- A span that does not exist, is incomplete or holds no CSV file: SpanSelection's own error.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf
import tensorflow_data_validation as tfdv
from tensorflow_transform.tf_metadata import schema_utils

from components.base.config import PipelineConfig
from components.base.errors import ActionableError
from components.base.use_case import UseCase, load
from pipelines.schema_proposal import Statistics, propose, span_files, span_statistics


def _config(root: Path) -> PipelineConfig:
    return PipelineConfig.load({"data_root": str(root)}, environ={})


def _write_span(root: Path, span: int, frame: pd.DataFrame, complete: bool = True, **csv) -> None:
    folder = root / f"span-{span}"
    folder.mkdir(parents=True)
    name = "part-00000.csv.gz" if csv.get("compression") == "gzip" else "part-00000.csv"
    frame.to_csv(folder / name, index=False, **csv)
    if complete:
        (folder / "_SUCCESS").touch()


def _trips(rows: int, seed: int = 0) -> pd.DataFrame:
    """Taxi-shaped rows within the curated schema; empty cells in the two optional columns."""
    rng = np.random.default_rng(seed)
    miles = np.round(rng.uniform(0.2, 30.0, rows), 2)
    return pd.DataFrame(
        {
            "trip_start_timestamp": 1_704_067_200 + rng.integers(0, 7 * 86_400, rows),
            "trip_miles": miles,
            "trip_seconds": (miles * 200 + 60).astype(int),
            "fare": np.round(3.25 + 2.25 * miles, 2),
            "payment_type": rng.choice(["Cash", "Credit Card", "Mobile"], rows),
            "company": rng.choice(["Company A", "Company B", ""], rows),
            "pickup_community_area": rng.choice(["1", "8", "77", ""], rows),
            "big_tipper": rng.integers(0, 2, rows),
        }
    )


def _statistics(root: Path, span: int) -> Statistics:
    """The span's statistics as StatisticsGen computes them from ExampleGen's examples."""
    return span_statistics(span_files(_config(root), span)[1])


def _anomalies(statistics: Statistics, schema_path: Path) -> dict[str, str]:
    """What the ExampleValidator finds with that schema file: column -> problem."""
    schema = tfdv.load_schema_text(str(schema_path))
    found = tfdv.validate_statistics(statistics, schema).anomaly_info
    return {name: info.description for name, info in found.items()}


@pytest.fixture
def taxi(tmp_path) -> UseCase:
    """The taxi use case with a copy of its curated schema, free to be overwritten."""
    copy = tmp_path / "schemas" / "taxi" / "schema.pbtxt"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(load("taxi").schema_path, copy)
    return dataclasses.replace(load("taxi"), schema_path=copy)


def test_new_use_case_gets_the_inferred_schema(tmp_path):
    frame = pd.DataFrame(
        {
            "age": [23, 35, 41, 52, 29, 33] * 10,
            "height": [1.71, 1.80, 1.65, 1.77, 1.69, 1.90] * 10,
            "colour": ["red, dark", "green", "blue", "green", "red, dark", "blue"] * 10,
            "label": [0, 1, 1, 0, 1, 0] * 10,
        }
    )
    # What uploads look like: gzip-compressed, with a byte-order mark, a value holding a comma.
    _write_span(tmp_path / "data", 0, frame, encoding="utf-8-sig", compression="gzip")
    path = tmp_path / "schemas" / "toy" / "schema.pbtxt"
    toy = UseCase(name="toy", label_key="label", class_names=("no", "yes"), slice_keys=(),
                  sample_columns=(), schema_path=path, preprocessing_fn="toy.preprocessing_fn",
                  build_model="toy.build_model", generate_span="toy.generate_span")  # fmt: skip
    printed: list[str] = []

    code = propose(_config(tmp_path / "data"), 0, write=True, out=printed.append, use_case=toy)

    assert code == 0, printed
    assert printed[0] == f"span 0 of {tmp_path / 'data'}: 60 rows"
    assert printed[1] == f"no schema for use case 'toy' yet ({path}); inferred from the data:"
    assert "  age: INT, in every row, shape [1]" in printed
    assert "  height: FLOAT, in every row, shape [1]" in printed
    assert (
        "  colour: BYTES, in every row, shape [1], domain 'blue', 'green', 'red, dark'" in printed
    )
    assert (
        "  label: INT, in every row, shape [1], 0 or 1, not in the SERVING environment" in printed
    )
    assert printed[-1].startswith(f"wrote {path}: review it and commit it")
    schema = tfdv.load_schema_text(str(path))
    assert [f.name for f in schema.feature] == ["age", "colour", "height", "label"]  # no BOM
    assert list(schema.default_environment) == ["TRAINING", "SERVING"]
    assert _anomalies(_statistics(tmp_path / "data", 0), path) == {}


def test_curated_schema_widened_by_a_span(tmp_path, taxi):
    root, curated = tmp_path / "data", taxi.schema_path.read_text()
    frame = _trips(300)
    frame.loc[10, "payment_type"], frame.loc[11, "trip_miles"] = "Dispute", 1710.5
    _write_span(root, 1, frame)
    statistics = _statistics(root, 1)
    before = _anomalies(statistics, taxi.schema_path)
    assert set(before) == {"payment_type", "trip_miles"}, before
    assert "Dispute" in before["payment_type"] and "1710.5>500" in before["trip_miles"]
    printed: list[str] = []

    assert propose(_config(root), 1, out=printed.append, use_case=taxi) == 0
    assert printed == [
        f"span 1 of {root}: 300 rows",
        f"changes to {taxi.schema_path}:",
        "  trip_miles: max 500.0 -> 1710.5 (range widened)",
        "  payment_type: domain gains 'Dispute'",
        f"rerun with --write to write it to {taxi.schema_path}",
    ]
    assert taxi.schema_path.read_text() == curated  # without --write nothing is written

    printed.clear()
    assert propose(_config(root), 1, write=True, out=printed.append, use_case=taxi) == 0
    assert printed[-1].startswith(f"wrote {taxi.schema_path}: review it and commit it")
    assert _anomalies(statistics, taxi.schema_path) == {}
    written = tfdv.load_schema_text(str(taxi.schema_path))
    features = {f.name: f for f in written.feature}
    assert features["trip_miles"].float_domain.max == 1710.5
    assert features["trip_miles"].drift_comparator.jensen_shannon_divergence.threshold == 0.13
    assert features["payment_type"].drift_comparator.infinity_norm.threshold == 0.12
    assert not features["company"].HasField("domain")  # curated as open: stays open
    assert list(features["big_tipper"].not_in_environment) == ["SERVING"]
    assert list(written.string_domain[0].value)[-1] == "Dispute"
    head = curated.split("\nfeature {")[0].split("default_environment")[0]
    assert taxi.schema_path.read_text().startswith(head)  # the file's documentation stays

    printed.clear()
    assert propose(_config(root), 1, write=True, out=printed.append, use_case=taxi) == 0
    assert printed[1:] == [f"{taxi.schema_path}: nothing to change"]


def test_a_required_column_with_empty_cells_becomes_optional(tmp_path, taxi):
    """The presence relaxation: `fare` is required (shape [1]); a span with empty fare cells is
    refused until the proposal makes it optional, which the written schema says as Transform
    reads it (a VarLen feature, no shape)."""
    root = tmp_path / "data"
    frame = _trips(300)
    frame.loc[::50, "fare"] = np.nan  # 6 of 300 rows: an empty cell in the CSV
    _write_span(root, 3, frame)
    statistics = _statistics(root, 3)
    assert set(_anomalies(statistics, taxi.schema_path)) == {"fare"}
    printed: list[str] = []

    assert propose(_config(root), 3, write=True, out=printed.append, use_case=taxi) == 0

    assert printed[1:4] == [
        f"changes to {taxi.schema_path}:",
        "  fare: shape [1] -> value_count 0..1 (now optional: 6 of 300 rows have no value)",
        "  fare: models trained before require it; a run whose eval rows lack it cannot compare "
        "its model with the served one and judges it on the thresholds alone",
    ]
    assert _anomalies(statistics, taxi.schema_path) == {}
    written = tfdv.load_schema_text(str(taxi.schema_path))
    fare = next(f for f in written.feature if f.name == "fare")
    assert not fare.HasField("shape")
    assert fare.float_domain.max == 5000.0  # the rest stays
    assert fare.drift_comparator.jensen_shannon_divergence.threshold == 0.13
    spec = schema_utils.schema_as_feature_spec(written).feature_spec
    assert isinstance(spec["fare"], tf.io.VarLenFeature)  # optional where Transform reads it
    assert isinstance(spec["trip_miles"], tf.io.FixedLenFeature)


def test_a_retyped_column_is_named_with_what_it_means_for_the_next_run(tmp_path, taxi):
    root = tmp_path / "data"
    frame = _trips(300)
    frame["trip_seconds"] = frame["trip_seconds"] + 0.5  # ExampleGen now infers FLOAT
    _write_span(root, 4, frame)
    printed: list[str] = []

    assert propose(_config(root), 4, out=printed.append, use_case=taxi) == 0

    changes = [line for line in printed if line.startswith("  trip_seconds: ")]
    assert changes[0].startswith("  trip_seconds: type INT -> FLOAT"), printed
    assert ("  trip_seconds: models trained before read it as another type; the next run cannot "
            "compare its model with the served one and judges it on the thresholds alone"
            ) in printed  # fmt: skip


def test_tolerated_values_and_lacking_columns_change_nothing(tmp_path, taxi):
    curated = taxi.schema_path.read_text().replace(
        "drift_comparator { infinity_norm { threshold: 0.12 } }",
        "drift_comparator { infinity_norm { threshold: 0.12 } }\n"
        "  distribution_constraints { min_domain_mass: 0.99 }",
    )
    taxi.schema_path.write_text(curated)
    frame = _trips(300).drop(columns=["company"])
    frame.loc[10, "payment_type"] = "Dispute"  # 1 of 300 values: 0.33 %, under 1 % tolerated
    _write_span(tmp_path / "data", 2, frame)
    printed: list[str] = []

    code = propose(_config(tmp_path / "data"), 2, write=True, out=printed.append, use_case=taxi)

    assert code == 1  # the lacking column is left to a person
    assert printed[1:] == [
        f"{taxi.schema_path}: nothing to change",
        "  payment_type: 'Dispute' tolerated (min_domain_mass 0.99: 0.33% of the values are "
        "outside the domain)",
        "  company: not in span 2, kept: drop it from the schema if that is meant to be, else "
        "fix the upload",
    ]
    assert taxi.schema_path.read_text() == curated


def test_a_span_that_is_missing_or_incomplete_is_named(tmp_path, taxi):
    root = tmp_path / "data"
    _write_span(root, 0, _trips(20))
    _write_span(root, 1, _trips(20), complete=False)

    # The errors are SpanSelection's own (components/base/spans.py select): one rule for both.
    with pytest.raises(ActionableError, match=r"span 7 requested but .* has spans \[0, 1\]"):
        propose(_config(root), 7, use_case=taxi)
    with pytest.raises(ActionableError, match=r"span 1 under .* is not complete: .*'_SUCCESS'"):
        propose(_config(root), 1, use_case=taxi)
    (root / "span-2").mkdir()
    (root / "span-2" / "README").write_text("no data here")
    (root / "span-2" / "_SUCCESS").write_text("")
    with pytest.raises(ActionableError, match=r"span-2/ holds no .csv or .csv.gz files"):
        propose(_config(root), 2, use_case=taxi)
