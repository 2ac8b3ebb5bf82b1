"""`tkp rollout status|promote|abort`: a release for a person.

The release's facts are the serving state (components/base/serving_state.py); the decisions are
components/base/release.py's. This module lays them out and records who forced a decision.
"""

from __future__ import annotations

import json

from components.base import live_release, release, serving_state
from components.base.config import PipelineConfig


def status(config: PipelineConfig) -> str:
    """What serves, the release under way (if any), and the last change with its reason."""
    folder = config.serving_model_dir
    state = serving_state.read(folder, config.model_name)
    if state.stable is None:
        return f"No version of {config.model_name!r} is pushed under {folder} yet."
    lines = [f"Model {config.model_name!r}: {state.describe()}"]
    if state.release:
        policy = state.release.get("policy", {})
        share = ("a copy of each request (shadow)" if state.release.get("mode") == "shadow"
                 else f"{policy.get('canary_percent')}% of the requests")  # fmt: skip
        lines.append(
            f"Release under way since {state.release.get('started')}: canary {state.canary} "
            f"beside stable {state.stable}, answering {share}; `tkp rollout promote` makes it "
            "stable, `tkp rollout abort` removes it."
        )
        try:
            verdict = release.live_verdict(state, config.model_name, config.metrics_url())
        except live_release.MetricsUnavailable as e:
            lines.append(f"Live figures: {e}")
        else:
            lines.append(f"Live figures: {json.dumps(verdict.figures, sort_keys=True)}")
            lines.append(f"Verdict so far: {verdict.action} ({'; '.join(verdict.reasons)})")
    else:
        lines.append(f"No release under way (release_mode={config.release_mode}).")
    change = state.change
    if change:
        lines.append(f"Last change: {change.get('what')} at {change.get('time')}: "
                     f"{change.get('why')}")  # fmt: skip
        for name, value in sorted((change.get("figures") or {}).items()):
            lines.append(f"  {name}: {value}")
    return "\n".join(lines)


def decide(config: PipelineConfig, action: str, reason: str) -> str:
    """Forces the release's decision: `promote` or `abort`."""
    folder, name = config.serving_model_dir, config.model_name
    why = f"forced with `tkp rollout {action}`" + (f": {reason}" if reason else "")
    before, after = release.end_release(folder, name, action, why)
    if action == release.PROMOTE:
        return (f"Version {after.stable} is stable now (was {before.stable}, which stays loaded "
                "for an instant rollback until the next release).")  # fmt: skip
    return (f"Canary {before.canary} is removed and unloaded; version {after.stable} stays "
            "stable.")  # fmt: skip
