"""A release on a cluster (kubeflow/serving/tf-serving.yaml): one TF Serving Deployment per
track (`stable`, `canary`), each fed by `tkp serving-sync --label <track>`, and an Istio
VirtualService that splits the model's traffic between the tracks' Services. `tkp watch` (its
CronJob) moves the weights and judges the canary on TF Serving's own metrics.

Why two Deployments and not one TF Serving with both labels: TF Serving's metrics carry the
model but not the version (servables/tensorflow/util.cc: `request_count{model_name, status}`,
`request_latency{model_name, API, entrypoint}`), so a canary's figures exist only where a
server serves the canary alone; and Istio (part of Kubeflow) splits or mirrors the traffic in
the Envoy sidecars the pods already have, where a router of ours would add a hop.

One poll (`ClusterRelease.poll`):
- no release: the routes go back to `stable` alone once every stable pod serves the stable
  version (after a promotion the canary pods serve it already, so nothing answers an old one);
- a release: until every canary pod reports the canary version AVAILABLE, the canary gets no
  traffic; then the routes take the policy's share (or mirror everything, in shadow mode) and
  each pod's counters are noted as the window's baseline (in the store: a later poll may run in
  another pod); from then on the canary is judged (live_release.judge) on the counters' growth
  since, its window counted from that moment; a verdict is carried out in the serving state, and
  an abort takes the canary's share away at once.

The figures, from TF Serving's exposition (cluster.tf_serving_figures): a request answered is
a `request_latency` sample of API predict, classify or regress (REST's names; gRPC's are
capitalised), which TF records for successful requests only (http_server.cc); an error is a
`request_count` of a status other than OK (a readiness probe's error too: TF does not tell them
apart). A restart of a canary pod's TF Serving during the window aborts the release: a crash
shows in no counter. TF Serving reports no predictions, so the shift of the canary's from
stable's is measured at each judging poll on the canary's warm-up rows, sent to a pod of each
track (`_probe`; those requests are taken out of the figures at the next poll). Requests that
name a label or version go through the split like any other (the VirtualService routes by
port), so on a cluster clients address the model without one (kubeflow/README.md, section 11).
"""

from __future__ import annotations

import datetime
import json
from typing import Any

from components.base import live_release, release, serving_state, storage
from pipelines.serving import metrics
from pipelines.serving.cluster import (
    TRACKS,
    Cluster,
    ClusterUnavailable,
    ModelServerPod,
)

PORTS = {8501: "rest", 8500: "grpc"}  # the VirtualService's routes, one per port
_BASELINE = "_registry/release-baseline.json"


def growth(now: live_release.Figures, then: live_release.Figures | None) -> live_release.Figures:
    """A pod's figures since `then`; all of `now` when a counter went back (TF Serving
    restarted: the caller passes None when the container's restartCount says so)."""
    went_back = (
        then is None
        or now.requests < then.requests
        or now.errors < then.errors
        or any(v < then.latency.get(k, 0.0) for k, v in now.latency.items())
    )
    if went_back:
        return now
    return live_release.Figures(
        requests=now.requests - then.requests,
        errors=now.errors - then.errors,
        latency={k: v - then.latency.get(k, 0.0) for k, v in now.latency.items()},
    )


def total(parts: list[live_release.Figures]) -> live_release.Figures:
    out = live_release.Figures()
    for part in parts:
        out.requests += part.requests
        out.errors += part.errors
        for k, v in part.latency.items():
            out.latency[k] = out.latency.get(k, 0.0) + v
    return out


def routed(http: list[dict], name: str, canary_percent: float, shadow: bool) -> list[dict]:
    """`http` with each port's route giving the canary `canary_percent` of the requests (an
    integer share: Istio's weights are integers summing to 100), or, `shadow`, all of them to
    stable with a copy to the canary. Other fields of a route (timeouts, retries) stay."""
    share = 0 if shadow else round(canary_percent)
    out = []
    for route in http:
        ports = [m.get("port") for m in route.get("match", [])]
        if len(ports) != 1 or ports[0] not in PORTS:
            out.append(route)
            continue
        port = {"number": ports[0]}
        new = {k: v for k, v in route.items() if k not in ("route", "mirror", "mirrorPercentage")}
        new["route"] = [
            {"destination": {"host": f"{name}-stable", "port": port}, "weight": 100 - share},
            {"destination": {"host": f"{name}-canary", "port": port}, "weight": share},
        ]
        if shadow:
            new["mirror"] = {"host": f"{name}-canary", "port": port}
            new["mirrorPercentage"] = {"value": 100.0}
        out.append(new)
    return out


class ClusterRelease:
    """Moves a release's traffic on the cluster and judges it (module docstring)."""

    def __init__(self, folder: str, model_name: str, cluster: Cluster | None = None) -> None:
        self.folder, self.model_name = folder, model_name
        self.cluster = cluster or Cluster(model_name)

    def poll(self) -> tuple[serving_state.ServingState, live_release.Verdict] | None:
        """One look: (the state, the verdict) during a release, None outside one."""
        state = serving_state.read(self.folder, self.model_name)
        http = self.cluster.routes()
        if http is None:
            if state.release:  # nothing can move the traffic
                raise ClusterUnavailable(
                    f"no VirtualService {self.cluster.name} in namespace "
                    f"{self.cluster.namespace}: apply kubeflow/serving/tf-serving.yaml (a "
                    "release on a cluster needs Istio). The release waits; stable keeps serving."
                )
            return None  # the InferenceService form, or no Istio: nothing to put back
        name = self.cluster.name
        at_rest = routed(http, name, 0, False)
        if not state.release:
            # After a promotion the canary pods serve the new stable already: the routes go
            # back once the stable ones do too. (After an abort they went back at once.)
            stable = self.cluster.pods("stable")
            serving = [p.version_state(self.model_name, state.stable) for p in stable]
            if http != at_rest and stable and set(serving) == {"AVAILABLE"}:
                self.cluster.set_routes(at_rest)
            return None
        canary_pods, canary = self.cluster.pods("canary"), state.canary
        states = {p.name: p.version_state(self.model_name, canary) for p in canary_pods}
        if not canary_pods or set(states.values()) != {"AVAILABLE"}:
            if http != at_rest:
                self.cluster.set_routes(at_rest)
            told = "; ".join(f"{k}: {v}" for k, v in states.items() if v != "AVAILABLE")
            why = (f"no canary pod serves version {canary} yet (Deployment {name}-canary, "
                   f"{len(canary_pods)} ready pod(s){': ' + told if told else ''}); it gets no "
                   "traffic until then")  # fmt: skip
            return state, live_release.Verdict(live_release.WAIT, [why], {})
        policy = state.release["policy"]
        wanted = routed(http, name, policy["canary_percent"], state.release["mode"] == "shadow")
        key = f"{canary}@{state.release['started']}"
        baseline = self._baseline(key)
        if http != wanted or baseline is None:
            self._save(self._snapshot(key))
            self.cluster.set_routes(wanted)
            share = ("a copy of every request" if state.release["mode"] == "shadow"
                     else f"{round(policy['canary_percent'])} % of the requests")  # fmt: skip
            return state, live_release.Verdict(live_release.WAIT, [
                f"the canary gets {share} from now on"], {})  # fmt: skip
        verdict = self._judge(state, baseline)
        release.carry_out(self.folder, self.model_name, state, verdict)
        if verdict.action == live_release.ABORT:
            self.cluster.set_routes(at_rest)  # the stable pods serve stable already
        return state, verdict

    def _judge(self, state: serving_state.ServingState, baseline: dict) -> live_release.Verdict:
        pods = {track: self.cluster.pods(track) for track in TRACKS}
        by_track = {}
        for track in TRACKS:
            parts = []
            for pod in pods[track]:
                restarts, then = baseline["pods"].get(pod.uid, (pod.restarts, None))
                parts.append(growth(pod.figures(self.model_name),
                                    then if restarts == pod.restarts else None))  # fmt: skip
            by_track[track] = total(parts)
            # The probes of earlier polls (below) are not the clients' requests.
            probes = baseline["probes"][track]
            by_track[track].requests = max(0, by_track[track].requests - probes["requests"])
            by_track[track].errors = max(0, by_track[track].errors - probes["errors"])
        for track, (status, values) in self._probe(state.canary, pods).items():
            probed = baseline["probes"][track]  # as TF Serving counts it: answered, or an error
            probed["requests"] += 1 if status else 0
            probed["errors"] += 1 if status not in (0, 200) else 0
            if values is not None:
                by_track[track].predictions = metrics.prediction_histogram(values)
        self._save(baseline)
        window = dict(state.release, started=baseline["since"])
        verdict = live_release.judge(window, {state.stable: by_track["stable"],
                                              state.canary: by_track["canary"]})  # fmt: skip
        restarted = [f"{pod.name} ({pod.restarts - baseline['pods'][pod.uid][0]}x)"
                     for pod in pods["canary"] if pod.uid in baseline["pods"]
                     and pod.restarts > baseline["pods"][pod.uid][0]]  # fmt: skip
        if restarted and verdict.action != live_release.ABORT:
            # A crash or an OOM kill shows in no counter of TF Serving's: the pod's restarts do.
            return live_release.Verdict(live_release.ABORT, [
                f"TF Serving restarted in canary pod(s) {', '.join(restarted)} during the "
                "release"], verdict.figures)  # fmt: skip
        return verdict

    def _probe(self, canary: int, pods: dict[str, list[ModelServerPod]]) -> dict[str, tuple]:
        """Each track's (HTTP status, predictions or None) on the same rows: the canary's warm-up
        sample (its evaluation rows, components/steps/warmup.py) sent to a pod of each track,
        since TF Serving's metrics hold no predictions. A track that does not answer has no
        predictions (the shift is then not judged: `null` in the figures); no track is asked
        when there is no sample."""
        from components.base.store_errors import StorageError
        from components.steps import warmup

        try:
            body = warmup.sample_request(f"{self.folder}/{canary}")
        except (OSError, StorageError):
            return {}
        found = {}
        for track in TRACKS:
            if body and pods[track]:
                status, answer = pods[track][0].predict(self.model_name, body)
                found[track] = (status, None if answer is None else
                                metrics.prediction_values(answer))  # fmt: skip
        return found

    def _baseline(self, key: str) -> dict[str, Any] | None:
        """The window's start noted for the release `key` (each pod's restarts and figures,
        the probes sent since), or None."""
        try:
            saved = json.loads(storage.read_bytes(f"{self.folder}/{_BASELINE}"))
        except (OSError, ValueError):
            return None
        if saved.get("release") != key:
            return None
        saved["pods"] = {uid: (f["restarts"], live_release.Figures(
            requests=f["requests"], errors=f["errors"],
            latency={float(k): v for k, v in f["latency"].items()}))
            for uid, f in saved["pods"].items()}  # fmt: skip
        return saved

    def _snapshot(self, key: str) -> dict[str, Any]:
        pods = {pod.uid: (pod.restarts, pod.figures(self.model_name))
                for track in TRACKS for pod in self.cluster.pods(track)}  # fmt: skip
        since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        probes = {track: {"requests": 0, "errors": 0} for track in TRACKS}
        return {"release": key, "since": since, "pods": pods, "probes": probes}

    def _save(self, baseline: dict[str, Any]) -> None:
        pods = {uid: {"restarts": restarts, "requests": f.requests, "errors": f.errors,
                      "latency": {str(k): v for k, v in f.latency.items()}}
                for uid, (restarts, f) in baseline["pods"].items()}  # fmt: skip
        text = json.dumps(dict(baseline, pods=pods))
        storage.write_bytes(f"{self.folder}/{_BASELINE}", text.encode())
