"""A deterministic generator of taxi-trip spans with a learnable label and optional drift.

Span N of a data root lives in `<data_root>/span-N/part-XXXXX.csv`. The same (span, rows, seed,
drift) always gives the same bytes.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pandas as pd

from components import features
from pipelines import storage

PAYMENT_TYPES = np.array(["Credit Card", "Cash", "Mobile", "Prcard", "No Charge", "Unknown"])
PAYMENT_WEIGHTS = np.array([0.46, 0.38, 0.08, 0.05, 0.02, 0.01])
COMPANIES = np.array([f"Company {c}" for c in "ABCDEFGHIJKL"])
EPOCH_2024 = 1_704_067_200  # 2024-01-01T00:00:00Z
WEEK_S = 7 * 24 * 3600


def generate_trips(num_rows: int, span: int, seed: int = 42, drift: float = 0.0) -> pd.DataFrame:
    """`num_rows` trips of the week belonging to `span`.

    `drift` (0 = none) shifts later spans: longer trips and more mobile payments, by
    `drift * span`, so a model trained on span 0 sees a different population at span 5.
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be at least 1, got {num_rows}")
    rng = np.random.default_rng([seed, span])
    shift = drift * span
    weights = PAYMENT_WEIGHTS.copy()
    weights[2] += min(0.3, 0.05 * shift)  # mobile payments grow
    weights[1] = max(0.05, weights[1] - min(0.3, 0.05 * shift))
    weights /= weights.sum()

    timestamp = EPOCH_2024 + span * WEEK_S + rng.integers(0, WEEK_S, num_rows)
    hour = (timestamp // 3600) % 24
    miles = np.round(rng.lognormal(mean=0.7 + 0.1 * shift, sigma=0.8, size=num_rows), 2)
    seconds = np.maximum(
        60, (miles * rng.normal(240, 60, num_rows) + rng.normal(180, 60, num_rows))
    )
    fare = np.round(3.25 + 2.25 * miles + 0.004 * seconds + rng.normal(0, 1.0, num_rows), 2)
    payment = rng.choice(PAYMENT_TYPES, size=num_rows, p=weights)
    company_idx = rng.integers(0, len(COMPANIES), num_rows)
    area = rng.integers(1, 78, num_rows)

    # Tipping behaviour: card and mobile payers tip, cash tips are rarely recorded; longer night
    # trips and some companies tip more. Noise keeps the problem from being trivial.
    logit = (
        -1.2
        + 2.2 * (payment == "Credit Card")
        + 1.6 * (payment == "Mobile")
        - 2.5 * (payment == "Cash")
        + 0.25 * np.log1p(miles)
        + 0.6 * ((hour >= 20) | (hour < 4))
        + 0.15 * (company_idx % 4 - 1.5)
        + 0.3 * (area < 20)
        + rng.normal(0, 0.7, num_rows)
    )
    label = (rng.random(num_rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)

    frame = pd.DataFrame(
        {
            features.TIMESTAMP_KEY: timestamp.astype(np.int64),
            "trip_miles": miles,
            "trip_seconds": seconds.astype(np.int64),
            "fare": fare,
            "payment_type": payment,
            "company": COMPANIES[company_idx].astype(object),
            "pickup_community_area": pd.array(area, dtype="Int64"),
            features.LABEL_KEY: label,
        },
        columns=features.RAW_COLUMNS,
    )
    frame.loc[rng.random(num_rows) < 0.03, "company"] = None  # a few missing values
    frame.loc[rng.random(num_rows) < 0.05, "pickup_community_area"] = pd.NA
    return frame


def span_dir(data_root: str, span: int) -> str:
    return storage.join(data_root, f"{features.SPAN_PREFIX}{span}")


def existing_spans(data_root: str) -> list[int]:
    return sorted(storage.numbered_children(data_root, features.SPAN_PREFIX))


def write_span(
    data_root: str,
    span: int,
    num_rows: int,
    seed: int = 42,
    drift: float = 0.0,
    rows_per_file: int = 250_000,
) -> list[str]:
    """Writes span `span` as CSV files (header in each) and returns their paths.

    Refuses to overwrite an existing span: spans are immutable once written, which is what lets
    the pipeline fingerprint them.
    """
    if span in existing_spans(data_root):
        raise FileExistsError(f"{span_dir(data_root, span)} already exists; spans are immutable")
    paths = []
    for part in range(math.ceil(num_rows / rows_per_file)):
        rows = min(rows_per_file, num_rows - part * rows_per_file)
        frame = generate_trips(rows, span, seed=seed * 1000 + part, drift=drift)
        buffer = io.StringIO()
        frame.to_csv(buffer, index=False, na_rep="")
        path = storage.join(span_dir(data_root, span), f"part-{part:05d}.csv")
        storage.write_bytes(path, buffer.getvalue().encode())
        paths.append(path)
    return paths


def add_next_span(data_root: str, num_rows: int, seed: int = 42, drift: float = 0.0) -> int:
    """Writes the span after the newest one (span 0 on an empty root) and returns its number."""
    spans = existing_spans(data_root)
    span = spans[-1] + 1 if spans else 0
    write_span(data_root, span, num_rows, seed=seed, drift=drift)
    return span
