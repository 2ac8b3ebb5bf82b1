"""A deterministic generator of taxi-trip spans with a learnable label and optional drift.

The same (span, rows, seed, drift, label_noise) always gives the same rows.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from components.use_cases.taxi import features

PAYMENT_TYPES = np.array(["Credit Card", "Cash", "Mobile", "Prcard", "No Charge", "Unknown"])
PAYMENT_WEIGHTS = np.array([0.46, 0.38, 0.08, 0.05, 0.02, 0.01])
COMPANIES = np.array([f"Company {c}" for c in "ABCDEFGHIJKL"])
EPOCH_2024 = 1_704_067_200  # 2024-01-01T00:00:00Z
WEEK_S = 7 * 24 * 3600


def generate_span(
    num_rows: int, span: int, seed: int = 42, drift: float = 0.0, label_noise: float = 0.0
) -> pd.DataFrame:
    """`num_rows` trips of the week belonging to `span`.

    `drift` (0 = none) is how far this span's population is from the undrifted one: longer
    trips (and so higher fares) and more mobile payments instead of cash. The shift depends on
    the strength alone, never on the span number: a span of strength d differs from an undrifted
    span of any number by the same amount (DEFAULT_DRIFT is what the drift check must catch).
    `label_noise` is the share of rows whose label is replaced by a coin flip (a broken export).
    """
    if num_rows < 1:
        raise ValueError(f"num_rows must be at least 1, got {num_rows}")
    if drift < 0:
        raise ValueError(f"drift must be >= 0, got {drift}")
    rng = np.random.default_rng([seed, span])
    # Per unit of strength: 20 % of all trips move from cash (which keeps at least 5 %) to mobile
    # payments, and the mean log trip length grows by 0.9 (x2.5 miles, and higher fares).
    weights = PAYMENT_WEIGHTS.copy()
    moved = min(0.2 * drift, weights[1] - 0.05)
    weights[2] += moved
    weights[1] -= moved
    weights /= weights.sum()

    timestamp = EPOCH_2024 + span * WEEK_S + rng.integers(0, WEEK_S, num_rows)
    hour = (timestamp // 3600) % 24
    miles = np.round(rng.lognormal(mean=0.7 + 0.9 * drift, sigma=0.8, size=num_rows), 2)
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
    if label_noise:
        noisy = rng.random(num_rows) < label_noise
        label[noisy] = rng.integers(0, 2, int(noisy.sum()))

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
