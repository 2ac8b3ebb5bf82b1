"""`tkp bench-serving`: latency and throughput of `tkp serve`, next to the SavedModel called in
this process on the same rows, under the same bounded load (fixed count, fixed concurrency).

The server runs as its own process (`tkp serve`, as users run it); this process only sends
prepared request bodies over keep-alive connections, so the figures are the server's. Both
sides are measured in one run, so their ratio holds on a noisy machine.
"""

from __future__ import annotations

import base64
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from components import registry
from components.model import SERVING_SIGNATURE
from pipelines import storage
from pipelines.config import WORK_DIR, PipelineConfig
from pipelines.errors import ActionableError


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _eval_rows(config: PipelineConfig, version: int, limit: int) -> list[dict[str, str]]:
    from pipelines.serving import read_rows

    record = registry.read_record(config.serving_model_dir, version) or {}
    data_root = record.get("data_root") or config.data_root
    files = storage.list_files(storage.join(data_root, f"span-{record.get('span', 0)}", "*.csv"))
    if not files:
        raise BenchError(f"no CSV file of version {version}'s span under {data_root}")
    return read_rows(files[0], limit)


def run(config: PipelineConfig, requests_per_size: int, concurrency: int, batch_sizes: list[int],
        say: Callable[[str], None]) -> dict:  # fmt: skip
    import tensorflow as tf

    from pipelines.serving import row_to_example

    folder = config.serving_model_dir
    version = registry.served_version(folder, config.model_name)
    if version is None:
        raise BenchError(f"no version is pushed under {folder}: run `make run` first")
    rows = _eval_rows(config, version, max(batch_sizes))
    examples = [row_to_example(row) for row in rows]
    port = _free_port()
    cache = Path(tempfile.mkdtemp(prefix="bench-serving-", dir=WORK_DIR))
    command = [sys.executable, "-m", "pipelines.cli", "serve", "--port", str(port),
               "--cache-dir", str(cache)]  # fmt: skip
    say(f"Starting `tkp serve` on port {port} (version {version}) ...")
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              env=dict(os.environ))  # fmt: skip
    url = f"http://127.0.0.1:{port}/v1/models/{config.model_name}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if requests.get(url, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise BenchError("`tkp serve` did not come up; run it alone to see why")
            time.sleep(0.5)
        model = tf.saved_model.load(str(cache / config.model_name / str(version)))
        signature = model.signatures[SERVING_SIGNATURE]
        results = {"version": version, "requests": requests_per_size,
                   "concurrency": concurrency, "sizes": {}}  # fmt: skip
        for size in batch_sizes:
            instances = [{"b64": base64.b64encode(e).decode()} for e in examples[:size]]
            body = json.dumps(
                {"signature_name": SERVING_SIGNATURE, "instances": instances}
            ).encode()
            local_session = threading.local()  # one keep-alive connection per thread

            def over_http(body=body, local_session=local_session) -> None:
                if not hasattr(local_session, "session"):
                    local_session.session = requests.Session()
                session = local_session.session
                response = session.post(f"{url}:predict", data=body, timeout=30)
                if response.status_code != 200:
                    raise BenchError(f"the server answered {response.status_code}: "
                                     f"{response.text[:200]}")  # fmt: skip

            batch = tf.constant(examples[:size])

            def in_process(batch=batch) -> None:
                signature(examples=batch)["outputs"].numpy()

            say(f"{size} example(s) per request: {requests_per_size} requests, "
                f"{concurrency} at a time ...")  # fmt: skip
            served, local = _load(over_http, requests_per_size, concurrency), _load(
                in_process, requests_per_size, concurrency)  # fmt: skip
            results["sizes"][str(size)] = {"serve": served, "in_process": local,
                "p50_ratio": round(served["p50_ms"] / max(local["p50_ms"], 1e-3), 2)}  # fmt: skip
    finally:
        server.terminate()
        server.wait(timeout=60)
    return results


def table(results: dict) -> str:
    lines = [f"Serving benchmark: version {results['version']}, {results['requests']} requests "
             f"per row, {results['concurrency']} concurrent",
             f"{'examples':>8}  {'where':<11} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} "
             f"{'rows/s':>9}"]  # fmt: skip
    for size, figures in results["sizes"].items():
        for where in ("serve", "in_process"):
            f = figures[where]
            rows_per_second = f["per_second"] * int(size)
            lines.append(f"{size:>8}  {where:<11} {f['p50_ms']:>8.2f} {f['p99_ms']:>8.2f} "
                         f"{f['per_second']:>8.1f} {rows_per_second:>9.0f}")  # fmt: skip
        lines.append(f"{'':>8}  serve / in-process p50: {figures['p50_ratio']:.2f}x")
    return "\n".join(lines)
