"""Istio's part of the Kubernetes stand-in (kube_api.py): the VirtualService API and the mesh's
routing by it, for kubeflow/serving/tf-serving.yaml's traffic split. No Istio can run here.

- The API: `networking.istio.io/v1` VirtualServices, their schema the CRD of istio/api 1.28.0
  (tests/stand_ins/schemas/, byte for byte); istiod's validating webhook (`validation.istio.io`)
  is played for the fields the product writes, from istio/istio 1.28.0's
  pkg/config/validation (validation.go validateWeight and validateHTTPRouteDestinations: a
  weight is never negative, the weights of several destinations never all 0; virtualservice.go:
  a mirrorPercentage from 0 to 100), its denial worded as pkg/webhooks/validation/server does
  ("configuration is invalid: ..."). Weights are relative (virtual_service.proto: "a
  destination will receive weight/(sum of all weights) requests"). Any other field of an HTTP
  route, or a match on anything but a port, is refused: the stand-in does not know istiod's
  rules for it.
- The mesh (`Mesh.send`): what a client's Envoy sidecar does with a request to the
  VirtualService's host on a port: the route matching the port, a destination drawn with the
  weights' probabilities (Envoy's weighted clusters), the request sent to a ready pod of that
  destination's Service (the Service's selector, its port's targetPort); with a mirror, a copy
  goes to the mirror's Service too and its answer is dropped (Envoy's request mirror policy).
  Not played: retries, timeouts, load balancing beyond a random ready pod, mTLS and
  AuthorizationPolicy (a caller without the mesh's identity is not refused here; on Kubeflow it
  is, which is why cluster.ModelServerPod names the headless Service's host).
"""

from __future__ import annotations

import random
import threading
import urllib.error
import urllib.request
from pathlib import Path

from tests.stand_ins.kube_api import KubeApi
from tests.stand_ins.kube_schema import Resource

CRDS = Path(__file__).parent / "schemas" / "istio-1.28.0-crds.yaml.gz"
_ROUTE_FIELDS = {"name", "match", "route", "mirror", "mirrorPercentage"}
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def webhook(body: dict) -> list[str]:
    """istiod's refusals of a VirtualService, for the fields played (module docstring)."""
    errors = []
    for i, route in enumerate(body.get("spec", {}).get("http", [])):
        unknown = sorted(set(route) - _ROUTE_FIELDS)
        if unknown or any(set(m) != {"port"} for m in route.get("match", [])):
            errors.append(f"http[{i}]: the stand-in cannot play istiod's validation of "
                          f"{unknown or 'a match other than port'}, so it refuses it")  # fmt: skip
        destinations = route.get("route", [])
        for destination in destinations:  # validation.go validateWeight
            if destination.get("weight", 0) < 0:
                errors.append(f"weight {destination['weight']} < 0")
        if len(destinations) > 1 and sum(d.get("weight", 0) for d in destinations) == 0:
            errors.append("total destination weight = 0")  # validateHTTPRouteDestinations
        if "mirrorPercentage" in route:  # virtualservice.go
            value = route["mirrorPercentage"].get("value", 0.0)
            if value > 100:
                errors.append(f"mirror_percentage must have a max value of 100 (it has {value:f})")
            if value < 0:
                errors.append(f"mirror_percentage must have a min value of 0 (it has {value:f})")
    return [f"configuration is invalid: {e}" for e in errors]


class Mesh:
    """The VirtualService API on `api`, and the routing of requests by it among the pods of
    `services` (Service manifests)."""

    def __init__(self, api: KubeApi, services: list[dict]) -> None:
        self.api = api
        self.services = {s["metadata"]["name"]: s for s in services}
        self.resource = api.serve(Resource(
            CRDS, "v1", webhook="validation.istio.io", admit=webhook,
            crd_name="virtualservices.networking.istio.io",
        ))  # fmt: skip
        self.mirrored: list[threading.Thread] = []

    def send(self, host: str, port: int, path: str, body: bytes) -> tuple[int, bytes, str]:
        """A POST from a client in the mesh to `host:port`: (status, body, the Service that
        answered)."""
        (route,) = [r for vs in self.api.objects_of("virtualservices")
                    if host in vs["spec"]["hosts"] for r in vs["spec"]["http"]
                    if [m.get("port") for m in r.get("match", [])] == [port]]  # fmt: skip
        destinations = route["route"]
        weights = [d.get("weight", 0) if len(destinations) > 1 else 1 for d in destinations]
        (chosen,) = random.choices(destinations, weights=weights)
        mirror = route.get("mirror")
        share = route.get("mirrorPercentage", {}).get("value", 100.0)
        if mirror and random.uniform(0, 100) < share:
            copy = threading.Thread(
                target=self._post,
                daemon=True,
                args=(mirror["host"], mirror["port"]["number"], path, body),
            )
            copy.start()  # fmt: skip
            self.mirrored.append(copy)
        target = chosen["destination"]
        status, answer = self._post(target["host"], target["port"]["number"], path, body)
        return status, answer, target["host"]

    def _post(self, service: str, port: int, path: str, body: bytes) -> tuple[int, bytes]:
        manifest = self.services[service]
        selector = manifest["spec"]["selector"]
        (target,) = [p["targetPort"] for p in manifest["spec"]["ports"] if p["port"] == port]
        with self.api.lock:
            pods = [p for p in self.api.pods.values() if not p.deleted
                    and selector.items() <= p.labels.items()]  # fmt: skip
        ready = [p for p in pods if p.ready()]
        if not ready:  # Envoy's answer when a cluster has no healthy endpoint
            return 503, b"no healthy upstream"
        pod = random.choice(ready)
        if isinstance(target, str):
            target = {p["name"]: p["containerPort"] for p in pod.container["ports"]}[target]
        request = urllib.request.Request(
            f"http://{pod.ip}:{target}{path}", data=body,
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with _OPENER.open(request, timeout=30) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()
