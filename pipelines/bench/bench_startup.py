"""Start-up of each Kubeflow step, next to a bare `import tensorflow`: seconds from process start
to the entry point's `<executor> starts: imports done` line, and peak RSS at that moment.

Each step runs its compiled command line from the spec (`python -m
pipelines.kubeflow.kfp_entrypoint` and
the spec's arguments) in the image's environment, as tests/stand_ins/kfp_launcher.py plays a pod:
`{{$}}` becomes an ExecutorInput with the task's parameters as the driver resolves them, inputs and
outputs under a throwaway pod root (KFP_LOCAL_ARTIFACT_ROOT), each input an empty folder. That
passes the entry point's checks without any data or object store, and the process is killed as soon
as the line appears, before the executor would read anything.

Usage: python -m pipelines.bench.bench_startup [SPEC] [--repeats N] [--steps a,b]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import yaml

from components.base.config import SPEC_PATH
from components.base.launcher_paths import LOCAL_ROOT_ENV
from pipelines.kubeflow.kfp_entrypoint import EXECUTOR_STARTS

REPO_ROOT = Path(__file__).resolve().parents[2]
# Both images' Python layers are the same text (tests/pipelines/kubeflow/test_kubeflow_spec.py
# compares them), so the CPU image's ENV is every step's.
DOCKERFILE = REPO_ROOT / "kubeflow" / "Dockerfile"
IMAGE_VENV = "/opt/venv"
BARE = "bare_import_tensorflow"
# The bare import ends with a line of its own so that both figures stop at the same kind of
# event (a line read from the process), not one at the line and the other at interpreter exit.
_BARE_DONE = "bare import done"
_BARE_CODE = f"import tensorflow; print({_BARE_DONE!r}, flush=True)"
# The launcher's output metadata file (component/launcher_v2.go OutputMetadataFilepath).
# Generous: a step on a loaded 2-CPU machine takes ~10 s; one that hangs must not hang the bench.
_TIMEOUT_S = 180


class StartupFailed(RuntimeError):
    """A process ended (or timed out) before its import-done line."""


def load_spec(spec_path: Path) -> dict:
    """The pipeline spec: the first YAML document (the second is the platform spec)."""
    with open(spec_path) as f:
        return next(iter(yaml.safe_load_all(f)))


def image_environment(dockerfile: Path = DOCKERFILE, python: str = sys.executable) -> dict:
    """The ENV a container of the image starts with (its Dockerfile's `ENV K=V` lines), with the
    image's venv replaced by the one `python` belongs to."""
    from pipelines.kubeflow.images import dockerfile_env

    environment = dockerfile_env(dockerfile)
    venv = str(Path(python).parent.parent)
    return {key: value.replace(IMAGE_VENV, venv) for key, value in environment.items()}


def step_commands(spec: dict, only: Iterable[str] | None = None) -> dict[str, dict]:
    """Task name -> {"executor" (its class path), "argv" (`{{$}}` not yet replaced),
    "parameters" (as the driver resolves them), "component"}: one task per distinct executor,
    in the spec's order, or the tasks named in `only`."""
    wanted = set(only) if only is not None else None
    root_values = {
        name: definition.get("defaultValue")
        for name, definition in spec["root"]
        .get("inputDefinitions", {})
        .get("parameters", {})
        .items()
    }
    steps, seen = {}, set()
    for task_name, task in spec["root"]["dag"]["tasks"].items():
        component = spec["components"][task["componentRef"]["name"]]
        label = component["executorLabel"]
        if label in seen or (wanted is not None and task_name not in wanted):
            continue
        seen.add(label)
        container = spec["deploymentSpec"]["executors"][label]["container"]
        argv = container.get("command", []) + container.get("args", [])
        executor = argv[argv.index("--executor_class_path") + 1]
        steps[task_name] = {
            "executor": executor,
            "argv": argv,
            "parameters": _parameters(task, component, root_values),
            "component": component,
        }
    if wanted is not None and wanted - set(steps):
        raise ValueError(f"no such task in the spec: {sorted(wanted - set(steps))}")
    return steps


def _parameters(task: dict, component: dict, root_values: dict) -> dict:
    """The task's parameter values as the driver resolves them, with the launcher's defaults."""
    values = {}
    for name, source in task.get("inputs", {}).get("parameters", {}).items():
        if "runtimeValue" in source:
            values[name] = source["runtimeValue"]["constant"]
        elif "componentInputParameter" in source:
            values[name] = root_values.get(source["componentInputParameter"])
    for name, definition in component.get("inputDefinitions", {}).get("parameters", {}).items():
        if name not in values and "defaultValue" in definition:
            values[name] = definition["defaultValue"]
    return values


def _executor_input(step: dict, root: Path, task_name: str) -> dict:
    """An ExecutorInput for a pod rooted at `root`: each declared input an empty folder where
    the launcher would have downloaded it, outputs where the driver would put them."""
    component = step["component"]
    inputs = {}
    for name, definition in component.get("inputDefinitions", {}).get("artifacts", {}).items():
        uri = f"s3://bench/upstream/{uuid.uuid4().hex[:8]}/{name}"
        (root / "s3" / uri[len("s3://") :]).mkdir(parents=True)
        artifact = {"name": name, "uri": uri, "type": definition["artifactType"], "metadata": {}}
        inputs[name] = {"artifacts": [artifact]}
    outputs = {}
    declared = dict(component.get("outputDefinitions", {}).get("artifacts", {}))
    declared["executor-logs"] = {"artifactType": {"schemaTitle": "system.Artifact"}}
    run = f"s3://bench/pipeline_root/pipeline/{uuid.uuid4()}/{task_name}/{uuid.uuid4()}"
    for name, definition in declared.items():
        artifact = {"uri": f"{run}/{name}", "type": definition["artifactType"]}
        outputs[name] = {"artifacts": [artifact]}
    # KFP 2.15+ (driver/driver.go provisionOutputs): the ExecutorOutput in the task's folder.
    task_root = root / "s3" / run[len("s3://") :]
    task_root.mkdir(parents=True)
    return {
        "inputs": {"parameterValues": step["parameters"], "artifacts": inputs},
        "outputs": {"artifacts": outputs, "outputFile": str(task_root / "output_metadata.json")},
    }


def _pod_environment(root: Path, python: str) -> dict[str, str]:
    environment = image_environment(python=python)
    home = root / environment.get("HOME", "/root").lstrip("/")
    home.mkdir(parents=True, exist_ok=True)
    environment.update(HOME=str(home), TMPDIR=str(root / "tmp"))
    environment[LOCAL_ROOT_ENV] = str(root)
    return environment


def time_to_line(
    argv: list[str], marker: str, env: dict[str, str], cwd: Path = REPO_ROOT
) -> dict[str, float]:
    """Runs argv until a line of its output holds `marker`: seconds from start to that line and
    the process's peak RSS then (VmHWM); the process is stopped at once and killed."""
    started = time.perf_counter()
    process = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    timed_out = []

    def kill_on_timeout() -> None:
        timed_out.append(True)
        os.killpg(process.pid, signal.SIGKILL)

    timer = threading.Timer(_TIMEOUT_S, kill_on_timeout)
    timer.start()
    tail: list[str] = []
    try:
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            if marker in line:
                seconds = time.perf_counter() - started
                # Stopped first so that nothing it does after the line counts in its memory.
                os.killpg(process.pid, signal.SIGSTOP)
                rss_mb = _peak_rss_mb(process.pid)
                return {"seconds": seconds, "rss_mb": rss_mb}
            tail = (tail + [line])[-30:]
        process.wait()
        how = f"killed after {_TIMEOUT_S} s" if timed_out else f"exited {process.returncode}"
        raise StartupFailed(
            f"{shlex.join(argv)[:200]}... {how} before {marker!r}:\n" + "".join(tail)
        )
    finally:
        timer.cancel()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()


def _peak_rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise StartupFailed(f"no VmHWM for process {pid}")


def measure(
    spec_path: Path,
    repeats: int = 3,
    say: Callable[[str], None] = print,
    steps: Iterable[str] | None = None,
    python: str = sys.executable,
    source: Path | None = None,
    profile_imports: bool = True,
) -> dict:
    """Median start-up of each distinct step executor in the compiled spec (or of the tasks
    named in `steps`) and of a bare `import tensorflow`, in the same interpreter (`python`, the
    image's venv stood in by this one) and the image's environment:

        {"bare_import_tensorflow": {"seconds", "rss_mb"},
         "steps": {task name: {"seconds", "rss_mb", "ratio", "executor"}}}

    `seconds` runs from the process's start to its import-done line, `rss_mb` is its peak RSS
    then, `ratio` a step's seconds over the bare import's, `executor` its class path. Runs are
    interleaved (bare, step 1, step 2, ..., bare, ...) so that the machine's noise is shared.
    StartupFailed when a process ends before its line.

    `source`: a checkout of another commit whose code the steps run (its spec's command lines,
    with its root first on PYTHONPATH, as the bench's before side runs a pipeline); the bare
    import runs beside them all the same. `profile_imports=False` leaves out the extra run
    per step that says where the seconds go (no `imports_*` keys)."""
    if source and profile_imports:  # import_seconds runs this checkout's code
        raise ValueError("profile_imports=True measures this checkout: pass False with source")
    commands = step_commands(load_spec(spec_path), steps)
    cwd = source or REPO_ROOT

    def environment(root: Path) -> dict[str, str]:
        env = _pod_environment(root, python)
        if source:
            env["PYTHONPATH"] = str(source)  # its packages before the venv's editable install
        return env

    samples: dict[str, list[dict]] = {BARE: [], **{name: [] for name in commands}}
    for round_ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
            root = Path(folder, "bare")
            root.mkdir()
            result = time_to_line(
                [python, "-c", _BARE_CODE], _BARE_DONE, _pod_environment(root, python)
            )
            samples[BARE].append(result)
            say(f"[{round_ + 1}/{repeats}] {BARE}: {_figures(result)}")
            for task_name, step in commands.items():
                root = Path(folder, task_name)
                root.mkdir()
                placeholder = json.dumps(_executor_input(step, root, task_name))
                argv = [part.replace("{{$}}", placeholder) for part in step["argv"]]
                if argv[0] == "python":  # the image's python is its venv's
                    argv[0] = python
                result = time_to_line(argv, EXECUTOR_STARTS, environment(root), cwd)
                samples[task_name].append(result)
                say(f"[{round_ + 1}/{repeats}] {task_name}: {_figures(result)}")
        if round_ == 0 and profile_imports:  # once: timing imports slows them a little
            with tempfile.TemporaryDirectory(prefix="bench-startup-") as folder:
                bare_env = _pod_environment(Path(folder), python)
                imports = {BARE: import_seconds([python, "-c", _BARE_CODE], _BARE_DONE, bare_env)}
                for task_name, step in commands.items():
                    root = Path(folder, task_name)
                    root.mkdir()
                    placeholder = json.dumps(_executor_input(step, root, task_name))
                    argv = [part.replace("{{$}}", placeholder) for part in step["argv"]]
                    argv[0] = python if argv[0] == "python" else argv[0]
                    imports[task_name] = import_seconds(argv, EXECUTOR_STARTS,
                                                        _pod_environment(root, python))  # fmt: skip
    bare = _median(samples[BARE])
    results = {BARE: bare, "steps": {}}
    for name in commands:
        step = results["steps"][name] = {
            **_median(samples[name]),
            "ratio": round(_median(samples[name])["seconds"] / bare["seconds"], 2),
            "executor": commands[name]["executor"],
        }
        if profile_imports:
            step["imports_seconds"] = round(sum(imports[name].values()), 2)
            step["imports_beyond_bare"] = beyond_bare(imports[name], imports[BARE])
    if profile_imports:
        bare["imports_seconds"] = round(sum(imports[BARE].values()), 2)
    return results


def combine(rounds: list[dict]) -> dict:
    """`measure`'s results of several rounds (each of one repeat) as one result: the median of
    each figure, ratios of the medians, the import figures from the round that has them."""
    steps = rounds[0]["steps"]
    bare = _median([r[BARE] for r in rounds])
    out = {BARE: bare, "steps": {}}
    for name in steps:
        step = out["steps"][name] = {
            **_median([r["steps"][name] for r in rounds]),
            "executor": steps[name]["executor"],
        }
        step["ratio"] = round(step["seconds"] / bare["seconds"], 2)
    profiled = next((r for r in rounds if "imports_seconds" in r[BARE]), None)
    if profiled:
        bare["imports_seconds"] = profiled[BARE]["imports_seconds"]
        for name, step in out["steps"].items():
            step["imports_seconds"] = profiled["steps"][name]["imports_seconds"]
            step["imports_beyond_bare"] = profiled["steps"][name]["imports_beyond_bare"]
    return out


def import_seconds(argv: list[str], marker: str, env: dict[str, str]) -> dict[str, float]:
    """Seconds of imports by top-level package, up to `marker`: one more run with Python's
    import timing on (PYTHONPROFILEIMPORTTIME; each module's own time, without its imports',
    summed per first name component), which says where a start-up's seconds go."""
    process = subprocess.Popen(argv, env={**env, "PYTHONPROFILEIMPORTTIME": "1"}, cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               start_new_session=True)  # fmt: skip
    by_package: dict[str, float] = {}
    try:
        for raw in process.stdout:
            line = raw.decode(errors="replace")
            if marker in line:
                break
            fields = line.split("|")
            if line.startswith("import time:") and len(fields) == 3 and "self [us]" not in line:
                package = fields[2].strip().split(".")[0]
                own = int(fields[0].split(":")[1]) / 1e6
                by_package[package] = by_package.get(package, 0.0) + own
        else:
            raise StartupFailed(f"{shlex.join(argv)[:200]}... ended before {marker!r}")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        process.stdout.close()
    return dict(sorted(by_package.items(), key=lambda item: -item[1]))


def beyond_bare(step: dict[str, float], bare: dict[str, float], top: int = 5) -> dict:
    """The packages whose imports cost a step most beyond what they cost the bare import."""
    extra = {name: seconds - bare.get(name, 0.0) for name, seconds in step.items()}
    return {name: round(seconds, 2) for name, seconds in
            sorted(extra.items(), key=lambda item: -item[1])[:top] if seconds >= 0.05}  # fmt: skip


def _median(results: list[dict]) -> dict:
    return {
        "seconds": round(statistics.median(r["seconds"] for r in results), 2),
        "rss_mb": round(statistics.median(r["rss_mb"] for r in results)),
    }


def _figures(result: dict) -> str:
    return f"{result['seconds']:.2f} s, {result['rss_mb']:.0f} MB"


def table(results: dict) -> str:
    bare = results[BARE]
    lines = [
        "| step | start-up | peak RSS | vs bare import |",
        "|---|---|---|---|",
        f"| bare `import tensorflow` | {bare['seconds']:.2f} s | {bare['rss_mb']} MB | 1.00 |",
    ]
    for name, step in results["steps"].items():
        lines.append(
            f"| {name} | {step['seconds']:.2f} s | {step['rss_mb']} MB | {step['ratio']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path, default=SPEC_PATH)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", help="comma-separated task names (default: every executor)")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    steps = args.steps.split(",") if args.steps else None
    results = measure(args.spec, args.repeats, lambda text: print(text, file=sys.stderr), steps)
    print(json.dumps(results, indent=2) if args.json else table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
