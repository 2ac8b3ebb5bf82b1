"""Multi-worker training on one machine: N processes on loopback, each with its TF_CONFIG.

The same Trainer executor and run_fn run in every process; MultiWorkerMirroredStrategy joins
them with TensorFlow's collectives over gRPC on free loopback ports. Worker 0 is the chief and
writes the real model and model_run artifacts; the others write theirs into temporary folders
(every worker must save the model, only one copy counts). When a worker dies, the others would
wait in the next all-reduce: the launcher stops them all and fails the step with the dead
worker's last log lines, within `poll` seconds of the death.

Usage of the module itself (by `run` only): python -m components.training.local_workers JOB_FILE
INDEX
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.base.errors import ActionableError
from components.base.processes import die_with_parent

_log = logging.getLogger(__name__)
STOP_GRACE_SECONDS = 10


class WorkerFailed(ActionableError, RuntimeError):
    """A training worker exited with an error; the message holds its last log lines."""


def free_ports(count: int) -> list[int]:
    """`count` distinct ports the kernel says are free on loopback now."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_config(ports: list[int], index: int) -> dict:
    return {
        "cluster": {"worker": [f"127.0.0.1:{port}" for port in ports]},
        "task": {"type": "worker", "index": index},
    }


def run(input_dict, output_dict, exec_properties, workers: int, poll: float = 0.5) -> None:
    """Runs the Trainer executor as `workers` processes and waits for all of them."""
    from tfx.types import artifact_utils

    work = Path(tempfile.mkdtemp(prefix="trainer-workers-"))
    processes = []
    try:
        ports = free_ports(workers)
        devices = gpu_split(visible_gpus(), workers)
        for index in range(workers):
            outputs = output_dict if index == 0 else _scratch_outputs(output_dict, work, index)
            job = {
                "inputs": artifact_utils.jsonify_artifact_dict(input_dict),
                "outputs": artifact_utils.jsonify_artifact_dict(outputs),
                "exec_properties": exec_properties,
            }
            job_file = work / f"job-{index}.json"
            job_file.write_text(json.dumps(job))
            log_file = open(work / f"worker-{index}.log", "wb")  # noqa: SIM115 (closed below)
            env = dict(os.environ, TF_CONFIG=json.dumps(tf_config(ports, index)),
                       CUDA_VISIBLE_DEVICES=devices[index])  # fmt: skip
            command = [
                sys.executable,
                "-m",
                "components.training.local_workers",
                str(job_file),
                str(index),
            ]
            process = subprocess.Popen(
                command, env=env, stdout=log_file, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent,  # a killed Trainer leaves no worker training on
            )  # fmt: skip
            processes.append((process, log_file))
        _log.info("Training with %d workers on 127.0.0.1 ports %s, GPUs %s (logs: %s)", workers,
                  ports, [d or "none" for d in devices], work)  # fmt: skip
        _wait(processes, work, poll)
        # The chief's output is the step's; its log goes to the run's log.
        _log.info("Chief worker's log:\n%s", _tail(work / "worker-0.log", 40))
    finally:
        _stop_all(processes)
        shutil.rmtree(work, ignore_errors=True)


def gpu_split(gpus: int, workers: int) -> list[str]:
    """CUDA_VISIBLE_DEVICES per worker: its own share of the GPUs when each can have one, else
    none (the CPU): two processes on one GPU would each reserve its memory, and NCCL refuses
    two ranks on one device."""
    if gpus < workers:
        return [""] * workers
    return [",".join(str(g) for g in range(i, gpus, workers)) for i in range(workers)]


def visible_gpus() -> int:
    """GPUs this machine has (the physical ones: no TensorFlow context is created)."""
    import tensorflow as tf

    return len(tf.config.list_physical_devices("GPU"))


def _scratch_outputs(output_dict, work: Path, index: int):
    return with_uris(output_dict, lambda key, _, __: str(work / f"worker-{index}" / key))


def with_uris(artifact_dict, uri_for: Callable[[str, int, Any], str]) -> dict:
    """A copy of an artifact dict whose artifacts have the URIs `uri_for(key, index, artifact)`
    gives (the originals are left as they are)."""
    from tfx.types import artifact_utils

    copies = artifact_utils.parse_artifact_dict(artifact_utils.jsonify_artifact_dict(artifact_dict))
    for key, artifacts in copies.items():
        for index, artifact in enumerate(artifacts):
            artifact.uri = uri_for(key, index, artifact)
    return copies


def _wait(processes, work: Path, poll: float) -> None:
    while True:
        codes = [process.poll() for process, _ in processes]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0)]
        if failed:
            index = failed[0]
            raise WorkerFailed(
                f"training worker {index} of {len(processes)} {_how(codes[index])}; the other "
                f"workers were stopped. Its last log lines:\n"
                f"{_tail(work / f'worker-{index}.log', 15)}"
            )
        if all(code == 0 for code in codes):
            return
        time.sleep(poll)


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with code {code}"


def _stop_all(processes) -> None:
    """Stops every worker still running (SIGTERM, then SIGKILL) and closes their logs."""
    for process, _ in processes:
        if process.poll() is None:
            process.terminate()
    deadline = time.monotonic() + STOP_GRACE_SECONDS
    for process, log_file in processes:
        try:
            process.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
    processes.clear()


def _tail(path: Path, lines: int) -> str:
    text = path.read_text(errors="replace") if path.exists() else ""
    return "\n".join(text.splitlines()[-lines:])


def main(job_file: str, index: str) -> None:
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from tfx.types import artifact_utils

    job = json.loads(Path(job_file).read_text())
    _log.info("Worker %s of TF_CONFIG %s", index, os.environ.get("TF_CONFIG"))
    run_executor(
        artifact_utils.parse_artifact_dict(job["inputs"]),
        artifact_utils.parse_artifact_dict(job["outputs"]),
        job["exec_properties"],
    )


def run_executor(input_dict, output_dict, exec_properties: dict) -> None:
    """One worker's training: TFX's stock Trainer executor, with the run parameters already
    folded in by TunableTrainerExecutor (also a cluster job replica's,
    components/training/replica.py)."""
    from tfx.components.trainer import executor as trainer_executor

    if os.environ.get("TF_CONFIG"):
        from components.training import distribution

        distribution.multi_worker_strategy()  # before TensorFlow runs anything (run_fn reuses it)
    trainer_executor.GenericExecutor().Do(input_dict, output_dict, exec_properties)


if __name__ == "__main__":
    main(*sys.argv[1:])
