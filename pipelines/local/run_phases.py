"""Where a `tkp run`'s wall time goes, for its `--timings` file (and `tkp bench`'s accounting).

The phases are measured in the process, in the order they happen: the interpreter's start and
the CLI's imports (from the process's start, as the kernel records it), the object store's
start, the data check, TFX's import and the pipeline's compilation, the steps (each, from the
runner's step progress), the orchestration between them, the summary and run report, the
sample predictions and the store's stop. What the process spends after the last phase (its
exit) only its parent can see: the bench measures it as its wall time less these.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path


def clock_tick_seconds() -> float:
    """The resolution of a process's start time as the kernel records it: one clock tick."""
    try:
        return 1 / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, AttributeError):
        return 0.01


def process_age_seconds() -> float:
    """Seconds since this process started (Linux: /proc/self/stat's starttime, in clock ticks
    since boot, against CLOCK_BOOTTIME); 0.0 where the kernel does not say. The start is counted
    in whole ticks, so the age can be up to one tick (`clock_tick_seconds`, 10 ms) too long."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started = int(fields[19]) * clock_tick_seconds()  # field 22 of the whole line
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class RunPhases:
    """Seconds of each phase of one run, in order; written with the steps to a timings file."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"process start and CLI imports": process_age_seconds()}
        self.steps: dict[str, dict] = {}  # the runner's step progress, when the pipeline ran

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.monotonic() - started

    def write(self, path: Path | None) -> None:
        """{"phases": {phase: seconds}, "steps": {step: {seconds, ran, peak_gb}}} to `path`."""
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"phases": self.seconds, "steps": self.steps}, indent=1))
