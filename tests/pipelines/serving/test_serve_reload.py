"""`tkp serve` follows the model config file without a restart: a push, a rollback and a broken
version while requests flow; and `tkp serve` / `tkp serving-sync` as a user runs them. The tests
with a model run once per shipped use case of CSV rows, on the session's model of it
(`tabular_use_case_model`)."""

import socket
import threading
import time

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.base import registry, release, serving_state, storage
from components.steps.pusher import push_version
from pipelines.serving.model_server import ModelManager
from pipelines.serving.serving_client import ServingClient
from tests.pipelines.serving.served import frame_rows, push, serving


def wait_until(condition, what: str, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Traffic:
    """Requests in a loop from another thread, naming no version or one `label`; every failure
    and every state seen is kept."""

    def __init__(self, client: ServingClient, rows: list[dict], label: str | None = None):
        self.client, self.rows, self.label = client, rows, label
        self.answered, self.failures, self.states = 0, [], set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                answer = self.client.predict_examples(self.rows, label=self.label)
                assert len(answer) == len(self.rows)
                self.answered += 1
                for entry in self.client.status():
                    self.states.add((int(entry["version"]), entry["state"]))
            except Exception as e:  # any failed request fails the test
                self.failures.append(repr(e))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)


def test_push_rollback_and_a_broken_version_while_requests_flow(
    object_store, tabular_use_case_model, tmp_path
):
    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    model = tabular_use_case_model.model_name
    folder = f"s3://{object_store.new_bucket('reload')}/serving/{model}"
    examples = tabular_use_case_model.to_examples(eval_frame.head(16), with_label=False)
    push(folder, model, fn_args.serving_model_dir, 1, examples)
    cache = tmp_path / "cache"
    with serving(model, folder, cache) as server:
        manager, said = server.manager, server.said
        client = ServingClient(server.url, model, use_case=tabular_use_case_model.name)
        traffic = Traffic(client, frame_rows(eval_frame.head(4)))
        try:
            wait_until(lambda: traffic.answered > 5, "the first answers")

            push(folder, model, fn_args.serving_model_dir, 2, examples)  # what the Pusher does
            wait_until(lambda: client.serving_version() == 2, "version 2 to serve")
            assert (2, "LOADING") in traffic.states  # answered by version 1 meanwhile
            release.rollback(folder, model)  # `tkp rollback`
            wait_until(lambda: client.serving_version() == 1, "the rollback to version 1")

            # A version whose saved_model.pb is garbage: never loaded, version 1 keeps serving.
            storage.copy_tree(f"{folder}/1", f"{folder}/3")
            storage.write_bytes(f"{folder}/3/saved_model.pb", b"not a SavedModel")
            release.release_pushed(folder, model, 3, 1, "immediate", "test: a corrupted push")
            wait_until(lambda: any(s.startswith("Version 3 failed") for s in said), "the failure")
            answered = traffic.answered
            wait_until(lambda: traffic.answered > answered + 3, "answers after the failure")
        finally:
            traffic.stop()

    assert traffic.failures == []
    statuses = {int(s["version"]): s for s in client_status(manager, model)}
    assert statuses[1]["state"] == "AVAILABLE" and statuses[2]["state"] == "END"
    assert statuses[3]["state"] == "END" and statuses[3]["status"]["error_code"] != "OK"
    assert statuses[3]["status"]["error_message"]
    assert any("Version 3 failed" in s and "version 1 keeps serving" in s for s in said)
    assert said[-1] == ("Labels not applied (stable -> 3: not loaded); the labels in force stay "
                        "(stable 1).")  # fmt: skip
    # The mirror the server reads, as TF Serving would: every version, and a config listing the
    # loaded ones (1, and 3 that failed), without labels (no model server was asked).
    local = model_server_config_pb2.ModelServerConfig()
    text_format.Parse((cache / "models.config").read_text(), local)
    (entry,) = local.model_config_list.config
    assert entry.base_path == str(cache / model)
    assert list(entry.model_version_policy.specific.versions) == [1, 3]
    assert dict(entry.version_labels) == {}
    assert sorted(p.name for p in (cache / model).iterdir()) == ["1", "2", "3"]


def free_port() -> int:
    """A free loopback port (closed again before the server binds it)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def client_status(manager: ModelManager, model: str) -> list[dict]:
    return manager.status(model, None)["model_version_status"]


def test_serve_and_serving_sync_from_the_command_line(
    object_store, tabular_use_case_model, tmp_path, cli_in_background
):
    from tests.pipelines.cli_process import run

    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    model = tabular_use_case_model.model_name
    bucket = object_store.new_bucket("serve-cli")
    folder = f"s3://{bucket}/serving/{model}"
    # A serving directory from before the serving state's log: models.config pins version 1.
    push_version(fn_args.serving_model_dir, folder, 1)
    pinned = serving_state.model_config_text(folder, model, {}, [1]).encode()
    storage.write_bytes(f"{folder}/{registry.MODEL_CONFIG_FILE}", pinned)
    # The use case's config, as a user of it sets it (its model name is a default of it).
    env = dict(AWS_ENDPOINT_URL_S3=object_store.endpoint,
               PIPELINE_USE_CASE=tabular_use_case_model.name,
               PIPELINE_SERVING_ROOT=f"s3://{bucket}/serving")  # fmt: skip

    synced = run(tmp_path, "serving-sync", "--target", str(tmp_path / "models"), "--once", **env)
    assert synced.returncode == 0, synced.stderr
    assert "stable 1 (loaded: 1); copied [1]" in synced.stdout
    assert (tmp_path / "models" / model / "1" / "saved_model.pb").exists()
    assert f"base_path: \"{tmp_path / 'models' / model}\"" in (
        tmp_path / "models" / "models.config").read_text()  # fmt: skip

    port = free_port()
    server = cli_in_background("serve", "--port", str(port), "--poll-seconds", "0.5", **env)
    server.wait_for("Version 1 serves")
    server.wait_for("TF Serving REST API at")
    client = ServingClient(f"http://127.0.0.1:{port}", model, use_case=tabular_use_case_model.name)
    assert len(client.predict_examples(frame_rows(eval_frame.head(3)))) == 3
    # A model config file broken by hand: said once (not at every poll), version 1 serves on.
    config_file = f"{folder}/{registry.MODEL_CONFIG_FILE}"
    storage.write_bytes(config_file, b"not a config {")
    server.wait_for("Could not read the served versions")
    time.sleep(2.5)  # five polls
    assert client.serving_version() == 1
    server.process.terminate()
    code, out, err = server.finish()
    assert code != 0 and "Stopping: received SIGTERM" in err
    assert out.count("Could not read the served versions") == 1, out
    assert f"{config_file} is not a TF Serving model config" in out

    broken = run(tmp_path, "serving-sync", "--target", str(tmp_path / "m2"), "--once", **env)
    assert broken.returncode == 1
    assert f"{config_file} is not a TF Serving model config" in broken.stderr
    away = dict(env, AWS_ENDPOINT_URL_S3=f"http://127.0.0.1:{free_port()}")
    down = run(tmp_path, "serving-sync", "--target", str(tmp_path / "m3"), "--once", **away)
    assert down.returncode == 1 and f"cannot read {folder}" in down.stderr
    assert f"object store at {away['AWS_ENDPOINT_URL_S3']} runs" in down.stderr


def test_a_copy_made_from_another_store_is_not_served_as_this_ones(object_store, tmp_path):
    """Version numbers are unique within one serving directory only: a cache filled from
    another one is emptied, not reused."""
    from pipelines.serving import serving_sync

    target = tmp_path / "cache"
    model = "a-model"  # any name: no model is loaded
    for name in ("a", "b"):
        folder = f"s3://{object_store.new_bucket(name)}/serving/{model}"
        storage.write_bytes(f"{folder}/1/variables/variables.index", name.encode())
        storage.write_bytes(f"{folder}/1/saved_model.pb", f"model {name}".encode())
        result = serving_sync.sync_once(folder, model, target)
        assert result.copied == [1] and result.served == 1
        assert (target / model / "1" / "saved_model.pb").read_text() == f"model {name}"


def test_bench_serving_measures_the_server_next_to_the_saved_model(
    object_store, tabular_use_case_model, tmp_path, monkeypatch
):
    """A small run of `tkp bench-serving`'s measurement: `tkp serve` as its own process, the
    SavedModel in this one, each batch size at 1 and at N requests in flight."""
    from components.base.config import PipelineConfig
    from pipelines import data
    from pipelines.bench import bench_serving

    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    bucket = object_store.new_bucket("bench")
    config = PipelineConfig.load(
        {"use_case": tabular_use_case_model.name, "serving_root": f"s3://{bucket}/serving",
         "data_root": f"s3://{bucket}/data"}, environ={},
    )  # fmt: skip
    push(config.serving_model_dir, config.model_name, fn_args.serving_model_dir, 1,
         tabular_use_case_model.to_examples(eval_frame.head(4), with_label=False))  # fmt: skip
    data.write_span(config.data_root, 0, 50, use_case=tabular_use_case_model.name)
    monkeypatch.setenv("PIPELINE_WORK_DIR", str(tmp_path))  # the server's log
    said: list[str] = []

    results = bench_serving.run(config, 5, [1, 2], [1, 4], said.append)

    assert [(r["examples"], r["concurrency"]) for r in results["runs"]] == [
        (1, 1), (1, 2), (4, 1), (4, 2)]  # fmt: skip
    for run in results["runs"]:
        for where in ("serve", "serve_batching", "in_process"):
            figures = run[where]
            assert 0 < figures["p50_ms"] <= figures["p99_ms"] and figures["per_second"] > 0
        assert run["p50_ratio"] > 0 and run["batching_throughput_ratio"] > 0
    # The batched server ran with the manifests' parameters, and says so.
    assert results["batching"]["max_batch_size"] == 256
    # The batched server batched (`tkp serve --enable-batching` wired through the CLI): every
    # request went through its queues, in no more model calls than requests.
    batched = results["batching"]
    assert (
        batched["requests_batched"] >= 5 * 2 * 2
        and 0 < batched["model_calls"] <= (batched["requests_batched"])
    )
    assert any("--enable-batching" in line for line in said)
    assert "batching / none, requests/s" in bench_serving.table(results)
    with pytest.raises(bench_serving.BenchError, match="fewer than the largest batch"):
        bench_serving.run(config, 5, [2], [1, 500], said.append)
