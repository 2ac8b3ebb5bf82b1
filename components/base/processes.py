"""Child processes that never outlive what they serve: stdlib only, so that the object store's
supervisor (components/base/store_supervisor.py) starts in a few tens of milliseconds."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator

_PR_SET_PDEATHSIG = 1
try:  # loaded in the parent: the child, between fork and exec, must only call it
    _PRCTL = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: signals still end in stop(), SIGKILL cannot
    _PRCTL = None


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies, however it dies (even SIGKILL);
    not SIGTERM, whose graceful shutdown takes SeaweedFS 15-20 s. Linux only; elsewhere nothing."""
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL)


def stop_process(process: subprocess.Popen, grace_seconds: float) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace_seconds`; nothing if it ended."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace_seconds)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def cleaned_up_even_on_sigterm(error: Callable[[], Exception],
                               clean_up: Callable[[], None]) -> Iterator[None]:  # fmt: skip
    """Runs the block, then `clean_up()` however it ends. In the main thread SIGTERM (a
    cancelled run: Argo's) raises `error()` in the block, and a second one cannot interrupt the
    clean-up; elsewhere (signals reach only the main thread) just the clean-up."""
    in_main = threading.current_thread() is threading.main_thread()
    if in_main:

        def raise_error(signum, frame) -> None:
            raise error()

        previous = signal.signal(signal.SIGTERM, raise_error)
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        try:
            clean_up()
        finally:
            if in_main:
                signal.signal(signal.SIGTERM, previous)
