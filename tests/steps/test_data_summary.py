"""The run report's Data table from real TFDV statistics: each feature's line per split, and a
split whose statistics are missing left out instead of failing the report."""

from __future__ import annotations

import pandas as pd
import tensorflow_data_validation as tfdv
from tfx.types import standard_artifacts

from components.steps import data_summary


def test_lines_per_feature_and_a_split_without_statistics_left_out(tmp_path):
    frame = pd.DataFrame({
        "trip_start": [1704067200, 1704070800, 1704074400],  # a timestamp, in full
        "fare": [2.5, 10.25, 7.0],
        "shape": ["circle", "circle", "square"],
    })  # fmt: skip
    frame = pd.concat([frame] * 500, ignore_index=True)  # counts in the thousands
    statistics = tfdv.generate_statistics_from_dataframe(frame)
    (tmp_path / "Split-eval").mkdir()
    (tmp_path / "Split-eval" / "FeatureStats.pb").write_bytes(statistics.SerializeToString())
    artifact = standard_artifacts.ExampleStatistics()
    artifact.uri = str(tmp_path)
    artifact.split_names = '["train", "eval"]'  # no train statistics were written

    summary = data_summary.summarize(artifact)

    assert summary["splits"] == {"eval": 1500}
    assert summary["features"] == [
        ["fare", "2.5 to 10.25, mean 6.583"],
        ["shape", "circle 1,000 · square 500"],
        ["trip_start", "1,704,067,200 to 1,704,074,400, mean 1.704e+09"],
    ]
