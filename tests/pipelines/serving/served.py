"""What the serving tests share: publishing a version as the Pusher does, and `tkp serve`'s server
on a serving folder in a thread on loopback (the model manager that mirrors the folder, and the
HTTP server in front of it), stopped when the test is done."""

from __future__ import annotations

import contextlib
import csv
import io
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import tensorflow as tf

from components.base import release, serving_state
from components.steps import warmup
from components.steps.pusher import push_version
from pipelines.serving.batching import BatchingParameters
from pipelines.serving.model_server import ModelManager
from pipelines.serving.serve import start_in_thread


def frame_rows(frame) -> list[dict[str, str]]:
    """DataFrame rows as a client reads them from a span's CSV file (pipelines/data.py)."""
    return list(csv.DictReader(io.StringIO(frame.to_csv(index=False, na_rep=""))))


def judge_until(condition, what: str, judge=None, timeout: float = 180.0) -> None:
    """Runs `watch`'s release check (`judge`, as its CronJob would, more often) until
    `condition` holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        if judge:
            judge()
        time.sleep(0.5)


def push(folder: str, model: str, model_dir: str, version: int, examples: list[bytes],
         mode: str = "immediate") -> None:  # fmt: skip
    """What the Pusher publishes: the files, the warm-up requests, then the release (`mode`:
    the config's release_mode) judged against the stable version."""
    rows = [tf.train.Example.FromString(e) for e in examples]
    pb = open(f"{model_dir}/saved_model.pb", "rb").read()
    extra = {warmup.WARMUP_PATH: warmup.warmup_records(model, pb, rows)}
    push_version(model_dir, folder, version, extra)
    stable = serving_state.read(folder, model, unreleased=version).stable
    release.release_pushed(folder, model, version, stable, mode, why="push")


@dataclass
class Serving:
    url: str  # the server's root, http://127.0.0.1:<port>
    manager: ModelManager
    said: list[str] = field(default_factory=list)  # what the manager said, in order


@contextlib.contextmanager
def serving(model: str, folder: str, cache: Path, batching: BatchingParameters | None = None,
            **server_options) -> Iterator[Serving]:  # fmt: skip
    """`tkp serve` on `folder`: the versions there are polled (every 0.3 s) and loaded into a
    mirror under `cache` before the server answers; with `batching`, --enable-batching."""
    manager = ModelManager(model, folder, cache, poll_seconds=0.3, batching=batching)
    running = Serving(url="", manager=manager)
    manager.on_change = running.said.append
    manager.poll()
    manager.start()
    try:
        server = start_in_thread(manager, **server_options)
    except BaseException:
        manager.stop()
        raise
    running.url = server.url
    try:
        yield running
    finally:
        server.stop()
        manager.stop()
