"""The embedded SeaweedFS server's keeper: it runs the server while any command of the project
uses it and stops it when the last one has ended, however that one ended.

`python -m components.base.store_supervisor DATA_DIR ENDPOINT -- weed server ...`, started by
EmbeddedObjectStore.start() in a session of its own (Ctrl-C in a terminal does not reach it).

Why a process of its own: the store must outlive the command that started it (a `serve` beside a
`run` keeps using it after the run ends), and it must still stop when the last user dies by
SIGKILL, when no clean-up of that user runs. Something alive has to notice that; the server
cannot, so this small process (stdlib only, about 12 MB resident) does, and the server dies with
it (kernel parent-death signal), so a killed supervisor leaves no server behind either.

A user's lease is a shared `flock` on USERS_LOCK that the command holds while it uses the store.
The kernel drops it when the command exits, whatever the way out (error, Ctrl-C, SIGTERM,
SIGKILL), so a dead user's lease cannot linger and a reused pid cannot inherit one. The supervisor
stops the server as soon as it can take that lock exclusively (no lease left), unless KEEP_FILE
names it (`--keep-store`). It checks under START_LOCK, the lock commands start or reuse the store
under, so a command that is attaching is never cut off; it only tries that lock, never waits on
it, so a command stopping the store under that lock (EmbeddedObjectStore.stop) never waits on it.
"""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from components.base.processes import die_with_parent, stop_process

PID_FILE = "store.pid"  # "<server pid> <endpoint> <supervisor pid>"
USERS_LOCK = "users.lock"
START_LOCK = ".start.lock"
KEEP_FILE = "keep"  # the pid of the supervisor whose store outlives its last user
CHECK_SECONDS = 0.25
GRACE_SECONDS = 0.5  # see EmbeddedObjectStore.stop: SeaweedFS's own shutdown takes 15-20 s


class _Stop(Exception):
    """A signal asked this supervisor to stop its server."""


def _raise_stop(signum: int, frame) -> None:
    raise _Stop


def try_lock(path: Path, mode: int):
    """`path` opened and flock-ed with `mode` without waiting; the open file, or None if held."""
    handle = open(path, "a")  # noqa: SIM115 (the caller keeps it open while it holds the lock)
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def unused(data_dir: Path) -> bool:
    """True when no command holds a lease; the caller holds START_LOCK."""
    users = try_lock(data_dir / USERS_LOCK, fcntl.LOCK_EX)
    if users is None:
        return False
    users.close()
    return True


def kept(data_dir: Path, supervisor_pid: int) -> bool:
    try:
        return (data_dir / KEEP_FILE).read_text().strip() == str(supervisor_pid)
    except OSError:
        return False


def _remove_own_files(data_dir: Path, server_pid: int) -> None:
    """The pid and keep files, if they still name this supervisor's server."""
    try:
        if (data_dir / PID_FILE).read_text().split()[0] == str(server_pid):
            (data_dir / PID_FILE).unlink()
    except (OSError, IndexError):
        pass
    if kept(data_dir, os.getpid()):
        (data_dir / KEEP_FILE).unlink(missing_ok=True)


def _remove_sockets(command: list[str]) -> None:
    """SeaweedFS's Unix sockets, which it leaves in /tmp whatever TMPDIR says: one per server
    and port (its gRPC port is the port + 10000)."""
    ports = [int(a.split("=")[1]) for a in command if re.fullmatch(r"-[a-z0-9.]*port=\d+", a)]
    for port in (p + offset for p in ports for offset in (0, 10000)):
        for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
            sock.unlink(missing_ok=True)


def _stopped_when_unused(data_dir: Path, server: subprocess.Popen) -> bool:
    start_lock = try_lock(data_dir / START_LOCK, fcntl.LOCK_EX)
    if start_lock is None:  # a command is starting, reusing or stopping the store: next time
        return False
    with start_lock:
        if kept(data_dir, os.getpid()) or not unused(data_dir):
            return False
        stop_process(server, GRACE_SECONDS)
        _remove_own_files(data_dir, server.pid)
        return True


def main(argv: list[str]) -> int:
    data_dir, endpoint, separator, *command = argv
    if separator != "--" or not command:
        print("usage: store_supervisor DATA_DIR ENDPOINT -- COMMAND...", file=sys.stderr)
        return 2
    data_dir = Path(data_dir)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, _raise_stop)
    server = subprocess.Popen(command, preexec_fn=die_with_parent)  # output: this process's
    ended_by_itself = None
    try:
        written = data_dir / f".{PID_FILE}.{os.getpid()}"
        written.write_text(f"{server.pid} {endpoint} {os.getpid()}\n")
        written.replace(data_dir / PID_FILE)  # readers never see half a line
        while server.poll() is None:
            time.sleep(CHECK_SECONDS)
            if _stopped_when_unused(data_dir, server):
                break
        else:
            ended_by_itself = server.returncode
    except _Stop:
        pass
    finally:
        stop_process(server, GRACE_SECONDS)
        _remove_own_files(data_dir, server.pid)
        _remove_sockets(command)
    # A server that ended by itself (a start that failed, `kill <pid>`): its code, for the
    # starter's message; a negative one (a signal) as a shell shows it.
    if ended_by_itself is None:
        return 0
    return 128 - ended_by_itself if ended_by_itself < 0 else ended_by_itself


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
