"""Each step in its own container, for real: `make images` builds the CPU image, and the
compiled spec runs with every task in a container of the image it names
(tests/stand_ins/kfp_containers.py
says what a pod gets and how it is played).

Needs a usable container engine: podman (as root, with runc and debootstrap for the local base
image; .ci/run installs them) or docker. Elsewhere these tests are skipped with one line that
says what is missing. The GPU image cannot be built here (NVIDIA's registry and apt repository
are out of reach): the test without an engine checks that its Python layers are the CPU image's.

The full run goes once per shipped use case (IDs `[<name>]`): its spec compiled from its config,
spans from its generator, bars from its test settings (tests/use_cases/<name>/fixtures.py). The
runs that fail a step on purpose fail it before any data is read, so they run the default
use case's spec only.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
import urllib.parse

import pytest

from components.base import serving_state, storage, use_case
from components.base.config import REPO_ROOT, SECRET_KEYS, WORK_DIR, PipelineConfig
from components.base.registry import complete_versions as pushed_versions
from components.base.registry import versions_dir as serving_model_dir
from pipelines import data
from pipelines.kubeflow import images, kubeflow_runner
from tests.stand_ins import kfp_harness
from tests.stand_ins.kfp_containers import ContainerRuntime, missing_for_images
from tests.use_cases import kit

FIGURES_PATH = WORK_DIR / "bench" / "containers.json"
README_IMAGE = "tfx-pipeline:local"  # the tag README's container route builds


def _python_layers(dockerfile) -> str:
    text = dockerfile.read_text()
    return text[text.index("# >>> Python layers") : text.index("# <<< Python layers")]


def test_gpu_image_installs_python_exactly_as_the_cpu_image():
    """Same ENV, same uv, same lock, same install commands, same user: only the base and the
    interpreter's path (ARG PYTHON) differ, so the two images cannot drift apart."""
    cpu, gpu = (_python_layers(images.DOCKERFILES[kind]) for kind in ("cpu", "gpu"))
    assert cpu == gpu
    assert "requirements.lock" in cpu and "uv pip sync" in cpu and "USER 1000:1000" in cpu
    for kind, python in (("cpu", "/usr/local/bin/python3.10"), ("gpu", "/usr/bin/python3.10")):
        text = images.DOCKERFILES[kind].read_text()
        assert f"ARG PYTHON={python}" in text
        assert re.search(r"^ARG BASE_IMAGE=\S+:\S+$", text, re.MULTILINE)  # pinned, a build arg
        assert ":latest" not in text


def test_image_tags_carry_the_project_version():
    version = re.search(r'^version = "([^"]+)"', (REPO_ROOT / "pyproject.toml").read_text(), re.M)
    config = PipelineConfig.load(environ={})
    assert config.cpu_image.endswith(f":{version.group(1)}")
    assert config.gpu_image.endswith(f":{version.group(1)}")


@pytest.fixture(scope="module")
def step_image():
    """The CPU image, built by `make images BASE=local`, the target CI runs."""
    missing = missing_for_images()
    if missing:
        pytest.skip(f"container tests: {missing}")
    started = time.monotonic()
    result = subprocess.run(
        # ARGS= : not the test command's own (`make test ARGS=...` hands it to every make below)
        ["make", "images", "BASE=local", "ARGS="], cwd=REPO_ROOT, capture_output=True, text=True,
        timeout=2400,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    image = PipelineConfig.load(environ={}).cpu_image
    assert f"Built {image} in " in result.stdout
    return images.engine(), image, time.monotonic() - started


def test_the_image_is_lean_and_runs_as_a_non_root_user(step_image):
    engine, image, _ = step_image
    assert engine.run("image", "inspect", "--format", "{{.Config.User}}", image).stdout.strip() == (
        "1000:1000"
    )
    probe = (
        "id -u; test ! -e /app/tests; test ! -e /app/.git; test ! -e /app/.venv; "
        "test ! -e /root/.cache/uv; command -v gcc cc || echo no-compiler; "
        "python -c 'import pipelines.kubeflow.kfp_entrypoint, importlib.metadata as m; "
        'print(m.version("tfx-kubeflow-pipeline"))\''
    )
    out = engine.run("run", "--rm", "--network=none", image, "sh", "-c", probe).stdout.split()
    assert out == [
        "1000",
        "no-compiler",
        PipelineConfig.load(environ={}).cpu_image.rsplit(":", 1)[1],
    ]


def _backend(
    bucket: str, work_dir, runtime: ContainerRuntime, config: PipelineConfig
) -> kfp_harness.Backend:
    return kfp_harness.Backend(
        pipeline_root=f"s3://{bucket}/pipeline_root",
        images={config.cpu_image: REPO_ROOT / "kubeflow" / "Dockerfile"},
        secrets={config.credentials_secret: {k: os.environ[k] for k in SECRET_KEYS}},
        work_dir=work_dir,
        containers=runtime,
    )


def _config_for_this_machine(name: str) -> PipelineConfig:
    """Use case `name`'s config (its defaults) for a cluster without GPUs: the Trainer on the
    CPU image."""
    use_case_kit = kit.of(name)
    return use_case_kit.config(gpu_count="0", gpu_image=use_case_kit.config().cpu_image)


def _store_port() -> int:
    return urllib.parse.urlsplit(os.environ["AWS_ENDPOINT_URL_S3"]).port


@pytest.mark.parametrize("name", use_case.shipped())
def test_compiled_spec_runs_each_task_in_its_own_container_and_pushes(
    step_image, object_store, tmp_path, name
):
    engine, image, build_seconds = step_image
    config, settings = _config_for_this_machine(name), kit.of(name).settings
    spec, platform = kubeflow_runner.compile_documents(config)
    bucket = object_store.new_bucket("containers")
    data_root, serving_root = f"s3://{bucket}/data", f"s3://{bucket}/serving"
    model_dir = serving_model_dir(serving_root, config.model_name)
    data.write_span(data_root, 0, settings.span_rows, use_case=name)
    # The bars are far below what this training reaches (the use case's SETTINGS say what it
    # measured): only a broken step can fail them.
    parameters = {"data_root": data_root, "serving_root": serving_root, "train_steps": 200,
                  **settings.run_bars}  # fmt: skip
    with ContainerRuntime(engine, _store_port(), tmp_path) as runtime:
        run = _backend(bucket, tmp_path, runtime, config).run(spec, platform, parameters)

    assert {t.state for t in run.tasks.values()} == {"executed"}
    executed = {figure["task"] for figure in runtime.figures}
    assert executed == set(run.tasks)  # every task ran in a container, once
    versions = pushed_versions(model_dir)
    assert list(versions) == [1]
    assert serving_state.read(model_dir, config.model_name).stable == 1
    scores, _ = kit.of(name).served_scores(versions[1], data_root, 0, 48)  # 12 of 4 classes
    assert scores.shape == (48, len(kit.of(name).class_names))
    # The step's log comes from inside its container: the image's paths, not the host's.
    log = storage.read_bytes(run.outputs("trainer")["executor-logs"]["uri"]).decode()
    assert "/opt/venv/lib/python3.10" in log or "components.steps.trainer" in log
    for figure in runtime.figures:
        assert figure["exit_code"] == 0 and not figure["oom_killed"], figure
        assert figure["start_up_s"] is not None, figure  # the executor's first line was seen
        assert 0 < (figure["peak_memory_bytes"] or 0) < figure["memory_limit_bytes"], figure
    FIGURES_PATH.parent.mkdir(parents=True, exist_ok=True)
    FIGURES_PATH.write_text(json.dumps({
        "use_case": name, "image": image, "image_bytes": engine.image_size(image),
        "build_seconds": build_seconds, "steps": runtime.figures,
    }, indent=2))  # fmt: skip


@pytest.mark.parametrize(
    "breakage, cause",
    [
        ("image", "ErrImageNeverPull: container image 'registry.example.com/no-such-image:1'"),
        ("memory", "OOMKilled: over its limit of 0.05G"),
        ("volume", "error: this step runs as uid 1000 and may not use /s3/"),
    ],
)
def test_a_step_that_cannot_start_or_run_fails_its_task_naming_the_cause(
    step_image, object_store, tmp_path, breakage, cause
):
    engine, _, _ = step_image
    config = _config_for_this_machine(PipelineConfig.load(environ={}).use_case)
    spec, platform = kubeflow_runner.compile_documents(config)
    first = kfp_harness._topological(spec["root"]["dag"]["tasks"])[0]
    label = spec["components"][spec["root"]["dag"]["tasks"][first]["componentRef"]["name"]]
    container = spec["deploymentSpec"]["executors"][label["executorLabel"]]["container"]
    if breakage == "image":
        container["image"] = "registry.example.com/no-such-image:1"
    elif breakage == "memory":
        # Far below what the imports need: near their working set the kernel can thrash on
        # the libraries' file pages for minutes instead of killing (seen at 0.2G).
        container["resources"]["memoryLimit"] = 0.05
    bucket = object_store.new_bucket("broken")
    data.write_span(f"s3://{bucket}/data", 0, 500)
    backend = _backend(bucket, tmp_path, None, config)
    backend.images["registry.example.com/no-such-image:1"] = REPO_ROOT / "kubeflow" / "Dockerfile"
    with ContainerRuntime(engine, _store_port(), tmp_path) as runtime:
        backend.containers = runtime
        runtime.hand_over_volumes = breakage != "volume"
        deadline = time.monotonic() + 180  # a failure to fail is reported, not waited out
        backend.interrupt[first] = lambda: time.monotonic() > deadline
        with pytest.raises(kfp_harness.TaskFailed) as failure:
            backend.run(spec, platform, {"data_root": f"s3://{bucket}/data",
                                         "serving_root": f"s3://{bucket}/serving"})  # fmt: skip
    assert f"task {first} failed" in str(failure.value) and cause in str(failure.value)
    assert not storage.list_files(f"s3://{bucket}/serving/**")  # nothing pushed


def _readme_container_run_line() -> str:
    """README's container route (other platforms): its `docker run ... tkp run` line."""
    lines = [line.strip() for line in (REPO_ROOT / "README.md").read_text().splitlines()]
    (line,) = [x for x in lines if x.startswith("docker run ") and x.endswith(" tkp run")]
    return line


def test_the_readme_container_route_runs_the_pipeline_to_a_pushed_model(step_image, tmp_path):
    """A machine the lock does not install on (macOS, ARM) runs `make run`'s pipeline in the
    step image, as README's container route says: the same line, with this machine's engine
    for `docker`, the built image for the tag it builds, the test's folder for `$PWD`, and for
    `$(id -u):$(id -g)` a user the image does not know who owns that folder (as a reader's
    shell gives their own). Nothing outside the container is needed: SeaweedFS and the
    generated data live in the mounted work folder."""
    engine, image, _ = step_image
    line = _readme_container_run_line()
    user, mount = '"$(id -u):$(id -g)"', '"$PWD/.work:/work"'
    assert README_IMAGE in line and user in line and mount in line
    work = tmp_path / ".work"
    work.mkdir()
    os.chown(work, 4321, 4321)
    command = line.replace(README_IMAGE, image).replace(user, "4321:4321")
    command = command.replace(mount, f"{work}:/work").replace("docker run ", "run --network=none ")
    started = time.monotonic()
    done = subprocess.run(
        [*engine.command, *shlex.split(command)], env=engine.process_environment,
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Blessed: yes" in output and "Pushed: s3://tfx-pipeline/serving/taxi-tips/1" in output
    assert "P(big tip)" in output  # the pushed model's predictions on raw rows
    reports = list((work / "logs").glob("run-*.report.html"))
    assert len(reports) == 1 and "Pushed: version 1" in reports[0].read_text()
    assert reports[0].stat().st_uid == 4321  # written as the reader's user, in their folder
    print(f"container route: tkp run in {time.monotonic() - started:.0f} s")
