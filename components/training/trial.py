"""A search's trial worker: python -m components.training.trial JOB_URI

One per parallel trial (components/training/search.py starts them: processes on loopback, or
pods on Kubeflow). It asks the search's oracle for a trial over KerasTuner's gRPC protocol
(KERASTUNER_ORACLE_IP, KERASTUNER_ORACLE_PORT, KERASTUNER_TUNER_ID), trains the use case's model
with the trial's values for the search's steps as the Trainer would (same datasets, model,
mixed precision, early stopping on the eval split), reports the objective, writes the trial's
record (values, metrics, steps, seconds, or its error) to the store, and asks again until the
oracle says STOPPED.

KerasTuner's own Tuner classes fit Keras 3 models only; the model here is tf_keras, so this
loop stands in for BaseTuner.search's worker side (keras_tuner/src/engine/base_tuner.py
`search`: create_trial, run, update_trial, end_trial) and talks to the oracle with KerasTuner's
OracleClient.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

_log = logging.getLogger("components.training.trial")
RECORDS = "trials"  # in the search's folder on the store: one <trial id>.json per trial
IDLE_WAIT_SECONDS = 1.0  # Hyperband answers IDLE while a round's other trials run


class SearchDeadline(Exception):
    """The search's tuner_max_minutes ran out during this trial."""


def _model_and_data(fn_args, custom_config: dict, values: dict):
    """(model, train, evaluation) with `values` (decoded) in force, as the Trainer builds them
    (components/training/loop.py `build`), on one process: all of its GPUs."""
    import tensorflow as tf

    from components.training import loop, search_space

    tf.keras.backend.clear_session()
    gpus = tf.config.list_logical_devices("GPU")
    strategy = tf.distribute.MirroredStrategy() if len(gpus) > 1 else tf.distribute.get_strategy()
    built = loop.build(fn_args, search_space.apply(custom_config, values), strategy)
    return built.model, built.train, built.evaluation


def fn_args_for(inputs: dict, exec_properties: dict, work: Path):
    """TFX's FnArgs for the (local) Trainer inputs, as the Trainer executor fills them in."""
    from tfx.components.trainer import fn_args_utils

    fn_args = fn_args_utils.get_common_fn_args(inputs, exec_properties, str(work))
    fn_args.transform_output = fn_args.transform_graph_path  # what run_fn reads
    return fn_args


def reported_metrics(fn_args, custom_config: dict) -> list[str]:
    """The metrics the model reports on an evaluation (one batch of the eval split, the
    defaults' model): what a search's objective can be, checked before any trial starts."""
    model, _, evaluation = _model_and_data(fn_args, custom_config, {})
    return list(model.evaluate(evaluation.take(1), return_dict=True, verbose=0))


def train_trial(fn_args, custom_config: dict, values: dict, search: dict) -> dict:
    """Trains the model with `values` (decoded) for the search's steps; returns the metrics
    (the objective: the best epoch's) and the steps trained. SearchDeadline when the search's
    time runs out first."""
    from components.training import guards

    model, train, evaluation = _model_and_data(fn_args, custom_config, values)
    # Hyperband gives each trial its epochs (tuner/epochs); the others train the search's.
    epochs = int(values.get("tuner/epochs") or search["epochs"])
    steps_per_epoch = max(1, int(search["steps"]) // int(search["epochs"]))
    deadline = guards.TimeBudget(
        max(0.0, (float(search["deadline"]) - time.time()) / 60), time.monotonic()
    )
    history = model.fit(
        train,
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        validation_data=evaluation,
        validation_steps=int(search["eval_steps"]),
        callbacks=[deadline],
        verbose=2,
    )
    trained = int(model._train_counter.numpy())
    if deadline.stopped_at_step is not None:
        raise SearchDeadline(f"tuner_max_minutes ran out after {trained} of "
                             f"{steps_per_epoch * epochs} steps")  # fmt: skip
    objective = search["objective"]
    if objective not in history.history:
        reported = ", ".join(k for k in history.history if k.startswith("val_"))
        raise ValueError(f"the model reports no {objective} (it reports {reported})")
    metrics = {name: float(max(series) if name == objective else series[-1])
               for name, series in history.history.items()}  # fmt: skip
    if not math.isfinite(metrics[objective]):  # diverged: KerasTuner would not score it
        raise ValueError(f"{objective} is {metrics[objective]}: the training diverged")
    return {"metrics": metrics, "steps": trained}


def run_trials(job: dict, fn_args) -> int:
    """Runs trials until the oracle says STOPPED; returns how many this worker ran."""
    from keras_tuner.src.distribute.oracle_client import OracleClient
    from keras_tuner.src.engine import trial as trial_module

    from components.base import storage
    from components.base.use_case import load as load_use_case
    from components.training import search_space

    status = trial_module.TrialStatus
    client = OracleClient(None)
    tuner_id = client.tuner_id
    use_case = load_use_case(job["custom_config"]["use_case"])
    ran = 0
    while True:
        trial = client.create_trial(tuner_id)
        if trial.status == status.STOPPED:
            return ran
        if trial.status == status.IDLE:
            time.sleep(IDLE_WAIT_SECONDS)
            continue
        started, ran = time.monotonic(), ran + 1
        values = dict(trial.hyperparameters.values)
        record = {"trial_id": trial.trial_id, "tuner_id": tuner_id, "values": values}
        _log.info("Trial %s (%s): %s", trial.trial_id, tuner_id, json.dumps(values))
        try:
            decoded = search_space.decode(use_case, values)
            result = train_trial(fn_args, job["custom_config"], decoded,
                                 job["search"])  # fmt: skip
            objective = job["search"]["objective"]
            client.update_trial(trial.trial_id, {objective: result["metrics"][objective]},
                                step=result["steps"])  # fmt: skip
            trial.status = status.COMPLETED
            record.update(status="COMPLETED", **result)
        except Exception as e:  # the trial failed, not the search: the next one may pass
            _log.error("Trial %s failed:\n%s", trial.trial_id, traceback.format_exc())
            trial.status = status.FAILED
            # The message, and the traceback's last lines (a pod's log goes with the pod).
            tail = "".join(traceback.format_exc().splitlines(keepends=True)[-12:])
            record.update(status="FAILED", error=f"{type(e).__name__}: {e}"[:1000],
                          traceback=tail[-3000:])  # fmt: skip
        record["seconds"] = round(time.monotonic() - started, 1)
        # Before end_trial: once it is ended the search may finish and read every record.
        storage.write_bytes(storage.join(job["search"]["folder"], RECORDS,
                                         f"{trial.trial_id}.json"),
                            json.dumps(record, sort_keys=True).encode())  # fmt: skip
        client.end_trial(trial)


def main(job_uri: str) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("absl").setLevel(logging.WARNING)
    from components.base import storage

    job = json.loads(storage.read_bytes(job_uri))
    if "heartbeat" in job:  # a pod: stop when the step that holds the search is gone
        from components.training import heartbeat

        heartbeat.watch(job["heartbeat"]["uri"], float(job["heartbeat"]["timeout_seconds"]))
    # TFX after the watch (components/training/replica.py says why).
    from tfx.types import artifact_utils

    from components.training.replica import download_inputs

    work = Path(tempfile.mkdtemp(prefix="trial-"))
    try:
        inputs = artifact_utils.parse_artifact_dict(job["inputs"])
        download_inputs(inputs, work / "inputs")
        fn_args = fn_args_for(inputs, job["exec_properties"], work)
        ran = run_trials(job, fn_args)
        _log.info("Worker %s: ran %d trial(s); the search stopped", os.environ.get(
            "KERASTUNER_TUNER_ID"), ran)  # fmt: skip
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
