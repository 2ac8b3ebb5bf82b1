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

The figures from TF Serving's exposition: a request answered is a `request_latency` sample of
API predict, classify or regress (TF records only successful requests there, http_server.cc);
an error is a `request_count` of a status other than OK (probes' errors too, which TF does not
tell apart). TF Serving reports no predictions: the shift of the canary's from stable's is
measured at each judging poll on the canary's warm-up rows, sent to a pod of each track
(`_probe`; those two requests count in the figures like any other).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import urllib.request
from typing import Any

from components.base import live_release, release, serving_state, storage
from components.base.errors import ActionableError
from pipelines.serving import metrics, serving_sync

TRACKS = ("stable", "canary")
TRACK_LABEL = "app.kubernetes.io/instance"  # each Deployment's pods: tfx-<model>-serving-<track>
PORTS = {8501: "rest", 8500: "grpc"}  # the VirtualService's routes, one per port
_APIS = ("predict", "classify", "regress")
_BASELINE = "_registry/release-baseline.json"
_ENDS = ("promotion", "abort", "rollback")  # the changes after which the routes go back
_TIMEOUT = (10, 30)


class ClusterUnavailable(ActionableError, RuntimeError):
    """The Kubernetes API or a model-server pod could not be asked; the release waits and
    `stable` keeps serving."""


def service(model_name: str) -> str:
    """The model's Service and VirtualService, as kubeflow/serving/tf-serving.yaml names them."""
    return f"tfx-{model_name}-serving"


def tf_serving_figures(text: str, model_name: str) -> live_release.Figures:
    """A TF Serving's figures for `model_name` in its Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    figures = live_release.Figures()
    answered = 0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if labels.get("model_name") != model_name:
                continue
            if sample.name == metrics.TF_LATENCY + "_count" and labels.get("API") in _APIS:
                answered += int(sample.value)
            elif sample.name == metrics.TF_LATENCY + "_bucket" and labels.get("API") in _APIS:
                bound = float(labels["le"]) / 1e6  # us -> s
                figures.latency[bound] = figures.latency.get(bound, 0.0) + sample.value
            elif sample.name.startswith(":tensorflow:serving:request_count") and labels.get(
                "status"
            ) not in ("OK", None):
                figures.errors += int(sample.value)
    figures.requests = answered + figures.errors
    return figures


def growth(now: live_release.Figures, then: live_release.Figures | None) -> live_release.Figures:
    """A pod's figures since `then`; all of `now` when its counters went back (a restart)."""
    if then is None or now.requests < then.requests or now.errors < then.errors:
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


@dataclasses.dataclass
class ModelServerPod:
    name: str
    uid: str
    rest_url: str  # http://<pod IP>:<port>
    metrics_url: str

    def serves(self, model_name: str, version: int) -> bool:
        return serving_sync.model_server_loaded(self.rest_url, model_name)(version)

    def predict(self, model_name: str, body: dict) -> dict | None:
        """The pod's answer to a :predict `body`; None when it does not answer 200."""
        request = urllib.request.Request(
            f"{self.rest_url}/v1/models/{model_name}:predict", data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=_TIMEOUT[1]) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError):
            return None

    def figures(self, model_name: str) -> live_release.Figures:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.metrics_url, timeout=_TIMEOUT[1]) as answer:
                text = answer.read().decode("utf-8")
        except OSError as e:
            raise ClusterUnavailable(
                f"cannot read the metrics of model-server pod {self.name} at {self.metrics_url} "
                f"({e}); is TF Serving's --monitoring_config_file set (kubeflow/serving/"
                "tf-serving-config.yaml)? The release waits; stable keeps serving."
            ) from e
        return tf_serving_figures(text, model_name)


class Cluster:
    """The Kubernetes calls a release makes: the tracks' pods, the VirtualService's routes."""

    def __init__(self, model_name: str) -> None:
        from kubernetes import client

        from components.training import kube_client

        try:
            api_client, self.namespace = kube_client.connect()
        except Exception as e:  # kubernetes.config.ConfigException, a broken kubeconfig
            raise ClusterUnavailable(
                f"no Kubernetes API to move the release's traffic ({e}): release_router "
                "'istio' runs in the cluster (kubeflow/watch-cronjob.yaml) or with KUBECONFIG "
                "set. The release waits; stable keeps serving."
            ) from e
        self.core, self.custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
        self.name = service(model_name)

    def pods(self, track: str) -> list[ModelServerPod]:
        """The track's running pods whose TF Serving is ready (a pod not ready takes no
        traffic from the Service, so its figures and version do not matter yet)."""
        found = self._call("list pods", lambda: self.core.list_namespaced_pod(
            self.namespace, label_selector=f"{TRACK_LABEL}={self.name}-{track}",
            _request_timeout=_TIMEOUT).items)  # fmt: skip
        pods = []
        for pod in found:
            ready = any(c.type == "Ready" and c.status == "True"
                        for c in pod.status.conditions or [])  # fmt: skip
            if pod.status.phase != "Running" or not ready or not pod.status.pod_ip:
                continue
            rest = f"http://{pod.status.pod_ip}:8501"
            annotations = pod.metadata.annotations or {}
            # Prometheus' convention, which Istio's metrics merging rewrites to its agent's
            # port (15020) so a scrape needs no mTLS certificate.
            port = annotations.get("prometheus.io/port", "8501")
            path = annotations.get("prometheus.io/path", metrics.PATH)
            scrape = f"http://{pod.status.pod_ip}:{port}{path}"
            pods.append(ModelServerPod(pod.metadata.name, pod.metadata.uid, rest, scrape))
        return pods

    def routes(self) -> list[dict]:
        found = self._call("get virtualservices", lambda: self.custom.get_namespaced_custom_object(
            "networking.istio.io", "v1", self.namespace, "virtualservices", self.name,
            _request_timeout=_TIMEOUT))  # fmt: skip
        return found.get("spec", {}).get("http", [])

    def set_routes(self, http: list[dict]) -> None:
        self._call("patch virtualservices", lambda: self.custom.patch_namespaced_custom_object(
            "networking.istio.io", "v1", self.namespace, "virtualservices", self.name,
            {"spec": {"http": http}}, _request_timeout=_TIMEOUT))  # fmt: skip

    def _call(self, doing: str, call):
        from kubernetes.client.exceptions import ApiException

        try:
            return call()
        except ApiException as e:
            try:
                reason = json.loads(e.body)["message"]
            except (TypeError, ValueError, KeyError):
                reason = str(e.reason or e)
            hint = (" Apply kubeflow/watch-cronjob.yaml's Role and RoleBinding (kubeflow/"
                    "README.md, section 11)." if e.status == 403 else "")  # fmt: skip
            if e.status == 404 and "virtualservices" in doing:
                hint = (f" Apply kubeflow/serving/tf-serving.yaml (VirtualService {self.name}); "
                        "a release on a cluster needs Istio.")  # fmt: skip
            raise ClusterUnavailable(f"cannot {doing} in namespace {self.namespace} "
                                     f"({e.status}): {reason}.{hint} The release waits; "
                                     "stable keeps serving.") from None  # fmt: skip
        except OSError as e:
            raise ClusterUnavailable(f"cannot {doing}: the Kubernetes API does not answer ({e}). "
                                     "The release waits; stable keeps serving.") from e  # fmt: skip


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
    """Moves a release's traffic on the cluster and judges it (module docstring). `say`: where
    a step of the release is told."""

    def __init__(self, folder: str, model_name: str, cluster: Cluster | None = None) -> None:
        self.folder, self.model_name = folder, model_name
        self.cluster = cluster or Cluster(model_name)

    def poll(self) -> tuple[serving_state.ServingState, live_release.Verdict] | None:
        """One look: (the state, the verdict) during a release, None outside one."""
        state = serving_state.read(self.folder, self.model_name)
        if not state.release and (state.change or {}).get("what") not in _ENDS:
            return None  # nothing to put back: the cluster is not asked
        http = self.cluster.routes()
        name = self.cluster.name
        at_rest = routed(http, name, 0, False)
        if not state.release:
            stable = self.cluster.pods("stable")
            if (
                http != at_rest
                and stable
                and all(p.serves(self.model_name, state.stable) for p in stable)
            ):
                self.cluster.set_routes(at_rest)
            return None
        canary_pods = self.cluster.pods("canary")
        canary = state.canary
        if not canary_pods or not all(p.serves(self.model_name, canary) for p in canary_pods):
            if http != at_rest:
                self.cluster.set_routes(at_rest)
            why = (f"no canary pod serves version {canary} yet (Deployment {name}-canary: "
                   f"{len(canary_pods)} ready pod(s)); it gets no traffic until then")  # fmt: skip
            return state, live_release.Verdict(live_release.WAIT, [why], {})
        policy = state.release["policy"]
        wanted = routed(http, name, policy["canary_percent"], state.release["mode"] == "shadow")
        key = f"{canary}@{state.release['started']}"
        baseline = self._baseline(key)
        if http != wanted or baseline is None:
            baseline = self._note_baseline(key)
            self.cluster.set_routes(wanted)
            share = ("a copy of every request" if state.release["mode"] == "shadow"
                     else f"{round(policy['canary_percent'])} % of the requests")  # fmt: skip
            return state, live_release.Verdict(live_release.WAIT, [
                f"the canary gets {share} from now on"], {})  # fmt: skip
        pods = {track: self.cluster.pods(track) for track in TRACKS}
        by_track = {track: total([
            growth(pod.figures(self.model_name), baseline["pods"].get(pod.uid))
            for pod in pods[track]]) for track in TRACKS}  # fmt: skip
        for track, values in self._probe(canary, pods).items():
            by_track[track].predictions = metrics.prediction_histogram(values)
        window = dict(state.release, started=baseline["since"])
        verdict = live_release.judge(window, {state.stable: by_track["stable"],
                                              canary: by_track["canary"]})  # fmt: skip
        release.carry_out(self.folder, self.model_name, state, verdict)
        if verdict.action == live_release.ABORT:
            self.cluster.set_routes(at_rest)  # the stable pods serve stable already
        return state, verdict

    def _probe(self, canary: int, pods: dict[str, list[ModelServerPod]]) -> dict[str, list]:
        """Both tracks' predictions on the same rows: the canary's warm-up sample (its
        evaluation rows, components/steps/warmup.py) sent to a pod of each track, since TF
        Serving's metrics hold no predictions. Nothing when there is no sample or a track does
        not answer it (the shift is then not judged: `null` in the figures)."""
        from components.steps import warmup

        try:
            body = warmup.sample_request(f"{self.folder}/{canary}")
        except OSError:
            return {}
        if body is None or not all(pods.values()):
            return {}
        found = {}
        for track in TRACKS:
            answer = pods[track][0].predict(self.model_name, body)
            if answer is None:
                return {}
            found[track] = metrics.prediction_values(answer)
        return found

    def _baseline(self, key: str) -> dict[str, Any] | None:
        try:
            saved = json.loads(storage.read_bytes(f"{self.folder}/{_BASELINE}"))
        except (OSError, ValueError):
            return None
        if saved.get("release") != key:
            return None
        saved["pods"] = {uid: live_release.Figures(requests=f["requests"], errors=f["errors"],
                                                   latency={float(k): v for k, v in
                                                            f["latency"].items()})
                         for uid, f in saved["pods"].items()}  # fmt: skip
        return saved

    def _note_baseline(self, key: str) -> dict[str, Any]:
        pods = {pod.uid: pod.figures(self.model_name)
                for track in TRACKS for pod in self.cluster.pods(track)}  # fmt: skip
        since = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        saved = {"release": key, "since": since,
                 "pods": {uid: dataclasses.asdict(f) for uid, f in pods.items()}}  # fmt: skip
        for figures in saved["pods"].values():
            figures.pop("predictions")
            figures["latency"] = {str(k): v for k, v in figures["latency"].items()}
        storage.write_bytes(f"{self.folder}/{_BASELINE}", json.dumps(saved).encode())
        return {"release": key, "since": since, "pods": pods}
