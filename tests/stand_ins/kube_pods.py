"""Nodes and pods of the Kubernetes stand-in (kube_api.py): resource quantities, the nodes the
scheduler places pods on, and a pod that is a real process once placed."""

from __future__ import annotations

import re
import subprocess
import time
import urllib.request
import uuid
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from components.base.processes import stop_process

if TYPE_CHECKING:
    from tests.stand_ins.kube_api import KubeApi


# pkg/kubelet/active_deadline.go: a pod past spec.activeDeadlineSeconds ends Failed with these.
DEADLINE_MESSAGE = "Pod was active on the node longer than the specified deadline"


def now_text() -> str:
    """A Kubernetes timestamp (RFC 3339, whole seconds, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def quantity(text: str | int | float) -> float:
    """A Kubernetes quantity (`4`, `500m`, `16G`, `8Gi`) as a number."""
    units = {"m": 1e-3, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
             "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}  # fmt: skip
    match = re.fullmatch(r"([0-9.]+)([a-zA-Z]*)", str(text))
    if not match or (match[2] and match[2] not in units):
        raise ValueError(f"not a quantity: {text!r}")
    return float(match[1]) * units.get(match[2], 1)


@dataclass
class Node:
    name: str
    capacity: dict[str, str]
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)  # {key, value?, effect}


def default_nodes(gpus: int = 8) -> list[Node]:
    """A CPU node and a GPU node as the GPU operator labels and taints them."""
    return [
        Node("cpu-node", {"cpu": "32", "memory": "128Gi"}),
        Node("gpu-node", {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": str(gpus)},
             {"nvidia.com/gpu.present": "true"},
             [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
    ]  # fmt: skip


class Pod:
    """A pod a controller made: Pending until the scheduler places it and the kubelet can build
    its container's env, then a real process."""

    def __init__(self, api: KubeApi, manifest: dict, env: dict[str, str], log: Path):
        self.api, self.manifest, self.extra_env, self.log_path = api, manifest, env, log
        self.name = manifest["metadata"]["name"]
        self.labels = manifest["metadata"].get("labels", {})
        self.spec = manifest["spec"]
        (self.container,) = self.spec["containers"]
        self.created = time.monotonic()
        # Its container starts this long after it is scheduled (image pull, sandbox): 0 to
        # api.start_spread_seconds, the same for a name every run, so that peers start apart.
        self.start_delay = api.start_spread_seconds * (zlib.crc32(self.name.encode()) % 100) / 100
        self.node: Node | None = None
        self.unschedulable: str | None = None
        self.waiting: tuple[str, str] | None = None  # (reason, message)
        self.process: subprocess.Popen | None = None
        self.finished_at: str | None = None
        self.started_at: float | None = None  # monotonic: its status.startTime
        self.deadline_exceeded = False  # killed past spec.activeDeadlineSeconds
        self.deleted = False
        self.ip = api.pod_ip()
        self.uid = str(uuid.uuid4())  # the API server's, unique for every pod ever made
        # A pod the test process itself plays (a KFP step's): Running, never started here.
        self.external = False

    def requests(self) -> dict[str, float]:
        resources = self.container.get("resources", {})
        asked = resources.get("requests") or resources.get("limits") or {}
        return {k: quantity(v) for k, v in asked.items()}

    def exit_code(self) -> int | None:
        if self.process is None:
            return None
        code = self.process.poll()
        if code is not None and self.finished_at is None:
            self.finished_at = now_text()
        return code if code is None or code >= 0 else 128 - code  # a signal, as the kubelet says

    def phase(self) -> str:
        if self.external:
            return "Running"
        if self.deadline_exceeded:
            return "Failed"
        if self.process is None:
            return "Pending"
        code = self.exit_code()
        return "Running" if code is None else "Succeeded" if code == 0 else "Failed"

    def ready(self) -> bool:
        """The kubelet's readiness, simplified: running, and its readinessProbe's httpGet (the
        only kind played; another kind is refused) answering 200-399 (pkg/probe/http) within
        the probe's timeoutSeconds. One try when asked: not every periodSeconds, without
        failureThreshold, successThreshold or a startupProbe before it."""
        if self.phase() != "Running":
            return False
        probe = self.container.get("readinessProbe")
        if probe is None:
            return True
        if set(probe) & {"exec", "tcpSocket", "grpc"}:
            raise ValueError(f"the stand-in plays only an httpGet readiness probe: {probe}")
        get = probe["httpGet"]
        port = get["port"]
        if isinstance(port, str):  # a named port of the container
            port = {p["name"]: p["containerPort"] for p in self.container["ports"]}[port]
        url = f"http://{self.ip}:{port}{get.get('path', '/')}"
        try:
            with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(
                url, timeout=probe.get("timeoutSeconds", 1)) as answer:  # fmt: skip
                return 200 <= answer.status < 400
        except (OSError, ValueError):
            return False

    def as_json(self) -> dict:
        conditions, state = [], {"waiting": {"reason": "ContainerCreating"}}
        if self.unschedulable:
            conditions.append(
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": self.unschedulable,
                }
            )
        elif self.node:
            conditions.append({"type": "PodScheduled", "status": "True"})
        ready = self.ready()
        if self.process is not None:
            conditions.append({"type": "Ready", "status": str(ready)})
        if self.waiting:
            state = {"waiting": {"reason": self.waiting[0], "message": self.waiting[1]}}
        if self.process is not None:
            code = self.exit_code()
            state = {"running": {}} if code is None else {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "finishedAt": self.finished_at,
            }}  # fmt: skip
        metadata = dict(self.manifest["metadata"], namespace=self.api.namespace, uid=self.uid)
        return {
            "apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": dict(self.spec, nodeName=self.node.name) if self.node else self.spec,
            "status": {
                "phase": self.phase(), "conditions": conditions,
                **({"reason": "DeadlineExceeded", "message": DEADLINE_MESSAGE}
                   if self.deadline_exceeded else {}),
                **({"podIP": self.ip} if self.node else {}),
                "containerStatuses": [{
                    "name": self.container["name"], "image": self.container.get("image", ""),
                    "imageID": "", "ready": ready, "restartCount": 0,
                    "state": state,
                }],
            },
        }  # fmt: skip

    def stop(self, grace_seconds: float = 10) -> None:
        self.deleted = True
        self.kill(grace_seconds)

    def kill(self, grace_seconds: float = 10) -> None:
        """Its container stopped as the kubelet does (SIGTERM, then SIGKILL after the grace)."""
        if self.process is not None:
            stop_process(self.process, grace_seconds)
