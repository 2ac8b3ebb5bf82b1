"""What reaches the console, and what goes to the command's log file instead.

The console shows progress, results and errors: the project writes them with `say` and `error`.
Everything else (TensorFlow's C++ log lines, absl and Python warnings, Keras' training lines,
Beam's and TFX's logging) goes to the log file: libraries write to file descriptors 1 and 2 from
C++ as well as from Python (`sys.stdout`, `sys.stderr`), so while a command runs both descriptors
point at the log, and only `say` and `error` hold on to the terminal.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from components.base.config import WORK_DIR

# The terminal while output_to_log is active; None means "sys.stdout / sys.stderr as they are".
_out: TextIO | None = None
_err: TextIO | None = None


def out() -> TextIO:
    """The stream for progress and results."""
    return _out or sys.stdout


def say(*parts: object) -> None:
    print(*parts, file=out(), flush=True)


def error(*parts: object) -> None:
    print(*parts, file=_err or sys.stderr, flush=True)


def new_log_path(command: str) -> Path:
    """A log file name that no earlier command used (time stamp and process id)."""
    return WORK_DIR / "logs" / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextlib.contextmanager
def output_to_log(log_path: Path) -> Iterator[TextIO]:
    """Sends fds 1 and 2, and so `sys.stdout` and `sys.stderr`, to `log_path` while `say` and
    `error` keep writing to the terminal; yields the log file, for writing a traceback to it."""
    global _out, _err
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal_out = os.fdopen(os.dup(1), "w", buffering=1)
    terminal_err = os.fdopen(os.dup(2), "w", buffering=1)
    with open(log_path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        _out, _err = terminal_out, terminal_err
        try:
            yield log
        finally:
            for stream in (sys.stdout, sys.stderr, terminal_out, terminal_err):
                stream.flush()
            _out = _err = None
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)
            terminal_out.close()
            terminal_err.close()
