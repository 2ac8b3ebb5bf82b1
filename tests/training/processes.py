"""The worker processes a test started (trial workers, replicas, local workers), found by the
module they run: what a test kills mid-training and checks that none outlived its step."""

from __future__ import annotations

import psutil


def running(module: str, parent: int | None = None) -> list[psutil.Process]:
    """The descendants of `parent` (default: this process) whose command line runs `module`,
    still running (an exited one not yet reaped is not)."""
    found = []
    for process in psutil.Process(parent).children(recursive=True):
        try:
            if module in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:  # exited (a zombie until reaped) or gone
            pass
    return found
