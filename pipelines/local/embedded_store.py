"""The object store a local command works against: the configured S3 endpoint, the embedded
SeaweedFS server already running under .work/seaweedfs, or one started for the command."""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

from components.base import console
from components.base.config import WORK_DIR, PipelineConfig
from components.base.object_store import EmbeddedObjectStore

_log = logging.getLogger(__name__)
STORE_DIR = WORK_DIR / "seaweedfs"  # the embedded store's folder in the work folder

# What every command loads after the store answers (boto3, TF Serving's config protos): loaded
# while the store starts (~3 s, spent waiting), in a thread, so a run with nothing new is quick.
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
    embedded: EmbeddedObjectStore | None = None  # the work folder's server, with this lease


@contextlib.contextmanager
def object_store(config: PipelineConfig, keep: bool = False) -> Iterator[Store]:
    """The S3 store for a command: the configured one (AWS_ENDPOINT_URL_S3), or the work folder's
    embedded server, reused when it runs, started otherwise. The command holds a lease on the
    embedded server until it leaves this block, whatever the way out (an error, Ctrl-C, SIGTERM,
    which the CLI turns into an exception, or SIGKILL, which drops the lease with the process);
    the server stops when the last lease is gone, unless `keep` (components/base/
    store_supervisor.py)."""
    store = EmbeddedObjectStore(STORE_DIR)
    configured = os.environ.get("AWS_ENDPOINT_URL_S3")
    recorded = store.read_pid_file()
    if configured and not (recorded and recorded[1] == configured.rstrip("/")):
        yield Store(configured, "configured")
        return
    # Not configured, or configured as the folder's own store (the line `tkp store` prints for
    # other shells): a user of it like any other, with a lease.
    if not s3_buckets(config):
        yield Store("", "none")
        return
    for module in _AFTER_STORE_START:
        threading.Thread(target=_import_quietly, args=(module,), daemon=True).start()
    console.say(f"Starting embedded object store (SeaweedFS) in {store.data_dir} ...")
    started = time.monotonic()
    store.start(detached=keep)
    if store.reused_pid:
        console.say(f"  already running at {store.endpoint} (pid {store.reused_pid}): reusing it")
    else:
        console.say(f"  listening at {store.endpoint} ({time.monotonic() - started:.1f} s)")
    failed = False
    try:
        for bucket in sorted(s3_buckets(config)):
            store.create_bucket(bucket)
        yield Store(store.endpoint, "reused" if store.reused_pid else "started", store)
    except BaseException:
        failed = True  # AWS_ENDPOINT_URL_S3 stays: the error's report names the store
        raise
    finally:
        outcome = store.stop()
        if outcome == "kept" and keep:
            stopper = store.supervisor_pid or store.pid  # its supervisor stops it at once
            console.say(
                f"Object store left running at {store.endpoint} (pid {store.pid}); the next "
                f"command reuses it; `kill {stopper}` stops it."
            )
        elif outcome == "in use" and not store.reused_pid:
            console.say(
                f"Object store left running at {store.endpoint}: another command uses it; it "
                "stops when the last one ends."
            )
        if not failed:
            os.environ.pop("AWS_ENDPOINT_URL_S3", None)


class StoreFollower:
    """For a command that runs until stopped and polls the store (serve, watch; tensorboard copies
    what it needs first and never touches the store while it serves): when its store stops
    answering, it finds the store the work folder's pid file now names, or starts one (the
    embedded store belongs to the work folder, and this command holds a lease on it), and says
    which; a configured store (AWS_ENDPOINT_URL_S3) is waited for. Each loss and each recovery is
    said once, however many polls fail in between; `keeps` says what the command does meanwhile.
    """

    def __init__(self, store: Store, say: Callable[[str], None], keeps: Callable[[], str]):
        self.store, self.say, self.keeps = store, say, keeps
        self.lost: str | None = None  # the endpoint that stopped answering

    def failed(self, error: BaseException) -> bool:
        """After a failed store call: True when the command should try again now (it follows
        another store); False when it should wait for its next poll. Errors other than an
        unreachable store are not this class's: False, and nothing said."""
        from components.base import store_errors

        if not store_errors.unreachable(error):
            return False
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3", self.store.endpoint)
        embedded = self.store.embedded
        if self.lost is None:
            self.lost = endpoint
            self.say(
                f"Object store at {endpoint} does not answer "
                f"({store_errors.short_reason(error)}); "
                f"{self.keeps()}; "
                + ("looking for the work folder's store." if embedded else
                   "trying again at every poll (the log has each attempt).")
            )  # fmt: skip
        if embedded is None:
            return False
        try:
            embedded.start(timeout_s=20)  # reuses the folder's live server, else starts one
        except Exception as e:  # said once per loss: the next poll tries again
            _log.warning("could not find or start the object store: %s", e)
            return False
        how = (f"already running (pid {embedded.reused_pid})" if embedded.reused_pid
               else f"started by this command (pid {embedded.pid})")  # fmt: skip
        self.say(f"Object store: now using {embedded.endpoint}, {how}.")
        self.lost = None
        return True

    def answered(self) -> None:
        """After a store call that worked: says once that a lost store answers again."""
        if self.lost is not None:
            self.say(f"Object store at {self.lost} answers again.")
            self.lost = None
