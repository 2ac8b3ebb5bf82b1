"""The Tuner step's search on the taxi kit's data: trials in parallel worker processes, a search
killed mid-way resumed from its store folder, a dead worker's trial recorded failed, and the
bad inputs named before any trial starts (or, when no trial completes, at the end with each
trial's failure)."""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from components.base.config import ConfigError, PipelineConfig
from components.base.use_case import load as load_use_case
from components.training import search, search_space
from tests.training import processes, search_step


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """One transformed data set for the module's searches (each test a search of its own)."""
    folder = tmp_path_factory.mktemp("search")
    search_step.transformed_inputs(folder)
    return folder


def test_a_killed_search_resumes_and_runs_only_the_trials_left(root, tmp_path):
    (tmp_path / "transform").symlink_to(root / "transform")
    props = search_step.properties(tmp_path)
    command = [sys.executable, "-m", "tests.training.search_step", str(tmp_path),
               json.dumps(props)]  # fmt: skip
    step = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not any(len(list(f.glob("*.json"))) >= 2 for f in search_step.records_folder(tmp_path)):
        assert step.poll() is None and time.monotonic() < deadline, "no two trials ended"
        time.sleep(0.2)
    step.send_signal(signal.SIGKILL)  # the step's process, as a preempted node kills it
    step.wait()
    (folder,) = search_step.records_folder(tmp_path)
    before = {p.name: p.read_bytes() for p in folder.glob("*.json")}
    time.sleep(1)
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(
        p.info["cmdline"] or []) and p.pid != step.pid], "a worker outlived the step"  # fmt: skip

    resumed = search_step.run(tmp_path, props)
    trials = resumed["trials"]
    assert [t["trial_id"] for t in trials] == [str(i) for i in range(6)]  # no trial beyond 6
    assert {t["status"] for t in trials} == {"COMPLETED"}
    for name, content in before.items():  # ended before the kill: never run again
        assert (folder / name).read_bytes() == content, name
    assert resumed["search"]["completed"] == 6
    best = max(trials, key=lambda t: t["metrics"]["val_auc"])
    assert resumed["search"]["best_trial"] == best["trial_id"]
    assert resumed["best"]["values"] == best["values"]


def test_a_dead_trial_worker_is_recorded_failed_and_the_search_completes(root, tmp_path):
    (tmp_path / "transform").symlink_to(root / "transform")
    killed = []

    def kill_one_worker_mid_trial() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            folders = search_step.records_folder(tmp_path)
            if folders and list(folders[0].glob("*.json")):  # a trial ended: both are warm
                time.sleep(1.0)
                worker = processes.running("components.training.trial")[0]
                worker.send_signal(signal.SIGKILL)
                killed.append(worker.pid)
            time.sleep(0.1)

    killer = threading.Thread(target=kill_one_worker_mid_trial, daemon=True)
    killer.start()
    result = search_step.run(tmp_path, search_step.properties(tmp_path))
    killer.join()
    assert killed
    trials = result["trials"]
    failed = [t for t in trials if t["status"] == "FAILED"]
    assert len(trials) == 6 and len(failed) == 1, trials
    assert failed[0]["error"].startswith("its worker was killed by SIGKILL")
    completed = [t for t in trials if t["status"] == "COMPLETED"]
    best = max(completed, key=lambda t: t["metrics"]["val_auc"])
    assert result["search"]["best_trial"] == best["trial_id"]
    assert result["search"]["completed"] == 5


def test_a_search_whose_trials_all_fail_names_each_failure(root, tmp_path):
    (tmp_path / "transform").symlink_to(root / "transform")
    props = search_step.properties(tmp_path, use_case="tests.training.broken_use_case",
                                   tuner_max_trials=2)  # fmt: skip
    with pytest.raises(search.SearchFailed) as failure:
        search_step.run(tmp_path, props)
    message = str(failure.value)
    assert "no trial of the search completed" in message
    assert "- trial 0: ValueError: no embedding of width" in message
    assert "- trial 1: ValueError: no embedding of width" in message
    assert not (tmp_path / "outputs" / "best" / "best_hyperparameters.txt").exists()
    (folder,) = search_step.records_folder(tmp_path)
    record = json.loads((folder / "0.json").read_text())
    assert "in build_model" in record["traceback"]  # where it failed, for the user
    # Run again (the cause fixed, say): the failed trials run again rather than stand.
    first = {p.name: p.stat().st_mtime_ns for p in folder.glob("*.json")}
    with pytest.raises(search.SearchFailed):
        search_step.run(tmp_path, props)
    assert all(p.stat().st_mtime_ns > first[p.name] for p in folder.glob("*.json"))


def test_an_objective_the_model_does_not_report_is_named_before_any_trial(root, tmp_path):
    (tmp_path / "transform").symlink_to(root / "transform")
    props = search_step.properties(tmp_path, tuner_objective="val_precision")
    with pytest.raises(search_space.SearchSpaceError) as failure:
        search_step.run(tmp_path, props)
    assert "tuner_objective val_precision is not a metric the model reports" in str(failure.value)
    assert "val_auc" in str(failure.value)
    assert not search_step.records_folder(tmp_path)  # no trial started


def _use_case_with_space(space: str):
    return dataclasses.replace(load_use_case("taxi"), search_space=f"{__name__}.{space}")


def min_above_max(hp) -> None:
    hp.Float("learning_rate", 0.1, 0.01)


def unknown_name(hp) -> None:
    hp.Int("layers", 1, 3)


def list_not_json(hp) -> None:
    hp.Choice("hidden_units", ["64,32", "[128]"])


def wrong_kind(hp) -> None:
    hp.Choice("embedding_dim", ["wide", "narrow"])


def float_for_a_whole_number(hp) -> None:
    hp.Float("embedding_dim", 4, 16)


@pytest.mark.parametrize("space, expected", [
    ("min_above_max", "min_value 0.1 is greater than the max_value 0.01"),
    ("unknown_name", "'layers' is not a hyperparameter of the use case"),
    ("list_not_json", "'hidden_units' is a list: search it as a Choice of JSON texts"),
    ("wrong_kind", "hyperparameter 'embedding_dim' must be like 8, got 'wide'"),
    ("float_for_a_whole_number", "'embedding_dim' is a whole number (default 8): search it "
     "with hp.Int"),
])  # fmt: skip
def test_a_contradictory_search_space_is_named(space, expected):
    with pytest.raises(search_space.SearchSpaceError) as failure:
        search_space.declared(_use_case_with_space(space), pinned={})
    assert f"search_space ({__name__}.{space})" in str(failure.value)
    assert expected in str(failure.value)


def test_an_empty_search_space_is_named():
    taxi = load_use_case("taxi")
    with pytest.raises(search_space.SearchSpaceError, match="declares no search space"):
        search_space.declared(dataclasses.replace(taxi, search_space=""), pinned={})
    everything = {"learning_rate": 0.01, "batch_size": 64, "hidden_units": [32],
                  "embedding_dim": 4}  # fmt: skip
    with pytest.raises(search_space.SearchSpaceError) as failure:
        search_space.declared(taxi, pinned=everything)
    assert "declares nothing to search (pinned by `hyperparameters`: learning_rate" in str(
        failure.value
    )  # fmt: skip
    space = search_space.declared(taxi, pinned={"hidden_units": [32]})
    assert space.get("hidden_units") == "[32]"  # pinned: the use case's Choice is not searched
    assert type(space._hps["hidden_units"][0]).__name__ == "Fixed"


def test_a_loss_as_the_objective_is_a_config_error():
    with pytest.raises(ConfigError) as failure:
        PipelineConfig.load({"tuner_objective": "val_loss"}, environ={})
    assert "not a loss" in str(failure.value)
    assert PipelineConfig.load({"tuner_objective": "val_auc"}, environ={}).tuner_objective


def test_more_parallel_trials_than_the_budget_is_a_config_error():
    with pytest.raises(ConfigError) as failure:
        PipelineConfig.load({"tuner_parallel_trials": "4", "tuner_max_trials": "3"}, environ={})
    assert "tuner_parallel_trials (4) cannot exceed tuner_max_trials (3)" in str(failure.value)
    assert "--set tuner_parallel_trials" in str(failure.value)


@pytest.mark.parametrize("algorithm", ["bayesian", "hyperband"])
def test_bayesian_and_hyperband_searches_run_through_the_same_oracle_protocol(
    algorithm, root, tmp_path
):
    """KerasTuner's other oracles behind the same server: Bayesian optimisation (random for
    half the budget, then from a Gaussian process over the trials so far); Hyperband, whose
    brackets train their trials for 1 to `epochs` epochs (tuner/epochs)."""
    (tmp_path / "transform").symlink_to(root / "transform")
    props = search_step.properties(tmp_path, tuner_algorithm=algorithm, tuner_max_trials=5,
                                   tuner_trial_steps=30, epochs=3)  # fmt: skip
    result = search_step.run(tmp_path, props)
    trials = result["trials"]
    assert len(trials) == 5 and {t["status"] for t in trials} == {"COMPLETED"}, trials
    best = max(trials, key=lambda t: t["metrics"]["val_auc"])
    assert result["search"]["best_trial"] == best["trial_id"]
    assert not any(name.startswith("tuner/") for name in result["search"]["values"])
    if algorithm == "hyperband":
        epochs = [t["values"]["tuner/epochs"] for t in trials]
        assert [t["steps"] for t in trials] == [10 * e for e in epochs]  # 10 steps an epoch
        assert min(epochs) < 3 == max(epochs)
