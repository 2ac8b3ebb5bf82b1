"""A hyperparameter search whose trials run in parallel, resumable from the object store.

The step's process holds the search: a KerasTuner oracle (random, Bayesian or Hyperband) behind
KerasTuner's own gRPC servicer, and `tuner_parallel_trials` trial workers
(components/training/trial.py) that ask it for trials: processes on loopback here
(`LocalTrialWorkers`), pods on Kubeflow. KerasTuner's chief loop (oracle_chief.start_server)
is not used: it waits forever for a worker that died, whose trial nothing ever ends. Here the
step watches every worker; a dead one's trial is ended FAILED with how it died, a new worker
takes its place, and the search goes on.

Every oracle save (after each trial starts and ends) is copied to `<folder>/state/` on the
store, so a search killed at any point resumes there: its completed and failed trials stand,
the ones running are run again, the rest are run. The folder is named by what defines the
search (data, schema, code, training settings, space, algorithm, objective, steps), so a
changed search starts afresh; tuner_max_trials, tuner_parallel_trials and tuner_max_minutes
are not in the name: raising tuner_max_trials extends a search.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path
from typing import Any, Protocol

from components.base import storage
from components.base.errors import ActionableError
from components.base.processes import cleaned_up_even_on_sigterm, die_with_parent, stop_process
from components.training.trial import RECORDS

_log = logging.getLogger(__name__)
STATE = "state"  # the oracle's files, under the search's folder
LOGS = "logs"  # the trial workers' logs (local workers), under the search's folder
PROJECT = "search"  # KerasTuner's project name: <local dir>/search/oracle.json, trial_*/
DEADLINE_GRACE_SECONDS = 120  # past tuner_max_minutes, workers still running are stopped
STOP_GRACE_SECONDS = 10


class SearchFailed(ActionableError, RuntimeError):
    """No trial of the search completed; the message lists each trial's failure."""


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    algorithm: str  # config TUNER_ALGORITHMS
    objective: str  # val_<metric>, maximised
    max_trials: int
    parallel_trials: int
    max_minutes: float
    steps: int  # each trial's training steps
    epochs: int
    eval_steps: int
    seed: int = 42

    def identity(self) -> dict:
        """What names the search's folder (not how many trials, how parallel, how long)."""
        return {"algorithm": self.algorithm, "objective": self.objective, "steps": self.steps,
                "epochs": self.epochs, "eval_steps": self.eval_steps,
                "seed": self.seed}  # fmt: skip


class TrialWorkers(Protocol):
    """Where trial workers run. `bind` is the address the oracle listens on; `address` the one
    workers reach it at."""

    bind: str
    address: str

    def start(self, tuner_id: str, env: dict[str, str]) -> None: ...

    def exit_codes(self) -> dict[str, int | None]: ...  # None: still running

    def how_it_ended(self, tuner_id: str) -> str: ...  # e.g. "was killed by SIGKILL; log: ..."

    def stop_all(self) -> None: ...


@dataclasses.dataclass
class SearchResult:
    best_values: dict[str, Any]  # KerasTuner's values of the best trial
    best_trial: str
    best_value: float
    records: list[dict]  # every trial's record (components/training/trial.py), by trial id
    searched: list[str]  # the names searched (not Fixed)
    space: dict  # the space's KerasTuner config


def run_search(input_dict, trainer_properties: dict, custom_config: dict,
               settings: SearchSettings, space, folder: str,
               step: str = "") -> SearchResult:  # fmt: skip
    """The Tuner step's search on its (Trainer-like) inputs: the objective checked on the
    defaults' model first (a named error before any trial), then the trials, in `folder`:
    processes here, pods on Kubeflow (components/training/trial_pods.py; `step` names the
    step's attempts' pods)."""
    from tfx.types import artifact_utils

    from components.training import cluster_job, search_space, trial, trial_pods
    from components.training.local_workers import visible_gpus
    from components.training.replica import download_inputs

    work = Path(tempfile.mkdtemp(prefix="tuner-"))
    try:
        local_inputs = artifact_utils.parse_artifact_dict(
            artifact_utils.jsonify_artifact_dict(input_dict)
        )
        download_inputs(local_inputs, work / "inputs")
        fn_args = trial.fn_args_for(local_inputs, trainer_properties, work)
        problem = objective_problem(trial.reported_metrics(fn_args, custom_config),
                                    settings.objective)  # fmt: skip
        if problem:
            raise search_space.SearchSpaceError(problem)
        job = {
            "inputs": artifact_utils.jsonify_artifact_dict(input_dict),
            "exec_properties": trainer_properties,
            "custom_config": custom_config,
            "search": {
                "objective": settings.objective,
                "steps": settings.steps,
                "epochs": settings.epochs,
                "eval_steps": settings.eval_steps,
                "folder": folder,
            },  # fmt: skip
        }
        log_dir = work / "logs"
        log_dir.mkdir()
        if trial_pods.search_on_a_cluster(custom_config):
            pod_settings = custom_config["cluster_job"]
            workers: TrialWorkers = trial_pods.ClusterTrialWorkers(
                pod_settings, step, folder, cluster_job.deadline_seconds(
                    settings.max_minutes, float(pod_settings["start_timeout_minutes"])),
            )  # fmt: skip
            job["inputs"] = artifact_utils.jsonify_artifact_dict(
                cluster_job.remote_inputs(input_dict)
            )
            job["heartbeat"] = workers.heartbeat_job()
            where = (f"kubectl -n {workers.api.namespace} logs -l "
                     f"{trial_pods.ATTEMPT_LABEL}={workers.attempt}, and {workers.logs} "
                     "once the search ends")  # fmt: skip
        else:
            workers = LocalTrialWorkers(log_dir, visible_gpus(), settings.parallel_trials)
            # A folder per attempt: a resumed search's workers start again at trials-0.
            where = storage.join(folder, LOGS, time.strftime("%Y%m%d-%H%M%S"))
        _log.info("Search: %s, %d trial(s), %d at once, at most %g min, %d steps each, "
                  "objective %s (max); the trial workers' logs: %s", settings.algorithm,
                  settings.max_trials, settings.parallel_trials, settings.max_minutes,
                  settings.steps, settings.objective, where)  # fmt: skip

        def stopped() -> Exception:
            return SearchFailed("the step was stopped (SIGTERM): its trial workers are stopped; "
                                "the next run resumes the search")  # fmt: skip

        def clean_up() -> None:
            workers.stop_all()
            if isinstance(workers, LocalTrialWorkers):
                storage.copy_tree(str(log_dir), where)

        with cleaned_up_even_on_sigterm(stopped, clean_up):
            return search(settings, space, folder, job, workers)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def oracle_class(algorithm: str):
    import keras_tuner

    return {
        "random": keras_tuner.oracles.RandomSearchOracle,
        "bayesian": keras_tuner.oracles.BayesianOptimizationOracle,
        "hyperband": keras_tuner.oracles.HyperbandOracle,
    }[algorithm]


def _mirrored_oracle(settings: SearchSettings, space, local_dir: str, store_dir: str):
    """The oracle, whose every save is also written to `store_dir` (trial files before
    oracle.json, as the oracle writes them)."""
    import keras_tuner

    base = oracle_class(settings.algorithm)

    class Mirrored(base):
        def save(self):
            super().save()
            _upload(self._get_oracle_fname())

        def _save_trial(self, trial):
            super()._save_trial(trial)
            _upload(os.path.join(self._get_trial_dir(trial.trial_id), "trial.json"))

        # The step's own reads and changes, under the lock the gRPC thread's calls take
        # (keras_tuner.synchronized): never a half-made trial or a list swapped mid-call.
        @keras_tuner.synchronized
        def progress(self, running: int) -> str:
            return _progress(self, running)

        @keras_tuner.synchronized
        def ongoing_trial(self, tuner_id: str):
            return self.ongoing_trials.get(tuner_id)

        @keras_tuner.synchronized
        def end_dead(self, tuner_id: str, message: str) -> bool:
            """Ends `tuner_id`'s trial FAILED if it still runs; False when it had ended."""
            from keras_tuner.src.engine import trial as trial_module

            trial = self.ongoing_trials.get(tuner_id)
            if trial is None:
                return False
            trial.status, trial.message = trial_module.TrialStatus.FAILED, message
            self.end_trial(trial)
            return True

        @keras_tuner.synchronized
        def stop_new_trials(self) -> None:
            self.max_trials = len(self.trials)
            self._retry_queue.clear()

        @keras_tuner.synchronized
        def trials_left(self) -> bool:
            return len(self.trials) < self.max_trials or bool(self._retry_queue)

    def _upload(path: str) -> None:
        relative = os.path.relpath(path, local_dir)
        data = Path(path).read_bytes()
        for attempt in range(3):  # a brief store error must not fail a finished trial
            try:
                storage.write_bytes(storage.join(store_dir, relative), data)
                return
            except Exception:
                if attempt == 2:
                    raise
                time.sleep(1 + attempt)

    objective = keras_tuner.Objective(settings.objective, direction="max")
    common = {"objective": objective, "hyperparameters": space, "seed": settings.seed,
              "allow_new_entries": False, "tune_new_entries": False,
              # Failures are this module's to report (each trial's, at the end); KerasTuner's
              # limit raises inside end_trial and would leave the trial running forever.
              "max_consecutive_failed_trials": None}  # fmt: skip
    if settings.algorithm == "hyperband":
        # Brackets of 1 to `epochs` epochs, as many as the trial budget allows (its own
        # budget, hyperband_iterations, left unbounded: max_trials caps it).
        oracle = Mirrored(max_epochs=settings.epochs, hyperband_iterations=None, **common)
        oracle.max_trials = settings.max_trials
    elif settings.algorithm == "bayesian":
        # KerasTuner's default starts with 3 random trials per dimension: more than a small
        # budget, which would then never fit its Gaussian process. Half the budget at most.
        dimensions = sum(1 for p in space.space if type(p).__name__ != "Fixed")
        initial = min(3 * dimensions, max(2, settings.max_trials // 2))
        oracle = Mirrored(max_trials=settings.max_trials, num_initial_points=initial, **common)
    else:
        oracle = Mirrored(max_trials=settings.max_trials, **common)
    oracle.verbose = 0  # its display's bookkeeping breaks on a reloaded search (KeyError)
    oracle._set_project_dir(local_dir, PROJECT)
    return oracle


def restore(oracle, store_dir: str, local_dir: str, max_trials: int) -> int:
    """Loads the search's state from the store, if any; returns the trials that completed.
    Trials that were running, and those that failed (a dead worker, the time budget, a cause
    fixed since), are run again; completed ones never are (KerasTuner's own reload re-runs the
    last trial each worker ended: its oracle.json still names it as ongoing)."""
    from keras_tuner.src.engine import trial as trial_module

    if not storage.list_files(storage.join(store_dir, PROJECT, "oracle.json")):
        return 0
    storage.copy_tree(store_dir, local_dir)
    oracle.reload()
    oracle.max_trials = max_trials  # this run's budget, not the saved one
    completed = trial_module.TrialStatus.COMPLETED
    oracle.ongoing_trials = {}
    # The queue is popped from its end: the lowest id first.
    oracle._retry_queue = sorted((t for t, trial in oracle.trials.items()
                                  if trial.status != completed), key=int, reverse=True)  # fmt: skip
    return sum(1 for trial in oracle.trials.values() if trial.status == completed)


def search(
    settings: SearchSettings,
    space,
    folder: str,
    job: dict,
    workers: TrialWorkers,
    poll: float = 0.5,
) -> SearchResult:
    """Runs the search in `folder` (on the store) with `workers`; `job` is what each worker
    reads (components/training/trial.py), written to `<folder>/job.json`."""
    import grpc
    from keras_tuner.src import protos
    from keras_tuner.src.distribute.oracle_chief import OracleServicer

    local_dir = tempfile.mkdtemp(prefix="search-")
    store_dir = storage.join(folder, STATE)
    server = None
    try:
        oracle = _mirrored_oracle(settings, space, local_dir, store_dir)
        ended = restore(oracle, store_dir, local_dir, settings.max_trials)
        left = max(0, settings.max_trials - len(oracle.trials)) + len(oracle._retry_queue)
        if ended or oracle._retry_queue:
            _log.info(f"Search: resuming {folder} ({ended} trial(s) completed before, "
                      f"{left} to run)")  # fmt: skip
        outside: list[str] = []
        if left:
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
            protos.get_service_grpc().add_OracleServicer_to_server(OracleServicer(oracle), server)
            port = server.add_insecure_port(f"{workers.bind}:0")
            server.start()
            job_uri = storage.join(folder, "job.json")
            deadline = time.time() + settings.max_minutes * 60
            job = {**job, "search": {**job["search"], "deadline": deadline}}
            storage.write_bytes(job_uri, json.dumps(job).encode())
            env = {"KERASTUNER_ORACLE_IP": workers.address, "KERASTUNER_ORACLE_PORT": str(port),
                   "TFX_SEARCH_JOB": job_uri}  # fmt: skip
            parallel = min(settings.parallel_trials, left)
            outside = _drive(oracle, settings, workers, env, parallel, deadline, folder, poll)
        return _result(oracle, folder, space, outside)
    finally:
        workers.stop_all()
        if server is not None:
            server.stop(grace=None)
        shutil.rmtree(local_dir, ignore_errors=True)


def _drive(oracle, settings: SearchSettings, workers: TrialWorkers, env: dict, parallel: int,
           deadline: float, folder: str, poll: float) -> list[str]:  # fmt: skip
    """Starts `parallel` workers and keeps the search going until every worker has exited: a
    dead worker's trial is ended FAILED and, while trials are left, a new worker takes its
    place (at most max_trials times: a worker that cannot start must not restart forever).
    Returns how each worker that died outside a trial ended (for the error if none ran)."""
    started, replacements, handled, outside = 0, settings.max_trials, set(), []

    def start() -> None:
        nonlocal started
        tuner_id = f"trials-{started}"  # never "chief": KerasTuner would make it one
        started += 1
        workers.start(tuner_id, {**env, "KERASTUNER_TUNER_ID": tuner_id})

    for _ in range(parallel):
        start()
    shown, stopped = "", False
    while True:
        for tuner_id, code in workers.exit_codes().items():
            if code in (None, 0) or tuner_id in handled:
                continue
            handled.add(tuner_id)
            how = workers.how_it_ended(tuner_id)
            if not _end_dead_trial(oracle, tuner_id, how, folder):
                _log.info(f"Search: trial worker {tuner_id} {how.split(';')[0]}")
                outside.append(f"worker {tuner_id} {how}")
            if oracle.trials_left() and not stopped and replacements > 0:
                replacements -= 1
                start()
        running = [t for t, code in workers.exit_codes().items() if code is None]
        if not running:
            return outside
        if not stopped and time.time() > deadline:
            stopped = True  # no new trial; the running ones stop at the deadline themselves
            oracle.stop_new_trials()
            _log.info(f"Search: tuner_max_minutes ({settings.max_minutes:g}) ran out; no "
                      "new trial starts")  # fmt: skip
        if stopped and time.time() > deadline + DEADLINE_GRACE_SECONDS:
            workers.stop_all()  # their trials end FAILED at the next round
        line = oracle.progress(len(running))
        if line != shown:
            _log.info(line)
            shown = line
        time.sleep(poll)


def _end_dead_trial(oracle, tuner_id: str, how: str, folder: str) -> bool:
    """Ends the trial of a worker that died, if it was in one: FAILED, with how it died, in
    the trial's record (first: a kill in between leaves no FAILED trial without one) and in
    the oracle. False when the worker was between trials."""
    trial = oracle.ongoing_trial(tuner_id)
    if trial is None:
        return False
    message = f"its worker {how}"
    record = {"trial_id": trial.trial_id, "tuner_id": tuner_id, "status": "FAILED",
              "values": dict(trial.hyperparameters.values), "error": message}  # fmt: skip
    storage.write_bytes(storage.join(folder, RECORDS, f"{trial.trial_id}.json"),
                        json.dumps(record, sort_keys=True).encode())  # fmt: skip
    if oracle.end_dead(tuner_id, message):
        _log.info(f"Search: trial {trial.trial_id} failed: its worker {how.split(';')[0]}")
    return True


def _progress(oracle, running: int) -> str:
    """One line on the search so far (under the oracle's lock: Mirrored.progress)."""
    from keras_tuner.src.engine import trial as trial_module

    status = trial_module.TrialStatus
    done = [t for t in oracle.trials.values() if t.status in (status.COMPLETED, status.FAILED)]
    scored = [t for t in oracle.trials.values()
              if t.status == status.COMPLETED and t.score is not None]  # fmt: skip
    best_text = ""
    if scored:
        best = max(scored, key=lambda t: t.score)
        best_text = f", best {oracle.objective.name} {best.score:.4f} (trial {best.trial_id})"
    return (f"Search: {len(done)}/{oracle.max_trials} trials ended, {running} worker(s) "
            f"running{best_text}")  # fmt: skip


def _result(oracle, folder: str, space, outside: list[str]) -> SearchResult:
    from keras_tuner.src.engine import trial as trial_module

    records = read_records(folder)
    completed = [t for t in oracle.trials.values()
                 if t.status == trial_module.TrialStatus.COMPLETED]  # fmt: skip
    searched = [p.name for p in space.space if type(p).__name__ != "Fixed"]
    if not completed:
        failures = (
            "\n".join(
                [f"- trial {r['trial_id']}: {r.get('error') or r.get('status')}" for r in records]
                + [f"- {how}" for how in outside[-3:]]  # workers that died before a trial
            )
            or "- no trial ran"
        )
        raise SearchFailed(
            f"no trial of the search completed, so there are no best hyperparameters and "
            f"nothing was trained (search folder {folder}):\n{failures}\nFix what the errors "
            f"say (each trial's record in {storage.join(folder, RECORDS)} ends with its "
            f"traceback; the workers' logs are in {storage.join(folder, LOGS)}), then run "
            "again: the search resumes, and runs its failed trials again."
        )
    best = oracle.get_best_trials(1)[0]
    values = {k: v for k, v in best.hyperparameters.values.items() if not k.startswith("tuner/")}
    return SearchResult(best_values=values, best_trial=best.trial_id, best_value=best.score,
                        records=records, searched=searched,
                        space=space.get_config())  # fmt: skip


def read_records(folder: str) -> list[dict]:
    """Every trial's record in the search's folder, by trial id."""
    paths = storage.list_files(storage.join(folder, RECORDS, "*.json"))
    return sorted((json.loads(storage.read_bytes(p)) for p in paths),
                  key=lambda r: int(r["trial_id"]))  # fmt: skip


class LocalTrialWorkers:
    """Trial workers as processes on this machine, the oracle on loopback. GPUs: the `parallel`
    workers split them when there are enough (local_workers.gpu_split), else share them (memory
    grown on demand, so two processes fit on one); a replacement takes its place's GPUs."""

    bind = address = "127.0.0.1"

    def __init__(self, log_dir: Path, gpus: int, parallel: int):
        from components.training.local_workers import gpu_split

        self.log_dir = log_dir
        self.slots = (gpu_split(gpus, parallel) if gpus >= parallel
                      else [str(i % gpus) if gpus else "" for i in range(parallel)])  # fmt: skip
        self._processes: dict[str, tuple[subprocess.Popen, Any]] = {}
        self._slot_of: dict[str, int] = {}

    def start(self, tuner_id: str, env: dict[str, str]) -> None:
        busy = {self._slot_of[t] for t, (p, _) in self._processes.items() if p.poll() is None}
        slot = next((i for i in range(len(self.slots)) if i not in busy), 0)
        self._slot_of[tuner_id] = slot
        devices = {"CUDA_VISIBLE_DEVICES": self.slots[slot], "TF_FORCE_GPU_ALLOW_GROWTH": "true"}
        log = open(self.log_dir / f"{tuner_id}.log", "wb")  # noqa: SIM115 (closed in stop_all)
        command = [sys.executable, "-m", "components.training.trial", env["TFX_SEARCH_JOB"]]
        process = subprocess.Popen(
            command, env={**os.environ, **env, **devices}, stdout=log,
            stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip
        self._processes[tuner_id] = (process, log)
        _log.debug("Trial worker %s: pid %d, log %s", tuner_id, process.pid, log.name)

    def exit_codes(self) -> dict[str, int | None]:
        return {t: p.poll() for t, (p, _) in self._processes.items()}

    def how_it_ended(self, tuner_id: str) -> str:
        from components.training.local_workers import _how, _tail

        process, log = self._processes[tuner_id]
        return (f"{_how(process.returncode)}; its last log lines:\n"
                f"{_tail(Path(log.name), 15)}")  # fmt: skip

    def stop_all(self) -> None:
        for process, log in self._processes.values():
            stop_process(process, STOP_GRACE_SECONDS)
            log.close()


def objective_problem(metric_names: list[str], objective: str) -> str | None:
    """Why `objective` cannot be searched for, given the metrics an evaluation reported."""
    reported = [f"val_{name}" for name in metric_names]
    if objective in reported:
        return None
    return (f"tuner_objective {objective} is not a metric the model reports on the eval split "
            f"(it reports {', '.join(reported)}): set tuner_objective to one of them, or compile "
            "that metric in the use case's build_model")  # fmt: skip


def write_hparams_logs(records: list[dict], objective: str, folder: str) -> int:
    """Every trial as a run of TensorBoard's HParams dashboard under `folder` (on the store):
    its values, and its objective at the steps it trained; returns the trials written. A list
    value is shown as its JSON text, a failed trial without a metric."""
    import tensorflow as tf
    from tensorboard.plugins.hparams import api as hp

    names = sorted({name for r in records for name in r.get("values", {})})
    local = tempfile.mkdtemp(prefix="hparams-")
    try:
        with tf.summary.create_file_writer(local).as_default():
            hp.hparams_config(hparams=[hp.HParam(n) for n in names],
                              metrics=[hp.Metric(objective)])  # fmt: skip
        for record in records:
            with tf.summary.create_file_writer(f"{local}/trial_{record['trial_id']}").as_default():
                values = {n: v if isinstance(v, int | float | str | bool) else json.dumps(v)
                          for n, v in record.get("values", {}).items()}  # fmt: skip
                hp.hparams(values, trial_id=record["trial_id"])
                value = (record.get("metrics") or {}).get(objective)
                if value is not None:
                    tf.summary.scalar(objective, value, step=int(record.get("steps", 0)))
        storage.copy_tree(local, folder)
        return len(records)
    finally:
        shutil.rmtree(local, ignore_errors=True)
