"""Releasing versions through TF Serving's labels: a push, a promotion, an abort, a rollback.

Each reads the serving state (components/base/serving_state.py), decides, and commits the next
state, which fails with ConcurrentChange when another writer committed first. A blessed version
becomes `stable` at once (release mode "immediate") or `canary` beside `stable` ("canary"); a
promotion makes the canary `stable` and keeps the old one loaded for an instant rollback until
the next release; an abort removes the canary's label and unloads it. What TF Serving keeps
loaded is always the labelled versions (and after a promotion or an immediate push, the version
it replaced), so its own default for an unlabelled request, the highest loaded version, is
`stable` whenever no release is under way.
"""

from __future__ import annotations

import time
from typing import Any

from components.base import live_release, registry, storage
from components.base.registry import RegistryError
from components.base.serving_state import (
    CANARY,
    STABLE,
    ConcurrentChange,
    ServingState,
    commit,
    newest_generation,
    previous_stable,
    read,
)


def policy_of(policy: dict[str, Any] | str) -> dict[str, Any]:
    """A release policy (PipelineConfig.release_policy()); a mode alone takes the defaults."""
    if isinstance(policy, str):
        from components.base.config import PipelineConfig

        return PipelineConfig.load({"release_mode": policy}, environ={}).release_policy()
    return dict(policy)


def release_pushed(folder: str, model_name: str, version: int, compared_with: int | None,
                   policy: dict[str, Any] | str, why: str) -> ServingState:  # fmt: skip
    """Serves the freshly pushed, blessed `version`, which was judged against `compared_with`
    (the stable version then, None: none), as `policy` says (its mode; PipelineConfig.
    release_policy()). ConcurrentChange when `stable` is another version now, or when another
    writer commits first: it was never compared with what serves."""
    policy = policy_of(policy)
    mode = policy.get("mode", "immediate")
    base = read(folder, model_name, unreleased=version)
    if base.stable != compared_with:
        raise ConcurrentChange(
            f"version {version} was judged against "
            f"{'no version' if compared_with is None else f'version {compared_with}'}, but "
            f"{base.describe()} now ({base.change.get('what', 'a change')} at "
            f"{base.change.get('time', '?')}): not released; run again with force=1 to compare "
            "it with what serves now"
        )
    if mode == "immediate" or base.stable is None:
        loaded = {version} | ({base.stable} if base.stable is not None else set())
        ended = f"; ends the release of canary {base.canary}" if base.canary is not None else ""
        return commit(folder, model_name, base, {STABLE: version}, loaded, what="push",
                      why=why + ended)  # fmt: skip
    replaced = f"; replaces canary {base.canary}" if base.canary is not None else ""
    release = {"canary": version, "stable": base.stable, "mode": mode, "started": _now(),
               "policy": policy}  # fmt: skip
    return commit(folder, model_name, base, {STABLE: base.stable, CANARY: version},
                  {base.stable, version}, release, what="canary", why=why + replaced)  # fmt: skip


def _running(folder: str, model_name: str, action: str) -> ServingState:
    state = read(folder, model_name)
    if state.canary is None:
        raise RegistryError(
            f"no release of {model_name!r} is under way ({state.describe()}): nothing to "
            f"{action}; `tkp rollback N` serves any complete version"
        )
    return state


PROMOTE, ABORT = "promote", "abort"


def end_release(
    folder: str,
    model_name: str,
    action: str,
    why: str,
    figures: dict[str, Any] | None = None,
    base: ServingState | None = None,
) -> tuple[ServingState, ServingState]:
    """Ends the release under way. PROMOTE: the canary becomes `stable`, the old stable stays
    loaded. ABORT: the canary's label goes and its version is unloaded (recorded as rolled back,
    with the figures), `stable` untouched. `base`: the state the decision was made on (default:
    the newest). Returns (before, after)."""
    base = base or _running(folder, model_name, action)
    if action == PROMOTE:
        labels, loaded, what = {STABLE: base.canary}, {base.canary, base.stable}, "promotion"
    else:
        labels, loaded, what = {STABLE: base.stable}, set(base.loaded) - {base.canary}, "abort"
    after = commit(folder, model_name, base, labels, loaded, what=what, why=why, figures=figures)
    return base, after


def rollback(folder: str, model_name: str, to: int | None = None) -> tuple[int | None, int]:
    """Serves `to` (default: the version that was stable before the stable one) as `stable`
    alone, ending any release; returns (was stable, is stable now). Nothing changes when the
    request is invalid. With `to`, a broken state (a model config file from before the log that
    is broken or pins a deleted version) is repaired ("was" is then None)."""
    complete = registry.complete_versions(folder)
    try:
        base = read(folder, model_name)
    except RegistryError:
        if to is None:
            raise
        base = ServingState(newest_generation(folder), {}, ())
    current = base.stable
    if to is None:
        if current is None:
            raise RegistryError(f"nothing to roll back: no version is pushed under {folder}")
        to = previous_stable(folder, current)
        if to is None:
            raise RegistryError(
                f"version {current} serves and no complete version served before it is left "
                f"under {folder}: nothing to roll back to; `tkp rollback N` serves version N "
                f"(complete: {sorted(complete)})"
            )
    elif to not in complete:
        known = sorted(storage.numbered_children(folder))
        state = "is incomplete (no saved_model.pb)" if to in known else "does not exist"
        raise RegistryError(
            f"version {to} {state} under {folder}: choose one of the complete versions "
            f"{sorted(complete)} (`tkp models list`)"
        )
    ended = f"; ends the release of canary {base.canary}" if base.canary is not None else ""
    commit(folder, model_name, base, {STABLE: to}, {to}, what="rollback",
           why=f"rollback from {current}{ended}")  # fmt: skip
    return current, to


def live_verdict(state: ServingState, model_name: str, metrics_url: str) -> live_release.Verdict:
    """The verdict on `state`'s release from the live figures at `metrics_url`
    (MetricsUnavailable when they cannot be read)."""
    text = live_release.read_metrics(metrics_url)
    return live_release.judge(state.release, live_release.figures_by_version(text, model_name))


def judge_release(
    folder: str, model_name: str, metrics_url: str
) -> tuple[ServingState, live_release.Verdict] | None:
    """Judges the release under way, if any, on the figures at `metrics_url` (`tkp serve`'s)
    and carries the verdict out (`carry_out`). Returns (the state judged, the verdict); None
    without a release. ConcurrentChange when another writer changed the state meanwhile."""
    state = read(folder, model_name)
    if not state.release:
        return None
    verdict = live_verdict(state, model_name, metrics_url)
    carry_out(folder, model_name, state, verdict)
    return state, verdict


def carry_out(folder: str, model_name: str, state: ServingState,
              verdict: live_release.Verdict) -> None:  # fmt: skip
    """Promotes or aborts `state`'s release as `verdict` says, with the figures recorded; a
    verdict to wait changes nothing."""
    why = "; ".join(verdict.reasons)
    if verdict.action == live_release.PROMOTE:
        end_release(folder, model_name, PROMOTE, f"live figures: {why}", verdict.figures, state)
    elif verdict.action == live_release.ABORT:
        end_release(folder, model_name, ABORT, f"rolled back on live figures: {why}",
                    verdict.figures, state)  # fmt: skip


def prune(folder: str, model_name: str, keep: int) -> list[int]:
    """Deletes complete versions beyond the newest `keep`, never a loaded or labelled one, nor
    the one a rollback returns to, nor any newer than `stable` (after a rollback those are kept
    until a newer version serves). Returns the deleted version numbers."""
    state = read(folder, model_name)
    if state.stable is None:
        return []
    protected = {*state.loaded, *state.labels.values(), previous_stable(folder, state.stable)}
    # A rollback committed meanwhile may label a version this state would delete: each deletion
    # waits until the log still ends at this state.
    unchanged = lambda: newest_generation(folder) == state.generation  # noqa: E731
    return registry.prune(folder, keep, protected, state.stable, unchanged)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
