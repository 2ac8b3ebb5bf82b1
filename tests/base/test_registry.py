"""The serving directory as registry (components/base/registry.py, serving_state.py, release.py,
pipelines/models.py), on SeaweedFS: which version serves, rollback, pruning, race-free version
numbers, the quality slide check."""

from __future__ import annotations

import multiprocessing

import pytest

from components.base import registry, release, serving_state, storage
from components.base.config import PipelineConfig
from components.steps.evaluation import quality_gate
from components.steps.pusher import push_version
from pipelines import models


def _model(tmp_path, tag: str) -> str:
    """A SavedModel-shaped folder: what TF Serving looks for (saved_model.pb) and a variable."""
    folder = tmp_path / f"model-{tag}"
    (folder / "variables").mkdir(parents=True)
    (folder / "saved_model.pb").write_bytes(f"graph {tag}".encode())
    (folder / "variables" / "variables.index").write_bytes(f"index {tag}".encode())
    return str(folder)


def _config(bucket: str) -> PipelineConfig:
    return PipelineConfig.load(
        {"serving_root": f"s3://{bucket}/serving", "data_root": f"s3://{bucket}/data"}, environ={}
    )


def _push(tmp_path, folder: str, tag: str) -> int:
    version = registry.claim_version(folder)
    push_version(_model(tmp_path, tag), folder, version)
    registry.write_record(folder, version, {"spans": {"0": "f"}, "metrics": {}})
    return version


def _served(folder: str, model_name: str) -> int | None:
    return serving_state.read(folder, model_name).stable


def _serve(folder: str, model_name: str, version: int) -> None:
    """What the Pusher does with a blessed version in release mode "immediate"."""
    stable = serving_state.read(folder, model_name, unreleased=version).stable
    release.release_pushed(folder, model_name, version, stable, "immediate", why="push")


def test_the_model_config_file_says_which_version_serves_and_rollback_rewrites_it(
    object_store, tmp_path
):
    config = _config(object_store.new_bucket("reg-serve"))
    folder = config.serving_model_dir
    assert _served(folder, config.model_name) is None
    for tag in "abc":
        _push(tmp_path, folder, tag)
    # No config file yet: TF Serving's default policy serves the highest version.
    assert _served(folder, config.model_name) == 3
    _serve(folder, config.model_name, 3)
    text = storage.read_bytes(f"{folder}/models.config").decode()
    assert 'base_path: "s3://' in text and "versions: 3" in text and 'name: "taxi-tips"' in text

    assert models.rollback(config, None).startswith("Version 2 serves now (was 3)")
    assert _served(folder, config.model_name) == 2
    assert "versions: 2" in storage.read_bytes(f"{folder}/models.config").decode()
    models.rollback(config, 3)
    assert _served(folder, config.model_name) == 3

    listing = models.list_versions(config)
    assert [line.split()[:2] for line in listing.splitlines()[2:] if line.split()[0].isdigit()] == [
        ["3", "SERVED"], ["2", "ready"], ["1", "ready"],
    ]  # fmt: skip
    assert "Lineage" in models.show_version(config, 2)


def test_a_bad_rollback_or_a_broken_config_file_is_named_and_changes_nothing(
    object_store, tmp_path
):
    config = _config(object_store.new_bucket("reg-bad"))
    folder = config.serving_model_dir
    with pytest.raises(registry.RegistryError, match="nothing to roll back: no version"):
        models.rollback(config, None)
    _push(tmp_path, folder, "a")
    _serve(folder, config.model_name, 1)
    with pytest.raises(registry.RegistryError, match="no complete version served before it"):
        models.rollback(config, None)
    with pytest.raises(registry.RegistryError, match=r"version 7 does not exist .* \[1\]"):
        models.rollback(config, 7)
    storage.write_bytes(f"{folder}/2/variables/variables.index", b"half a push")
    with pytest.raises(registry.RegistryError, match="version 2 is incomplete"):
        models.rollback(config, 2)
    assert _served(folder, config.model_name) == 1

    # Once the serving state's log exists, models.config is only its view: an edit changes
    # nothing, and the next change rewrites it.
    storage.write_bytes(f"{folder}/models.config", b"model_config_list { config { name: ")
    assert _served(folder, config.model_name) == 1
    # A labelled version whose files went is named.
    storage.delete_files([f"{folder}/1/saved_model.pb"])
    with pytest.raises(registry.RegistryError, match=r"labels version 1 'stable', which is not"):
        _served(folder, config.model_name)
    assert "NOTHING SERVES:" in models.list_versions(config)  # the versions are still listed


def test_a_broken_model_config_file_from_before_the_serving_state_is_named(object_store, tmp_path):
    config = _config(object_store.new_bucket("reg-legacy"))
    folder = config.serving_model_dir
    _push(tmp_path, folder, "a")
    storage.write_bytes(f"{folder}/models.config", b"model_config_list { config { name: ")
    with pytest.raises(registry.RegistryError, match="models.config is not a TF Serving model"):
        _served(folder, config.model_name)
    assert "NOTHING SERVES:" in models.list_versions(config)  # the versions are still listed
    policy = serving_state.model_config_text(folder, config.model_name, {}, [9])
    storage.write_bytes(f"{folder}/models.config", policy.encode())
    with pytest.raises(registry.RegistryError, match="pins version 9, which is not a complete"):
        _served(folder, config.model_name)


def test_pruning_keeps_the_newest_the_served_and_the_rollback_target(object_store, tmp_path):
    config = _config(object_store.new_bucket("reg-prune"))
    folder = config.serving_model_dir
    for tag in "abcde":
        _push(tmp_path, folder, tag)
    _serve(folder, config.model_name, 5)
    assert release.prune(folder, config.model_name, keep=2) == [3, 2, 1]
    assert sorted(registry.complete_versions(folder)) == [4, 5]
    assert sorted(registry.records(folder)) == [1, 2, 3, 4, 5]  # records outlive their files
    assert "deleted" in models.list_versions(config)

    # After a rollback to 4, nothing newer is deleted and 4's own rollback target stays.
    _push(tmp_path, folder, "f")
    models.rollback(config, 4)
    assert release.prune(folder, config.model_name, keep=2) == []
    assert sorted(registry.complete_versions(folder)) == [4, 5, 6]


def test_rollback_returns_to_the_version_served_before_not_a_rejected_one(object_store, tmp_path):
    """Serve 4, push 5, roll back to 4 (5 was bad), push and serve 6: the way back from 6 is 4,
    and pruning keeps 4, while the rejected 5 may go."""
    config = _config(object_store.new_bucket("reg-history"))
    folder = config.serving_model_dir
    for tag in "abcd":
        _push(tmp_path, folder, tag)
    _serve(folder, config.model_name, 4)
    _push(tmp_path, folder, "e")
    _serve(folder, config.model_name, 5)
    models.rollback(config, None)
    assert _served(folder, config.model_name) == 4
    _push(tmp_path, folder, "f")
    _serve(folder, config.model_name, 6)

    assert serving_state.previous_stable(folder, 6) == 4
    assert 5 in release.prune(folder, config.model_name, keep=1)
    assert 4 in registry.complete_versions(folder)
    assert models.rollback(config, None).startswith("Version 4 serves now (was 6)")
    changes = [(s.change["what"], s.stable) for s in serving_state.history(folder)]
    assert changes == [("push", 4), ("push", 5), ("rollback", 4), ("push", 6), ("rollback", 4)]
    assert serving_state.history(folder)[2].change["why"] == "rollback from 5"


def test_rollback_to_a_given_version_repairs_a_broken_model_config_file(object_store, tmp_path):
    config = _config(object_store.new_bucket("reg-repair"))
    folder = config.serving_model_dir
    _push(tmp_path, folder, "a")
    storage.write_bytes(f"{folder}/models.config", b"model_config_list { config { name: ")
    with pytest.raises(registry.RegistryError, match="is not a TF Serving model config"):
        models.rollback(config, None)  # which version served before is unknown
    assert models.rollback(config, 1).startswith("Version 1 serves now (was None)")
    assert _served(folder, config.model_name) == 1


def race(racer, folder: str, tmp: str, rounds: int, timeout: float) -> dict:
    """Runs `racer(folder, tmp, tag, barrier, rounds, results)` in two spawned processes ("a"
    and "b"), which meet at `barrier` (a multiprocessing.Barrier of 2) to start each step of a
    round together; returns each one's result by tag."""
    context = multiprocessing.get_context("spawn")
    results, barrier = context.Queue(), context.Barrier(2, timeout=timeout)
    racers = [context.Process(target=racer, args=(folder, tmp, tag, barrier, rounds, results))
              for tag in ("a", "b")]  # fmt: skip
    for process in racers:
        process.start()
    outcomes = dict(results.get(timeout=timeout) for _ in racers)
    for process in racers:
        process.join(timeout=30)
        assert process.exitcode == 0
    return outcomes


def _racing_pusher(folder: str, tmp: str, tag: str, barrier, rounds: int, results):
    from pathlib import Path

    pushed = []
    for round_ in range(rounds):
        barrier.wait()  # both start together
        version = registry.claim_version(folder)
        push_version(_model(Path(tmp), f"{tag}{round_}"), folder, version)
        pushed.append(version)
    results.put((tag, pushed))


def test_two_pushers_racing_never_write_the_same_version(object_store, tmp_path):
    """Two processes claim and push at the same instants, round after round, against SeaweedFS.
    With the number taken as highest + 1 both would pick the same one (push_version would then
    refuse the second); with claims every push gets its own version."""
    folder = _config(object_store.new_bucket("reg-race")).serving_model_dir
    rounds = 4
    pushed = race(_racing_pusher, folder, str(tmp_path), rounds, timeout=120)
    every = pushed["a"] + pushed["b"]
    assert sorted(every) == list(range(1, 2 * rounds + 1))
    assert sorted(registry.complete_versions(folder)) == sorted(every)
    for version in every:  # each version holds exactly one pusher's model, whole
        graph = storage.read_bytes(f"{folder}/{version}/saved_model.pb").decode()
        index = storage.read_bytes(f"{folder}/{version}/variables/variables.index").decode()
        assert graph.split()[1] == index.split()[1]


def test_quality_cannot_slide_over_a_chain_of_pushes_each_within_max_auc_drop():
    """Each candidate is 0.006 AUC worse than the served model, within max_auc_drop=0.01 of it:
    the second such step already puts it more than 0.01 below the best, and is refused."""
    served, best, pushed = 0.0, 0.0, []
    for _ in range(5):
        quality, refusal = quality_gate(served, best, auc_change=-0.006, max_auc_drop=0.01)
        if refusal:
            break
        pushed.append(quality)
        served, best = quality, max(best, quality)
    assert pushed == [pytest.approx(-0.006)]
    assert "quality would slide" in refusal and "max_auc_drop=0.01" in refusal
    # A candidate is judged against the best of the served model's lineage too, named.
    assert quality_gate(-0.006, 0.0, auc_change=+0.004, max_auc_drop=0.01)[1] is None
    refusal = quality_gate(-0.02, 0.0, auc_change=+0.005, max_auc_drop=0.01, best_version=3)[1]
    assert "below version 3's +0.0000" in refusal and "larger max_auc_drop" in refusal


def test_a_poller_does_not_remember_a_state_the_store_left_during_its_sync(object_store):
    """A push's model config landing between a poller's probe and its sync must not be
    remembered as the probe's state: a rollback writing back the older, byte-identical config
    would match it and never be synced (seen as a flaky rollback in test_serve_reload)."""
    from components.base.object_store import s3_client
    from pipelines.serving import serving_sync

    folder = f"s3://{object_store.new_bucket('reg-probe')}/serving/taxi-tips"
    storage.write_bytes(storage.join(folder, registry.MODEL_CONFIG_FILE), b"serves 1")
    client = s3_client()
    before = serving_sync.store_state(folder, client)
    assert serving_sync.state_after_sync(folder, client, before) == before  # nothing moved
    storage.write_bytes(storage.join(folder, registry.MODEL_CONFIG_FILE), b"serves 2")
    assert serving_sync.state_after_sync(folder, client, before) is None  # sync again next time
    storage.write_bytes(storage.join(folder, registry.MODEL_CONFIG_FILE), b"serves 1")
    assert serving_sync.store_state(folder, client) == before  # why None is needed: same ETag
