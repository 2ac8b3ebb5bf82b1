"""`tkp tensorboard`: real TensorBoard event files on a real SeaweedFS, staged and served.

Two local-runner Trainer runs (executions 3 and 12: "12" sorts before "3" as text, so the newest
must be found by number) and one Kubeflow-layout run are uploaded with `storage.copy_tree` to
where the Trainer writes its model_run artifact, next to files that are not logs.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import tensorflow as tf

from components.base import storage
from components.base.config import PipelineConfig
from components.base.object_store import s3_client
from components.base.processes import stop_process
from pipelines.local import tensorboard
from tests.pipelines import cli_process

# Per run: epoch_loss per epoch in train/, epoch_auc in validation/.
SCALARS = {
    "3": {"train": [0.69, 0.61, 0.55], "validation": [0.71, 0.74, 0.76]},
    "12": {"train": [0.64, 0.52, 0.47, 0.45], "validation": [0.75, 0.79, 0.81, 0.82]},
}
TAGS = {"train": "epoch_loss", "validation": "epoch_auc"}
KFP_RUN_ID = "0f8c2a51-6d3e-4b7a-9c1e-2b4d6f8a0c3e"


def _write_logs(folder: Path, values: dict[str, list[float]]) -> None:
    for split, series in values.items():
        writer = tf.summary.create_file_writer(str(folder / split))
        with writer.as_default():
            for step, value in enumerate(series):
                tf.summary.scalar(TAGS[split], value, step=step)
        writer.close()


def _read_scalars(folder: Path) -> dict[str, list[float]]:
    """{split: values by step} from the event files under folder/<split>/."""
    found = {}
    for split in TAGS:
        (path,) = tf.io.gfile.glob(f"{folder}/{split}/events.out.tfevents.*")
        points = {}
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                if value.tag == TAGS[split]:
                    points[event.step] = float(tf.make_ndarray(value.tensor))
        found[split] = [points[step] for step in sorted(points)]
    return found


@pytest.fixture(scope="module")
def roots(object_store, tmp_path_factory) -> dict[str, str]:
    """A local-runner pipeline root with runs 3 and 12, a Kubeflow one with one run (run 12's
    logs), and one without any Trainer run, all on SeaweedFS."""
    bucket = object_store.new_bucket("tensorboard")
    local = tmp_path_factory.mktemp("event-logs")
    pipeline_root = f"s3://{bucket}/pipeline_root"
    for run, values in SCALARS.items():
        _write_logs(local / run, values)
        model_run = f"{pipeline_root}/Trainer/model_run/{run}"
        assert storage.copy_tree(str(local / run), f"{model_run}/logs") == 2
        storage.write_bytes(f"{model_run}/training_summary.json", b"{}")  # not a log
    storage.write_bytes(f"{pipeline_root}/Trainer/model/12/saved_model.pb", b"not a log")
    storage.write_bytes(f"{pipeline_root}/Trainer/model_run/13/backup/checkpoint", b"no logs")
    kfp_root = f"s3://{bucket}/kfp_root"
    kfp_model_run = f"{kfp_root}/taxi-tips/{KFP_RUN_ID}/trainer/5b1e9d0a-77aa/model_run"
    storage.copy_tree(str(local / "12"), f"{kfp_model_run}/logs")
    storage.write_bytes(f"{kfp_root}/taxi-tips/{KFP_RUN_ID}/transform/1a2b/x/data", b"other")
    empty_root = f"s3://{bucket}/empty_root"
    storage.write_bytes(f"{empty_root}/Transform/transform_graph/9/metadata", b"no trainer")
    return {"local": pipeline_root, "kfp": kfp_root, "kfp_model_run": kfp_model_run,
            "empty": empty_root}  # fmt: skip


def _stage(tmp_path: Path, **options) -> tuple[int, list[str]]:
    lines: list[str] = []
    config = PipelineConfig(pipeline_root=options.pop("config_root", "/nonexistent"))
    code = tensorboard.main(config, lines.append, serve=False, staging_root=tmp_path, **options)
    return code, lines


def test_the_newest_run_is_staged_by_default_and_its_scalars_read_back(roots, tmp_path):
    code, lines = _stage(tmp_path, config_root=roots["local"])  # the config's pipeline_root

    assert code == 0
    staged = tmp_path / "12"
    assert lines[0] == (
        "Staged Trainer run 12 (the newest of 2; --run ID or --all for others): "
        f"{roots['local']}/Trainer/model_run/12/logs"
    )
    assert lines[1] == f"2 file(s) in {staged}"
    assert _read_scalars(staged) == {
        split: pytest.approx(values) for split, values in SCALARS["12"].items()
    }
    assert sorted(p.name for p in staged.iterdir()) == ["train", "validation"]  # logs only

    code, lines = _stage(tmp_path, pipeline_root=roots["local"], run="3")
    assert code == 0 and "Staged Trainer run 3 (not the newest of 2" in lines[0]
    assert _read_scalars(tmp_path / "3") == {
        split: pytest.approx(values) for split, values in SCALARS["3"].items()
    }


def test_all_stages_every_run_side_by_side(roots, tmp_path):
    code, lines = _stage(tmp_path, pipeline_root=roots["local"], all_runs=True)

    assert code == 0
    folder = tmp_path / "all-runs"
    assert lines == [
        f"Staged Trainer run 3: {roots['local']}/Trainer/model_run/3/logs",
        f"Staged Trainer run 12: {roots['local']}/Trainer/model_run/12/logs",
        f"4 file(s) in {folder}",
        f"Serve it with: .venv/bin/tensorboard --logdir {folder}",
    ]
    assert sorted(p.name for p in folder.iterdir()) == ["12", "3"]
    for run, values in SCALARS.items():
        expected = {split: pytest.approx(series) for split, series in values.items()}
        assert _read_scalars(folder / run) == expected


def test_a_kubeflow_pipeline_root_and_a_model_run_uri(roots, tmp_path):
    code, lines = _stage(tmp_path, pipeline_root=roots["kfp"])
    assert code == 0
    assert lines[0].startswith(f"Staged Trainer run {KFP_RUN_ID} (the newest of 1;")
    expected = {split: pytest.approx(series) for split, series in SCALARS["12"].items()}
    assert _read_scalars(tmp_path / KFP_RUN_ID) == expected

    minio_uri = roots["kfp_model_run"].replace("s3://", "minio://")  # as KFP's UI may show it
    code, lines = _stage(tmp_path / "one", model_run_uri=minio_uri)
    assert code == 0
    assert lines[0] == f"Staged Trainer run {KFP_RUN_ID}: {roots['kfp_model_run']}/logs"
    assert _read_scalars(tmp_path / "one" / KFP_RUN_ID) == expected


def test_missing_runs_are_clear_errors_and_a_nonzero_exit(roots, tmp_path):
    with pytest.raises(tensorboard.TensorBoardError, match=r"--run 7 is no Trainer run .*3, 12"):
        _stage(tmp_path, pipeline_root=roots["local"], run="7")
    with pytest.raises(tensorboard.TensorBoardError, match="no TensorBoard event files"):
        _stage(tmp_path, model_run_uri=f"{roots['local']}/Trainer/model_run/13")

    result = cli_process.run(
        tmp_path, "tensorboard", "--no-serve", "--pipeline-root", roots["empty"],
        AWS_ENDPOINT_URL_S3=s3_client().meta.endpoint_url, timeout=120,
    )  # fmt: skip

    assert result.returncode == 1, result.stderr
    assert (
        f"error: no Trainer run with TensorBoard logs found under {roots['empty']} "
        in result.stderr
    )
    assert "run `make run` first" in result.stderr
    assert result.stdout == "" and not (tmp_path / "tensorboard").exists()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get_json(url: str):
    with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(url, timeout=5) as r:
        assert r.status == 200
        return json.loads(r.read())


def test_tensorboard_serves_the_staged_runs(roots, tmp_path):
    _stage(tmp_path, pipeline_root=roots["local"], all_runs=True)
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with open(tmp_path / "tensorboard.log", "w") as output:
        server = tensorboard.start_server(tmp_path / "all-runs", "127.0.0.1", port, output)
        try:
            deadline = time.monotonic() + 30  # the first load of the folder is asynchronous
            while "12/train" not in (runs := _get_json(f"{base}/data/runs")):
                assert time.monotonic() < deadline, f"runs {runs}"
                time.sleep(0.5)
            assert set(runs) == {"3/train", "3/validation", "12/train", "12/validation"}
            points = _get_json(f"{base}/data/plugin/scalars/scalars?run=12/train&tag=epoch_loss")
            assert [value for _, _, value in points] == pytest.approx(SCALARS["12"]["train"])
        finally:
            stop_process(server, grace_seconds=10)
    assert server.poll() is not None
    with socket.socket() as probe:  # nothing listens on the port any more
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()
