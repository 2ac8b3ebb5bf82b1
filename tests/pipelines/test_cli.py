"""The CLI as a user calls it: `store`, `run`, `add-span` and `compile` in their own processes.

One user session: the store started in the foreground and stopped with SIGTERM, a run that keeps
the store, an `add-span` that reuses it, and a compile. The credentials are sentinels that must
appear nowhere: not on the console, in a log, in ML Metadata, in an artifact or in the spec.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from components.base import release, serving_state, storage
from components.base.config import SPEC_PATH
from components.base.object_store import EmbeddedObjectStore, s3_client
from components.use_cases.taxi import data as taxi_data
from pipelines import data
from tests.pipelines import cli_process
from tests.pipelines.cli_process import (
    SENTINEL_KEY_ID,
    SENTINEL_SECRET,
    alive,
    store_pid,
    wait_gone,
)

BUCKET = "tfx-pipeline"  # the default config's bucket, created by the CLI's store
# Every line `run` may print: progress, the executors' notes, the summary, the predictions.
RUN_CONSOLE = re.compile(
    r"|Starting embedded object store .*|  listening at .*|Running pipeline .*"
    r"|\[\d+/12\] \w+ (\.\.\.|finished in .*|skipped after .*)|      \S.*"
    r"|Pipeline run summary|-+|  \w+ +(ran|cached) +[\d.]+ s|Data span: \d+|Evaluation \(.*"
    r"|  payment_type=.*|Compared with the served model: .*|Blessed: (yes|NO)"
    r"|Hyperparameters \((defaults|search: .*|served version \d+'s search)\): .*"
    r"|Training: \d+ steps on \d+ replica\(s\), \d+ worker\(s\), [\d,]+ examples/s.*"
    r"|  failed threshold: .*|Pushed: .*|Report: .*|Predictions of .*"
    r"|  payment_type +fare +trip_miles +P\(big tip\) +actual"
    r"|  [A-Za-z ]+ +[\d.]+ +[\d.]+ +[\d.]+ +[01]|Object store left running at .*"
    r"|Done in [\d.]+ s\."
)


def _files_containing(root: Path, needles: list[bytes]) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and any(n in path.read_bytes() for n in needles):
            found.append(str(path))
    return found


def test_a_user_session_store_run_add_span_compile(tmp_path, monkeypatch, cli_in_background):
    console = []  # everything the commands printed
    for name, value in cli_process.environment(tmp_path).items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)  # this process writes to the CLI's store too

    # The store in the foreground: span 0, and a newer span folder that holds no CSV yet.
    store = cli_in_background("store")
    line = store.wait_for("export AWS_ENDPOINT_URL_S3=")
    endpoint = re.search(r"AWS_ENDPOINT_URL_S3=(\S+)", line).group(1)
    client = s3_client(endpoint)
    frame = taxi_data.generate_span(3000, span=0)
    # Saved with a byte-order mark, as Excel writes UTF-8 CSV: the run, its sample predictions
    # included, reads it as ExampleGen does (a run that pushed once exited 1 on the BOM).
    client.put_object(Bucket=BUCKET, Key="data/taxi-trips/span-0/part-00000.csv",
                      Body=frame.to_csv(index=False, na_rep="").encode("utf-8-sig"))  # fmt: skip
    client.put_object(Bucket=BUCKET, Key="data/taxi-trips/span-0/_SUCCESS", Body=b"")
    client.put_object(Bucket=BUCKET, Key="data/taxi-trips/span-1/UPLOADING", Body=b"")
    store.process.send_signal(signal.SIGTERM)
    code, out, err = store.finish()
    console += [out, err]
    assert code == 143, err

    kept_pid = None
    try:
        # The run of span 0 (not the newest folder), keeping the store; a temp folder of its own
        # shows what it leaves there (TFX's Beam steps used to leave a 45 MB package each). Its
        # bar is far below what this training reaches (AUC 0.883-0.888, accuracy 0.821-0.838
        # over 5 local runs with these settings on 3,000 rows of the same generator): the push
        # cannot depend on its noise.
        run_settings = (
            "--set", "span=0", "--set", "train_steps=300", "--set", "epochs=1",
            "--set", "eval_steps=10", "--set", "min_auc=0.5", "--set", "min_accuracy=0.5",
        )  # fmt: skip
        temp_dir = tmp_path / "temp"
        temp_dir.mkdir()
        run = cli_process.run(tmp_path, "run", "--keep-store", *run_settings, TMPDIR=str(temp_dir))
        console += [run.stdout, run.stderr]
        left_in_temp = sum(f.stat().st_size for f in temp_dir.rglob("*") if f.is_file())
        assert left_in_temp < 1_000_000, sorted(temp_dir.rglob("*"))[:20]
        assert run.returncode == 0, run.stdout + run.stderr
        assert run.stderr == ""
        unexpected = [line for line in run.stdout.splitlines() if not RUN_CONSOLE.fullmatch(line)]
        assert unexpected == [], run.stdout  # e.g. Keras' epoch lines, TensorFlow's C++ lines
        assert "[11/12] Pusher finished in" in run.stdout
        assert "[12/12] RunReport finished in" in run.stdout
        assert "Data span: 0" in run.stdout
        assert (
            f"Predictions of s3://{BUCKET}/serving/taxi-tips/1 on the first rows of "
            f"s3://{BUCKET}/data/taxi-trips/span-0/part-00000.csv:" in run.stdout
        )
        log_path = Path(re.search(r"full log: (\S+)\)", run.stdout).group(1))
        assert log_path.parent == tmp_path / "logs"
        log = log_path.read_text()
        assert "ExampleGen: reading span 0" in log
        report = log_path.with_suffix(".report.html")  # the page Kubeflow's UI shows
        assert f"Report: {report} " in run.stdout
        assert "Pushed: version 1" in report.read_text()
        assert "Warning" in log or "WARNING" in log  # the libraries' warnings went here
        assert "Object store left running at" in run.stdout
        kept_pid = store_pid(tmp_path)

        # Nothing new: said without loading TFX, nothing trained or pushed.
        again = cli_process.run(tmp_path, "run", *run_settings)
        console += [again.stdout, again.stderr]
        assert again.returncode == 0, again.stdout + again.stderr
        assert "no new data since span 0: span(s) [0]" in again.stdout
        assert "version 1 was pushed from it. Nothing is trained or pushed" in again.stdout
        assert f"Served: s3://{BUCKET}/serving/taxi-tips/1 (`tkp serve`" in again.stdout
        assert "Running pipeline" not in again.stdout
        _, kept_endpoint = cli_process.recorded_store(tmp_path)
        served = s3_client(kept_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="serving/")
        versions = {item["Key"].split("/")[2] for item in served["Contents"]}
        assert {v for v in versions if v.isdigit()} == {"1"}

        # add-span reuses the kept store and numbers after the newest folder.
        added = cli_process.run(tmp_path, "add-span", "--rows", "100")
        console += [added.stdout, added.stderr]
        assert added.returncode == 0, added.stderr
        assert f"(pid {kept_pid}): reusing it" in added.stdout
        assert "Wrote span 2 (100 rows, drift 0.0, then _SUCCESS)" in added.stdout
        refused = cli_process.run(tmp_path, "add-span", "--rows", "-5")
        assert refused.returncode == 2
        assert refused.stderr == (
            "error: add-span: rows_per_span must be at least 1, got -5 (from --rows)\n"
        )
        _, kept_endpoint = cli_process.recorded_store(tmp_path)
        listing = s3_client(kept_endpoint).list_objects_v2(Bucket=BUCKET, Prefix="data/taxi-trips/")
        written = {item["Key"].split("/")[2] for item in listing["Contents"]}
        assert written == {"span-0", "span-1", "span-2"}  # nothing for --rows -5
    finally:
        pid_file = tmp_path / "seaweedfs" / EmbeddedObjectStore.PID_FILE
        if pid_file.exists() and alive(store_pid(tmp_path)):  # also when the test failed early
            os.kill(store_pid(tmp_path), signal.SIGTERM)
        if kept_pid:
            assert wait_gone(kept_pid)

    # The store stopped with its last user. A run with nothing new starts it, checks and records
    # its answer; the next, with the folder as that run left it, answers without starting it.
    checked = cli_process.run(tmp_path, "run", *run_settings)
    recalled = cli_process.run(tmp_path, "run", *run_settings)
    console += [checked.stdout, checked.stderr, recalled.stdout, recalled.stderr]
    for nothing_new in (checked, recalled):
        assert nothing_new.returncode == 0, nothing_new.stdout + nothing_new.stderr
        assert "version 1 was pushed from it. Nothing is trained or pushed" in nothing_new.stdout
        assert f"Served: s3://{BUCKET}/serving/taxi-tips/1 (`tkp serve`" in nothing_new.stdout
    assert "Starting embedded object store" in checked.stdout
    assert "Starting embedded object store" not in recalled.stdout, recalled.stdout
    assert "Answered from the last run's record" in recalled.stdout
    # Another config, or a store another command has written to since: checked again.
    other = cli_process.run(tmp_path, "run", *run_settings, "--set", "min_auc=0.6")
    added = cli_process.run(tmp_path, "add-span", "--rows", "50")
    after_upload = cli_process.run(tmp_path, "run", *run_settings)
    console += [other.stdout, added.stdout, after_upload.stdout]
    assert added.returncode == 0, added.stdout + added.stderr
    for checked_again in (other, after_upload):
        assert checked_again.returncode == 0, checked_again.stdout + checked_again.stderr
        assert "Starting embedded object store" in checked_again.stdout
        assert "Nothing is trained or pushed" in checked_again.stdout

    spec = tmp_path / "spec.yaml"
    compiled = cli_process.run(tmp_path, "compile", "--output", str(spec))
    console += [compiled.stdout, compiled.stderr]
    assert compiled.returncode == 0, compiled.stderr
    assert spec.read_text() == SPEC_PATH.read_text()  # the environment changes nothing in it

    secrets = [SENTINEL_KEY_ID.encode(), SENTINEL_SECRET.encode()]
    assert (tmp_path / "metadata.sqlite").exists() and (tmp_path / "pipeline_root").is_dir()
    assert _files_containing(tmp_path, secrets) == []
    assert not any(s.decode() in text for s in secrets for text in console)


@pytest.fixture
def data_bucket(object_store) -> str:
    bucket = object_store.new_bucket("cli")
    data.write_span(f"s3://{bucket}/data", 0, 200)
    return bucket


def test_unexpected_error_keeps_its_traceback_in_this_commands_log(tmp_path, data_bucket):
    old_log = tmp_path / "logs" / "run-20200101-000000-1.log"
    old_log.parent.mkdir()
    old_log.write_text("an older run\n")
    endpoint = s3_client().meta.endpoint_url

    result = cli_process.run(
        tmp_path, "run", "--set", f"data_root=s3://{data_bucket}/data",
        "--set", f"serving_root=s3://{data_bucket}/serving",
        "--set", "beam_args=--runner=NoSuchRunner",
        AWS_ENDPOINT_URL_S3=endpoint,
    )  # fmt: skip

    assert result.returncode == 1
    assert "NoSuchRunner" in result.stderr
    named = re.search(r"the traceback is in (\S+)\.$", result.stderr, re.M)
    assert named, result.stderr
    log_path = Path(named.group(1))
    assert log_path != old_log and log_path.parent == old_log.parent
    log = log_path.read_text()
    assert "Traceback (most recent call last)" in log and "NoSuchRunner" in log
    assert not storage.list_files(f"s3://{data_bucket}/serving/**")


def test_failure_before_the_pipeline_names_this_commands_log(tmp_path):
    old_log = tmp_path / "logs" / "run-20200101-000000-1.log"
    old_log.parent.mkdir()
    old_log.write_text("an older run\n")

    result = cli_process.run(tmp_path, "run", AWS_ENDPOINT_URL_S3="http://127.0.0.1:9")

    assert result.returncode == 1
    assert "error: cannot reach bucket 'tfx-pipeline'" in result.stderr
    named = re.search(r"The full log is in (\S+)\.$", result.stderr, re.M)
    assert named, result.stderr
    log_path = Path(named.group(1))
    assert log_path != old_log
    assert "StorageError" in log_path.read_text()


def test_help_and_refusals_name_the_program_as_it_was_started():
    script = Path(sys.executable).parent / "tkp"  # the console script pyproject.toml installs
    by_script = subprocess.run([str(script), "pause", "--set", "x=1"], capture_output=True,
                               text=True, timeout=60)  # fmt: skip
    by_module = subprocess.run([sys.executable, "-m", "pipelines.cli", "--help"],
                               capture_output=True, text=True, timeout=60)  # fmt: skip

    assert by_script.returncode == 2
    assert by_script.stderr.startswith("usage: tkp pause")
    assert "--set changes the compiled spec and has no effect here" in by_script.stderr
    assert by_module.stdout.startswith("usage: python -m pipelines.cli ")


def test_models_and_rollback_as_an_operator_uses_them(tmp_path, object_store):
    """`models list`, `models show N` and `rollback [N]` against a serving directory with two
    pushed versions; a rollback to a version that does not exist changes nothing."""
    from components.base import registry

    serving_root = f"s3://{object_store.new_bucket('cli-models')}/serving"
    folder = f"{serving_root}/taxi-tips"
    for version in (1, 2):
        storage.write_bytes(f"{folder}/{version}/saved_model.pb", b"graph")
        record = {"spans": {str(version): "f"}, "baseline_version": version - 1 or None}
        registry.write_record(folder, version, record)
    release.release_pushed(folder, "taxi-tips", 2, 1, "immediate", why="push")
    endpoint = {"AWS_ENDPOINT_URL_S3": s3_client().meta.endpoint_url}

    def tkp(*args: str):
        return cli_process.run(tmp_path, *args, "--set", f"serving_root={serving_root}", **endpoint)

    listed = tkp("models", "list")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"^\s+2  SERVED .*\n\s+1  loaded ", listed.stdout, re.M), listed.stdout
    shown = tkp("models", "show", "2")
    assert (
        shown.returncode == 0 and "Lineage (each beat the one after it): v2 <- v1" in shown.stdout
    )

    missing = tkp("rollback", "7")
    assert missing.returncode == 1
    assert "error: version 7 does not exist under" in missing.stderr and "[1, 2]" in missing.stderr
    assert serving_state.read(folder, "taxi-tips").stable == 2

    rolled = tkp("rollback")
    assert rolled.returncode == 0, rolled.stderr
    assert rolled.stdout.strip().endswith("TF Serving loads it at its next config poll.")
    assert "Version 1 serves now (was 2)" in rolled.stdout
    assert serving_state.read(folder, "taxi-tips").stable == 1
