"""Google Cloud Storage on loopback: gcp-storage-emulator (PyPI, pinned in requirements.lock), an
in-memory server of GCS's JSON API, started as its own process.

Boundary: it stands in for GCS itself, which cannot be reached from here. Beam's `gs://` file
system and google-cloud-storage reach it through `STORAGE_EMULATOR_HOST` (google-cloud-storage's
`_get_storage_emulator_override`); `components/base/storage.py` then connects anonymously.
What it does not play (gcp_storage_emulator/handlers/objects.py, 2026.7.19), so no test may lean
on it: authentication and IAM (it accepts any request); paging (a listing comes back whole, never
with a `nextPageToken`, where GCS pages at 1,000 objects); preconditions, except on uploads:
tests/stand_ins/gcs_emulator_main.py plays an upload's `ifGenerationMatch` and refuses its other
preconditions, while those of deletes, copies and composes are still ignored (nothing here sends
them); errors a real bucket answers (429 rate limits, 5xx), so no retry is
exercised. TensorFlow's own `gs://` client cannot be pointed at it (its endpoints are compiled
in), so any `gs://` read that bypasses the project's storage layer fails here instead of
passing: that is what the `gs://` tests prove.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import requests

from tests.pipelines.serving.test_serve_reload import free_port


@contextlib.contextmanager
def running(bucket: str, log: Path) -> Iterator[str]:
    """An emulator holding an empty `bucket`, its output in `log`; yields the value of
    STORAGE_EMULATOR_HOST."""
    port = free_port()
    output = log.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.stand_ins.gcs_emulator_main", "start", "--host",
         "127.0.0.1", "--port", str(port), "--default-bucket", bucket, "--in-memory", "--quiet"],
        stdout=output, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    host = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert process.poll() is None, f"gcp-storage-emulator exited: {log.read_text()}"
            assert time.monotonic() < deadline, "gcp-storage-emulator did not listen within 30 s"
            time.sleep(0.2)
        yield host
    finally:
        process.terminate()
        process.wait(timeout=30)
        output.close()


def object_names(host: str, bucket: str, prefix: str) -> list[str]:
    """The names under `prefix`, asked of the emulator's JSON API directly (not through the code
    under test)."""
    names, token = [], None
    while True:
        params = {"prefix": prefix, **({"pageToken": token} if token else {})}
        answer = requests.get(f"{host}/storage/v1/b/{bucket}/o", params=params, timeout=30)
        answer.raise_for_status()
        body = answer.json()
        names += [item["name"] for item in body.get("items", [])]
        token = body.get("nextPageToken")
        if not token:
            return names
