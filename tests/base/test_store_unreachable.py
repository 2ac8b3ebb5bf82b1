"""A store that gives no answer fails every store call within seconds, naming its endpoint; Beam's
long retries stay for answers that ask for them (5xx, throttling, 408), announced on the console.

Before, a store that refused connections held a step silent for 527 s: Beam retried each S3 call
7 times from 5 s, doubling (apache_beam/utils/retry.py, `with_exponential_backoff`), because its
filter retries an S3ClientError without a status code, which is what boto3's connection errors
become (apache_beam/io/aws/clients/s3/boto3_client.py).
"""

from __future__ import annotations

import time

import pytest
from apache_beam.io.aws.clients.s3.messages import S3ClientError
from apache_beam.io.filesystems import FileSystems
from apache_beam.utils import retry
from botocore.exceptions import EndpointConnectionError

from components.base import storage
from components.base.object_store import EmbeddedObjectStore


@pytest.fixture
def gone_store(tmp_path, monkeypatch):
    """A real SeaweedFS with one object in bucket `gone`, stopped: its port refuses connections."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)  # start() sets it; put back after
    store = EmbeddedObjectStore(tmp_path / "store" / "data").start()
    store.create_bucket("gone")
    storage.write_bytes("s3://gone/data/a.csv", b"x,y\n1,2\n")
    assert storage.list_files("s3://gone/data/*") == ["s3://gone/data/a.csv"]
    store.shutdown()
    return store.endpoint


@pytest.mark.parametrize(
    "call",
    [
        lambda: storage.list_files("s3://gone/data/*"),  # Beam's listing
        lambda: storage.read_bytes("s3://gone/data/a.csv"),  # Beam's open (metadata, then GETs)
        lambda: storage.open_stream("s3://gone/data/a.csv").read(),
        lambda: storage.write_bytes("s3://gone/data/b.csv", b"1"),  # boto3
        lambda: storage.content_tags("s3://gone/data"),  # boto3's paginator
        lambda: storage.copy_tree("s3://gone/data", "/tmp/never-written"),
        lambda: storage.check_reachable("s3://gone/data"),
    ],
    ids=["list", "read", "stream", "write", "tags", "copy", "reachable"],
)
def test_every_store_call_fails_within_seconds_naming_the_endpoint(gone_store, call):
    started = time.monotonic()
    with pytest.raises(storage.StorageError) as raised:
        call()
    assert time.monotonic() - started < 15
    assert gone_store in str(raised.value)


def test_beam_itself_gives_up_at_once_when_there_is_no_answer(gone_store):
    """Beam's own calls, as TFX's and tfx_bsl's Beam transforms make them inside a step."""
    for call in (FileSystems.exists, FileSystems.open, FileSystems.delete):
        started = time.monotonic()
        with pytest.raises(Exception) as raised:
            call(["s3://gone/data/a.csv"] if call is FileSystems.delete else "s3://gone/data/a.csv")
        assert time.monotonic() - started < 15, call
        assert storage.unreachable(raised.value), call
        assert gone_store in storage.store_error("reading", raised.value).args[0]


def test_a_refused_connection_of_anything_else_is_not_the_stores():
    import requests

    with pytest.raises(requests.ConnectionError) as raised:
        requests.get("http://127.0.0.1:9/", timeout=5)  # the discard port: nothing listens
    assert not storage.unreachable(raised.value)


def test_beam_retries_answers_that_ask_for_it_and_says_so(capsys):
    allowed = retry.retry_on_server_errors_and_timeout_filter  # the one s3io's listing uses
    assert allowed(S3ClientError("SlowDown: reduce your request rate", 503))
    assert allowed(S3ClientError("Request Timeout", 408))
    assert "the object store answered 503 SlowDown: reduce your request rate: retrying" in (
        capsys.readouterr().out
    )
    assert not allowed(S3ClientError("Access Denied", 403))
    try:
        try:
            raise EndpointConnectionError(endpoint_url="http://127.0.0.1:9/b")
        except Exception as e:
            raise S3ClientError(str(e), None)  # noqa: B904 (Beam's boto3 client raises it so)
    except S3ClientError as wrapped:
        assert wrapped.code is None  # which Beam's filter alone would retry for ~10 minutes
        assert not allowed(wrapped)
    assert capsys.readouterr().out == ""
