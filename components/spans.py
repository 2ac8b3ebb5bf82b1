"""Spans in a data root: `<data_root>/span-N/` holding CSV files, complete once they hold the
success marker that the uploader writes last (`success_marker` in pipelines/config.py).

One place for what counts as a span and which of its files are data, so that span selection,
`watch` and `add-span` agree.
"""

from __future__ import annotations

from components.features import SPAN_PREFIX
from pipelines import storage
from pipelines.errors import ActionableError


class ExampleGenInputError(ActionableError, ValueError):
    """The input data cannot be turned into examples; the message names the file and the fix."""


# Data files of a span; anything else in its folder (the marker, a README) is not read.
CSV_PATTERNS = ("*.csv", "*.csv.gz")


def span_dirs(data_root: str) -> dict[int, str]:
    """Every `span-N/` folder that holds any file, by N (folder paths end in '/')."""
    return storage.numbered_children(data_root, SPAN_PREFIX)


def complete_spans(data_root: str, marker: str) -> dict[int, str]:
    """The span folders that hold `marker` (all of them when `marker` is "")."""
    spans = span_dirs(data_root)
    if not marker or not spans:
        return spans
    markers = set(storage.list_files(storage.join(data_root, f"{SPAN_PREFIX}*/{marker}")))
    return {span: folder for span, folder in spans.items() if folder + marker in markers}


def span_files(span_dir: str) -> list[storage.FileInfo]:
    """The span's data files (`*.csv`, `*.csv.gz`) with size and time, sorted by path."""
    return sorted(
        info for pattern in CSV_PATTERNS for info in storage.list_file_infos(span_dir + pattern)
    )
