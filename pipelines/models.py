"""`tkp models list`, `tkp models show N` and `tkp rollback [N]`: the registry for a person.

The facts live in the serving directory (components/base/registry.py, serving_state.py); this
module only reads them, lays them out, and asks components/base/release.py to change what serves.
"""

from __future__ import annotations

import json

from components.base import registry, release, serving_state, storage
from components.base.config import PipelineConfig
from components.steps.auc_text import AUC_UNDEFINED_KEY, accuracy_of


def _state(version: int, complete: dict[int, str], present: set[int],
           served: serving_state.ServingState | None) -> str:  # fmt: skip
    if served is not None and version == served.stable:
        return "SERVED"
    if served is not None and version == served.canary:
        return "CANARY"
    if served is not None and version in served.loaded:
        return "loaded"  # the stable one before, kept loaded for an instant rollback
    if version in complete:
        return "ready"
    return "incomplete" if version in present else "deleted"


def list_versions(config: PipelineConfig) -> str:
    """A table of every version with a record or files, newest first, the served one marked."""
    folder = config.serving_model_dir
    complete = registry.complete_versions(folder)
    present = set(storage.numbered_children(folder))
    records = registry.records(folder)
    try:
        served, broken = serving_state.read(folder, config.model_name), None
    except registry.RegistryError as e:  # still list what is there, and say what is wrong
        served, broken = None, str(e)
    versions = sorted(set(records) | present, reverse=True)
    if not versions:
        return f"No version pushed under {folder} yet."
    header = f"{'VERSION':>7}  {'STATE':<10}  {'PUSHED AT':<25}  {'SPANS':<12}  {'AUC':>6}  "
    header += f"{'ACC':>6}  {'vs BASELINE':<16}"
    lines = [f"Model {config.model_name!r} in {folder}", header]
    for version in versions:
        record = records.get(version) or {}
        overall = record.get("metrics", {}).get("overall", {})
        baseline = record.get("baseline_version")
        change = record.get("auc_change")
        versus = "first model" if baseline is None else f"v{baseline}"
        if record.get("not_compared"):  # the served model could not read its data
            versus = "not compared"
        if baseline is not None and change is not None:
            versus += f" {change:+.4f}"
        spans = ",".join(sorted(record.get("spans", {}), key=int)) or "?"
        lines.append(
            f"{version:>7}  {_state(version, complete, present, served):<10}  "
            f"{record.get('pushed_at', '?'):<25}  {spans:<12}  "
            f"{_auc(overall)}  {_number(accuracy_of(overall))}  "
            f"{versus:<16}"
        )
    if broken:
        lines.append(f"NOTHING SERVES: {broken}")
    elif served.generation == 0:
        if (
            served.stable is not None
            and registry.configured_version(folder, config.model_name) is None
        ):
            no_file = f"no {registry.MODEL_CONFIG_FILE} yet"
            lines.append(f"({no_file}: TF Serving serves the highest version)")
    else:
        lines.append(f"Serving: {served.describe()}; last change: {_change(served)}")
        if served.release:
            lines.append(f"Release under way: canary {served.canary} beside stable "
                         f"{served.stable} since {served.release.get('started')} "
                         "(`tkp rollout status`)")  # fmt: skip
    return "\n".join(lines)


def _change(state: serving_state.ServingState) -> str:
    change = state.change
    return f"{change.get('what')} at {change.get('time')} ({change.get('why')})"


def _auc(overall: dict) -> str:
    """The AUC column: "n/a" where the record says why there is none (one label only)."""
    return f"{'n/a':>6}" if overall.get(AUC_UNDEFINED_KEY) else _number(overall.get("auc"))


def _number(value: float | None) -> str:
    return f"{value:6.4f}" if value is not None else f"{'-':>6}"


def show_version(config: PipelineConfig, version: int) -> str:
    """One version's record, and its lineage: the baselines it beat, back to the first model."""
    folder = config.serving_model_dir
    records = registry.records(folder)
    if version not in records:
        known = sorted(records)
        raise registry.RegistryError(
            f"no record of version {version} under {folder}: versions with records are {known} "
            "(`tkp models list`)"
        )
    try:
        served = serving_state.read(folder, config.model_name)
    except registry.RegistryError:
        served = None  # `models list` says why
    complete = registry.complete_versions(folder)
    state = _state(version, complete, set(storage.numbered_children(folder)), served)
    lines = [f"Version {version} ({state}) of {config.model_name!r} in {folder}"]
    lines.append(json.dumps(records[version], indent=2, sort_keys=True))
    lines += _training_lines(records[version])
    chain = registry.lineage(folder, version)
    oldest = records.get(chain[-1]) or {}
    start = "(first model)"
    if oldest.get("not_compared"):  # a new lineage: the version it replaced could not score it
        replaced = oldest.get("replaced_version", "?")
        start = f"(not compared with v{replaced}, which could not read its data)"
    lineage = " <- ".join(f"v{v}" for v in chain) + f" <- {start}"
    lines.append(f"Lineage (each beat the one after it): {lineage}")
    return "\n".join(lines)


def _training_lines(record: dict) -> list[str]:
    """What the version was trained with, and the search those values came from."""
    values = record.get("hyperparameters")
    if not values:
        return []  # pushed before versions recorded them
    shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                      for k, v in sorted(values.items()))  # fmt: skip
    lines = [f"Hyperparameters: {shown}"]
    search = record.get("search")
    if not search:
        lines.append("Search: none (the use case's defaults and the config)")
        return lines
    carried = search.get("from_version")
    lines.append(
        f"Search: {search['algorithm']}, {search['completed']} of {search['trials']} trials "
        f"completed, best {search['objective']} {search['best_value']:.4f} in trial "
        f"{search['best_trial']}; searched {', '.join(search['searched'])}"
        + (f"; carried over from version {carried} (tune=0)" if carried is not None else "")
        + f" ({search['folder']})"
    )
    return lines


def rollback(config: PipelineConfig, to: int | None) -> str:
    was, now = release.rollback(config.serving_model_dir, config.model_name, to)
    config_path = storage.join(config.serving_model_dir, registry.MODEL_CONFIG_FILE)
    return (
        f"Version {now} serves now (was {was}); {config_path} labels it stable, and TF Serving "
        "loads it at its next config poll."
    )
