"""What the run's data looked like, for the run report: examples per split and, per feature and
split, a line a person reads (a number's range, a category's counts, bytes' sizes), from
StatisticsGen's statistics (nothing is read again). An image use case's rows show its class
counts (the label name's values) and its image sizes (height, width, bytes per image).
"""

from __future__ import annotations

from typing import Any

from tensorflow_metadata.proto.v0 import statistics_pb2
from tfx.types import artifact_utils

from components.base import storage
from components.steps.step_outputs import STATISTICS_FILE, read_statistics

SHOWN_VALUES = 8  # a category with more values shows its most common ones and how many there are
_KB = 1024


def _common(feature: statistics_pb2.FeatureNameStatistics) -> statistics_pb2.CommonStatistics:
    for kind in ("num_stats", "string_stats", "bytes_stats", "struct_stats"):
        if feature.HasField(kind):
            return getattr(feature, kind).common_stats
    return statistics_pb2.CommonStatistics()


def _missing(common: statistics_pb2.CommonStatistics) -> str:
    return f"; {common.num_missing:,} missing" if common.num_missing else ""


def _number(value: float) -> str:
    """Whole numbers in full (a timestamp reads 1,704,067,200, not 1.70407e+09)."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:.4g}"


def describe(feature: statistics_pb2.FeatureNameStatistics) -> str:
    """One feature of one split, in a line."""
    if feature.HasField("num_stats"):
        s = feature.num_stats
        text = f"{_number(s.min)} to {_number(s.max)}, mean {s.mean:.4g}"
    elif feature.HasField("string_stats"):
        s = feature.string_stats
        # " · " between values: a comma would run into a count's thousands separator.
        counts = " · ".join(f"{v.value} {v.frequency:,.0f}" for v in s.top_values[:SHOWN_VALUES])
        text = counts if s.unique <= SHOWN_VALUES else f"{s.unique:,} values; most: {counts}"
        if not s.top_values or s.top_values[0].frequency <= 1:  # free text, paths
            text = f"{s.unique:,} values" + (", each once" if s.top_values else "")
    elif feature.HasField("bytes_stats"):
        s = feature.bytes_stats
        text = (f"{s.avg_num_bytes / _KB:.1f} KB on average ({s.min_num_bytes / _KB:.1f} to "
                f"{s.max_num_bytes / _KB:.1f} KB)")  # fmt: skip
    else:  # a struct: its values are features of their own
        return "-" + _missing(_common(feature))
    return text + _missing(_common(feature))


def summarize(statistics) -> dict[str, Any]:
    """{"splits": {split: examples}, "features": [[name, line per split, ...], ...]}; a split
    without statistics is left out (the report says what there is rather than fail the run)."""
    by_split = {}
    for split in artifact_utils.decode_split_names(statistics.split_names):
        try:
            # What TFX's stats_artifact_utils.load_statistics reads, without importing TFDV.
            path = storage.join(artifact_utils.get_split_uri([statistics], split), STATISTICS_FILE)
            datasets = read_statistics(path).datasets
        except Exception:  # noqa: BLE001 - a missing or unreadable file: nothing to show
            continue
        if datasets:
            by_split[split] = datasets[0]
    splits = list(by_split)
    names = sorted({".".join(f.path.step) for d in by_split.values() for f in d.features})
    rows = []
    for name in names:
        row = [name]
        for split in splits:
            found = [f for f in by_split[split].features if ".".join(f.path.step) == name]
            row.append(describe(found[0]) if found else "-")
        rows.append(row)
    return {"splits": {s: int(d.num_examples) for s, d in by_split.items()}, "features": rows}
