"""Spans in a data root: `<data_root>/span-N/` holding CSV files, or images in one folder per
class (`span-N/<class>/<name>.jpg`), complete once they hold the success marker that the
uploader writes last (`success_marker` in components/base/config.py).

One place for what counts as a span and which of its files are data, so that span selection,
`watch` and `add-span` agree.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from components.base import storage
from components.base.errors import ActionableError
from components.base.use_case import CSV, IMAGE_FOLDERS, INPUT_FORMATS  # noqa: F401 (re-exported)


class ExampleGenInputError(ActionableError, ValueError):
    """The input data cannot be turned into examples; the message names the file and the fix."""


LATEST_SPAN = -1  # the span parameter's "newest complete span"

# How a use case's spans hold their data (UseCase.input_format):
# - CSV: `*.csv` and `*.csv.gz` files in the span's folder; anything else there (the marker, a
#   README) is not read;
# - IMAGE_FOLDERS: every file in the span's sub-folders (`<class>/<name>.jpg`, the layout of
#   Keras' image_dataset_from_directory) and every image at its top level; components/steps/
#   image_input.py says which of them break the layout. Hidden names (`.DS_Store`) are skipped.
CSV_PATTERNS = ("*.csv", "*.csv.gz")
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")  # in any case: cameras write .JPG

# Layout of a data root: span N of the data lives in `<data_root>/span-N/`.
SPAN_PREFIX = "span-"


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


def span_files(span_dir: str, input_format: str = CSV) -> list[storage.FileInfo]:
    """The span's data files with size and time, sorted by path (see INPUT_FORMATS)."""
    if input_format == CSV:
        return sorted(
            info for pattern in CSV_PATTERNS for info in storage.list_file_infos(span_dir + pattern)
        )
    if input_format != IMAGE_FOLDERS:
        raise ValueError(f"input_format must be one of {INPUT_FORMATS}, got {input_format!r}")
    found = []
    for info in storage.list_file_infos(span_dir + "**"):
        parts = info.path[len(span_dir) :].split("/")
        if any(part.startswith(".") for part in parts):
            continue
        if len(parts) > 1 or parts[0].lower().endswith(IMAGE_SUFFIXES):
            found.append(info)
    return found


def describe_files(input_format: str) -> str:
    """What a span of `input_format` holds, for messages."""
    if input_format == IMAGE_FOLDERS:
        return "images in one sub-folder per class (<class>/<name>.jpg, .jpeg or .png)"
    return ".csv or .csv.gz files"


def select(
    data_root: str, span: int, window_spans: int, marker: str, input_format: str = CSV
) -> dict[str, Any]:
    """{"span": newest, "spans": {N: {"files": [...], "fingerprint": ...}}, "fingerprint": ...};
    ExampleGenInputError naming the data root, the spans and the fix when there is nothing to
    read."""
    folders = span_dirs(data_root)
    if not folders:
        raise ExampleGenInputError(
            f"no {SPAN_PREFIX}N/ folders under {data_root}: write data there first "
            "(`make add-span` generates the next span)."
        )
    complete = complete_spans(data_root, marker)
    chosen = max(complete, default=None) if span == LATEST_SPAN else span
    if chosen is None or chosen not in complete:
        what = f"no span under {data_root} is" if span == LATEST_SPAN else (
            f"span {span} under {data_root} is not")  # fmt: skip
        if span != LATEST_SPAN and span not in folders:
            raise ExampleGenInputError(
                f"span {span} requested but {data_root} has spans {sorted(folders)}: "
                "set the span parameter to one of them or -1 for the newest."
            )
        raise ExampleGenInputError(
            f"{what} complete: complete spans hold the marker file "
            f"{marker!r}, written last by the upload (spans without it: "
            f"{sorted(set(folders) - set(complete))}). Finish the upload with that file, or set "
            "success_marker to '' to read spans without markers."
        )
    window = [n for n in sorted(complete) if n <= chosen][-window_spans:]
    selected = {}
    for number in window:
        files = span_files(complete[number], input_format)
        if not files:
            raise ExampleGenInputError(
                f"{complete[number]} holds no {describe_files(input_format)}: write the span's "
                "data there, or remove the folder, or set the span parameter to another span."
            )
        tags = storage.content_tags(complete[number])
        content = "\n".join(f"{f.path[len(complete[number]):]}:{tags.get(f.path)}" for f in files)
        selected[number] = {
            "folder": complete[number],
            "files": [f.path for f in files],
            "fingerprint": hashlib.sha256(content.encode()).hexdigest()[:16],
        }
    whole = json.dumps({n: s["fingerprint"] for n, s in selected.items()}, sort_keys=True)
    return {
        "data_root": data_root,
        "span": chosen,
        "spans": selected,
        "fingerprint": hashlib.sha256(whole.encode()).hexdigest()[:16],
    }


def no_new_data_reason(selection: dict[str, Any], before: dict[str, Any]) -> str:
    outcome = (
        f"version {before['pushed_version']} was pushed from it"
        if before.get("pushed_version")
        else f"its model was not pushed ({before.get('reason') or 'not blessed'})"
    )
    return (
        f"no new data since span {selection['span']}: span(s) {sorted(selection['spans'])} "
        f"(fingerprint {selection['fingerprint']}) already trained a model on "
        f"{before.get('time', '?')}, and {outcome}. Nothing is trained or pushed; add a span, or "
        "set the run parameter force=1 to train on the same data again."
    )
