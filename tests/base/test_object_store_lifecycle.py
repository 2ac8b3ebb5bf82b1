"""The embedded object store's life cycle, with the real `weed` binary and the CLI as users run it.

A signal to the CLI ends in the same clean-up as an error; a server whose CLI died anyway dies
with it; a second start on a folder whose server is alive reuses it; a server left on the folder
by something else is named with what to do, and SeaweedFS's own error line reaches the user.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time

import boto3
import pytest

from components.base.object_store import EmbeddedObjectStore, StoreError
from tests.pipelines import cli_process
from tests.pipelines.cli_process import SENTINEL_KEY_ID, alive, store_pid, wait_gone


@pytest.fixture
def own_environment(monkeypatch):
    """start() in this process sets AWS_ENDPOINT_URL_S3; put the session's store back after."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)


def test_sigterm_to_store_stops_seaweedfs_and_the_key_is_never_printed(tmp_path, cli_in_background):
    store = cli_in_background("store")
    export = store.wait_for("export AWS_ENDPOINT_URL_S3=")
    weed = store_pid(tmp_path)
    assert alive(weed)
    # The printed line works when pasted into a shell, and the store accepts its made-up key.
    shell = subprocess.run(
        ["bash", "-c", f"{export.strip()} && printenv AWS_ENDPOINT_URL_S3 AWS_ACCESS_KEY_ID"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert shell.returncode == 0, shell.stderr
    endpoint, key_id = shell.stdout.split()
    assert key_id == "any"
    any_key = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="any",
                           aws_secret_access_key="any", region_name="us-east-1")  # fmt: skip
    any_key.put_object(Bucket="tfx-pipeline", Key="hello.txt", Body=b"hi")
    assert any_key.get_object(Bucket="tfx-pipeline", Key="hello.txt")["Body"].read() == b"hi"

    store.process.send_signal(signal.SIGTERM)
    code, out, err = store.finish()

    assert code == 128 + signal.SIGTERM
    assert "Stopping: received SIGTERM" in err
    assert not alive(weed)
    assert not (tmp_path / "seaweedfs" / EmbeddedObjectStore.PID_FILE).exists()
    assert "AWS_ACCESS_KEY_ID=any " in out
    assert SENTINEL_KEY_ID not in out + err


def test_seaweedfs_stops_within_seconds_when_its_only_user_is_sigkilled(
    tmp_path, own_environment, cli_in_background
):
    store = cli_in_background("store")
    store.wait_for("export AWS_ENDPOINT_URL_S3=")
    weed = store_pid(tmp_path)

    store.process.kill()  # no clean-up runs: the kernel drops its lease, the supervisor sees it
    store.finish()

    assert wait_gone(weed, timeout=5)
    restarted = EmbeddedObjectStore(tmp_path / "seaweedfs").start()
    try:
        assert restarted.reused_pid is None and restarted.pid != weed
    finally:
        restarted.stop()


def test_a_running_store_is_reused_by_the_next_command_and_left_running(tmp_path, own_environment):
    kept = EmbeddedObjectStore(tmp_path / "seaweedfs").start(detached=True)  # as --keep-store
    try:
        added = cli_process.run(tmp_path, "add-span", "--rows", "50", timeout=180)
        assert added.returncode == 0, added.stderr
        assert f"already running at {kept.endpoint} (pid {kept.pid}): reusing it" in added.stdout
        assert "Wrote span 0 (50 rows" in added.stdout
        assert alive(kept.pid)  # not the command's to stop

        again = cli_process.run(tmp_path, "store", timeout=180)
        assert again.returncode == 0, again.stderr
        assert f"Nothing to start: the store of this folder answers at {kept.endpoint}" in (
            again.stdout
        )
    finally:
        kept.shutdown()


def test_a_server_without_pid_file_on_the_folder_is_named_with_what_to_do(
    tmp_path, own_environment
):
    first = EmbeddedObjectStore(tmp_path / "seaweedfs").start()
    try:
        first.pid_file.unlink()  # as left by an older version of this project
        with pytest.raises(StoreError) as raised:
            EmbeddedObjectStore(tmp_path / "seaweedfs").start()
        assert f"SeaweedFS (pid {first.pid}) uses {first.data_dir}" in str(raised.value)
        assert f"`kill {first.pid}`" in str(raised.value)
    finally:
        first.stop()


def test_seaweedfs_exiting_early_shows_its_own_error_line(tmp_path, own_environment):
    """A server that reached the folder by another path holds SeaweedFS's lock: the start fails
    with SeaweedFS's reason, not just an exit code."""
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    other = EmbeddedObjectStore(tmp_path / "real")
    other.data_dir = tmp_path / "link"  # its command line names the folder by the link
    other.start()
    try:
        with pytest.raises(StoreError) as raised:
            EmbeddedObjectStore(tmp_path / "real").start(timeout_s=60)
        message = str(raised.value)
        assert "SeaweedFS exited with code" in message
        assert "resource temporarily unavailable" in message
        assert str(tmp_path / "seaweedfs.log") in message
    finally:
        other.stop()


def test_a_port_taken_between_its_choice_and_seaweedfs_binding_it_is_chosen_again(
    tmp_path, own_environment, monkeypatch
):
    """The ports are picked free, then bound by SeaweedFS a moment later; another process may
    take one in between (CI46: the volume's gRPC port). The first start's volume port is held
    here, so SeaweedFS fails to bind it; the store starts on new ports."""
    from components.base import object_store

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    taken = held.getsockname()[1] - 10000  # SeaweedFS puts the volume's gRPC port at +10000
    chosen = iter([object_store._free_port_pair(), object_store._free_port_pair(), taken,
                   object_store._free_port_pair()])  # fmt: skip
    real = object_store._free_port_pair
    monkeypatch.setattr(object_store, "_free_port_pair", lambda: next(chosen, None) or real())
    store = EmbeddedObjectStore(tmp_path / "seaweedfs")
    try:
        store.start()
        assert boto3.client("s3", endpoint_url=store.endpoint).list_buckets() is not None
        log = store.log_path.read_text()
        assert f"{taken + 10000}" in log and "address already in use" in log  # the first try
    finally:
        store.stop()
        held.close()


def test_store_log_handle_is_closed_in_the_parent(tmp_path, own_environment):
    store = EmbeddedObjectStore(tmp_path / "seaweedfs").start()
    try:
        mine = subprocess.run(
            ["ls", "-l", f"/proc/{os.getpid()}/fd"], capture_output=True, text=True
        ).stdout
        assert str(store.log_path) not in mine
    finally:
        store.stop()


def test_store_with_a_configured_endpoint_says_there_is_nothing_to_start(tmp_path):
    result = cli_process.run(tmp_path, "store", AWS_ENDPOINT_URL_S3="http://127.0.0.1:9")
    assert result.returncode == 1
    assert "AWS_ENDPOINT_URL_S3 is set (http://127.0.0.1:9)" in result.stderr
    assert not (tmp_path / "seaweedfs").exists()


def test_a_command_given_the_endpoint_store_prints_is_a_user_of_the_folders_store(
    tmp_path, cli_in_background
):
    store = cli_in_background("store")
    export = store.wait_for("export AWS_ENDPOINT_URL_S3=")
    endpoint = export.split("AWS_ENDPOINT_URL_S3=")[1].split()[0]
    weed = store_pid(tmp_path)
    added = cli_process.run(tmp_path, "add-span", "--rows", "50", AWS_ENDPOINT_URL_S3=endpoint)
    assert added.returncode == 0, added.stderr
    assert f"already running at {endpoint} (pid {weed}): reusing it" in added.stdout
    # A watcher with that endpoint holds a lease: `store` ending does not stop the store under it.
    watcher = cli_in_background("watch", "--interval", "5", AWS_ENDPOINT_URL_S3=endpoint)
    watcher.wait_for("reusing it")
    store.process.send_signal(signal.SIGTERM)
    store.finish()
    assert alive(weed)
    watcher.process.send_signal(signal.SIGTERM)
    watcher.finish(timeout=120)
    assert wait_gone(weed, timeout=10)


def test_watch_once_against_a_store_that_is_not_there_fails_at_once(tmp_path):
    started = time.monotonic()
    result = cli_process.run(tmp_path, "watch", "--once", timeout=120,
                             AWS_ENDPOINT_URL_S3="http://127.0.0.1:9")  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert "at http://127.0.0.1:9" in result.stderr and "Could not connect" in result.stderr
    assert time.monotonic() - started < 60
