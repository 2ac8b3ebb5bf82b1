"""The CI recipe (.github/workflows/train-on-merge.yml) cannot rot unseen: it passes its linter,
every command it runs is a Makefile target, and its jobs are played here, their `run:` scripts
verbatim with the environment the workflow gives them:

- the images job against a real registry (Debian's docker-registry, the CNCF distribution
  server) on loopback: the commit-tagged CPU image is pushed and the registry serves it;
- the deploy job against tests/stand_ins/kfp_api_stand_in.py (no Kubernetes here): the spec is
  compiled with the commit's tags, uploaded, one run started and the recurring run moved to it.

What differs from GitHub, and why: `uses:` steps are not run (checkout: this repository;
setup-python: the Makefile's venv; login: the loopback registry has no accounts; upload-artifact:
its path is checked); the images job builds with podman on the local base (BASE=local) and
without the GPU image (NVIDIA's base cannot be pulled here); podman is told the loopback
registry speaks plain HTTP (a registries.conf of the test's own).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from components.base.config import REPO_ROOT, SPEC_PATH, PipelineConfig
from components.base.processes import stop_process
from components.training.local_workers import free_ports
from pipelines.kubeflow import images, kfp_client
from tests.stand_ins.kfp_api_stand_in import API, FakeKfpApi
from tests.stand_ins.kfp_containers import missing_for_images

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "train-on-merge.yml"
SHA = "0123456789abcdef0123456789abcdef01234567"
EXPRESSION = re.compile(r"\$\{\{\s*([^}]*?)\s*\}\}")
# The make targets the jobs run; each is played by a test below (a new one must be, too).
PLAYED_TARGETS = {"images", "compile", "submit", "schedule"}


def _workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def _evaluate(text: str, context: dict[str, str]) -> str:
    """The workflow's ${{ context.name }} expressions, the only kind this recipe uses."""

    def value(match: re.Match) -> str:
        if match.group(1) not in context:
            pytest.fail(f"{WORKFLOW.name}: ${{{{ {match.group(1)} }}}} is not known to this test")
        return context[match.group(1)]

    return EXPRESSION.sub(value, text)


def _condition(expression: str, context: dict[str, str]) -> bool:
    found = re.fullmatch(r"\s*([\w.]+)\s*(==|!=)\s*'([^']*)'\s*", expression)
    if not found or found.group(1) not in context:
        pytest.fail(f"{WORKFLOW.name}: condition {expression!r} is not known to this test")
    equal = context[found.group(1)] == found.group(3)
    return equal if found.group(2) == "==" else not equal


def _play(job_name: str, context: dict, changes: dict, environment: dict) -> list[dict]:
    """Runs the job's `run:` scripts in order as GitHub's bash does; returns the `uses:` steps
    (their `with:` evaluated) for the caller to check. `changes`: env this machine needs."""
    job = _workflow()["jobs"][job_name]
    if "if" in job:
        assert _condition(job["if"], context), f"job {job_name} would not run on a merge"
    env = {name: _evaluate(str(value), context) for name, value in job.get("env", {}).items()}
    env = {k: v for k, v in {**env, **changes}.items() if v is not None}
    context = {**context, **{f"env.{name}": value for name, value in env.items()}}
    used = []
    for step in job["steps"]:
        if "if" in step and not _condition(step["if"], context):
            continue
        if "uses" in step:
            used.append({k: _evaluate(str(v), context) for k, v in step.get("with", {}).items()})
            continue
        step_env = {name: _evaluate(str(value), context)
                    for name, value in step.get("env", {}).items()}  # fmt: skip
        result = subprocess.run(
            ["bash", "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", step["run"]],
            cwd=REPO_ROOT, env={**environment, **env, **step_env}, capture_output=True,
            text=True, timeout=2400,
        )  # fmt: skip
        assert result.returncode == 0, f"{step['run']}:\n{result.stdout[-3000:]}{result.stderr}"
        used.append({"run": step["run"], "output": result.stdout + result.stderr})
    return used


def _clean_environment(**extra: str) -> dict[str, str]:
    """This process's environment without the settings a job sets itself."""
    inherited = {k: v for k, v in os.environ.items()
                 if not k.startswith(("PIPELINE_", "KFP_", "CONTAINER"))}  # fmt: skip
    return {**inherited, **extra}


def test_the_recipe_passes_its_linter_which_catches_a_broken_recipe(tmp_path):
    linter = [str(REPO_ROOT / ".venv" / "bin" / "actionlint")]
    path = f"{REPO_ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"  # shellcheck for run: scripts
    result = subprocess.run([*linter, str(WORKFLOW)], capture_output=True, text=True,
                            env={**os.environ, "PATH": path})  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr

    text = WORKFLOW.read_text()
    broken = {
        "needs.yml": (text.replace("needs: images", "needs: image"), 'needs job "image"'),
        "shell.yml": (text.replace("run: make submit", "run: make submit ARGS=$KFP_TOKEN"),
                      "SC2086"),
    }  # fmt: skip
    for name, (content, complaint) in broken.items():
        assert content != text
        (tmp_path / name).write_text(content)
        result = subprocess.run([*linter, str(tmp_path / name)], capture_output=True, text=True,
                                env={**os.environ, "PATH": path})  # fmt: skip
        assert result.returncode != 0 and complaint in result.stdout, result.stdout


def test_every_command_is_a_make_target_played_here_and_every_action_is_pinned():
    workflow = _workflow()
    targets = set()
    for job_name, job in workflow["jobs"].items():
        for step in job["steps"]:
            if "uses" in step:  # a commit, not a tag that can move
                assert re.fullmatch(r"[\w-]+/[\w-]+@[0-9a-f]{40}", step["uses"]), step["uses"]
                continue
            assert "${{" not in step["run"], f"{job_name}: an expression inside a script"
            command = re.fullmatch(r"make ([a-z-]+)(?: [A-Z_]+=\S+)*", step["run"])
            assert command, f"{job_name}: {step['run']!r} is not a make target"
            targets.add(command.group(1))
    assert targets == PLAYED_TARGETS | {"ci"}  # ci: .ci/run, the CI of every submission
    assert workflow["jobs"]["test"]["steps"][-1]["run"] == "make ci"
    # The API's address and credentials go to the two steps that talk to it, and only there.
    deploy_steps = workflow["jobs"]["deploy"]["steps"]
    talking = [step for step in deploy_steps if "KFP_ENDPOINT" in step.get("env", {})]
    assert [step["run"].split()[1] for step in talking] == ["submit", "schedule"]
    kfp_env = {name for name in talking[0]["env"] if name.startswith("KFP_")}
    assert kfp_env == {"KFP_ENDPOINT", "KFP_TOKEN", "KFP_NAMESPACE"}
    assert all(talking[1]["env"][name] == talking[0]["env"][name] for name in kfp_env)
    elsewhere = [workflow.get("env", {}), workflow["jobs"]["deploy"].get("env", {})] + [
        job for name, job in workflow["jobs"].items() if name != "deploy"
    ]
    assert not any(name in json.dumps(elsewhere) for name in kfp_env)
    # One commit, one pair of tags: what is pushed is what the spec names.
    images_env, deploy_env = (workflow["jobs"][job]["env"] for job in ("images", "deploy"))
    for name in ("PIPELINE_CPU_IMAGE", "PIPELINE_GPU_IMAGE"):
        assert images_env[name] == deploy_env[name]
        assert images_env[name].endswith(":${{ github.sha }}")
    assert workflow["jobs"]["images"]["needs"] == "test"
    assert workflow["jobs"]["deploy"]["needs"] == "images"


class LoopbackRegistry:
    """Debian's docker-registry (distribution 2.8) on 127.0.0.1, storage in `root`."""

    def __init__(self, root: Path) -> None:
        self.port = free_ports(1)[0]
        self.host = f"127.0.0.1:{self.port}"
        self.root = root
        root.mkdir(parents=True)
        config = root / "config.yml"
        config.write_text(
            "version: 0.1\nlog:\n  level: warn\n"
            f"storage:\n  filesystem:\n    rootdirectory: {root / 'data'}\n"
            f"http:\n  addr: {self.host}\n"
        )
        # podman refuses plain HTTP unless the registry is listed as insecure.
        self.registries_conf = root / "registries.conf"
        self.registries_conf.write_text(
            f'[[registry]]\nlocation = "{self.host}"\ninsecure = true\n'
        )
        self.log = open(root / "registry.log", "w")  # noqa: SIM115 (closed in close())
        self.process = subprocess.Popen(["docker-registry", "serve", str(config)],
                                        stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 30
        while self.get("/v2/") is None:
            assert self.process.poll() is None and time.monotonic() < deadline, (
                root / "registry.log"
            ).read_text()
            time.sleep(0.2)

    def get(self, path: str, accept: str = "", method: str = "GET") -> dict | None:
        request = urllib.request.Request(f"http://{self.host}{path}", method=method,
                                         headers={"Accept": accept} if accept else {})  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=10) as response:
                body = response.read()
                return json.loads(body) if body and method == "GET" else {}
        except OSError:
            return None

    def close(self) -> None:
        stop_process(self.process, grace_seconds=5)
        self.log.close()
        shutil.rmtree(self.root / "data", ignore_errors=True)  # gigabytes of layers


@pytest.fixture
def loopback_registry(tmp_path):
    missing = missing_for_images()
    if not missing and not shutil.which("docker-registry"):
        missing = "docker-registry is missing (apt-get install docker-registry)"
    if missing:
        pytest.skip(f"CI recipe, images job: {missing}")
    registry = LoopbackRegistry(tmp_path / "registry")
    yield registry
    registry.close()


def test_the_images_job_pushes_the_commit_tagged_image_the_registry_then_serves(
    loopback_registry: LoopbackRegistry,
):
    context = {"github.ref": "refs/heads/main", "github.sha": SHA,
               "vars.REGISTRY": loopback_registry.host,
               "vars.IMAGE_REPOSITORY": f"{loopback_registry.host}/ci",
               "secrets.REGISTRY_USERNAME": "", "secrets.REGISTRY_PASSWORD": ""}  # fmt: skip
    this_machine = {"CONTAINER_ENGINE": None, "GPU": None, "BASE": "local"}
    registries_conf = str(loopback_registry.registries_conf)
    environment = _clean_environment(CONTAINERS_REGISTRIES_CONF=registries_conf)
    steps = _play("images", context, this_machine, environment)

    (login,) = [step for step in steps if "registry" in step]
    assert login["registry"] == loopback_registry.host
    (push,) = [step for step in steps if "run" in step]
    reference = f"{loopback_registry.host}/ci/tfx-pipeline:{SHA}"
    assert re.search(rf"Pushed {re.escape(reference)} in \d+ s", push["output"]), push["output"]
    manifest = loopback_registry.get(
        f"/v2/ci/tfx-pipeline/manifests/{SHA}",
        "application/vnd.oci.image.manifest.v1+json,"
        "application/vnd.docker.distribution.manifest.v2+json",
    )
    engine = images.engine()
    try:
        image_id = engine.run("image", "inspect", "--format", "{{.Id}}", reference).stdout.strip()
        assert manifest is not None, "the registry does not serve the pushed tag"
        assert manifest["config"]["digest"] == f"sha256:{image_id}"  # the very image built
        for layer in manifest["layers"]:
            blob = f"/v2/ci/tfx-pipeline/blobs/{layer['digest']}"
            assert loopback_registry.get(blob, method="HEAD") == {}, layer
    finally:  # the commit's tag goes; the image stays as `make images` names it (build cache)
        engine.run("tag", reference, PipelineConfig.load(environ={}).cpu_image, check=False)
        engine.run("rmi", reference, check=False)


def test_the_deploy_job_compiles_with_the_commit_tags_submits_and_moves_the_schedule(
    tmp_path, monkeypatch: pytest.MonkeyPatch
):
    api = FakeKfpApi(multi_user=True)  # a profile namespace is needed
    monkeypatch.setattr("kfp.Client._LOCAL_KFP_CONTEXT", str(tmp_path / "kfp-context.json"))
    try:  # the recurring run an earlier merge left, on the committed spec
        kfp_client.schedule(api.endpoint, str(SPEC_PATH),
                            "0 2 * * *", {}, namespace="team-a")  # fmt: skip
        del api.requests[:], api.authorization[:]
        context = {"github.sha": SHA, "vars.IMAGE_REPOSITORY": "registry.example.com/ci",
                   "secrets.KFP_ENDPOINT": api.endpoint, "secrets.KFP_TOKEN": "ci-token",
                   "secrets.KFP_NAMESPACE": "team-a", "vars.KFP_SCHEDULE": "0 2 * * *"}  # fmt: skip
        environment = _clean_environment(HOME=str(tmp_path))  # kfp's context file goes there
        steps = _play("deploy", context, {}, environment)
    finally:
        api.close()

    cpu, gpu = (f"registry.example.com/ci/tfx-pipeline{kind}:{SHA}" for kind in ("", "-gpu"))
    (artifact,) = [step for step in steps if "path" in step]
    spec_path = REPO_ROOT / artifact["path"]
    spec = yaml.safe_load_all(spec_path.read_text())
    executors = next(spec)["deploymentSpec"]["executors"].values()
    named = {executor["container"]["image"] for executor in executors}
    assert named == {cpu, gpu}  # every step on this commit's images, the Trainer on the GPU one
    assert PipelineConfig.load(environ={}).cpu_image not in spec_path.read_text()
    assert api.uploads and cpu.encode() in api.uploads[-1]  # the uploaded package is that spec

    (run,) = api.bodies("POST", f"{API}/runs")
    (job,) = api.recurring_runs  # the earlier one is gone, the new one runs the new version
    new_version = job["pipeline_version_reference"]["pipeline_version_id"]
    assert run["pipeline_version_reference"]["pipeline_version_id"] == new_version != "v0"
    assert (job["display_name"], job["mode"]) == ("taxi-tips-nightly", "ENABLE")
    assert job["trigger"] == {"cron_schedule": {"cron": "0 0 2 * * *"}}
    assert set(api.authorization) == {"Bearer ci-token"}
    # The experiment the earlier merge made is found in the profile namespace and reused.
    assert [e["namespace"] for e in api.experiments.values()] == ["team-a"]
    looked_up = [q for m, p, q, _ in api.requests if (m, p) == ("GET", f"{API}/experiments")]
    assert looked_up and all(q["namespace"] == "team-a" for q in looked_up)
    assert not any("ci-token" in step.get("output", "") for step in steps)


def test_the_push_sends_the_gpu_image_too_and_refuses_one_not_built(tmp_path):
    """The images job's GPU half. Boundary: docker with NVIDIA's base cannot exist here, so the
    engine is a script that records its arguments (and has no image named `missing`)."""
    calls = tmp_path / "calls"
    engine = tmp_path / "docker"
    engine.write_text(f'#!/bin/sh\necho "$@" >> {calls}\ncase "$*" in *missing*) exit 1;; esac\n')
    engine.chmod(0o755)
    cpu, gpu = "registry.example.com/ci/tfx:abc", "registry.example.com/ci/tfx-gpu:abc"
    config = PipelineConfig.load({"cpu_image": cpu, "gpu_image": gpu}, environ={})
    said: list[str] = []
    pushed = images.push_images(config, gpu=True, say=said.append,
                                container_engine=images.Engine([str(engine)]))  # fmt: skip
    assert pushed == [cpu, gpu]
    assert calls.read_text().splitlines() == [
        f"image inspect {cpu}",
        f"push {cpu}",
        f"image inspect {gpu}",
        f"push {gpu}",
    ]
    assert any(line.startswith(f"Pushed {gpu} in ") for line in said)

    config = PipelineConfig.load({"gpu_image": "registry.example.com/missing:1"}, environ={})
    with pytest.raises(images.ImageBuildFailed, match="missing:1 is not built here: run `make"):
        images.push_images(config, gpu=True, say=said.append,
                           container_engine=images.Engine([str(engine)]))  # fmt: skip
