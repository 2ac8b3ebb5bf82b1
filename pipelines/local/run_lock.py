"""One pipeline run at a time per work folder: a second run refuses at start, naming the first.

Why refuse rather than run both: the runs share the work folder's ML Metadata (SQLite, which
TFX's local runner opens without any wait for a writer, so a second writer fails on "database is
locked") and its pipeline root; both would read the same newest span and train on the same data
for the same decision, on a machine whose cores the first run already uses; and the second one's
"is there anything new?" depends on what the first one pushes. Waiting in a queue would look
like a hang. A user who wants two runs at once gives the second a work folder of its own.
`watch` does not refuse: a span that lands while a run is going runs at a later poll.

The lock is an exclusive `flock` on `<work folder>/run.lock`, held by the run's process: the
kernel drops it when that process ends, however (SIGKILL included), so a crashed run never
blocks the next one. The file holds the holder's pid, start time and command line, for the
message of the one refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from components.base.config import WORK_DIR
from components.base.errors import ActionableError

LOCK_NAME = "run.lock"


class RunBusy(ActionableError, RuntimeError):
    """Another run holds the work folder; `waiting` says which, for a caller that waits."""

    def __init__(self, message: str, waiting: str):
        super().__init__(message)
        self.waiting = waiting


def holder(path: Path) -> tuple[str | None, str]:
    """(pid, "pid 123, `tkp run ...`, since 2026-12-02 10:02:03") of the holder, as the lock
    file says; (None, ...) when it has not said."""
    for _ in range(20):  # the holder writes its line just after it takes the lock
        try:
            pid, since, command = path.read_text().rstrip("\n").split("\t", 2)
            return pid, f"pid {pid}, `{command}`, since {since}"
        except (OSError, ValueError):
            time.sleep(0.05)
    return None, "a process that has not said which"


@contextlib.contextmanager
def exclusive_run(command: str, work_dir: Path = WORK_DIR) -> Iterator[None]:
    """Holds the work folder's run lock for the block; raises RunBusy at once when another run
    holds it."""
    path = work_dir / LOCK_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, who = holder(path)
            waiting = f"another run is using the work folder {work_dir} ({who})"
            stop = f", or stop it with `kill {pid}`" if pid else ""
            raise RunBusy(
                f"{waiting}; one run at a time per work folder. Wait for it to end and start "
                f"this one again (with nothing new it ends in seconds){stop}.",
                waiting,
            ) from None
        try:
            lock.truncate(0)
            lock.write(f"{os.getpid()}\t{time.strftime('%Y-%m-%d %H:%M:%S')}\t{command}\n")
            lock.flush()
            yield
        finally:
            lock.truncate(0)  # before the lock is dropped: a reader never sees a stale holder
