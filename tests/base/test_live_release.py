"""The verdict on a release from live figures (components/base/live_release.py): the Prometheus
text `tkp serve` writes is read back per version; the window, then each threshold, decides."""

from __future__ import annotations

import datetime

import pytest

from components.base import live_release
from components.base.live_release import Figures, judge, prediction_shift, quantile
from components.base.release import policy_of
from pipelines.serving.metrics import ServingMetrics

STARTED = datetime.datetime(2026, 12, 1, 12, 0, tzinfo=datetime.timezone.utc)


def _release(**policy) -> dict:
    return {
        "canary": 2,
        "stable": 1,
        "mode": "canary",
        "started": "2026-12-01T12:00:00Z",
        "policy": {**policy_of("canary"), "min_requests": 100, "min_minutes": 5, **policy},
    }


def _served(metrics: ServingMetrics, version: int, n: int, seconds: float, score: float,
            errors: int = 0) -> None:  # fmt: skip
    label = "stable" if version == 1 else "canary"
    for i in range(n):
        code = 500 if i < errors else 200
        metrics.record("m", version, label, code, seconds, {"predictions": [[score]]})


def _figures(*served) -> dict[int, Figures]:
    metrics = ServingMetrics()
    for args in served:
        _served(metrics, *args)
    metrics.record("other-model", 1, "stable", 500, 1.0, None)  # not this model's
    return live_release.figures_by_version(metrics.exposition().decode(), "m")


def test_figures_are_read_back_per_version_from_the_exposition():
    by_version = _figures((1, 300, 0.002, 0.2, 3), (2, 120, 0.004, 0.2))
    assert (by_version[1].requests, by_version[1].errors) == (300, 3)
    assert (by_version[2].requests, by_version[2].errors) == (120, 0)
    # TF Serving's buckets (10 us x 1.8^i): 2 ms lies in (1.98, 3.57] ms, 4 ms in (3.57, 6.43].
    assert 1.98 < by_version[1].p99_ms <= 3.58 and 3.57 < by_version[2].p99_ms <= 6.43


def test_a_release_waits_for_its_window_then_is_promoted_within_every_threshold():
    figures = _figures((1, 300, 0.002, 0.3), (2, 60, 0.002, 0.3))
    early = judge(_release(), figures, STARTED + datetime.timedelta(minutes=2))
    assert early.action == "wait"
    assert early.reasons == ["the canary answered 60 of 100 requests", "2.0 of 5 minutes passed"]
    figures = _figures((1, 300, 0.002, 0.3), (2, 150, 0.002, 0.3))
    verdict = judge(_release(), figures, STARTED + datetime.timedelta(minutes=6))
    assert verdict.action == "promote" and verdict.figures["prediction_shift"] == 0.0
    assert verdict.figures["canary"]["requests"] == 150


@pytest.mark.parametrize(("canary", "reason"), [
    ((2, 150, 0.002, 0.3, 15), "error rate 10.00% against stable's 0.00%"),
    ((2, 150, 0.010, 0.3), "p99 latency"),
    ((2, 150, 0.002, 0.95), "prediction distribution 1.000 from stable's"),
])  # fmt: skip
def test_a_worse_canary_is_aborted_naming_the_threshold(canary, reason):
    verdict = judge(_release(), _figures((1, 300, 0.002, 0.3), canary),
                    STARTED + datetime.timedelta(minutes=6))  # fmt: skip
    assert verdict.action == "abort" and len(verdict.reasons) == 1
    assert verdict.reasons[0].startswith(reason), verdict.reasons


def test_quantile_and_shift_follow_prometheus_and_jensen_shannon():
    assert quantile(0.5, {1.0: 0, 2.0: 10, float("inf"): 10}) == pytest.approx(1.5)
    assert quantile(0.99, {1.0: 0, float("inf"): 10}) == 1.0  # in +Inf: the highest bound
    assert quantile(0.5, {}) is None
    assert prediction_shift({0.5: 10, 1.0: 10}, {0.5: 10, 1.0: 10}) == 0.0
    assert prediction_shift({0.5: 10, 1.0: 10}, {0.5: 0, 1.0: 10}) == pytest.approx(1.0)
    assert prediction_shift({}, {0.5: 1}) is None


def test_unreachable_figures_name_the_address():
    with pytest.raises(live_release.MetricsUnavailable, match="cannot read the live figures at "
                       "http://127.0.0.1:1/metrics"):  # fmt: skip
        live_release.read_metrics("http://127.0.0.1:1/metrics", timeout=2)
