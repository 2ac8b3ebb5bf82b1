"""Where `tkp serve` sends a request that names no version or label during a release, and what
it records of each answer (pipelines/serving/metrics.py).

Release mode "canary": `canary_percent` of those requests go to the canary, spread evenly (the
n-th goes there when n x percent crosses a multiple of 100), the rest to `stable`. Mode "shadow":
`stable` answers each of them, and a copy is answered by the canary afterwards in a worker of its
own, recorded but never returned; when copies pile up (more than SHADOW_BACKLOG waiting) new ones
are dropped and counted (`tkp_serving_shadow_dropped_total`), so the work the shadow adds to
`stable`'s process is bounded. A request naming a version or a
label is never rerouted.

Fault drills (`drill`) make one version slower or failing on purpose, to try a release policy
end to end (the tests' "worse canary"): they act only on the version named, in this process.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pipelines.serving.tfs_json import ServingError

SHADOW_BACKLOG = 64


@dataclasses.dataclass
class Drill:
    delay_seconds: float = 0.0
    error_share: float = 0.0  # this share of its requests fail with 500 INTERNAL


class Router:
    def __init__(self) -> None:
        self.release: dict[str, Any] | None = None  # the release in force (its canary loaded)
        self.drills: dict[int, Drill] = {}
        self._split = itertools.count(1)
        self._failures: dict[int, itertools.count] = {}
        self._shadow = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shadow")
        self._backlog = threading.BoundedSemaphore(SHADOW_BACKLOG)

    def routed_version(self) -> tuple[str, bool]:
        """For a request naming neither version nor label: the label that answers it, and
        whether a copy goes to the canary (shadow mode)."""
        release = self.release
        if not release:
            return "stable", False
        if release["mode"] == "shadow":
            return "stable", True
        percent = release["policy"]["canary_percent"]
        n = next(self._split)
        to_canary = int(n * percent // 100) > int((n - 1) * percent // 100)
        return ("canary" if to_canary else "stable"), False

    def drill(self, version: int, delay_seconds: float = 0.0, error_share: float = 0.0) -> None:
        """Makes `version` slower by `delay_seconds` and failing for `error_share` of its
        requests, from now on in this process (a fault drill)."""
        self.drills[version] = Drill(delay_seconds, error_share)
        self._failures[version] = itertools.count(1)

    def apply_drill(self, version: int) -> None:
        drill = self.drills.get(version)
        if drill is None:
            return
        if drill.delay_seconds:
            time.sleep(drill.delay_seconds)
        n = next(self._failures[version])
        if int(n * drill.error_share) > int((n - 1) * drill.error_share):
            raise ServingError("INTERNAL", f"fault drill: version {version} fails this request")

    def shadow(self, answer) -> bool:
        """Runs `answer()` (the canary's copy) in the background unless the backlog is full
        (False: dropped)."""
        if not self._backlog.acquire(blocking=False):
            return False

        def run() -> None:
            try:
                answer()
            finally:
                self._backlog.release()

        self._shadow.submit(run)
        return True

    def stop(self) -> None:
        self._shadow.shutdown(wait=False, cancel_futures=True)
