"""The waiting Trainer step's heartbeat, which a multi-worker job's replicas watch.

A step killed outright (OOM, SIGKILL, a cancelled run: Argo's emissary signals the launcher and
the step together, and the container ends before the step's clean-up) cannot delete its job,
and on KFP 2.17's defaults no retry comes to delete it either: its replicas would hold their
GPUs until the job's deadline, hours later. So the step rewrites a small object in the job's
staging folder while it waits, and every replica stops once that object has not changed for
`timeout_seconds`: the first replica to exit fails the job (restartPolicy Never), and its
controller deletes the others. The replicas compare what they read, not timestamps, so clocks
need not agree, and a failing read counts as no change. The step beats between its polls and
while it retries failing API calls, so its longest silence is HEARTBEAT_SECONDS plus about two
calls' timeouts (kube_client.REQUEST_TIMEOUT): a few minutes. A store outage longer than the
timeout less those minutes stops the replicas, as a dead step would.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

from components.base import storage

_log = logging.getLogger(__name__)


class Heartbeat:
    """The step's side: `beat()` between polls rewrites the object at most every `seconds`."""

    def __init__(self, uri: str, seconds: float):
        self.uri, self.seconds = uri, seconds
        self.count, self.last = 0, float("-inf")

    def beat(self) -> None:
        if time.monotonic() - self.last < self.seconds:
            return
        self.count += 1
        try:
            storage.write_bytes(self.uri, str(self.count).encode())
            self.last = time.monotonic()
        except Exception as error:  # the store briefly away: the replicas tolerate a gap
            _log.warning("Could not write the job's heartbeat %s (%s)", self.uri, error)


def watch(uri: str, timeout_seconds: float, stop: Callable[[int], None] = os._exit) -> None:
    """The replica's side: a daemon thread that calls `stop(3)` once the heartbeat at `uri`
    has not changed for `timeout_seconds`."""
    poll = min(60.0, timeout_seconds / 5)

    def loop() -> None:
        seen, changed = None, time.monotonic()
        while True:
            time.sleep(poll)
            try:
                now_seen = storage.read_bytes(uri)
            except Exception:  # not there yet, or the store briefly away: no change
                now_seen = seen
            now = time.monotonic()
            if now_seen != seen:
                seen, changed = now_seen, now
            elif now - changed > timeout_seconds:
                _log.error(
                    "The Trainer step that started this job has not been heard from for %.0f s "
                    "(its heartbeat %s): it is gone (killed, or its run cancelled), so this "
                    "replica stops rather than train on for nobody",
                    now - changed,
                    uri,
                )
                stop(3)
                return

    threading.Thread(target=loop, name="heartbeat-watch", daemon=True).start()
