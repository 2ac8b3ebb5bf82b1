"""`gs://` data and serving roots, for each shipped use case: the CLI as a user runs it, against a
GCS emulator on loopback (tests/stand_ins/gcs_emulator.py), with no S3 store at all.

A span is generated onto `gs://`, read by ExampleGen, the model pushed to `gs://` and its
predictions on the span printed; a second run finds nothing new there; `tkp serve` loads the
pushed version from `gs://`. TensorFlow's own `gs://` client cannot reach the emulator, so a step
that read or wrote a root without the project's storage layer would fail here.
"""

from __future__ import annotations

import os
import subprocess
import sys

from pipelines.serving.serving_client import ServingClient
from tests.pipelines import cli_process
from tests.pipelines.serving.test_serve_reload import free_port
from tests.stand_ins import gcs_emulator
from tests.use_cases import kit

BUCKET = "tfx-pipeline"


def test_a_gs_data_root_becomes_a_model_served_from_a_gs_serving_root(
    shipped_use_case, tmp_path, cli_in_background
):
    use_case = kit.of(shipped_use_case)
    settings = use_case.settings
    model_name = use_case.config().model_name
    roots = (
        "--set", f"use_case={shipped_use_case}",
        "--set", f"data_root=gs://{BUCKET}/data", "--set", f"serving_root=gs://{BUCKET}/serving",
    )  # fmt: skip
    small = (
        "--set", f"rows_per_span={settings.span_rows}", "--set", "train_steps=200",
        *(part for name, bar in settings.run_bars.items() for part in ("--set", f"{name}={bar}")),
    )  # fmt: skip
    with gcs_emulator.running(BUCKET, tmp_path / "emulator.log") as host:
        first = cli_process.run(tmp_path, "run", *roots, *small, STORAGE_EMULATOR_HOST=host)
        out = first.stdout
        assert first.returncode == 0, out + first.stderr
        assert "Starting embedded object store" not in out  # no S3 store was needed
        assert f"No data under gs://{BUCKET}/data: generating span 0" in out
        assert f"Pushed: gs://{BUCKET}/serving/{model_name}/1" in out, out
        assert f"Predictions of gs://{BUCKET}/serving/{model_name}/1 on the first" in out
        pushed = gcs_emulator.object_names(host, BUCKET, f"serving/{model_name}/1/")
        assert f"serving/{model_name}/1/saved_model.pb" in pushed, pushed

        again = cli_process.run(tmp_path, "run", *roots, STORAGE_EMULATOR_HOST=host)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "no new data since span 0" in again.stdout, again.stdout
        assert "Pushed:" not in again.stdout

        port = free_port()
        server = cli_in_background("serve", *roots, "--port", str(port),
                                   STORAGE_EMULATOR_HOST=host)  # fmt: skip
        server.wait_for("Version 1 serves", timeout=180)
        server.wait_for("TF Serving REST API at")
        client = ServingClient(f"http://127.0.0.1:{port}", model_name, use_case=shipped_use_case)
        assert client.serving_version() == 1
        assert [s["state"] for s in client.status()] == ["AVAILABLE"]


PROBE = """
import time
from apache_beam.internal.gcp import auth
from apache_beam.options.pipeline_options import PipelineOptions
import components.base.storage  # noqa: F401
began = time.monotonic()
initialised = auth._Credentials._credentials_init
found = auth.get_service_credentials(PipelineOptions([])) if initialised else "not asked"
print(initialised, found, round(time.monotonic() - began, 1))
"""


def test_towards_an_emulator_beam_asks_for_no_google_credentials_and_elsewhere_it_still_does():
    """With STORAGE_EMULATOR_HOST set, Beam's gs:// client gets no credentials at once (it would
    otherwise look for Google's for about 24 s, or send them to the emulator); without it,
    nothing is decided in Beam's place."""
    env = {k: v for k, v in os.environ.items() if k != "STORAGE_EMULATOR_HOST"}
    towards = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                             env={**env, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"},
                             timeout=120)  # fmt: skip
    initialised, found, seconds = towards.stdout.split()
    assert (initialised, found) == ("True", "None") and float(seconds) < 1, towards.stderr
    elsewhere = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                               env=env, timeout=120)  # fmt: skip
    assert elsewhere.stdout.split()[:2] == ["False", "not"], elsewhere.stderr
