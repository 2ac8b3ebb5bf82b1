"""A run's recorded "nothing new" answer (pipelines/local/unchanged_store.py) is given again only
while nothing can have changed: the same config and code, no store running, the store's folder
as the recording run left it, everything the check reads inside that store.

A real SeaweedFS on the folder: any start of it changes the folder, so a record made before is
never answered from afterwards. (The CLI's use of it: tests/pipelines/test_cli.py.)"""

from __future__ import annotations

import dataclasses

from components.base.config import PipelineConfig
from components.base.object_store import EmbeddedObjectStore, s3_client
from pipelines.local import unchanged_store

LINES = ["no new data since span 0: ...", "Served: s3://tfx-pipeline/serving/taxi-tips/1"]


def test_an_answer_is_given_again_only_while_nothing_can_have_changed(tmp_path, monkeypatch):
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)  # restored after the test
    folder = tmp_path / "seaweedfs"
    config = PipelineConfig.load({})
    store = EmbeddedObjectStore(folder).start()
    try:
        store.create_bucket("tfx-pipeline")
        unchanged_store.remember(config, folder, LINES)  # the store runs: nothing is recorded
        assert not (tmp_path / unchanged_store.RECORD_NAME).exists()
    finally:
        store.stop()
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)  # the store's start set it

    unchanged_store.remember(config, folder, LINES)
    assert unchanged_store.recall(config, folder) == LINES
    assert unchanged_store.recall(dataclasses.replace(config, span=3), folder) is None
    assert unchanged_store.recall(dataclasses.replace(config, force=1), folder) is None
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9")  # another store's data
    assert unchanged_store.recall(config, folder) is None
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3")
    assert unchanged_store.recall(config, folder) == LINES

    # Data outside the store changes without it: such a config is never recorded.
    local_data = dataclasses.replace(config, data_root=str(tmp_path / "data"))
    unchanged_store.remember(local_data, folder, LINES)
    assert unchanged_store.recall(local_data, folder) is None

    # An upload through the store (any start of it) changes its folder.
    unchanged_store.remember(config, folder, LINES)
    store = EmbeddedObjectStore(folder).start()
    try:
        assert unchanged_store.recall(config, folder) is None  # running: anything may change
        s3_client(store.endpoint).put_object(Bucket="tfx-pipeline", Key="data/x", Body=b"new")
    finally:
        store.stop()
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    assert unchanged_store.recall(config, folder) is None


def test_a_run_knows_whether_another_command_used_the_store_meanwhile(tmp_path, monkeypatch):
    """The CLI records an answer only when its run was the store's one user from start to stop
    (pipelines/cli.py): a command that reused the store meanwhile (add-span, rollback) may have
    written after the run's check, and its lease shows."""
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    folder = tmp_path / "seaweedfs"
    run = EmbeddedObjectStore(folder).start()
    try:
        assert run.sole_user_since_start()
        other = EmbeddedObjectStore(folder).start()  # reuses the run's server
        assert other.reused_pid == run.pid
        other.stop()
        assert not run.sole_user_since_start()
    finally:
        run.stop()
    alone = EmbeddedObjectStore(folder).start()
    try:
        assert alone.sole_user_since_start()
    finally:
        alone.stop()
