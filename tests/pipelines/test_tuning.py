"""Hyperparameter search in the pipeline as a user runs it: `tune=1` searches (6 trials, 2 at
once, processes on loopback) before the Trainer, whose model is built with the best trial's
values and recorded with them and the search; the nightly run after it (`tune=0`) searches
nothing and trains with the served version's searched values."""

from __future__ import annotations

import dataclasses
import json
import os
import re

import pytest

from components.base import registry, serving_state, storage
from components.base.use_case import load as load_use_case
from components.steps.tuner import TRIALS_FILE
from components.training import search_space
from pipelines import data, models
from pipelines.local.local_runner import run_pipeline
from pipelines.run_summary import latest_step_outputs
from tests.pipelines.retraining_loop import loop_config

TRIALS, PARALLEL, TRIAL_STEPS = 6, 2, 40


def trained_shape(model_uri: str, scratch) -> tuple[list[int], set[int]]:
    """(the widths of the dense layers in order, the embedding widths) of a served SavedModel,
    read from its variables: what build_model really built."""
    import tensorflow as tf

    local = str(scratch / model_uri.rsplit("/", 1)[1])
    storage.copy_tree(model_uri, local)
    model = tf.saved_model.load(local)
    dense = {}
    for variable in model.variables:
        found = re.fullmatch(r"dense(?:_(\d+))?/kernel:0", variable.name)
        if found:
            dense[int(found.group(1) or 0)] = int(variable.shape[1])
    embeddings = {int(v.shape[1]) for v in model.variables if "_emb/embeddings" in v.name}
    return [dense[i] for i in sorted(dense)], embeddings


def hparams_runs(logs: str) -> dict[str, float]:
    """The HParams dashboard's runs under `logs`: each trial folder's objective, for trials
    whose folder holds the hparams plugin's session data."""
    import tensorflow as tf

    runs = {}
    for path in tf.io.gfile.glob(f"{logs}/trial_*/events.out.tfevents.*"):
        plugins, value = set(), None
        for event in tf.compat.v1.train.summary_iterator(path):
            for v in event.summary.value:
                plugins.add(v.metadata.plugin_data.plugin_name)
                if v.tag == "val_auc":
                    value = float(tf.make_ndarray(v.tensor))
        if "hparams" in plugins:
            runs[path.split("/")[-2].removeprefix("trial_")] = value
    return runs


def test_a_parallel_search_trains_the_model_and_the_nightly_run_reuses_its_values(
    object_store, tmp_path
):
    bucket = object_store.new_bucket("tuning")
    config = loop_config(
        bucket, tmp_path, tune=1, tuner_parallel_trials=PARALLEL, tuner_max_trials=TRIALS,
        tuner_trial_steps=TRIAL_STEPS,
        # The first version is pushed on its own bars; the nightly one must be pushed too (its
        # record carries the search on), whatever training noise does to its AUC.
        max_auc_drop=1.0,
    )  # fmt: skip
    data.write_span(config.data_root, 0, 4000, seed=3)

    tuned = run_pipeline(config)
    assert tuned.hyperparameter_source == "search", tuned.steps
    trials = json.loads(storage.read_bytes(storage.join(
        latest_step_outputs(config, "Tuner")["tuner_results"].uri, TRIALS_FILE)))  # fmt: skip
    assert len(trials) == TRIALS and {t["status"] for t in trials} == {"COMPLETED"}, trials
    assert {t["steps"] for t in trials} == {TRIAL_STEPS}
    assert len({t["tuner_id"] for t in trials}) == PARALLEL  # two workers shared the trials
    assert len({json.dumps(t["values"], sort_keys=True) for t in trials}) == TRIALS
    best = max(trials, key=lambda t: t["metrics"]["val_auc"])
    search = tuned.search
    assert (search["best_trial"], search["completed"]) == (best["trial_id"], TRIALS)
    assert search["best_value"] == best["metrics"]["val_auc"]
    chosen = search_space.decode(load_use_case("taxi"), best["values"])
    assert {k: tuned.hyperparameters[k] for k in chosen} == chosen

    # The model was built with them, and the registry says so.
    version = int(tuned.pushed_path.rsplit("/", 1)[1])
    dense, embeddings = trained_shape(tuned.pushed_path, tmp_path)
    assert dense == chosen["hidden_units"] and embeddings == {chosen["embedding_dim"]}
    record = registry.read_record(config.serving_model_dir, version)
    assert record["hyperparameters"] == tuned.hyperparameters
    assert record["search"]["best_trial"] == best["trial_id"]
    assert set(record["search"]["searched"]) == set(chosen)

    # What a user sees of the search: the report's table (best first) and chart, the run's
    # metrics, TensorBoard's HParams dashboard (`tkp tensorboard`), `tkp models show`.
    report = storage.read_bytes(tuned.report_uri).decode()
    ranked = [t["trial_id"] for t in sorted(trials, key=lambda t: -t["metrics"]["val_auc"])]
    assert re.findall(r"<tr><td>(\d+)</td><td>COMPLETED</td>", report) == ranked
    assert 'aria-label="val_auc over trials"' in report
    metrics = latest_step_outputs(config, "RunReport")["metrics"].custom_properties
    assert metrics["tuner_best_val_auc"].double_value == pytest.approx(best["metrics"]["val_auc"])
    assert metrics["tuner_best_hidden_units"].string_value == json.dumps(chosen["hidden_units"])
    model_run = latest_step_outputs(config, "Trainer")["model_run"].uri
    assert hparams_runs(f"{model_run}/logs/hparams") == {
        t["trial_id"]: pytest.approx(t["metrics"]["val_auc"]) for t in trials
    }
    shown = models.show_version(config, version)
    assert f"Hyperparameters: batch_size={chosen['batch_size']}, embedding_dim=" in shown
    assert (f"Search: random, {TRIALS} of {TRIALS} trials completed, best val_auc "
            f"{best['metrics']['val_auc']:.4f} in trial {best['trial_id']}") in shown  # fmt: skip

    nightly = run_pipeline(dataclasses.replace(config, tune=0, force=1))
    assert nightly.hyperparameter_source == f"served version {version}"
    assert nightly.hyperparameters == tuned.hyperparameters
    results = latest_step_outputs(config, "Tuner")["tuner_results"].uri
    assert json.loads(storage.read_bytes(storage.join(results, TRIALS_FILE))) == []  # no trial
    assert trained_shape(nightly.pushed_path, tmp_path) == (dense, embeddings)
    stable = serving_state.read(config.serving_model_dir, config.model_name).stable
    assert (
        registry.read_record(config.serving_model_dir, stable)["search"]["best_trial"]
        == (best["trial_id"])
    )
    assert os.path.basename(nightly.pushed_path) == str(stable)
    assert f"; carried over from version {version} (tune=0)" in models.show_version(config, stable)
    record = registry.read_record(config.serving_model_dir, stable)
    assert record["search"]["source"] == f"served version {version}"
    nightly_run = latest_step_outputs(config, "Trainer")["model_run"].uri
    assert nightly_run != model_run and not os.path.exists(f"{nightly_run}/logs/hparams")
