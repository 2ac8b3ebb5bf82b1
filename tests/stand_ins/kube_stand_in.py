"""A stand-in for the Kubernetes API server and the Training Operator, for the TFJob tests.

Neither a Kubernetes API server nor the operator can run here, so this is the one part of the
TFJob path that is not the real thing. Everything on both sides of it is: the step talks to it
with the real `kubernetes` client (through a kubeconfig, as `kubectl` would), and it runs every
replica's container command as a real process with the environment the operator and the kubelet
would give it. What it plays, each rule from the source it follows:

- admission: the TFJob must be valid against the CRD's own OpenAPI schema (training-operator
  v1.8.1 manifests/base/crds/kubeflow.org_tfjobs.yaml, shipped in tests/stand_ins/crds/) with
  unknown fields rejected (the API server's strict field validation), and pass the operator's
  webhook (pkg/webhooks/tensorflow/tfjob_webhook.go validateTFJob: DNS-1035 name, an image and a
  container named "tensorflow" in every replica, at most one Chief);
- pods: one per replica, named `<job>-<type>-<index>` with the operator's labels
  (pkg/core/utils.go GenGeneralName, common_types.go *Label); env from `value` or a Secret's
  key (`secretKeyRef`), nothing of the test's own credentials; TF_CONFIG as genTFConfigJSONStr
  writes it (pkg/controller.v1/tensorflow/tensorflow.go), except that every address is
  127.0.0.1 with its own free port instead of `<pod>.<namespace>.svc:2222`;
- status: Created, then Running while the chief runs, Succeeded when the chief exits 0, Failed
  with the operator's message when any replica fails (tfjob_controller.go UpdateJobStatus);
  cleanPodPolicy Running stops the replicas still running once the job has finished; with
  `runPolicy.backoffLimit` 0 a failed replica instead deletes every pod, the failed one too,
  and fails the job as "reached the specified backoff limit" (common/job.go ReconcileJobs,
  which runs before UpdateJobStatus);
- listing TFJobs by label (`labelSelector` of one `key=value`);
- deletion: DELETE stops every replica process and forgets the job.
GPUs, node selectors and tolerations are accepted (the schema checks them) but not scheduled:
the replicas train on the CPU.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
from concurrent.futures import Future
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import jsonschema
import yaml

from components.base.processes import die_with_parent, stop_process
from components.training import local_workers, tfjob

CRD_PATH = Path(__file__).parent / "crds" / "kubeflow.org_tfjobs.yaml"  # v1.8.1, verbatim
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def _now() -> str:
    """A Kubernetes timestamp (RFC 3339, whole seconds, UTC)."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused wherever it lists the known ones."""
    if isinstance(schema, dict):
        schema = {k: strict(v) for k, v in schema.items()}
        if (
            "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def tfjob_schema() -> dict:
    crd = yaml.safe_load(CRD_PATH.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == tfjob.VERSION]
    return strict(version["schema"]["openAPIV3Schema"])


def validate_tfjob(body: dict) -> None:
    """Raises ValueError with every reason the API server or the webhook would refuse it."""
    errors = [
        f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
        for e in jsonschema.Draft7Validator(tfjob_schema()).iter_errors(body)
    ]
    name = body.get("metadata", {}).get("name", "")
    if not _DNS_1035.match(name):
        errors.append(f"metadata/name: {name!r} is not a DNS-1035 label")
    specs = body.get("spec", {}).get("tfReplicaSpecs") or {}
    for kind, spec in specs.items():
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        if not containers or any(not c.get("image") for c in containers):
            errors.append(f"tfReplicaSpecs/{kind}: every container needs an image")
        if tfjob.CONTAINER not in [c.get("name") for c in containers]:
            errors.append(f"tfReplicaSpecs/{kind}: no container named {tfjob.CONTAINER}")
    if sum(kind in ("Chief", "Master") for kind in specs) > 1:
        errors.append("tfReplicaSpecs: more than one Chief or Master")
    if errors:
        raise ValueError("; ".join(errors))


class _Replica:
    def __init__(self, job: str, kind: str, index: int, container: dict, env: dict, log: Path):
        self.name = f"{job}-{kind}-{index}"
        self.kind, self.index, self.log_path = kind, index, log
        command = [sys.executable if c == "python" else c for c in container["command"]]
        command += container.get("args", [])
        self.process = subprocess.Popen(
            command, env=env, cwd=Path(__file__).parents[2],
            stdout=open(log, "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
            preexec_fn=die_with_parent,
        )  # fmt: skip
        self.finished_at: str | None = None

    def exit_code(self) -> int | None:
        code = self.process.poll()
        if code is not None and self.finished_at is None:
            self.finished_at = _now()
        return code if code is None or code >= 0 else 128 - code  # a signal, as the kubelet says

    def phase(self) -> str:
        code = self.exit_code()
        return "Running" if code is None else "Succeeded" if code == 0 else "Failed"

    def as_pod(self, namespace: str, job: str) -> dict:
        code = self.exit_code()
        state = {"running": {}} if code is None else {"terminated": {
            "exitCode": code, "reason": "Completed" if code == 0 else "Error",
            "finishedAt": self.finished_at,
        }}  # fmt: skip
        return {
            "metadata": {
                "name": self.name,
                "namespace": namespace,
                "labels": {
                    tfjob.JOB_NAME_LABEL: job,
                    tfjob.REPLICA_TYPE_LABEL: self.kind,
                    tfjob.REPLICA_INDEX_LABEL: str(self.index),
                },
            },  # fmt: skip
            "status": {
                "phase": self.phase(),
                "containerStatuses": [
                    {
                        "name": tfjob.CONTAINER,
                        "image": "stand-in",
                        "imageID": "",
                        "ready": code is None,
                        "restartCount": 0,
                        "state": state,
                    }
                ],
            },  # fmt: skip
        }

    def stop(self, grace_seconds: float = 10) -> None:
        stop_process(self.process, grace_seconds)


class KubeStandIn:
    """Serves the API on loopback; `kubeconfig` is the file to point KUBECONFIG at."""

    def __init__(self, work: Path, namespace: str, secrets: dict[str, dict[str, str]]):
        self.work, self.namespace, self.secrets = work, namespace, secrets
        self.jobs: dict[str, dict] = {}
        self.replicas: dict[str, list[_Replica]] = {}
        self.created: list[dict] = []  # every TFJob admitted, as posted
        self.deleted: list[str] = []
        self.requests: set[tuple[str, str, str]] = set()  # (API group, resource, RBAC verb)
        self.lock = threading.Lock()
        # Replicas die with the thread that started them (PR_SET_PDEATHSIG follows the thread),
        # so they are started by one thread that lives as long as the stand-in, not by the
        # request's thread.
        self._starts: queue.Queue = queue.Queue()
        threading.Thread(target=self._start_replicas, daemon=True).start()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.kubeconfig = work / "kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {
                "server": f"http://127.0.0.1:{self.server.server_address[1]}"}}],
            "users": [{"name": "pipeline-runner", "user": {"token": "stand-in"}}],
            "contexts": [{"name": "stand-in", "context": {
                "cluster": "stand-in", "user": "pipeline-runner", "namespace": namespace}}],
        }))  # fmt: skip

    def _start_replicas(self) -> None:
        while True:
            arguments, result = self._starts.get()
            try:
                result.set_result(_Replica(*arguments))
            except Exception as error:
                result.set_exception(error)

    def close(self) -> None:
        self.server.shutdown()
        with self.lock:
            for replicas in self.replicas.values():
                for replica in replicas:
                    replica.stop(grace_seconds=0)

    def replica(self, pod_name: str) -> _Replica | None:
        with self.lock:
            for replicas in self.replicas.values():
                for replica in replicas:
                    if replica.name == pod_name:
                        return replica
        return None

    # -- the operator ---------------------------------------------------------------------

    def _create(self, body: dict) -> None:
        validate_tfjob(body)
        name = body["metadata"]["name"]
        specs = body["spec"]["tfReplicaSpecs"]
        ports = {kind: local_workers.free_ports(spec["replicas"]) for kind, spec in specs.items()}
        cluster = {kind.lower(): [f"127.0.0.1:{p}" for p in ports[kind]] for kind in specs}
        replicas = []
        for kind, spec in specs.items():
            (container,) = spec["template"]["spec"]["containers"]
            for index in range(spec["replicas"]):
                own = ("AWS_", "KFP_", "PIPELINE_", "KUBECONFIG")  # the test's, not the pod's
                env = {k: v for k, v in os.environ.items() if not k.startswith(own)}
                for variable in container.get("env", []):
                    if "value" in variable:
                        env[variable["name"]] = variable["value"]
                    else:
                        ref = variable["valueFrom"]["secretKeyRef"]
                        env[variable["name"]] = self.secrets[ref["name"]][ref["key"]]
                env["TF_CONFIG"] = json.dumps({
                    "cluster": cluster, "task": {"type": kind.lower(), "index": index},
                    "environment": "cloud",
                })  # fmt: skip
                log = self.work / f"{name}-{kind.lower()}-{index}.log"
                started: Future = Future()
                self._starts.put(((name, kind.lower(), index, container, env, log), started))
                replicas.append(started.result())
        now = _now()
        body = json.loads(json.dumps(body))
        created = self._condition("Created", "Created", f"TFJob {name} is created.", now)
        body["status"] = {"conditions": [created]}
        with self.lock:
            self.created.append(json.loads(json.dumps(body)))
            self.jobs[name], self.replicas[name] = body, replicas

    @staticmethod
    def _condition(kind: str, reason: str, message: str, now: str) -> dict:
        return {"type": kind, "status": "True", "reason": f"TFJob{reason}", "message": message,
                "lastUpdateTime": now, "lastTransitionTime": now}  # fmt: skip

    def _status(self, name: str) -> dict:
        """UpdateJobStatus's rules for a TFJob with a Chief, recomputed from the processes."""
        job, replicas = self.jobs[name], self.replicas[name]
        status = job["status"]
        finished = any(c["type"] in ("Succeeded", "Failed") for c in status["conditions"])
        counts: dict[str, dict[str, int]] = {}
        for replica in replicas:
            kind = "Chief" if replica.kind == "chief" else "Worker"
            phase = {"Running": "active", "Succeeded": "succeeded", "Failed": "failed"}
            count = counts.setdefault(kind, {"active": 0, "succeeded": 0, "failed": 0})
            count[phase[replica.phase()]] += 1
        status["replicaStatuses"] = counts
        failed = sum(count["failed"] for count in counts.values())
        limit = job["spec"].get("runPolicy", {}).get("backoffLimit")
        if not finished and failed and limit is not None and 1 > limit:  # previousRetry 0 + 1
            now = _now()
            for replica in list(replicas):  # DeletePodsAndServices: not finished yet, so all
                replica.stop()
                replicas.remove(replica)
            message = f"Job {name} has failed because it has reached the specified backoff limit"
            status["conditions"].append(self._condition("Failed", "Failed", message, now))
            return job
        if not finished:
            now = _now()
            ns = job["metadata"]["namespace"]
            new = None
            if counts["Chief"]["active"] and "Running" not in [
                c["type"] for c in status["conditions"]
            ]:
                new = self._condition("Running", "Running", f"TFJob {ns}/{name} is running.", now)
            if counts["Chief"]["succeeded"]:
                done = f"TFJob {ns}/{name} successfully completed."
                new = self._condition("Succeeded", "Succeeded", done, now)
            for kind, count in counts.items():
                if count["failed"]:
                    new = self._condition("Failed", "Failed", f"TFJob {ns}/{name} has failed "
                                          f"because {count['failed']} {kind} replica(s) failed.",
                                          now)  # fmt: skip
            if new:
                for condition in status["conditions"]:
                    if condition["type"] == "Running" and new["type"] != "Running":
                        condition["status"] = "False"
                status["conditions"].append(new)
                if new["type"] in ("Succeeded", "Failed"):
                    # cleanPodPolicy Running: the operator deletes the pods still running
                    # (pkg/controller.v1/common/job.go deletePodsAndServices).
                    for replica in [r for r in replicas if r.phase() == "Running"]:
                        replica.stop()
                        replicas.remove(replica)
        return job

    # -- the API --------------------------------------------------------------------------

    def _handler(self):
        stand_in = self
        jobs_path = re.compile(
            rf"^/apis/{tfjob.GROUP}/{tfjob.VERSION}/namespaces/([^/]+)/{tfjob.PLURAL}(?:/([^/]+))?$"
        )
        pods_path = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)/log)?$")

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code: int, body, content_type="application/json"):
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, code: int, message: str):
                self._reply(code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                   "message": message, "code": code})  # fmt: skip

            def _route(self, method: str):
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                if match := jobs_path.match(url.path):
                    namespace, name = match.groups()
                    verb = {"POST": "create", "DELETE": "delete"}.get(method, "get")
                    verb = "list" if verb == "get" and name is None else verb
                    stand_in.requests.add((tfjob.GROUP, tfjob.PLURAL, verb))
                    if namespace != stand_in.namespace:
                        return self._error(403, f"namespace {namespace} is not ours")
                    if method == "GET" and name is None:
                        return self._list_jobs(query.get("labelSelector", ""))
                    return self._jobs(method, name, body)
                if (match := pods_path.match(url.path)) and method == "GET":
                    log = match.group(2) is not None
                    stand_in.requests.add(
                        ("", "pods/log" if log else "pods", "get" if log else "list")
                    )
                    return self._pods(match.group(2), query)
                return self._error(404, f"{method} {url.path} is not served by the stand-in")

            def _list_jobs(self, selector: str):
                key, _, value = selector.partition("=")
                with stand_in.lock:
                    items = [job for job in stand_in.jobs.values()
                             if job["metadata"].get("labels", {}).get(key) == value]  # fmt: skip
                    return self._reply(200, {"kind": "TFJobList", "items": items})

            def _jobs(self, method: str, name: str | None, body):
                with stand_in.lock:
                    exists = name in stand_in.jobs
                if method == "POST" and name is None:
                    try:
                        stand_in._create(body)
                    except ValueError as error:
                        return self._error(422, f"TFJob is invalid: {error}")
                    return self._reply(201, body)
                if not exists:
                    return self._error(404, f'tfjobs.kubeflow.org "{name}" not found')
                if method == "GET":
                    with stand_in.lock:
                        return self._reply(200, stand_in._status(name))
                if method == "DELETE":
                    with stand_in.lock:
                        stand_in.jobs.pop(name)
                        replicas = stand_in.replicas.pop(name)
                        stand_in.deleted.append(name)
                    for replica in replicas:
                        replica.stop()
                    return self._reply(200, {"kind": "Status", "status": "Success"})
                return self._error(405, method)

            def _pods(self, pod: str | None, query: dict):
                if pod is None:
                    job = query.get("labelSelector", "").partition(f"{tfjob.JOB_NAME_LABEL}=")[2]
                    with stand_in.lock:
                        items = [r.as_pod(stand_in.namespace, job)
                                 for r in stand_in.replicas.get(job, [])]  # fmt: skip
                    return self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
                replica = stand_in.replica(pod)
                if replica is None:
                    return self._error(404, f'pods "{pod}" not found')
                lines = replica.log_path.read_text(errors="replace").splitlines()
                tail = int(query.get("tailLines", len(lines)))
                return self._reply(200, "\n".join(lines[-tail:]) + "\n", "text/plain")

            def do_GET(self):
                self._route("GET")

            def do_POST(self):
                self._route("POST")

            def do_DELETE(self):
                self._route("DELETE")

        return Handler
