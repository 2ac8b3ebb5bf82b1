"""Writes generated spans: `<data_root>/span-N/part-XXXXX.csv` (or `span-N/<class>/<name>` for
images), then the success marker.

The data come from the use case's generator (`UseCase.generate_span`); the same (use case, span,
rows, seed, drift, label noise, corrupt) always gives the same bytes.
"""

from __future__ import annotations

import io
import math
from concurrent.futures import ThreadPoolExecutor

from components.base import spans, storage
from components.base.config import (
    DEFAULT_DRIFT,  # noqa: F401 (add-span --drift's strength)
    FIELDS,
)
from components.base.use_case import IMAGE_FOLDERS
from components.base.use_case import load as load_use_case

# The config's default use case, for callers that name none.
DEFAULT_USE_CASE = FIELDS["use_case"].default
UPLOAD_THREADS = 16  # images are small objects: the time is the round trip, not the bytes


def span_dir(data_root: str, span: int) -> str:
    return storage.join(data_root, f"{spans.SPAN_PREFIX}{span}")


def existing_spans(data_root: str) -> list[int]:
    """Every span folder, complete or not."""
    return sorted(spans.span_dirs(data_root))


def write_span(
    data_root: str,
    span: int,
    num_rows: int,
    seed: int = 42,
    drift: float = 0.0,
    rows_per_file: int = 250_000,
    marker: str = "_SUCCESS",
    label_noise: float = 0.0,
    use_case: str = DEFAULT_USE_CASE,
    corrupt: int = 0,
) -> list[str]:
    """Writes span `span` as CSV files (header in each) or image files, then `marker` (when not
    ""), and returns the data files' paths. The marker goes last, as an uploader's must: a
    reader that waits for it never sees a half-written span. `corrupt` (images only) cuts that
    many files off half-way.

    Refuses to overwrite an existing span: spans are immutable once written, which is what lets
    the pipeline fingerprint them.
    """
    if span in existing_spans(data_root):
        raise FileExistsError(f"{span_dir(data_root, span)} already exists; spans are immutable")
    case = load_use_case(use_case)
    generate = case.function("generate_span")
    if case.input_format == IMAGE_FOLDERS:
        files = generate(num_rows, span, seed=seed, drift=drift, label_noise=label_noise,
                         corrupt=corrupt)  # fmt: skip
        paths = [storage.join(span_dir(data_root, span), name) for name, _ in files]
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(storage.write_bytes, paths, [data for _, data in files]))
        if marker:
            storage.write_bytes(storage.join(span_dir(data_root, span), marker), b"")
        return paths
    if corrupt:
        raise ValueError(f"corrupt is for image use cases; {use_case!r} writes CSV rows")
    paths = []
    for part in range(math.ceil(num_rows / rows_per_file)):
        rows = min(rows_per_file, num_rows - part * rows_per_file)
        frame = generate(rows, span, seed=seed * 1000 + part, drift=drift, label_noise=label_noise)
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False, na_rep="")
        path = storage.join(span_dir(data_root, span), f"part-{part:05d}.csv")
        storage.write_bytes(path, buffer.getvalue().encode())
        paths.append(path)
    if marker:
        storage.write_bytes(storage.join(span_dir(data_root, span), marker), b"")
    return paths


def add_next_span(
    data_root: str,
    num_rows: int,
    seed: int = 42,
    drift: float = 0.0,
    marker: str = "_SUCCESS",
    label_noise: float = 0.0,
    use_case: str = DEFAULT_USE_CASE,
    corrupt: int = 0,
) -> int:
    """Writes the span after the newest one (span 0 on an empty root) and returns its number."""
    existing = existing_spans(data_root)
    span = existing[-1] + 1 if existing else 0
    write_span(data_root, span, num_rows, seed=seed, drift=drift, marker=marker,
               label_noise=label_noise, use_case=use_case, corrupt=corrupt)  # fmt: skip
    return span
