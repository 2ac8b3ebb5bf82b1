"""The CLI as a user starts it: `python -m pipelines.cli ...` in its own process and work folder."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

from components.base.object_store import EmbeddedObjectStore

# Credentials nothing may print, log, store or compile. SeaweedFS accepts any key.
SENTINEL_KEY_ID = "AKIASENTINELKEY7QX4"
SENTINEL_SECRET = "sentinel-secret-9b1f0c7e4d2a"


def environment(work_dir: Path, **extra: str) -> dict[str, str]:
    """The test process's environment without its object store, in a work folder of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PIPELINE_"))}
    env.update(
        PIPELINE_WORK_DIR=str(work_dir),
        AWS_ACCESS_KEY_ID=SENTINEL_KEY_ID,
        AWS_SECRET_ACCESS_KEY=SENTINEL_SECRET,
        AWS_REGION="us-east-1",
    )
    env.update(extra)
    return env


def run(work_dir: Path, *args: str, timeout: float = 600, **extra: str):
    """Runs one CLI command to its end; returns the CompletedProcess (text output)."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=environment(work_dir, **extra),
    )


class Background:
    """A CLI command left running (`store`), whose output lines can be waited for. Use it as a
    context manager: a test that fails half-way must not leave the command and its store."""

    def __enter__(self) -> Background:
        return self

    def __exit__(self, *exc) -> None:
        if self.process.poll() is None:
            self.process.kill()  # its store stops unless another command uses it
            self.process.wait(timeout=30)

    def __init__(self, work_dir: Path, *args: str, **extra: str):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipelines.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=environment(work_dir, **extra),
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.put(line)

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.process.poll() is not None:
                    break
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(
            f"no line with {text!r}; output so far: {self.seen}; "
            f"stderr: {self.process.stderr.read() if self.process.poll() is not None else '…'}"
        )

    def finish(self, timeout: float = 60) -> tuple[int, str, str]:
        """Waits for the command to end: (exit code, everything it printed, its stderr). Its
        stdout is read by the reader thread alone (a second reader would take lines from it);
        stderr holds only the console's error lines, which no pipe buffer fills."""
        self.process.wait(timeout=timeout)
        self._reader.join(timeout=30)
        err = self.process.stderr.read()
        while not self.lines.empty():
            self.seen.append(self.lines.get())
        return self.process.returncode, "".join(self.seen), err


def recorded_store(work_dir: Path) -> tuple[int, str]:
    """(server pid, endpoint) from the pid file of the work folder's embedded store."""
    recorded = EmbeddedObjectStore(work_dir / "seaweedfs").read_pid_file()
    assert recorded, f"no store recorded in {work_dir / 'seaweedfs'}"
    return recorded[0], recorded[1]


def store_pid(work_dir: Path) -> int:
    return recorded_store(work_dir)[0]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float = 40) -> bool:
    deadline = time.monotonic() + timeout
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not alive(pid)
