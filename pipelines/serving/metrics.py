"""`tkp serve`'s Prometheus metrics, at TF Serving's path `/monitoring/prometheus/metrics`
(util/prometheus_exporter.cc kPrometheusPath at 2.16.1).

TF Serving's own metrics carry the model but no version or label
(`:tensorflow:serving:request_count{model_name, status}`, servables/tensorflow/util.cc); that one
is kept under its name, so a dashboard built for TF Serving reads this server too. The figures a
release is judged on (components/base/live_release.py) are per version and label:
requests by HTTP code, a latency histogram (TF Serving's buckets: 10 us x 1.8^i, 33 of them,
tsl/lib/monitoring/sampler.cc ExponentialBuckets(10, 1.8, 33) in us), and a histogram of the
predictions (one value per instance: a single output's score, or a classifier's top class).
"""

from __future__ import annotations

import bisect
import re
import threading

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from components.base import live_release

disable_created_metrics()  # no `_created` series: TF Serving writes none
PATH = "/monitoring/prometheus/metrics"
CONTENT_TYPE = CONTENT_TYPE_LATEST
_LATENCY_BUCKETS = tuple(10e-6 * 1.8**i for i in range(33))
TF_LATENCY = ":tensorflow:serving:request_latency"
# Buckets::Exponential(10, 1.8, 33) (servables/tensorflow/util.cc), in microseconds.
_TF_LATENCY_LIMITS = tuple(10 * 1.8**i for i in range(33))
# Scores in [0, 1] in tenths; class indexes 0..99 each in its own bucket above that.
_PREDICTION_BUCKETS = tuple(i / 10 for i in range(1, 11)) + tuple(float(i) + 0.5 for i in
                                                                  range(1, 100))  # fmt: skip


class ServingMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name", "version", "label")
        self.requests = Counter(live_release.REQUESTS, "Requests by version, label and HTTP code",
                                (*labels, "code"), registry=self.registry)  # fmt: skip
        self.latency = Histogram(live_release.LATENCY, "Request latency in seconds", labels,
                                 buckets=_LATENCY_BUCKETS, registry=self.registry)  # fmt: skip
        what = "Each instance's score (a single output) or top class (several)"
        self.predictions = Histogram(
            live_release.PREDICTION, what, labels, buckets=_PREDICTION_BUCKETS,
            registry=self.registry,
        )  # fmt: skip
        # TF Serving's request count: every request, status "OK" or the error code's name
        # (servables/tensorflow/util.cc).
        self.tf_serving = _TfServingCounter(":tensorflow:serving:request_count",
                                            ("model_name", "status"))  # fmt: skip
        # And its latency of every successful request in microseconds, API "predict",
        # "classify", "regress" ("" for a GET), entrypoint "REST" (http_server.cc
        # ProcessRequest): what a cluster's release is judged on (pipelines/serving/
        # cluster_release.py), since TF Serving has no per-version figures.
        self.tf_latency = _TfServingHistogram(TF_LATENCY, ("model_name", "API", "entrypoint"),
                                              _TF_LATENCY_LIMITS)  # fmt: skip
        self.batching: BatchingMetrics | None = None  # with --enable-batching

    def enable_batching(self) -> BatchingMetrics:
        self.batching = BatchingMetrics(self.registry)
        return self.batching

    def count_request(self, model: str, status: str, api: str = "", seconds: float = 0.0) -> None:
        """TF Serving's count: every client request (any method), by the model its path names
        ("" when the path does not parse) and status "OK" or the error code's name; a
        successful one's latency too."""
        self.tf_serving.inc(model, status)
        if status == "OK":
            self.tf_latency.observe((model, api, "REST"), seconds * 1e6)

    def record(self, model: str, version: int | None, label: str, code: int, seconds: float,
               payload: dict | None) -> None:  # fmt: skip
        """One inference answer of `version` (a shadow copy's too: the canary's figures)."""
        if version is None:  # refused before a version was found (bad path, unknown model)
            return
        names = (model, str(version), label)
        self.requests.labels(*names, str(code)).inc()
        self.latency.labels(*names).observe(seconds)
        if code == 200 and payload is not None:
            for value in prediction_values(payload):
                self.predictions.labels(*names).observe(value)

    def exposition(self) -> bytes:
        runs = self.batching.batches_run.text() if self.batching else ""
        tf_serving = self.tf_serving.text() + self.tf_latency.text()
        return generate_latest(self.registry) + (tf_serving + runs).encode()


# TF's Exponential(1, 2, 14) buckets of a batch size (batching_util.h).
_SIZE_BUCKETS = tuple(2.0**i for i in range(14))


class BatchingMetrics:
    """TF Serving's BatchingSession figures under its names (batching_session.cc,
    batching_util.h at 2.16.1): each request's size, each batch's size after padding and its
    padding (by that size), the time each request waited in its queue (us, Exponential(100, 1.2,
    52)), and the model runs. One difference: a value equal to a bucket's bound is counted in
    that bucket here (Prometheus' `le`), in the next one by TF's exporter."""

    def __init__(self, registry: CollectorRegistry) -> None:
        prefix = ":tensorflow:serving:batching_session:"
        self.input_size = Histogram(
            prefix + "input_batch_size", "Tracks the batch size distribution on the inputs.",
            buckets=_SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.processed_size = Histogram(
            prefix + "processed_batch_size", "Tracks the batch size distribution on processing.",
            buckets=_SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.padding = Histogram(
            prefix + "padding_size", "Tracks the padding size distribution on batches.",
            ("execution_batch_size",), buckets=_SIZE_BUCKETS, registry=registry,
        )  # fmt: skip
        self.queuing_latency = Histogram(
            prefix + "queuing_latency", "Tracks the latency distribution of queuing time in "
            "microseconds.", ("thread_pool_name",), buckets=tuple(100 * 1.2**i for i in range(52)),
            registry=registry,
        )  # fmt: skip
        self.batches_run = _TfServingCounter(prefix + "wrapped_run_count", ())

    def batch_input(self, size: int) -> None:
        """A request's rows (TF records one per input tensor; this project's signatures take
        one)."""
        self.input_size.observe(size)

    def batch_queued(self, waited: list[float]) -> None:
        for seconds in waited:
            self.queuing_latency.labels("").observe(seconds * 1e6)

    def batch_merged(self, size: int, padding: int) -> None:
        self.processed_size.observe(size)
        self.padding.labels(str(size)).observe(padding)


class _TfServingCounter:
    """A TF Serving counter exactly as its exporter writes it (util/prometheus_exporter.cc:
    `# TYPE name counter`, then one line per label set, `name{} N` without labels; no `_total`
    suffix, which prometheus_client would add)."""

    def __init__(self, name: str, label_names: tuple[str, ...]) -> None:
        self.name, self.label_names = name, label_names
        self._counts: dict[tuple[str, ...], int] = {}
        self._lock = threading.Lock()

    def inc(self, *values: str) -> None:
        with self._lock:
            self._counts[values] = self._counts.get(values, 0) + 1

    def text(self) -> str:
        with self._lock:
            counts = sorted(self._counts.items())
        if not counts:
            return ""
        lines = [f"# TYPE {self.name} counter"]
        for values, count in counts:
            labels = _labels(self.label_names, values)
            lines.append(f"{self.name}{{{labels}}} {count}")
        return "\n".join(lines) + "\n"


class _TfServingHistogram:
    """A TF Serving sampler as its exporter writes it (prometheus_exporter.cc
    SerializeHistogram): a bucket counts the values below its limit (tsl's Histogram), each
    limit in absl::StrCat's six significant digits, the last "+Inf"; then `_sum` and
    `_count`."""

    def __init__(self, name: str, label_names: tuple[str, ...], limits: tuple[float, ...]):
        self.name, self.label_names, self.limits = name, label_names, limits
        self._cells: dict[tuple[str, ...], list[float]] = {}  # counts per bucket, then the sum
        self._lock = threading.Lock()

    def observe(self, values: tuple[str, ...], value: float) -> None:
        index = bisect.bisect_right(self.limits, value)
        with self._lock:
            cell = self._cells.setdefault(values, [0.0] * (len(self.limits) + 2))
            cell[index] += 1
            cell[-1] += value

    def text(self) -> str:
        with self._lock:
            cells = sorted((k, list(v)) for k, v in self._cells.items())
        if not cells:
            return ""
        lines = [f"# TYPE {self.name} histogram"]
        for values, cell in cells:
            labels = _labels(self.label_names, values)
            total = 0
            for i, count in enumerate(cell[:-1]):
                total += int(count)
                limit = f"{self.limits[i]:g}" if i < len(self.limits) else "+Inf"
                lines.append(f'{self.name}_bucket{{{labels},le="{limit}"}} {total}')
            lines.append(f"{self.name}_sum{{{labels}}} {cell[-1]:g}")
            lines.append(f"{self.name}_count{{{labels}}} {total}")
        return "\n".join(lines) + "\n"


def sample_value(text: str, name: str) -> float:
    """The value of the unlabelled sample `name` in an exposition (`name{} N`, as TF's exporter
    writes an unlabelled counter, or `name N`); 0 when it is not there yet."""
    found = re.search(rf"^{re.escape(name)}(?:{{}})? (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def _labels(names: tuple[str, ...], values: tuple[str, ...]) -> str:
    """`name="value",...` as TF's exporter writes a point's labels."""
    return ",".join(f'{k}="{_quoted(v)}"' for k, v in zip(names, values, strict=True))


def _quoted(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def prediction_histogram(values: list[float]) -> dict[float, float]:
    """`values` as a cumulative histogram on the prediction metric's buckets (le: count), as
    live_release reads one from an exposition."""
    bounds = (*_PREDICTION_BUCKETS, float("inf"))
    return {bound: float(sum(1 for v in values if v <= bound)) for bound in bounds}


def prediction_values(payload: dict) -> list[float]:
    """One value per instance of a :predict, :classify or :regress answer: a single output's
    value, or the index of the highest of several (a classifier's class)."""
    if "predictions" in payload:
        rows = payload["predictions"]
    elif "results" in payload:
        rows = payload["results"]
    else:
        return []
    values = []
    for row in rows if isinstance(rows, list) else []:
        if isinstance(row, dict):  # several named outputs: the first by name
            row = row[sorted(row)[0]] if row else None
        if isinstance(row, list) and row and isinstance(row[0], list):  # :classify [[class, s]]
            row = [pair[1] for pair in row]
        if isinstance(row, int | float):
            values.append(float(row))
        elif isinstance(row, list) and len(row) == 1 and isinstance(row[0], int | float):
            values.append(float(row[0]))
        elif isinstance(row, list) and row and all(isinstance(v, int | float) for v in row):
            values.append(float(max(range(len(row)), key=row.__getitem__)))
    return values
