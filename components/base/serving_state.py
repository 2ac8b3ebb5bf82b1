"""What serves: the versions TF Serving keeps loaded, the labels (`stable`, `canary`) that name
them, and the release under way; changed by one writer at a time.

The state is a log: `<versions dir>/_registry/serving/<generation>.json`, each generation a whole
state plus the change that made it (what, why, when, the figures behind a decision), written once
with a conditional create (components/base/storage.create_exclusive). A writer (a push, a
promotion, an abort, a rollback) reads the newest generation G, decides, and creates G+1; when
another writer created G+1 first, nothing is written and ConcurrentChange names what that writer
changed. The log is also the registry's history of every label change and its reason.

`models.config` beside the versions is TF Serving's view of the state, rewritten after each
change (`model_version_policy { specific }` lists the loaded versions, `version_labels` the
labels); nothing reads it back once the log exists (a crash between the two writes, or a slow
writer, can leave it a change behind). A TF Serving reads the copy that `tkp serving-sync`
writes, which adds a label only once its version is loaded (pipelines/serving/serving_sync.py).
A serving directory from before the log (or with none yet) is read from that file, or the
highest complete version, and `_registry/served.json` as history; its first change starts
the log.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from typing import Any

from google.protobuf import text_format
from tensorflow_serving.config import model_server_config_pb2

from components.base import registry, storage
from components.base.registry import RegistryError

STABLE, CANARY = "stable", "canary"
LOG_FOLDER = "_registry/serving"  # pipelines/serving/serving_sync.py probes it


class ConcurrentChange(RegistryError):
    """Another writer changed the serving state between this writer's read and its write."""


@dataclasses.dataclass(frozen=True)
class ServingState:
    generation: int  # 0: no change recorded yet (nothing pushed, or a directory from before)
    labels: dict[str, int]
    loaded: tuple[int, ...]  # the versions TF Serving keeps loaded
    release: dict[str, Any] | None = None  # the release under way (pipelines/release.py)
    change: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def stable(self) -> int | None:
        return self.labels.get(STABLE)

    @property
    def canary(self) -> int | None:
        return self.labels.get(CANARY)

    def describe(self) -> str:
        if not self.labels:
            return "nothing served"
        ordered = sorted(self.labels.items(), key=_label_order)
        names = ", ".join(f"{label} {version}" for label, version in ordered)
        return f"{names} (loaded: {', '.join(map(str, self.loaded))})"

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "labels": self.labels, "loaded": list(self.loaded),
                "release": self.release, "change": self.change}  # fmt: skip


def _label_order(item: tuple[str, int]) -> tuple[int, str]:
    return (0 if item[0] == STABLE else 1, item[0])


def _log_path(folder: str, generation: int) -> str:
    return storage.join(folder, LOG_FOLDER, f"{generation:010d}.json")


def _parse(path: str, data: bytes) -> ServingState:
    try:
        doc = json.loads(data)
        return ServingState(
            generation=int(doc["generation"]),
            labels={str(k): int(v) for k, v in doc["labels"].items()},
            loaded=tuple(int(v) for v in doc["loaded"]),
            release=doc.get("release"),
            change=doc.get("change") or {},
        )
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise RegistryError(
            f"{path} is not a serving state ({type(e).__name__}: {e}); it is written once and "
            "never edited: `tkp rollback N` writes a new state serving version N"
        ) from e


def _generations(folder: str) -> dict[int, str]:
    found = {}
    for path in storage.list_files(storage.join(folder, LOG_FOLDER, "*.json")):
        name = path.rsplit("/", 1)[-1][: -len(".json")]
        if name.isdigit():
            found[int(name)] = path
    return found


def newest_generation(folder: str) -> int:
    """The newest generation's number (0: none), even when its state cannot be read."""
    return max(_generations(folder), default=0)


def read(folder: str, model_name: str, unreleased: int | None = None) -> ServingState:
    """The newest state. RegistryError naming the file when it (or, before the log, the model
    config file) is broken, or when a label names a version whose files are gone. `unreleased`:
    a version pushed but not released yet, which before the log is not the highest served."""
    generations = _generations(folder)
    if not generations:
        return _from_model_config(folder, model_name, unreleased)
    newest = max(generations)
    state = _parse(generations[newest], storage.read_bytes(generations[newest]))
    complete = registry.complete_versions(folder)
    for label, version in state.labels.items():
        if version not in complete:
            raise RegistryError(
                f"{generations[newest]} labels version {version} {label!r}, which is not a "
                f"complete version under {folder} (complete: {sorted(complete)}): serve one of "
                "them with `tkp rollback N`"
            )
    return state


def _from_model_config(folder: str, model_name: str, unreleased: int | None) -> ServingState:
    """Before the log: the version models.config pins, else the highest complete one (TF
    Serving's default policy)."""
    complete = registry.complete_versions(folder)
    complete.pop(unreleased, None)
    pinned = registry.configured_version(folder, model_name)
    if pinned is None:
        version = max(complete, default=None)
    elif pinned not in complete:
        raise RegistryError(
            f"{storage.join(folder, registry.MODEL_CONFIG_FILE)} pins version {pinned}, which is "
            f"not a complete version under {folder} (complete: {sorted(complete)}): serve one of "
            "them with `tkp rollback N`"
        )
    else:
        version = pinned
    if version is None:
        return ServingState(0, {}, ())
    return ServingState(0, {STABLE: version}, (version,))


def history(folder: str) -> list[ServingState]:
    """Every recorded state, oldest first: `served.json`'s entries from before the log (as
    stable-only states of generation 0), then the log."""
    legacy = [
        ServingState(0, {STABLE: entry["version"]}, (entry["version"],),
                     change={"what": entry.get("why", ""), "time": entry.get("time", "")})
        for entry in registry.legacy_served_history(folder)
    ]  # fmt: skip
    logged = [_parse(path, storage.read_bytes(path)) for _, path in
              sorted(_generations(folder).items())]  # fmt: skip
    return legacy + logged


def previous_stable(folder: str, version: int) -> int | None:
    """The complete version that was stable before `version` first was: where a rollback goes,
    and what pruning keeps. Rolling back from 5 to 4 and pushing 6 makes it 4, not the rejected
    5. Without a history before it: the complete version below."""
    complete = registry.complete_versions(folder)
    stables: list[int] = []
    for state in history(folder):
        if state.stable is not None and (not stables or stables[-1] != state.stable):
            stables.append(state.stable)
    if version in stables:
        before = [v for v in stables[: stables.index(version)] if v in complete and v != version]
        if before:
            return before[-1]
    return max((v for v in complete if v < version), default=None)


def commit(folder: str, model_name: str, base: ServingState, labels: dict[str, int],
           loaded: set[int] | None = None, release: dict | None = None, *, what: str,
           why: str, figures: dict | None = None) -> ServingState:  # fmt: skip
    """Writes the state after `base`: `labels`, `loaded` (default: the labelled versions),
    `release`, and the change (`what`, `why`, `figures`). ConcurrentChange when `base` is no
    longer the newest state (nothing is written then); RegistryError when a label names a version
    that is not complete."""
    complete = registry.complete_versions(folder)
    loaded = set(loaded or ()) | set(labels.values())
    for version in loaded:
        if version not in complete:
            raise RegistryError(f"version {version} is not a complete version under {folder} "
                                f"(complete: {sorted(complete)})")  # fmt: skip
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    change = {"what": what, "why": why, "time": now, **({"figures": figures} if figures else {})}
    # Which writer this is: a create whose answer was lost and whose retry was refused (412) is
    # this writer's own when the object there carries its token.
    change["writer"] = uuid.uuid4().hex
    state = ServingState(base.generation + 1, dict(labels), tuple(sorted(loaded)), release, change)
    path = _log_path(folder, state.generation)
    created = storage.create_exclusive(path, json.dumps(state.to_json(), indent=2).encode())
    winner = state if created else _parse(path, storage.read_bytes(path))
    if winner.change.get("writer") != change["writer"]:
        raise ConcurrentChange(
            f"the serving state of {model_name!r} changed while this {what} was deciding: "
            f"{winner.change.get('what')} at {winner.change.get('time')} "
            f"({winner.change.get('why')}) made it {winner.describe()}; it was "
            f"{base.describe()}. This {what} changed nothing (`tkp models list` shows the state)."
        )
    text = model_config_text(folder, model_name, state.labels, state.loaded)
    storage.write_bytes(storage.join(folder, registry.MODEL_CONFIG_FILE), text.encode())
    return state


def model_config_text(base_path: str, model_name: str, labels: dict[str, int],
                      versions) -> str:  # fmt: skip
    """TF Serving's model config file (a ModelServerConfig text proto, serving_config.md): the
    versions loaded, and the labels naming them."""
    config = model_server_config_pb2.ModelServerConfig()
    entry = config.model_config_list.config.add()
    entry.name = model_name
    entry.base_path = base_path.rstrip("/")
    entry.model_platform = "tensorflow"
    entry.model_version_policy.specific.versions.extend(sorted(versions))
    for label, version in sorted(labels.items()):
        entry.version_labels[label] = version
    return text_format.MessageToString(config)
