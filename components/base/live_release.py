"""Judging a release on live figures: the canary's error rate, p99 latency and prediction
distribution against `stable`'s, read from a model server's Prometheus metrics.

The metrics are the ones `tkp serve` exposes (pipelines/serving/metrics.py), per model and
version: `tkp_serving_requests_total{model_name, version, label, code}`,
`tkp_serving_request_latency_seconds` (a histogram) and `tkp_serving_prediction` (a histogram of
each instance's score: a single output's value, or a classifier's top class index). The window:
the canary's figures since it was loaded, stable's since its server started (so stable's include
traffic from before the release: a steadier reference, but not the same hours); a decision waits
for `min_requests` canary requests, `min_minutes` since the release began, and some stable
traffic to compare with.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import urllib.request
from typing import Any

from components.base.errors import ActionableError

REQUESTS = "tkp_serving_requests"  # a counter: the exposition adds _total
LATENCY = "tkp_serving_request_latency_seconds"
PREDICTION = "tkp_serving_prediction"
WAIT, PROMOTE, ABORT = "wait", "promote", "abort"


class MetricsUnavailable(ActionableError, RuntimeError):
    """The live figures could not be read; the release waits and `stable` keeps serving."""


@dataclasses.dataclass
class Figures:
    """One version's live figures."""

    requests: int = 0
    errors: int = 0
    latency: dict[float, float] = dataclasses.field(default_factory=dict)  # le: cumulative
    predictions: dict[float, float] = dataclasses.field(default_factory=dict)  # le: cumulative

    @property
    def error_rate(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    @property
    def p99_ms(self) -> float | None:
        seconds = quantile(0.99, self.latency)
        return None if seconds is None else seconds * 1000

    def summary(self) -> dict[str, Any]:
        p99 = self.p99_ms
        return {"requests": self.requests, "error_rate": round(self.error_rate, 4),
                "p99_ms": None if p99 is None else round(p99, 2)}  # fmt: skip


def read_metrics(url: str, timeout: float = 10) -> str:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            return answer.read().decode("utf-8")
    except (OSError, ValueError) as e:
        raise MetricsUnavailable(
            f"cannot read the live figures at {url} ({e}): is the model server running there? "
            "(config release_metrics_url) The release waits; stable keeps serving."
        ) from e


def figures_by_version(text: str, model_name: str) -> dict[int, Figures]:
    """Each version's figures in a Prometheus text exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[int, Figures] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (REQUESTS, LATENCY, PREDICTION):
            continue
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model_name") != model_name or not labels.get("version", "").isdigit():
                continue
            figures = found.setdefault(int(labels["version"]), Figures())
            if sample.name == REQUESTS + "_total":
                figures.requests += int(sample.value)
                figures.errors += int(sample.value) if labels.get("code") != "200" else 0
            elif sample.name in (LATENCY + "_bucket", PREDICTION + "_bucket"):
                bucket = figures.latency if sample.name.startswith(LATENCY) else figures.predictions
                bound = float(labels["le"])
                bucket[bound] = bucket.get(bound, 0.0) + sample.value
    return found


def quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile: linear interpolation inside the bucket that holds the
    q-th observation; the highest finite bound when it falls in the +Inf bucket."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] == 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower_bound, lower_count = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (
                count - lower_count
            )
        lower_bound, lower_count = bound, count
    return bounds[-1]


def prediction_shift(stable: dict[float, float], canary: dict[float, float]) -> float | None:
    """Jensen-Shannon divergence (base 2, 0..1) between two cumulative histograms' buckets."""

    def masses(cumulative: dict[float, float]) -> dict[float, float]:
        out, before = {}, 0.0
        for bound in sorted(cumulative):
            out[bound], before = cumulative[bound] - before, cumulative[bound]
        total = sum(out.values())
        return {k: v / total for k, v in out.items()} if total else {}

    p, q = masses(stable), masses(canary)
    if not p or not q:
        return None
    divergence = 0.0
    for bound in set(p) | set(q):
        a, b = p.get(bound, 0.0), q.get(bound, 0.0)
        m = (a + b) / 2
        divergence += (a * math.log2(a / m) if a else 0.0) + (b * math.log2(b / m) if b else 0.0)
    return divergence / 2


@dataclasses.dataclass
class Verdict:
    action: str  # WAIT, PROMOTE or ABORT
    reasons: list[str]
    figures: dict[str, Any]


def judge(release: dict[str, Any], by_version: dict[int, Figures],
          now: datetime.datetime | None = None) -> Verdict:  # fmt: skip
    """The decision on a release (serving state's `release`) from its versions' figures."""
    policy, canary_version = release["policy"], release["canary"]
    stable = by_version.get(release["stable"], Figures())
    canary = by_version.get(canary_version, Figures())
    started = datetime.datetime.fromisoformat(release["started"].replace("Z", "+00:00"))
    now = now or datetime.datetime.now(datetime.timezone.utc)
    minutes = (now - started).total_seconds() / 60
    shift = prediction_shift(stable.predictions, canary.predictions)
    figures = {"stable": stable.summary(), "canary": canary.summary(),
               "minutes": round(minutes, 2),
               "prediction_shift": None if shift is None else round(shift, 4)}  # fmt: skip
    waiting = []
    if canary.requests < policy["min_requests"]:
        waiting.append(f"the canary answered {canary.requests} of {policy['min_requests']} "
                       "requests")  # fmt: skip
    if minutes < policy["min_minutes"]:
        waiting.append(f"{minutes:.1f} of {policy['min_minutes']:g} minutes passed")
    if stable.requests == 0:
        waiting.append("stable answered no request yet (nothing to compare with)")
    if waiting:
        return Verdict(WAIT, waiting, figures)
    failures = []
    increase = canary.error_rate - stable.error_rate
    if increase > policy["max_error_rate_increase"]:
        failures.append(f"error rate {canary.error_rate:.2%} against stable's "
                        f"{stable.error_rate:.2%} (more than "
                        f"{policy['max_error_rate_increase']:.2%} above)")  # fmt: skip
    p99_canary, p99_stable = canary.p99_ms, stable.p99_ms
    if p99_canary is not None and p99_stable:
        ratio = p99_canary / p99_stable
        if ratio > policy["max_p99_ratio"]:
            failures.append(f"p99 latency {p99_canary:.1f} ms against stable's "
                            f"{p99_stable:.1f} ms ({ratio:.1f}x, more than "
                            f"{policy['max_p99_ratio']:g}x)")  # fmt: skip
    if shift is not None and shift > policy["max_prediction_shift"]:
        failures.append(f"prediction distribution {shift:.3f} from stable's (Jensen-Shannon; "
                        f"more than {policy['max_prediction_shift']:g})")  # fmt: skip
    if failures:
        return Verdict(ABORT, failures, figures)
    return Verdict(PROMOTE, [f"within every threshold over {canary.requests} requests and "
                             f"{minutes:.1f} minutes"], figures)  # fmt: skip
