"""The Kubernetes side of a release on a cluster (pipelines/serving/cluster_release.py): the
model-server pods of each track of kubeflow/serving/tf-serving.yaml, asked at their own address
(the version they serve, a prediction, their TF Serving metrics), and the VirtualService's
routes. The only part the tests stand in for (tests/stand_ins/kube_api.py, istio.py)."""

from __future__ import annotations

import dataclasses
import json
import urllib.error
import urllib.request

from components.base import live_release
from components.base.errors import ActionableError
from pipelines.serving import metrics, serving_sync

TRACKS = ("stable", "canary")
TRACK_LABEL = "app.kubernetes.io/instance"  # each Deployment's pods: tfx-<model>-serving-<track>
# TF Serving's API label: "predict" over REST, "Predict" over gRPC (prediction_service_impl.cc).
_APIS = ("predict", "classify", "regress")
REST_PORT = 8501
SERVER_CONTAINER = "tf-serving"  # the container whose restarts reset the counters
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
            api = labels.get("API", "").lower()
            if sample.name == metrics.TF_LATENCY + "_count" and api in _APIS:
                answered += int(sample.value)
            elif sample.name == metrics.TF_LATENCY + "_bucket" and api in _APIS:
                bound = float(labels["le"]) / 1e6  # us -> s
                figures.latency[bound] = figures.latency.get(bound, 0.0) + sample.value
            elif sample.name.startswith(":tensorflow:serving:request_count") and labels.get(
                "status"
            ) not in ("OK", None):
                figures.errors += int(sample.value)
    figures.requests = answered + figures.errors
    return figures


@dataclasses.dataclass
class ModelServerPod:
    """A ready model-server pod of a track, asked at its own address. Its REST requests name
    it as a host of the headless Service (`Host: <a-b-c-d>.<Service>...`): in an Istio mesh the
    caller's sidecar then sends them through that Service's route, with mTLS, where a bare IP
    would leave as plain text and be refused by a namespace that requires mTLS."""

    name: str
    uid: str
    ip: str
    restarts: int  # the tf-serving container's restartCount: its counters start over
    host: str  # the Host header of REST requests
    metrics_url: str

    def _open(self, path: str, body: dict | None = None):
        request = urllib.request.Request(
            f"http://{self.ip}:{REST_PORT}{path}",
            data=None if body is None else json.dumps(body).encode(),
            headers={"Host": self.host, "Content-Type": "application/json"},
        )  # fmt: skip
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        return opener.open(request, timeout=_TIMEOUT[1])

    def version_state(self, model_name: str, version: int) -> str:
        """ "AVAILABLE" when TF Serving answers that `version` is, else what it or the network
        said instead."""
        url = f"http://{self.ip}:{REST_PORT}"
        return serving_sync.version_state(url, model_name, version, self.host, _TIMEOUT[1])

    def predict(self, model_name: str, body: dict) -> tuple[int, dict | None]:
        """(the HTTP status, the answer when 200) of a :predict `body`; status 0 when the pod
        did not answer (TF Serving then counted nothing)."""
        try:
            with self._open(f"/v1/models/{model_name}:predict", body) as answer:
                return answer.status, json.loads(answer.read())
        except urllib.error.HTTPError as e:
            return e.code, None
        except (OSError, ValueError):
            return 0, None

    def figures(self, model_name: str) -> live_release.Figures:
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(self.metrics_url, timeout=_TIMEOUT[1]) as answer:
                return tf_serving_figures(answer.read().decode("utf-8"), model_name)
        except (OSError, ValueError) as e:  # ValueError: not a Prometheus text exposition
            raise ClusterUnavailable(
                f"cannot read the metrics of model-server pod {self.name} at {self.metrics_url} "
                f"({e}); is TF Serving's --monitoring_config_file set (kubeflow/serving/"
                "tf-serving-config.yaml)? The release waits; stable keeps serving."
            ) from e


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
        self._version = ""  # the VirtualService's resourceVersion when last read

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
            ip = pod.status.pod_ip
            if pod.status.phase != "Running" or not ready or not ip:
                continue
            restarts = sum(c.restart_count or 0 for c in pod.status.container_statuses or []
                           if c.name == SERVER_CONTAINER)  # fmt: skip
            annotations = pod.metadata.annotations or {}
            # Prometheus' convention, which Istio's metrics merging rewrites to its agent's
            # port (15020): that scrape needs no mTLS certificate.
            port = annotations.get("prometheus.io/port", str(REST_PORT))
            path = annotations.get("prometheus.io/path", metrics.PATH)
            host = (f"{ip.replace('.', '-')}.{self.name}-pods.{self.namespace}.svc.cluster.local"
                    f":{REST_PORT}")  # fmt: skip
            pods.append(ModelServerPod(pod.metadata.name, pod.metadata.uid, ip, restarts, host,
                                       f"http://{ip}:{port}{path}"))  # fmt: skip
        return pods

    def routes(self) -> list[dict] | None:
        """The VirtualService's HTTP routes; None when there is none (no Istio, or the
        InferenceService form)."""
        found = self._call("get virtualservices", lambda: self.custom.get_namespaced_custom_object(
            "networking.istio.io", "v1", self.namespace, "virtualservices", self.name,
            _request_timeout=_TIMEOUT), missing_ok=True)  # fmt: skip
        if found is None:
            return None
        self._version = found.get("metadata", {}).get("resourceVersion", "")
        return found.get("spec", {}).get("http", [])

    def set_routes(self, http: list[dict]) -> None:
        """Writes `http` unless the VirtualService changed since `routes` read it (then the
        API server refuses with 409 and the next poll starts again from what is there)."""
        patch = {"metadata": {"resourceVersion": self._version}, "spec": {"http": http}}
        self._call("patch virtualservices", lambda: self.custom.patch_namespaced_custom_object(
            "networking.istio.io", "v1", self.namespace, "virtualservices", self.name, patch,
            _request_timeout=_TIMEOUT))  # fmt: skip

    def _call(self, doing: str, call, missing_ok: bool = False):
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        try:
            return call()
        except ApiException as e:
            if e.status == 404 and missing_ok:
                return None
            try:
                reason = json.loads(e.body)["message"]
            except (TypeError, ValueError, KeyError):
                reason = str(e.reason or e)
            hint = {
                403: " Apply kubeflow/watch-cronjob.yaml's Role and RoleBinding (kubeflow/"
                     "README.md, section 11).",
                404: f" Apply kubeflow/serving/tf-serving.yaml (VirtualService {self.name}); "
                     "a release on a cluster needs Istio.",
                409: " It was changed meanwhile; the next poll starts from what is there.",
            }.get(e.status, "")  # fmt: skip
            raise ClusterUnavailable(f"cannot {doing} in namespace {self.namespace} "
                                     f"({e.status}): {reason}.{hint} The release waits; "
                                     "stable keeps serving.") from None  # fmt: skip
        except (OSError, HTTPError) as e:  # urllib3's own, without retries: not OSErrors
            raise ClusterUnavailable(f"cannot {doing}: the Kubernetes API does not answer ({e}). "
                                     "The release waits; stable keeps serving.") from e  # fmt: skip
