"""The span data generator: deterministic, learnable, drifting, written as immutable spans."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score

from components.base import storage
from components.use_cases.taxi import data as taxi_data
from components.use_cases.taxi import features
from pipelines import data


def test_same_arguments_give_identical_data_and_spans_differ():
    first = taxi_data.generate_span(1000, span=0)
    assert first.equals(taxi_data.generate_span(1000, span=0))
    assert not first.equals(taxi_data.generate_span(1000, span=1))
    assert list(first.columns) == features.RAW_COLUMNS


def test_label_has_signal_a_simple_model_can_learn():
    frame = taxi_data.generate_span(6000, span=0)
    x = np.column_stack(
        [
            frame["payment_type"] == "Credit Card",
            frame["payment_type"] == "Cash",
            np.log1p(frame["trip_miles"]),
        ]
    ).astype(float)
    y = frame[features.LABEL_KEY].to_numpy()
    model = LogisticRegression().fit(x[:4000], y[:4000])
    auc = roc_auc_score(y[4000:], model.predict_proba(x[4000:])[:, 1])
    assert 0.75 < auc < 0.99  # learnable, not trivial
    assert 0.3 < y.mean() < 0.7


def test_missing_values_and_drift():
    base = taxi_data.generate_span(5000, span=5, drift=0.0)
    drifted = taxi_data.generate_span(5000, span=5, drift=1.0)
    assert 0.01 < base["company"].isna().mean() < 0.06
    assert 0.02 < base["pickup_community_area"].isna().mean() < 0.08
    assert drifted["trip_miles"].mean() > 1.3 * base["trip_miles"].mean()
    mobile = (drifted["payment_type"] == "Mobile").mean()
    assert mobile > (base["payment_type"] == "Mobile").mean() + 0.1


def test_drift_shifts_every_span_number_by_the_same_amount():
    """A strength means one shift from the undrifted population, whatever the span's number."""
    shifts = []
    for span in (0, 1, 9):
        base = taxi_data.generate_span(4000, span=span)
        drifted = taxi_data.generate_span(4000, span=span, drift=data.DEFAULT_DRIFT)
        mobile = (drifted["payment_type"] == "Mobile").mean()
        shifts.append(
            (
                drifted["trip_miles"].mean() / base["trip_miles"].mean(),
                mobile - (base["payment_type"] == "Mobile").mean(),
            )
        )
    for miles_ratio, mobile_gain in shifts:
        assert miles_ratio == pytest.approx(shifts[0][0], rel=0.05)
        assert mobile_gain == pytest.approx(shifts[0][1], abs=0.03)
        assert miles_ratio > 2 and mobile_gain > 0.15  # what the drift check must catch
    assert taxi_data.generate_span(500, span=3, drift=0.0).equals(
        taxi_data.generate_span(500, span=3)
    )
    with pytest.raises(ValueError, match="drift must be >= 0"):
        taxi_data.generate_span(10, span=0, drift=-0.5)


def test_spans_are_written_in_order_split_into_files_and_never_overwritten(tmp_path):
    root = str(tmp_path / "trips")
    assert data.add_next_span(root, 250, seed=1) == 0
    paths = data.write_span(root, 1, 250, rows_per_file=100)
    assert [p.rsplit("/", 1)[1] for p in paths] == [
        "part-00000.csv",
        "part-00001.csv",
        "part-00002.csv",
    ]
    assert data.existing_spans(root) == [0, 1]
    assert data.add_next_span(root, 10) == 2
    lines = storage.read_bytes(paths[2]).decode().splitlines()
    assert lines[0] == ",".join(features.RAW_COLUMNS)
    assert len(lines) == 1 + 50
    with pytest.raises(FileExistsError, match="span-1"):
        data.write_span(root, 1, 10)


def test_zero_rows_is_refused():
    with pytest.raises(ValueError, match="num_rows"):
        taxi_data.generate_span(0, span=0)
