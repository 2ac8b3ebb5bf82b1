"""`tkp tensorboard`: the Trainer's TensorBoard logs, copied to local disk and served.

The Trainer writes its logs into its `model_run` artifact (`<model_run>/logs/train/`, `.../
validation/`; components/training/loop.py). Locally that artifact is
`<pipeline_root>/Trainer/model_run/
<execution id>/`; on Kubeflow `<pipeline root>/<pipeline name>/<run id>/trainer/<uuid>/model_run`.

Why stage instead of `tensorboard --logdir s3://...`: TensorBoard reads `s3://` through
TensorFlow's own client (the tensorflow-io plugin), whose reads are broken against SeaweedFS (it
hangs at the end of a file, returns large files wrong, and aborts the process at exit; README.md,
"Object storage notes"). So the logs are copied with `components.base.storage` (boto3 and Beam,
which read the AWS_* environment) into `.work/tensorboard/<name>/`, and TensorBoard only ever reads
local files. The copy is a snapshot: run the command again to pick up a training still in progress.

"""

from __future__ import annotations

import dataclasses
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import IO

from components.base import storage
from components.base.config import WORK_DIR, ConfigError, PipelineConfig
from components.base.errors import ActionableError
from components.base.processes import stop_process

STAGING_ROOT = WORK_DIR / "tensorboard"
EVENTS = ".tfevents."  # in every TensorBoard event file's name
# A model_run folder's log files, in the local runner's layout and in Kubeflow's (full paths).
_LOCAL = re.compile(r"(?P<model_run>(?:.*/)?Trainer/model_run/(?P<execution>\d+))/logs/")
_KUBEFLOW = re.compile(
    r"(?P<model_run>(?:.*/)?(?P<run_id>[^/]+)/trainer/(?P<task>[^/]+)/model_run)/logs/"
)


class TensorBoardError(ActionableError, RuntimeError):
    """No logs where the user pointed, or TensorBoard could not be started."""


@dataclasses.dataclass
class Run:
    name: str  # the execution id (local) or the KFP run id: the staged folder's name
    model_run: str  # the artifact's URI
    logs: str  # the folder that is staged
    events: int = 0  # TensorBoard event files among its logs
    execution: int | None = None  # local runs: ordered by it
    newest: float = 0.0  # the newest log file's time: orders Kubeflow runs (random ids)


def find_runs(pipeline_root: str) -> list[Run]:
    """Every Trainer model_run under `pipeline_root` that holds TensorBoard logs, oldest first.

    `pipeline_root` may also be one Kubeflow run's folder or one model_run artifact's URI. The
    local layout is listed first (one prefix); only without a hit is everything under it listed.
    """
    root = pipeline_root.rstrip("/")
    storage.check_reachable(root)
    files = storage.list_file_infos(f"{root}/Trainer/model_run/*/logs/**")
    files = files or storage.list_file_infos(f"{root}/**")
    runs: dict[str, Run] = {}
    for info in files:
        match = _LOCAL.match(info.path) or _KUBEFLOW.match(info.path)
        if not match:
            continue
        uri = match.group("model_run")
        if uri not in runs:
            groups = match.groupdict()
            name = groups.get("run_id") or groups["execution"]
            if any(run.name == name for run in runs.values()):  # a retried Kubeflow task
                name = f"{name}-{groups['task'][:8]}"
            execution = int(groups["execution"]) if groups.get("execution") else None
            runs[uri] = Run(name, uri, f"{uri}/logs", execution=execution)
        runs[uri].events += EVENTS in info.path
        runs[uri].newest = max(runs[uri].newest, info.mtime)
    found = [run for run in runs.values() if run.events]
    return sorted(found, key=lambda r: (-1 if r.execution is None else r.execution, r.newest))


def model_run(uri: str) -> Run:
    """One model_run artifact given by its URI (as the KFP UI shows it), in any layout; a folder
    of event files (such as `<model_run>/logs`) works too."""
    uri = uri.rstrip("/")
    storage.check_reachable(uri)
    for logs in (f"{uri}/logs", uri):
        paths = storage.list_files(f"{logs}/**")
        if any(EVENTS in path for path in paths):
            match = _LOCAL.match(f"{uri}/logs/") or _KUBEFLOW.match(f"{uri}/logs/")
            groups = match.groupdict() if match else {}
            name = groups.get("run_id") or groups.get("execution") or _folder_name(uri)
            return Run(name, uri, logs)
    raise TensorBoardError(
        f"no TensorBoard event files (*{EVENTS}*) under {uri}: give the URI of a Trainer "
        "`model_run` artifact (the KFP UI shows it on the trainer task), whose logs are in "
        "its logs/ folder"
    )


def _folder_name(uri: str) -> str:
    parts = [part for part in re.split(r"[/:]+", uri) if part not in ("", "logs", "model_run")]
    return re.sub(r"[^A-Za-z0-9._-]", "_", parts[-1] if parts else "model_run")


def select(runs: list[Run], pipeline_root: str, wanted: str | None = None) -> Run:
    """The newest run, or the one named `wanted` (its execution id or KFP run id, or a unique
    beginning of it)."""
    if not runs:
        raise TensorBoardError(
            f"no Trainer run with TensorBoard logs found under {pipeline_root} (looked for "
            "Trainer/model_run/<execution>/logs/ and <pipeline>/<run id>/trainer/<id>/model_run/"
            "logs/): run `make run` first, or point --pipeline-root (a Kubeflow pipeline root) or "
            "--model-run (one model_run artifact's URI) at the Trainer's output"
        )
    if wanted is None:
        return runs[-1]
    exact = [run for run in runs if run.name == wanted]
    matches = exact or [run for run in runs if run.name.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    known = ", ".join(run.name for run in runs)
    problem = "matches several runs" if matches else "is no Trainer run with TensorBoard logs"
    raise TensorBoardError(f"--run {wanted} {problem} under {pipeline_root}; runs: {known}")


def stage(runs: list[Run], folder: Path, side_by_side: bool = False) -> int:
    """Copies the runs' logs into `folder`, each into a subfolder of its name when `side_by_side`
    (TensorBoard then shows `<run>/train`, `<run>/validation`); returns how many files. What
    `folder` held is replaced once the copy is complete."""
    partial = folder.with_name(f"{folder.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    copied = 0
    try:
        for run in runs:
            target = partial / run.name if side_by_side else partial
            copied += storage.copy_tree(run.logs, str(target))
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return copied


def checked_source(source: str, option: str) -> str:
    """`source` as the storage helpers read it: `minio://B/K` (KFP's default root, as its UI
    shows URIs) is `s3://B/K` on the store AWS_ENDPOINT_URL_S3 names."""
    scheme, separator, rest = source.partition("://")
    if scheme == "minio":
        return f"s3://{rest}"
    if separator and scheme not in ("s3", "gs"):
        raise ConfigError(
            f"{option} must be s3://..., minio://..., gs://... or a local path, got {source!r}"
        )
    return source


def _check_port_free(host: str, port: int) -> None:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as TensorBoard's server
        try:
            probe.bind((host, port))
        except OSError as e:
            raise TensorBoardError(
                f"cannot listen on {host}:{port} ({e.strerror or e}): another TensorBoard may be "
                "running there; stop it or pass --port N"
            ) from e


def url(host: str, port: int) -> str:
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]"}.get(host, f"[{host}]" if ":" in host else host)
    return f"http://{shown}:{port}/"


def start_server(
    logdir: Path, host: str, port: int, output: IO | None = None, timeout_s: float = 90.0
) -> subprocess.Popen:
    """TensorBoard from this environment on `logdir`, returned once it answers HTTP; the caller
    stops it (`processes.stop_process`). Its output goes to `output`, else where this
    process's stdout and stderr go (for the CLI: the command's log)."""
    _check_port_free(host, port)
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir),
               "--host", host, "--port", str(port)]  # fmt: skip
    process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT if output else None)
    no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise TensorBoardError(
                    f"TensorBoard exited with code {process.returncode} before it answered on "
                    f"{host}:{port}; its own output (in the log) says why"
                )
            try:
                with no_proxy.open(f"{url(host, port)}data/runs", timeout=2):
                    return process
            except OSError:
                time.sleep(0.5)
        raise TensorBoardError(f"TensorBoard did not answer on {host}:{port} in {timeout_s:.0f} s")
    except BaseException:
        stop_process(process, grace_seconds=10)
        raise


def main(
    config: PipelineConfig,
    say: Callable[[str], None],
    pipeline_root: str | None = None,
    model_run_uri: str | None = None,
    run: str | None = None,
    all_runs: bool = False,
    serve: bool = True,
    host: str = "127.0.0.1",
    port: int = 6006,
    staging_root: Path = STAGING_ROOT,
) -> int:
    """Stages the newest run's logs (or run `run`'s, every run's side by side, or one
    model_run's) and, with `serve`, runs TensorBoard on them until Ctrl-C. For an `s3://` source
    the embedded object store is started unless AWS_ENDPOINT_URL_S3 names a store."""
    from pipelines.local import embedded_store

    if model_run_uri and (run or all_runs or pipeline_root):
        raise ConfigError("--model-run names one artifact: leave out --run, --all, --pipeline-root")
    if pipeline_root:
        pipeline_root = checked_source(pipeline_root, "--pipeline-root")
    if model_run_uri:
        model_run_uri = checked_source(model_run_uri, "--model-run")
    source = model_run_uri or pipeline_root or config.pipeline_root
    if serve:
        _check_port_free(host, port)  # before anything is copied
    # object_store() starts the embedded store for the s3:// roots of the config it is given.
    roots = dict.fromkeys(("data_root", "serving_root", "pipeline_root"), source)
    with embedded_store.object_store(dataclasses.replace(config, **roots)):
        if model_run_uri:
            chosen = [model_run(model_run_uri)]
            note = ""
        else:
            runs = find_runs(source)
            chosen = runs if all_runs and runs else [select(runs, source, run)]
            newest = "the newest" if chosen[-1] is runs[-1] else "not the newest"
            note = "" if all_runs else f" ({newest} of {len(runs)}; --run ID or --all for others)"
        folder = staging_root / ("all-runs" if all_runs else chosen[0].name)
        copied = stage(chosen, folder, side_by_side=all_runs)
    for each in chosen:
        say(f"Staged Trainer run {each.name}{note}: {each.logs}")
    say(f"{copied} file(s) in {folder}")
    if not serve:
        say(f"Serve it with: .venv/bin/tensorboard --logdir {folder}")
        return 0
    process = start_server(folder, host, port)
    try:
        say(f"TensorBoard at {url(host, port)} (Ctrl-C stops it)")
        code = process.wait()
    except KeyboardInterrupt:
        say("TensorBoard stopped.")
        return 0
    finally:
        stop_process(process, grace_seconds=10)
    if code != 0:
        raise TensorBoardError(f"TensorBoard stopped with code {code}; its output is in the log")
    return 0
