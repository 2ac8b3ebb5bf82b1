"""The object store a local command works against: the configured S3 endpoint, the embedded
SeaweedFS server already running under .work/seaweedfs, or one started for the command."""

from __future__ import annotations

import contextlib
import importlib
import os
import threading
import time
from collections.abc import Iterator
from typing import NamedTuple

from components.base import console
from components.base.config import WORK_DIR, PipelineConfig
from components.base.object_store import EmbeddedObjectStore

# What every command loads after the store answers (Beam's file systems, pandas, ~1.5 s): loaded
# while the store starts (~2 s, spent waiting), in a thread, so a run with nothing new is quick.
_AFTER_STORE_START = ("pipelines.data", "components.base.registry")


def _import_quietly(module: str) -> None:
    """An import ahead of its use; a failure shows where the module is used, not here."""
    with contextlib.suppress(Exception):
        importlib.import_module(module)


def s3_buckets(config: PipelineConfig) -> set[str]:
    roots = (config.data_root, config.serving_root, config.pipeline_root)
    return {root[len("s3://") :].split("/")[0] for root in roots if root.startswith("s3://")}


class Store(NamedTuple):
    endpoint: str
    kind: str  # "configured" (AWS_ENDPOINT_URL_S3), "none" (no s3:// paths), "reused", "started"


@contextlib.contextmanager
def object_store(config: PipelineConfig, keep: bool = False) -> Iterator[Store]:
    """The S3 store for a command: the configured one (AWS_ENDPOINT_URL_S3), the embedded server
    already running on .work/seaweedfs, or one started now and stopped on the way out, whatever
    the way out (an error, Ctrl-C, or SIGTERM, which the CLI turns into an exception), unless
    `keep`."""
    if os.environ.get("AWS_ENDPOINT_URL_S3"):
        yield Store(os.environ["AWS_ENDPOINT_URL_S3"], "configured")
        return
    if not s3_buckets(config):
        yield Store("", "none")
        return
    for module in _AFTER_STORE_START:
        threading.Thread(target=_import_quietly, args=(module,), daemon=True).start()
    store = EmbeddedObjectStore(WORK_DIR / "seaweedfs")
    console.say(f"Starting embedded object store (SeaweedFS) in {store.data_dir} ...")
    started = time.monotonic()
    store.start(detached=keep)
    if store.reused_pid:
        console.say(f"  already running at {store.endpoint} (pid {store.reused_pid}): reusing it")
    else:
        console.say(f"  listening at {store.endpoint} ({time.monotonic() - started:.1f} s)")
    try:
        for bucket in sorted(s3_buckets(config)):
            store.create_bucket(bucket)
        yield Store(store.endpoint, "reused" if store.reused_pid else "started")
    finally:
        if keep and store.process:
            console.say(
                f"Object store left running at {store.endpoint} (pid {store.pid}); the next "
                f"command reuses it; `kill {store.pid}` stops it."
            )
        else:
            store.stop()
        os.environ.pop("AWS_ENDPOINT_URL_S3", None)
