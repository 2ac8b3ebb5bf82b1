"""`tkp bench-serving`: latency and throughput of `tkp serve`, next to the SavedModel called in
this process on the same rows, under the same bounded load (fixed count, fixed concurrency).

The server runs as its own process (`tkp serve`, as users run it); this process only sends
prepared request bodies over keep-alive connections, so the figures are the server's. Both
sides are measured in one run, so their ratio holds on a noisy machine.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

from components.base import registry, serving_state, spans, storage
from components.base.config import WORK_DIR, PipelineConfig
from components.base.errors import ActionableError
from components.base.processes import stop_process
from components.base.use_case import load as load_use_case
from components.training.export import SERVING_SIGNATURE
from pipelines.serving.serving_client import ServingClient


class BenchError(ActionableError, RuntimeError):
    pass


def _load(call: Callable[[], None], count: int, concurrency: int) -> dict:
    """`count` calls on `concurrency` threads: p50, p99 (ms) and calls per second."""
    for _ in range(min(10, count)):  # not measured: connections, first-call paths
        call()

    def timed(_: int) -> float:
        started = time.perf_counter()
        call()
        return time.perf_counter() - started

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        latencies = sorted(pool.map(timed, range(count)))
    elapsed = time.perf_counter() - started
    return {
        "p50_ms": round(1000 * statistics.median(latencies), 2),
        "p99_ms": round(1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))], 2),
        "per_second": round(count / elapsed, 1),
    }


def _http_caller(port: int, path: str, body: bytes) -> Callable[[], None]:
    """A POST of `body` on a keep-alive connection of the calling thread. http.client rather
    than requests: the client's own CPU time must not eat into the server's on a small machine."""
    local = threading.local()

    def call() -> None:
        if not hasattr(local, "connection"):
            local.connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        local.connection.request("POST", path, body, {"Content-Type": "application/json"})
        response = local.connection.getresponse()
        answer = response.read()
        if response.status != 200:
            raise BenchError(f"the server answered {response.status}: {answer[:200]!r}")

    return call


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _eval_rows(config: PipelineConfig, version: int, limit: int) -> list[dict[str, str]]:
    from pipelines.serving.samples import read_rows

    record = registry.read_record(config.serving_model_dir, version) or {}
    data_root = record.get("data_root") or config.data_root
    span_dir = storage.join(data_root, f"{spans.SPAN_PREFIX}{record.get('span', 0)}", "")
    files = [f.path for f in spans.span_files(span_dir)]
    if not files:
        raise BenchError(f"no data file of version {version}'s span under {data_root}")
    return read_rows(files[0], limit, config.input_encoding)


# The batching parameters the manifests give TF Serving (kubeflow/serving/tf-serving.yaml).
SHIPPED_BATCHING = Path(__file__).resolve().parents[1] / "serving" / "batching_parameters.txt"
SERVERS = ("serve", "serve_batching")  # `tkp serve` without and with --enable-batching


def _start_server(config: PipelineConfig, cache: Path,
                  batching: Path | None) -> tuple[int, subprocess.Popen]:  # fmt: skip
    """`tkp serve` as its own process on a free port (the same store and model as this
    command's config, whatever set them: --set, env); with `batching`, --enable-batching and
    that parameters file."""
    port = _free_port()
    command = [sys.executable, "-m", "pipelines.cli", "serve", "--port", str(port),
               "--cache-dir", str(cache), "--set", f"serving_root={config.serving_root}",
               "--set", f"model_name={config.model_name}"]  # fmt: skip
    if batching is not None:
        command += ["--enable-batching", "--batching-parameters-file", str(batching)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ))  # fmt: skip
    return port, server


def _wait_until_serving(config: PipelineConfig, port: int, server, version: int) -> None:
    deadline = time.monotonic() + 180
    client = ServingClient(f"http://127.0.0.1:{port}", config.model_name, use_case=config.use_case)
    # The status answers 200 while the version still loads: wait for AVAILABLE.
    while client.serving_version() != version:
        if server.poll() is not None or time.monotonic() > deadline:
            raise BenchError("`tkp serve` did not come up; run it alone to see why")
        time.sleep(0.5)


def run(config: PipelineConfig, requests_per_size: int, concurrencies: list[int],
        batch_sizes: list[int], say: Callable[[str], None],
        batching: Path = SHIPPED_BATCHING) -> dict:  # fmt: skip
    """Each batch size at each concurrency: `tkp serve` without batching, the same with
    `batching`'s parameters, and the SavedModel in this process, one after the other on the same
    requests (both servers up the whole time, so the three figures of a row share the machine's
    state)."""
    import tensorflow as tf

    from pipelines.serving.batching import load_parameters
    from pipelines.serving.samples import row_to_example

    parameters = load_parameters(batching)  # a bad file stops here, not in a server's log
    folder = config.serving_model_dir
    version = serving_state.read(folder, config.model_name).stable
    if version is None:
        raise BenchError(f"no version is pushed under {folder}: run `make run` first")
    rows = _eval_rows(config, version, max(batch_sizes))
    if len(rows) < max(batch_sizes):
        largest = max(batch_sizes)
        raise BenchError(f"the span of version {version} has {len(rows)} rows, fewer than the "
                         f"largest batch ({largest}): use smaller --batch-sizes")  # fmt: skip
    use_case = load_use_case(config.use_case)
    examples = [row_to_example(row, use_case) for row in rows]
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    caches, servers = [], {}
    path = f"/v1/models/{config.model_name}:predict"
    try:
        for name, file in zip(SERVERS, (None, batching), strict=True):
            caches.append(Path(tempfile.mkdtemp(prefix="bench-serving-", dir=WORK_DIR)))
            servers[name] = _start_server(config, caches[-1], file)
            say(f"Starting `tkp serve` on port {servers[name][0]} (version {version}"
                f"{', --enable-batching' if file else ''}) ...")  # fmt: skip
        for port, server in servers.values():
            _wait_until_serving(config, port, server, version)
        model = tf.saved_model.load(str(caches[0] / config.model_name / str(version)))
        signature = model.signatures[SERVING_SIGNATURE]
        results = {"version": version, "requests": requests_per_size, "runs": [],
                   "batching": {"file": str(batching), **asdict(parameters)}}  # fmt: skip
        for size in batch_sizes:
            instances = [{"b64": base64.b64encode(e).decode()} for e in examples[:size]]
            body = json.dumps({"signature_name": SERVING_SIGNATURE, "instances": instances})
            batch = tf.constant(examples[:size])
            for threads in sorted(set(concurrencies)):
                say(f"{size} example(s) per request, {threads} at a time: {requests_per_size} "
                    "requests to `tkp serve`, the same with batching, then as many calls "
                    "in-process ...")  # fmt: skip
                figures = {name: _load(_http_caller(port, path, body.encode()),
                                       requests_per_size, threads)
                           for name, (port, _) in servers.items()}  # fmt: skip
                figures["in_process"] = _load(
                    lambda batch=batch: signature(examples=batch)["outputs"].numpy(),
                    requests_per_size, threads,
                )  # fmt: skip
                served, batched = figures["serve"], figures["serve_batching"]
                results["runs"].append({
                    "examples": size, "concurrency": threads, **figures,
                    "p50_ratio": round(served["p50_ms"] / max(figures["in_process"]["p50_ms"],
                                                              1e-3), 2),
                    "batching_throughput_ratio": round(batched["per_second"]
                                                       / served["per_second"], 2),
                })  # fmt: skip
        results["batching"].update(_batching_counts(servers["serve_batching"][0]))
    finally:
        for _, server in servers.values():
            stop_process(server, grace_seconds=60)
        for cache in caches:
            shutil.rmtree(cache, ignore_errors=True)
    return results


def _batching_counts(port: int) -> dict[str, int]:
    """From the batched server's own metrics (TF Serving's names): the requests it batched and
    the model calls they took, warm-up included."""
    from components.base.live_release import read_metrics
    from pipelines.serving import metrics

    text = read_metrics(f"http://127.0.0.1:{port}{metrics.PATH}")

    def count(name: str) -> int:
        return int(metrics.sample_value(text, ":tensorflow:serving:batching_session:" + name))

    return {"requests_batched": count("input_batch_size_count"),
            "model_calls": count("wrapped_run_count")}  # fmt: skip


def table(results: dict) -> str:
    lines = [f"Serving benchmark: version {results['version']}, {results['requests']} requests "
             "per row (serve: over HTTP to `tkp serve`; serve_batching: the same with "
             f"--enable-batching, {results['batching']['file']}; in_process: the SavedModel "
             "called here)",
             f"{'examples':>8} {'threads':>7}  {'where':<14} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'req/s':>8} {'rows/s':>9}"]  # fmt: skip
    for run in results["runs"]:
        for where in (*SERVERS, "in_process"):
            f = run[where]
            rows_per_second = f["per_second"] * run["examples"]
            lines.append(f"{run['examples']:>8} {run['concurrency']:>7}  {where:<14} "
                         f"{f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f} {f['per_second']:>8.1f} "
                         f"{rows_per_second:>9.0f}")  # fmt: skip
        lines.append(f"{'':>17}serve / in-process p50: {run['p50_ratio']:.2f}x; batching / "
                     f"none, requests/s: {run['batching_throughput_ratio']:.2f}x")  # fmt: skip
    counts = results["batching"]
    lines.append(f"With batching: {counts['requests_batched']} requests in "
                 f"{counts['model_calls']} model calls.")  # fmt: skip
    return "\n".join(lines)
