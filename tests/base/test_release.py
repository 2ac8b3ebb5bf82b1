"""The serving state and releases (components/base/serving_state.py, release.py) on real stores:
a conditional create granted once on S3 (SeaweedFS), GCS (the emulator with its preconditions
played) and local disk; a canary release labelled in TF Serving's model config, promoted or
aborted; two blessed runs racing to release against SeaweedFS."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.base import registry, release, serving_state, storage
from components.base.serving_state import CANARY, STABLE, ConcurrentChange
from components.steps.pusher import push_version
from pipelines import models, rollout
from tests.base.test_registry import _config, _model, _push, race
from tests.stand_ins import gcs_emulator

MODEL = "taxi-tips"  # _config's model name


def _conditional_creates(root: str) -> None:
    path = storage.join(root, "state", "0000000001.json")
    assert storage.create_exclusive(path, b"first") is True
    assert storage.create_exclusive(path, b"second") is False
    assert storage.read_bytes(path) == b"first"  # the loser wrote nothing


def test_a_conditional_create_is_granted_once_on_every_store(object_store, tmp_path, monkeypatch):
    _conditional_creates(str(tmp_path / "local"))
    _conditional_creates(f"s3://{object_store.new_bucket('cond')}/x")
    with gcs_emulator.running("cond-gs", tmp_path / "emulator.log") as host:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        _conditional_creates("gs://cond-gs/x")
        names = gcs_emulator.object_names(host, "cond-gs", "x/")
    assert names == ["x/state/0000000001.json"]


def _model_config(folder: str) -> model_server_config_pb2.ModelConfig:
    config = model_server_config_pb2.ModelServerConfig()
    text_format.Parse(storage.read_bytes(f"{folder}/models.config").decode(), config)
    (entry,) = config.model_config_list.config
    return entry


def test_a_canary_is_labelled_beside_stable_then_promoted_or_aborted(object_store, tmp_path):
    config = _config(object_store.new_bucket("rel-canary"))
    folder = config.serving_model_dir
    _push(tmp_path, folder, "a")
    release.release_pushed(folder, MODEL, 1, None, "canary", why="first")  # nothing to compare
    assert serving_state.read(folder, MODEL).labels == {STABLE: 1}  # a first version is stable

    _push(tmp_path, folder, "b")
    state = release.release_pushed(folder, MODEL, 2, 1, "canary", why="blessed on span 1")
    assert (state.labels, state.loaded) == ({STABLE: 1, CANARY: 2}, (1, 2))
    entry = _model_config(folder)
    assert list(entry.model_version_policy.specific.versions) == [1, 2]
    assert dict(entry.version_labels) == {"stable": 1, "canary": 2}
    assert "canary 2 beside stable 1" in rollout.status(config)
    listing = [line.split()[:2] for line in models.list_versions(config).splitlines()[2:4]]
    assert listing == [["2", "CANARY"], ["1", "SERVED"]]

    assert rollout.decide(config, "promote", "looks good").startswith("Version 2 is stable now")
    state = serving_state.read(folder, MODEL)
    assert (state.labels, state.loaded, state.release) == ({STABLE: 2}, (1, 2), None)
    assert state.change["why"] == "forced with `tkp rollout promote`: looks good"

    _push(tmp_path, folder, "c")
    release.release_pushed(folder, MODEL, 3, 2, "canary", why="blessed on span 2")
    before, after = release.end_release(folder, MODEL, "abort", "p99 too high", {"p99_ms": 80.0})
    # Version 1 was unloaded when the next release began; the canary goes now.
    assert (before.canary, after.labels, after.loaded) == (3, {STABLE: 2}, (2,))
    assert after.change == {**after.change, "what": "abort", "figures": {"p99_ms": 80.0}}
    assert dict(_model_config(folder).version_labels) == {"stable": 2}
    with pytest.raises(registry.RegistryError, match="no release of 'taxi-tips' is under way"):
        rollout.decide(config, "promote", "")
    # A rollback during a release ends it; only the version rolled back to stays loaded.
    _push(tmp_path, folder, "d")
    release.release_pushed(folder, MODEL, 4, 2, "canary", why="blessed on span 3")
    assert models.rollback(config, None).startswith("Version 1 serves now (was 2)")
    state = serving_state.read(folder, MODEL)
    assert (state.labels, state.loaded) == ({STABLE: 1}, (1,))
    assert state.change["why"] == "rollback from 2; ends the release of canary 4"
    whats = [s.change["what"] for s in serving_state.history(folder)]
    assert whats == ["push", "canary", "promotion", "canary", "abort", "canary", "rollback"]


def test_a_release_judged_against_a_version_no_longer_stable_changes_nothing(
    object_store, tmp_path
):
    folder = _config(object_store.new_bucket("rel-stale")).serving_model_dir
    for tag in "abc":
        _push(tmp_path, folder, tag)
    release.release_pushed(folder, MODEL, 2, 3, "immediate", why="push")  # legacy: 3 serves
    with pytest.raises(ConcurrentChange, match="judged against version 3, but stable 2"):
        release.release_pushed(folder, MODEL, 3, 3, "canary", why="push")
    assert serving_state.read(folder, MODEL).labels == {STABLE: 2}


def _racing_release(folder: str, tmp: str, tag: str, barrier, rounds: int, results):
    """One blessed run's Pusher, round after round: both read the stable version they were
    judged against together, then push and release at once."""
    outcomes = []
    for round_ in range(rounds):
        barrier.wait()  # the previous round is over for both
        stable = serving_state.read(folder, MODEL).stable  # what the run was judged against
        barrier.wait()
        version = registry.claim_version(folder)
        push_version(_model(Path(tmp), f"{tag}{round_}"), folder, version)
        try:
            state = release.release_pushed(folder, MODEL, version, stable, "immediate", "race")
            outcomes.append((round_, version, stable, state.generation, None))
        except ConcurrentChange as e:
            outcomes.append((round_, version, stable, None, str(e)))
    results.put((tag, outcomes))


def test_two_blessed_runs_racing_end_with_one_release_judged_against_the_stable_one(
    object_store, tmp_path
):
    """Two processes push and release at the same instants, each judged against the stable
    version it read, against SeaweedFS. Each round exactly one becomes stable; the other's
    release fails, names what changed, and writes nothing; every state in the log follows from
    the one before (no lost update)."""
    folder = _config(object_store.new_bucket("rel-race")).serving_model_dir
    _push(tmp_path, folder, "base")
    release.release_pushed(folder, MODEL, 1, None, "immediate", why="first")
    rounds = 3
    outcomes = race(_racing_release, folder, str(tmp_path), rounds, timeout=180)
    history = serving_state.history(folder)
    assert [s.generation for s in history] == list(range(1, len(history) + 1))
    for round_ in range(rounds):
        pair = [o for tag in "ab" for o in outcomes[tag] if o[0] == round_]
        winners = [o for o in pair if o[4] is None]
        assert len(winners) == 1, pair
        (_, version, judged_against, generation, _), (loser,) = (
            winners[0],
            [o for o in pair if o is not winners[0]],
        )
        state = history[generation - 1]
        assert (state.stable, state.loaded) == (version, tuple(sorted({version, judged_against})))
        assert history[generation - 2].stable == judged_against  # judged against what served
        assert "changed nothing" in loser[4] or "not released" in loser[4]
    assert len(history) == 1 + rounds  # the losers wrote no state


def test_concurrent_conditional_creates_on_seaweedfs_have_one_winner(object_store):
    """SeaweedFS 4.48 grants a create with If-None-Match to one of eight writers at once, ten
    times over, and the winner's content is there (60 rounds were tried when this was written;
    each round costs a second or more on a 2-core machine)."""
    import threading

    root = f"s3://{object_store.new_bucket('cond-many')}/x"
    for round_ in range(10):
        path, won = f"{root}/{round_:04d}.json", []
        barrier = threading.Barrier(8)

        def create(writer: int, path: str = path, won: list = won, barrier=barrier) -> None:
            barrier.wait()
            if storage.create_exclusive(path, f"writer {writer}".encode()):
                won.append(writer)

        threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(won) == 1, (round_, won)
        assert storage.read_bytes(path) == f"writer {won[0]}".encode()


def test_the_sidecar_moves_a_label_only_once_tf_serving_has_loaded_its_version(tmp_path):
    """serving_config.md's two-step move, as `tkp serving-sync --model-server` writes the pod's
    config: a label keeps its old version (still listed) until TF Serving reports the new one
    AVAILABLE; a label already naming its version stays while TF Serving does not answer or
    reloads (restarted)."""
    from pipelines.serving.serving_sync import local_config_path, write_local_config

    def written(state, loaded_in_tf):
        out = write_local_config(tmp_path, MODEL, state, lambda v: v in loaded_in_tf)
        config = model_server_config_pb2.ModelServerConfig()
        text_format.Parse(local_config_path(tmp_path).read_text(), config)
        (entry,) = config.model_config_list.config
        listed = list(entry.model_version_policy.specific.versions)
        return dict(entry.version_labels), listed, out.withheld

    one = serving_state.ServingState(1, {STABLE: 1}, (1,))
    assert write_local_config(tmp_path, MODEL, one, None).labels == {}  # init container: none
    assert written(one, {1}) == ({"stable": 1}, [1], {})
    two = serving_state.ServingState(2, {STABLE: 2}, (1, 2))
    assert written(two, {1}) == ({"stable": 1}, [1, 2], {"stable": 2})
    assert written(two, {1, 2}) == ({"stable": 2}, [1, 2], {})
    assert written(two, set()) == ({"stable": 2}, [1, 2], {})  # TF Serving restarted, silent
    back = serving_state.ServingState(3, {STABLE: 1}, (1,))  # a rollback to an unloaded 1
    assert written(back, {2}) == ({"stable": 2}, [1, 2], {"stable": 1})
    assert written(back, {1, 2}) == ({"stable": 1}, [1], {})
    canary = serving_state.ServingState(4, {STABLE: 1, CANARY: 5}, (1, 5))
    assert written(canary, {1}) == ({"stable": 1}, [1, 5], {"canary": 5})
    assert written(canary, {1, 5}) == ({"stable": 1, "canary": 5}, [1, 5], {})


def test_one_server_per_label_mirrors_only_its_labels_version_through_a_promotion_and_an_abort(
    object_store, tmp_path
):
    """`tkp serving-sync --label` (one model server per label): the stable server's copy holds
    only the stable version, the canary server's only the canary (stable's outside a release).
    When its version changes, a server keeps the one it served, labelled, until TF Serving has
    loaded the new one; a version's files go only once the config file in force (the one before
    the round's) no longer listed it either: TF Serving unloads a version whose folder went
    within a second, but reads a new config only at its next poll."""
    from pipelines.serving.serving_sync import local_config_path, sync_once

    folder = f"{_config(object_store.new_bucket('per-label')).serving_root}/{MODEL}"
    one = _push(tmp_path, folder, "a")
    release.release_pushed(folder, MODEL, one, None, "immediate", why="push")

    def synced(label: str, loaded_in_tf: set[int]) -> tuple[dict, list, list]:
        target = tmp_path / f"pod-{label}"
        sync_once(folder, MODEL, target, lambda v: v in loaded_in_tf, label=label)
        config = model_server_config_pb2.ModelServerConfig()
        text_format.Parse(local_config_path(target).read_text(), config)
        (entry,) = config.model_config_list.config
        on_disk = sorted(int(p.name) for p in (target / MODEL).iterdir() if p.name.isdigit())
        listed = list(entry.model_version_policy.specific.versions)
        return dict(entry.version_labels), listed, on_disk

    assert synced("stable", {one}) == ({"stable": one}, [one], [one])
    assert synced("canary", {one}) == ({"stable": one}, [one], [one])  # no release: stable's
    two = _push(tmp_path, folder, "b")
    release.release_pushed(folder, MODEL, two, one, "canary", why="push")
    assert synced("stable", {one}) == ({"stable": one}, [one], [one])
    assert synced("canary", {one}) == ({"stable": one}, [one, two], [one, two])  # loading two
    assert synced("canary", {one, two}) == ({"canary": two}, [two], [one, two])  # 1 in force
    assert synced("canary", {two}) == ({"canary": two}, [two], [two])
    release.end_release(folder, MODEL, release.PROMOTE, why="test")
    assert synced("stable", {one}) == ({"stable": one}, [one, two], [one, two])
    assert synced("stable", {one, two}) == ({"stable": two}, [two], [one, two])
    assert synced("stable", {two}) == ({"stable": two}, [two], [two])
    assert synced("canary", {two}) == ({"stable": two}, [two], [two])

    three = _push(tmp_path, folder, "c")  # a canary aborted: its server goes back to stable's
    release.release_pushed(folder, MODEL, three, two, "canary", why="push")
    assert synced("canary", {two, three}) == ({"canary": three}, [three], [two, three])
    assert synced("canary", {three}) == ({"canary": three}, [three], [three])
    release.end_release(folder, MODEL, release.ABORT, why="test")
    assert synced("canary", {three}) == ({"canary": three}, [two, three], [two, three])
    assert synced("canary", {two, three}) == ({"stable": two}, [two], [two, three])
    assert synced("canary", {two}) == ({"stable": two}, [two], [two])
    assert synced("stable", {two}) == ({"stable": two}, [two], [two])
