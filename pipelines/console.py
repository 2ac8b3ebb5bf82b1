"""What reaches the console, and what goes to the command's log file instead.

The console shows progress, results and errors. Everything else (TensorFlow's C++ log lines,
absl and Python warnings, Beam's and TFX's logging) goes to the log file: the libraries write to
file descriptors 1 and 2 from C++ as well as from Python, so the descriptors themselves are
redirected, and Python's `sys.stdout` is pointed back at the terminal for the project's own output.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from pipelines.config import WORK_DIR

# Where the project's own error lines go: the terminal's stderr, also while fd 2 is redirected.
err: TextIO = sys.stderr


def new_log_path(command: str) -> Path:
    """A log file name that no earlier command used (time stamp and process id)."""
    return WORK_DIR / "logs" / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextlib.contextmanager
def output_to_log(log_path: Path) -> Iterator[TextIO]:
    """Sends fds 1 and 2 to `log_path` while `sys.stdout` (print) and `console.err` stay on the
    terminal; yields the log file, for writing a traceback to it."""
    global err
    log_path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal_out = os.fdopen(os.dup(1), "w", buffering=1)
    terminal_err = os.fdopen(os.dup(2), "w", buffering=1)
    previous_stdout, previous_err = sys.stdout, err
    with open(log_path, "a", buffering=1) as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        sys.stdout, err = terminal_out, terminal_err
        try:
            yield log
        finally:
            for stream in (sys.stdout, sys.stderr, terminal_err):
                stream.flush()
            sys.stdout, err = previous_stdout, previous_err
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for descriptor in saved:
                os.close(descriptor)
            terminal_out.close()
            terminal_err.close()
