"""The serving directory as the registry of pushed versions: which serves, what each was, what ran.

Layout of `<serving_root>/<model_name>/` (TF Serving reads the numbered folders and the model
config file; it ignores every other name):
- `<N>/`: version N, a SavedModel (saved_model.pb written last: a version is complete with it);
- `models.config`: TF Serving's model config file (a ModelServerConfig text proto): the loaded
  versions and their labels, written from the serving state (components/base/serving_state.py:
  its log `_registry/serving/` says what serves and why; before it, this file's pinned version
  did, else the highest version, as with TF Serving run without a config file);
- `_registry/<N>.json`: the record of version N (run, spans, metrics, baseline, code, time);
- `_registry/served.json`: the served versions recorded before the serving state's log;
- `_trained/<fingerprint>.json`: what a run on that input produced, blessed or not, so that a run
  on the same data ends early (components/steps/span_selection.py);
- `_claims/<N>/<token>`: claims on version numbers, so that two pushers never write one version
  (one empty object per push, kept: a withdrawn winning claim would let a late rival win too);
- `_statistics/span-<N>/`, `_watch/span-<N>.json`: the statistics of spans that passed validation
  (the drift check's reference, components/steps/validation.py) and `watch`'s trigger records.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from typing import Any

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.base import storage
from components.base.errors import ActionableError

MODEL_CONFIG_FILE = "models.config"
_RECORDS = "_registry"
_TRAINED = "_trained"
_CLAIMS = "_claims"
STATISTICS = "_statistics"  # components/steps/validation.py
WATCH = "_watch"  # pipelines/watch.py
_HISTORY = "served.json"


class RegistryError(ActionableError, ValueError):
    """The serving directory or a request about it is invalid; the message says what to do."""


def versions_dir(serving_root: str, model_name: str) -> str:
    """Where the numbered versions of `model_name` live: `<serving_root>/<model_name>`."""
    return storage.join(serving_root, model_name)


def complete_versions(folder: str) -> dict[int, str]:
    """Complete versions (saved_model.pb is written last) by number, each path ending in '/'."""
    present = set(storage.list_files(storage.join(folder, "*", "saved_model.pb")))
    return {
        version: path
        for version, path in storage.numbered_children(folder).items()
        if path + "saved_model.pb" in present
    }


# ---------------------------------------------------------------------------------------------
# Which version served before the serving state's log: TF Serving's model config file.
# ---------------------------------------------------------------------------------------------


def configured_version(folder: str, model_name: str) -> int | None:
    """The version a model config file from before the serving state's log pins, or None when
    there is no file. RegistryError naming the file when it is not a config TF Serving would
    accept for this model."""
    path = storage.join(folder, MODEL_CONFIG_FILE)
    if not storage.list_files(path):
        return None
    text = storage.read_bytes(path).decode("utf-8", errors="replace")
    fix = "fix it by hand or rewrite it with `tkp rollback N` (N: the version to serve)"
    config = model_server_config_pb2.ModelServerConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise RegistryError(f"{path} is not a TF Serving model config ({e}): {fix}") from e
    entries = [c for c in config.model_config_list.config if c.name == model_name]
    if len(entries) != 1:
        raise RegistryError(f"{path} must configure model {model_name!r} exactly once: {fix}")
    versions = list(entries[0].model_version_policy.specific.versions)
    if len(versions) != 1:
        raise RegistryError(
            f"{path} must pin exactly one version of {model_name!r} "
            f"(model_version_policy {{ specific {{ versions: N }} }}), found {versions}: {fix}"
        )
    return versions[0]


def legacy_served_history(folder: str) -> list[dict[str, Any]]:
    """`_registry/served.json`: the served versions recorded before the serving state's log
    (components/base/serving_state.py), oldest first."""
    return (_read_json(storage.join(folder, _RECORDS, _HISTORY)) or {}).get("served", [])


# ---------------------------------------------------------------------------------------------
# Version numbers: claimed, never reused.
# ---------------------------------------------------------------------------------------------


def claim_version(folder: str, attempts: int = 30) -> int:
    """The next free version number, claimed so that no concurrent pusher gets it too.

    A pusher writes a claim object `_claims/<N>/<token>` and then lists `_claims/<N>/`: it owns N
    only if its own claim is the only one there; otherwise it withdraws and tries again after a
    random pause. Two pushers cannot both own N: the one that listed first saw only itself, so the
    other wrote after that listing and sees the first claim, which is never withdrawn. This needs
    nothing but read-after-write consistency of writes and listings, which S3, GCS and SeaweedFS
    give; no conditional writes.
    """
    token = uuid.uuid4().hex
    claims = storage.join(folder, _CLAIMS)
    for attempt in range(attempts):
        # A number with a record stays taken after its files were deleted (by hand or pruned).
        taken = {*storage.numbered_children(folder), *storage.numbered_children(claims),
                 *records(folder)}  # fmt: skip
        number = max(taken, default=0) + 1
        mine = storage.join(claims, str(number), token)
        storage.write_bytes(mine, b"")
        holders = storage.list_files(storage.join(claims, str(number), "*"))
        if [holder.rsplit("/", 1)[-1] for holder in holders] == [token]:
            return number
        storage.delete_files([mine])
        time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
    raise RegistryError(f"could not claim a version number under {folder} in {attempts} tries")


# ---------------------------------------------------------------------------------------------
# Records: one per version, one per trained input.
# ---------------------------------------------------------------------------------------------


def _read_json(path: str) -> dict[str, Any] | None:
    if not storage.list_files(path):
        return None
    try:
        return json.loads(storage.read_bytes(path))
    except ValueError as e:
        raise RegistryError(f"{path} is not valid JSON ({e}): restore or delete it") from e


def _write_json(path: str, value: dict[str, Any]) -> None:
    storage.write_bytes(path, json.dumps(value, indent=2, sort_keys=True).encode())


def write_record(folder: str, version: int, record: dict[str, Any]) -> None:
    _write_json(storage.join(folder, _RECORDS, f"{version}.json"), {**record, "version": version})


def read_record(folder: str, version: int) -> dict[str, Any] | None:
    return _read_json(storage.join(folder, _RECORDS, f"{version}.json"))


def records(folder: str) -> dict[int, dict[str, Any]]:
    """Every version's record by number, including versions whose files were deleted."""
    found = {}
    for path in storage.list_files(storage.join(folder, _RECORDS, "*.json")):
        name = path.rsplit("/", 1)[-1][: -len(".json")]
        if name.isdigit():
            found[int(name)] = _read_json(path)
    return found


def record_trained(folder: str, input_fingerprint: str, outcome: dict[str, Any]) -> None:
    """Notes that a model was trained and judged on this input, whatever the verdict."""
    _write_json(storage.join(folder, _TRAINED, f"{input_fingerprint}.json"), outcome)


def trained_outcome(folder: str, input_fingerprint: str) -> dict[str, Any] | None:
    return _read_json(storage.join(folder, _TRAINED, f"{input_fingerprint}.json"))


# ---------------------------------------------------------------------------------------------
# Keeping the serving directory small.
# ---------------------------------------------------------------------------------------------


def lineage(folder: str, version: int) -> list[int]:
    """`version` and the baselines it beat, newest first, from the records."""
    chain, all_records = [], records(folder)
    while version is not None and version not in chain:
        chain.append(version)
        version = (all_records.get(version) or {}).get("baseline_version")
    return chain


def prune(folder: str, keep: int, protected: set[int], newest_kept: int,
          unchanged=lambda: True) -> list[int]:  # fmt: skip
    """Deletes complete versions beyond the newest `keep`, never a `protected` one (served,
    labelled, or where a rollback returns) nor any above `newest_kept` (after a rollback those
    are kept until a newer version serves); their records stay. Half-written versions are left
    for a person to look at. `unchanged()` is asked before each deletion: False stops (what
    protects a version may have changed). Returns the deleted version numbers."""
    complete = sorted(complete_versions(folder), reverse=True)
    doomed = [v for v in complete[keep:] if v not in protected and v < newest_kept]
    deleted = []
    for version in doomed:
        if not unchanged():
            break
        deleted.append(version)
        # saved_model.pb first: a half-deleted version is no longer complete to any reader.
        path = storage.join(folder, str(version))
        storage.delete_files([storage.join(path, "saved_model.pb")])
        storage.delete_tree(path)
    return deleted
