"""`make compile` writes the operator's spec where submit, schedule and watch look for it, and
never a committed one; `make specs` rewrites the committed ones from the defaults alone."""

from __future__ import annotations

from components.base.config import spec_path
from tests.pipelines import cli_process
from tests.stand_ins.kfp_api_stand_in import FakeKfpApi

IMAGES = ("--set", "cpu_image=registry.example.org/team/tfx-pipeline:1.4.2",
          "--set", "gpu_image=registry.example.org/team/tfx-pipeline-gpu:1.4.2")  # fmt: skip


def test_compile_writes_the_operators_spec_which_submit_sends(tmp_path):
    committed = spec_path("taxi").read_bytes()
    api = FakeKfpApi()
    try:
        before = cli_process.run(tmp_path, "submit", "--endpoint", api.endpoint)
        compiled = cli_process.run(tmp_path, "compile", *IMAGES)
        submitted = cli_process.run(tmp_path, "submit", "--endpoint", api.endpoint)
    finally:
        api.server.shutdown()
        api.server.server_close()
    # Nothing compiled yet: submit names the file it looked for and how to make it, sends nothing.
    assert before.returncode == 2, before.stdout + before.stderr
    assert f"no compiled spec at {tmp_path / 'kubeflow' / 'pipeline-taxi.yaml'}" in before.stderr
    assert "make compile" in before.stderr and "--package" in before.stderr
    assert compiled.returncode == 0, compiled.stdout + compiled.stderr
    written = tmp_path / "kubeflow" / "pipeline-taxi.yaml"
    assert f"Wrote {written}" in compiled.stdout
    assert "registry.example.org/team/tfx-pipeline:1.4.2" in written.read_text()
    assert spec_path("taxi").read_bytes() == committed
    # What submit uploads is that spec, the operator's images in it.
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    (upload,) = api.uploads
    assert b"registry.example.org/team/tfx-pipeline:1.4.2" in upload


def test_compile_refuses_to_write_a_committed_spec_and_specs_refuses_any_setting(tmp_path):
    committed = {name: spec_path(name).read_bytes() for name in ("taxi", "images")}
    into_committed = cli_process.run(
        tmp_path, "compile", "--output", "kubeflow/pipeline-taxi.yaml", *IMAGES
    )
    assert into_committed.returncode == 2
    assert "--output kubeflow/pipeline-taxi.yaml: that is a committed spec" in into_committed.stderr
    assert "make specs" in into_committed.stderr
    # The committed specs take the defaults alone: a --set or a PIPELINE_* variable is refused.
    with_setting = cli_process.run(tmp_path, "compile", "--committed", *IMAGES[:2])
    assert with_setting.returncode == 2
    assert "remove --set cpu_image" in with_setting.stderr
    with_variable = cli_process.run(tmp_path, "compile", "--committed", PIPELINE_TRAIN_STEPS="5")
    assert with_variable.returncode == 2
    assert "remove PIPELINE_TRAIN_STEPS" in with_variable.stderr
    assert {name: spec_path(name).read_bytes() for name in committed} == committed
    # With nothing set it rewrites them, byte for byte what the stale-spec test expects.
    rewritten = cli_process.run(tmp_path, "compile", "--committed")
    assert rewritten.returncode == 0, rewritten.stderr
    assert "Wrote kubeflow/pipeline-taxi.yaml (use case taxi, the defaults)." in rewritten.stdout
    assert {name: spec_path(name).read_bytes() for name in committed} == committed
