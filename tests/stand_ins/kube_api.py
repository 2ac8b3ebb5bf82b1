"""The Kubernetes API server and kubelet half of the Kubernetes stand-in (kube_stand_in.py adds
the controllers). No API server can run here; what this plays, each rule from the source it
follows (kubernetes v1.29 unless named), and where it cannot play a rule it refuses:

- custom resources served only when their CRD is installed; any other group/version/plural is a
  404 "the server could not find the requested resource" (as for a CRD not installed);
- create: a namespace in the body other than the URL's is a 400 (apiserver
  pkg/registry/rest/create.go EnsureObjectNamespaceMatchesRequestNamespace); unknown fields
  follow `fieldValidation` (pkg/endpoints/handlers/rest.go fieldValidation: absent means Warn):
  Strict refuses them with a 400 "strict decoding error: unknown field", Warn drops them and
  answers with a `Warning: 299` header per field, Ignore drops them silently (the structural
  schema's pruning, apiextensions-apiserver pkg/apiserver/schema/pruning); then ObjectMeta's
  label and annotation syntax, the CRD's OpenAPI schema (422 Invalid) and CEL rules, after its
  defaults (kube_schema.py); the admission webhook the controller registers (a denial is a
  403, controller-runtime's Denied); an existing name is a 409 AlreadyExists
  (k8s.io/apimachinery pkg/api/errors NewAlreadyExists);
- a label selector's key and value checked as labels are (400, apimachinery pkg/labels);
- pods: admitted by Pod Security when the namespace enforces it (pod_security.py; refused, the
  controller records FailedCreate and makes none); Pending until scheduled (`schedule_seconds`),
  then on a node that fits or never: the scheduler's reasons as `0/N nodes are available: ...`
  (kube-scheduler framework/types.go FitError; noderesources/fit.go "Insufficient
  <resource>"; nodeaffinity "node(s) didn't match Pod's node affinity/selector";
  tainttoleration "node(s) had untolerated taint {key: value}");
  a scheduled pod whose Secret or key is missing waits in CreateContainerConfigError
  (kubelet kuberuntime_container.go / kubelet_pods.go makeEnvironmentVariables: `secret "<name>"
  not found`, `couldn't find key <key> in Secret <ns>/<name>`) until it appears; a started pod's
  container is a real process with the env the kubelet gives it (see below for what else); a
  log of a pod not started yet is a 400 (`container "<c>" in pod "<p>" is waiting to start`);
  a pod's DNS name under a headless Service's subdomain, in its env, is answered on loopback
  (`_resolve`); each pod has an IP of its own on loopback (`pod_ip`, `status.podIP`, the
  downward API's too), its command's `$(VAR)` expanded as the kubelet does, and a Ready
  condition from its readinessProbe (kube_pods.Pod.ready);
- pods a client creates (POST, the Tuner step's trial pods): as above for the namespace and
  `fieldValidation` (the fields Kubernetes 1.29's Pod definition lacks), the owner references'
  required fields (422), Pod Security's refusal as a 403 to the caller, an existing name a 409;
  only `restartPolicy: Never` is played (refused otherwise); `spec.activeDeadlineSeconds`: past
  it after the pod's start, the kubelet kills it and it ends Failed, reason DeadlineExceeded
  (pkg/kubelet/active_deadline.go); GET and
  DELETE of one pod by name (404 when absent; a deleted pod's process is stopped at once); the
  pod the test process plays (a KFP step's, `add_step_pod`), Running with an IP of its own;
- patch: a JSON merge patch of a custom resource, admitted as a create is (schema, CEL, the
  webhook), a strategic merge patch refused with 415 as for any custom resource, a
  `metadata.resourceVersion` in the patch that is not the stored one a 409 Conflict; each
  create and patch gives a new resourceVersion, a patch that changes `spec` a new generation.
RBAC, when given (`rbac`): a call the Role does not allow is a 403 with the authorizer's text
(a rule may name the one object it allows, as resourceNames does); every call is recorded for
the tests to compare with the Role the product ships. Not played: owner-reference garbage
collection, graceful deletion (a deleted pod is gone at once; on a cluster it is listed a while
with a deletionTimestamp, ending Failed with 143, which replica_pods.failure leaves out),
updates (PUT), a JSON patch (refused), watches, label selectors beyond one `key=value`
(refused), a name that does not resolve yet: a real cluster has a pod's DNS record once the
pod has an IP (JobSet's headless Service publishes addresses not ready), the stand-in answers
from the pod's creation; but pods' containers start up to 3 s apart, so a replica does meet
peers that do not listen yet. A pod's
env is the image's (kubeflow/Dockerfile's ENV, `image_env`) and what the pod spec and its
controller give it, nothing of this test process's: the replicas run this machine's Python.
Nodes and pods are in kube_pods.py; Pod Security admission in pod_security.py.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml

from components.base.processes import die_with_parent
from components.training import local_workers
from tests.stand_ins import kfp_launcher, pod_security
from tests.stand_ins.kube_pods import Node, Pod, default_nodes, now_text, quantity
from tests.stand_ins.kube_schema import (
    Resource,
    core_definitions,
    defaulted,
    drop,
    metadata_errors,
    unknown_fields,
)

REPO = Path(__file__).parents[2]


def image_env(home: Path) -> dict[str, str]:
    """The env the image gives every container (its Dockerfile's ENV, read as the KFP harness
    reads it), its venv being this project's here, and a fresh HOME of the pod's own."""
    image = kfp_launcher.image_environment(REPO / "kubeflow" / "Dockerfile")
    environment = {k: v.replace(kfp_launcher.IMAGE_VENV, sys.prefix) for k, v in image.items()}
    home.mkdir(parents=True, exist_ok=True)
    return dict(environment, HOME=str(home))


class ApiError(Exception):
    def __init__(self, code: int, reason: str, message: str):
        super().__init__(message)
        self.code, self.reason, self.message = code, reason, message


# -- the server ------------------------------------------------------------------------------


class KubeApi:
    """Serves the API on loopback; `kubeconfig` is the file to point KUBECONFIG at."""

    def __init__(self, work: Path, namespace: str, secrets: dict[str, dict[str, str]],
                 nodes: list[Node] | None = None, schedule_seconds: float = 0.5,
                 rbac: set[tuple[str, str, str]] | None = None,
                 pod_security: str | None = "restricted"):  # fmt: skip
        self.work, self.namespace, self.secrets = work, namespace, secrets
        # (API group, resource, verb) the service account may use; None: everything.
        self.rbac = rbac
        self.nodes = default_nodes() if nodes is None else nodes
        self.schedule_seconds = schedule_seconds
        self.start_spread_seconds = 3.0  # containers start up to this long apart (kube_pods.Pod)
        self.resources: list[Resource] = []
        self.objects: dict[tuple[str, str], dict] = {}  # (plural, name) -> object
        self.pods: dict[str, Pod] = {}
        self.loopback_ports: dict[tuple[str, str], int] = {}  # (pod, port) -> loopback port
        self.created: list[dict] = []  # every object admitted, as stored
        self.deleted: list[str] = []
        self.warnings: list[str] = []  # every Warning header sent
        self.requests: set[tuple[str, str, str]] = set()  # (API group, resource, RBAC verb)
        self.events: list[str] = []  # "<kind>/<name>: <type> <reason>: <message>"
        # The namespace's pod-security.kubernetes.io/enforce level: "restricted" or None.
        self.pod_security = pod_security
        self.lock = threading.RLock()
        self._version = 0  # the last resourceVersion given
        self._pod_ips: set[str] = set()
        # Processes die with the thread that started them (PR_SET_PDEATHSIG follows the thread),
        # so one thread that lives as long as the stand-in schedules and starts every pod.
        self._closed = threading.Event()
        threading.Thread(target=self._kubelet, daemon=True).start()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
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

    def serve(self, resource: Resource) -> Resource:
        self.resources.append(resource)
        return resource

    def close(self) -> None:
        self._closed.set()
        self.server.shutdown()
        with self.lock:
            for pod in self.pods.values():
                pod.stop(grace_seconds=0)

    # -- objects ---------------------------------------------------------------------------

    def resource(self, group: str, version: str, plural: str) -> Resource | None:
        for resource in self.resources:
            if (resource.group, resource.version, resource.plural) == (group, version, plural):
                return resource
        return None

    def create(self, resource: Resource, body: dict, namespace: str | None,
               validation: str = "") -> list[str]:  # fmt: skip
        """Admits `body` as the API server would; returns the warnings; raises ApiError."""
        if not isinstance(body, dict):
            raise ApiError(400, "BadRequest", "the body is not a JSON object")
        meta = body.setdefault("metadata", {})
        if resource.namespaced:
            if meta.get("namespace", namespace) != namespace:
                raise ApiError(400, "BadRequest", "the namespace of the provided object does "
                               "not match the namespace sent on the request")  # fmt: skip
            meta["namespace"] = namespace
        body, warnings = self._admitted(resource, body, validation)
        meta = body["metadata"]
        name = meta.get("name", "")
        with self.lock:
            if (resource.plural, name) in self.objects:
                raise ApiError(
                    409,
                    "AlreadyExists",
                    f'{resource.plural}.{resource.group} "{name}" already exists',
                )
            meta.update(creationTimestamp=now_text(), uid=f"uid-{len(self.created)}",
                        resourceVersion=str(self._next_version()), generation=1)  # fmt: skip
            self.objects[resource.plural, name] = body
            self.created.append(json.loads(json.dumps(body)))
        resource.on_create(body)
        self.warnings += warnings
        return warnings

    def patch(self, resource: Resource, name: str, patch: dict, content_type: str,
              validation: str = "") -> list[str]:  # fmt: skip
        """A JSON merge patch (RFC 7386: an object merges, anything else, a list too, replaces;
        null deletes), admitted as a create is, the webhook asked again (an UPDATE). A custom
        resource has no strategic merge patch (apiserver pkg/endpoints/handlers/patch.go: 415);
        a JSON patch the stand-in does not play, so it refuses it. Returns the warnings."""
        if content_type != "application/merge-patch+json":
            if content_type == "application/json-patch+json":
                raise ApiError(415, "UnsupportedMediaType", "the stand-in plays only a JSON "
                               "merge patch, not a JSON patch")  # fmt: skip
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an "
                           "unknown format - accepted media types include: "
                           "application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml")  # fmt: skip
        if not isinstance(patch, dict):
            raise ApiError(400, "BadRequest", "the patch is not a JSON object")
        with self.lock:
            found = self.objects.get((resource.plural, name))
            if found is None:
                raise ApiError(404, "NotFound", f'{resource.plural}.{resource.group} "{name}" '
                               "not found")  # fmt: skip
            before = json.loads(json.dumps(found))
        merged = _merge_patch(json.loads(json.dumps(before)), patch)
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != before["metadata"].get("resourceVersion"):
            # A precondition in the patch (apiserver: the update's resourceVersion must be the
            # stored one, else a Conflict).
            raise ApiError(409, "Conflict", f'Operation cannot be fulfilled on '
                           f'{resource.plural}.{resource.group} "{name}": the object has been '
                           "modified; please apply your changes to the latest version and try "
                           "again")  # fmt: skip
        if merged.get("metadata", {}).get("name") != name:
            raise ApiError(400, "BadRequest", "the name of the object does not match the name "
                           "on the URL")  # fmt: skip
        body, warnings = self._admitted(resource, merged, validation)
        with self.lock:
            meta = body["metadata"]
            meta["resourceVersion"] = str(self._next_version())
            if body.get("spec") != before.get("spec"):
                meta["generation"] = before["metadata"].get("generation", 1) + 1
            self.objects[resource.plural, name] = body
        self.warnings += warnings
        return warnings

    def _next_version(self) -> int:
        with self.lock:
            self._version += 1
            return self._version

    def _admitted(self, resource: Resource, body: dict, validation: str) -> tuple[dict, list]:
        """`body` as stored: unknown fields per `validation`, defaults, schema, CEL, webhook."""
        unknown = unknown_fields(body, resource.schema)
        warnings = _field_validation(resource.kind, resource.version, unknown, validation)
        kind = resource.kind
        body = defaulted(drop(body, unknown), resource.schema)
        meta = body["metadata"]
        name = meta.get("name", "")
        errors = resource.check(body)
        if errors:
            raise ApiError(422, "Invalid", f'{kind}.{resource.group} "{name}" is invalid: '
                           + "; ".join(errors))  # fmt: skip
        # A webhook's errors come back as a denial (controller-runtime pkg/webhook/admission
        # validator.go: an error that is not an API status is Denied, 403), aggregated as
        # k8s.io/apimachinery's utilerrors.Aggregate writes them.
        denied = resource.admit(body)
        if denied:
            text = denied[0] if len(denied) == 1 else "[" + ", ".join(denied) + "]"
            raise ApiError(403, "Forbidden", f'admission webhook "{resource.webhook}" denied '
                           f"the request: {text}")  # fmt: skip
        return body, warnings

    def add_pod(self, manifest: dict, env: dict[str, str], owner: str,
                refused_reason: str) -> Pod | None:  # fmt: skip
        """A pod a controller creates for `owner` (`Job/<name>`), or None when admission
        refuses it: the controller then records a Warning event with `refused_reason` on its
        owner and makes no pod (the Job controller: FailedCreate, pkg/controller/job; the
        Training Operator: FailedCreatePod, pod_control.go). Here one event per refused pod;
        the Job controller creates in batches and records one per failed batch, the Training
        Operator stops at its first failure: a test counts on at least one."""
        name = manifest["metadata"]["name"]
        refused = None
        if self.pod_security:
            refused = pod_security.refusal(name, manifest["metadata"], manifest["spec"])
        if refused:
            self.events.append(f"{owner}: Warning {refused_reason}: Error creating: {refused}")
            return None
        pod = Pod(self, manifest, env, self.work / f"{name}.log")
        with self.lock:
            self.pods[name] = pod
        return pod

    def create_pod(self, body: dict, namespace: str, validation: str = "") -> tuple[Pod, list]:
        """A pod a client creates (POST .../pods), and the warnings: the fields a Pod does not
        have (Kubernetes 1.29's Pod definition) per `fieldValidation` as for any object; the
        namespace as for any object; the owner references' required fields (apimachinery
        pkg/api/validation/objectmeta.go validateOwnerReference: 422); Pod Security's refusal
        answered to the caller as a 403 (pod-security-admission's webhook message,
        pod_security.py); an existing name a 409 (`pods "x" already exists`). Only
        `restartPolicy: Never` is played (the default, Always, restarts a container in place:
        refused rather than played wrong). `spec.activeDeadlineSeconds` is played by the
        kubelet (`_past_deadline`)."""
        if not isinstance(body, dict) or body.get("kind") != "Pod":
            raise ApiError(400, "BadRequest", "the body is not a Pod")
        definitions = core_definitions()
        unknown = unknown_fields(body, definitions["io.k8s.api.core.v1.Pod"], "", definitions)
        warnings = _field_validation("Pod", "v1", unknown, validation)
        body = drop(body, unknown)
        meta = body.setdefault("metadata", {})
        if meta.get("namespace", namespace) != namespace:
            raise ApiError(400, "BadRequest", "the namespace of the provided object does not "
                           "match the namespace sent on the request")  # fmt: skip
        meta["namespace"] = namespace
        problems = metadata_errors(meta)
        for index, owner in enumerate(meta.get("ownerReferences", [])):
            problems += [f"metadata.ownerReferences[{index}].{field}: Invalid value: \"\": "
                         f"{field} must not be empty"
                         for field in ("apiVersion", "kind", "name", "uid")
                         if not owner.get(field)]  # fmt: skip
        name = meta.get("name", "")
        if problems:
            raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: ' + ", ".join(problems))
        if body.get("spec", {}).get("restartPolicy", "Always") != "Never":
            raise ApiError(501, "NotImplemented", "the stand-in plays only restartPolicy Never")
        refused = self.pod_security and pod_security.refusal(name, meta, body["spec"])
        if refused:
            raise ApiError(403, "Forbidden", refused)
        with self.lock:
            if name in self.pods:
                raise ApiError(409, "AlreadyExists", f'pods "{name}" already exists')
            pod = Pod(self, body, {}, self.work / f"{name}.log")
            self.pods[name] = pod
            self.created.append(json.loads(json.dumps(body)))
        return pod, warnings

    def add_step_pod(self, name: str, uid: str) -> str:
        """The pod a test process plays (a KFP step's pod, KFP_POD_NAME and KFP_POD_UID): Running
        on a node with an IP of its own; returns that IP."""
        pod = Pod(self, {"metadata": {"name": name, "labels": {}},
                         "spec": {"containers": [{"name": "main"}]}}, {},
                  self.work / f"{name}.log")  # fmt: skip
        pod.external, pod.uid, pod.node = True, uid, self.nodes[0]
        with self.lock:
            self.pods[name] = pod
        return pod.ip

    def pod_ip(self) -> str:
        """A pod's IP: an address of its own on loopback (127.0.0.0/8 is all loopback on
        Linux), so that each pod's servers listen on the ports its manifest names, as on a
        cluster, without meeting another pod's or another test's."""
        while True:
            ip = f"127.{random.randint(1, 254)}.{random.randint(0, 255)}.{random.randint(2, 254)}"
            with self.lock:
                if ip not in self._pod_ips:
                    self._pod_ips.add(ip)
                    return ip

    def delete_pod(self, name: str) -> None:
        with self.lock:
            pod = self.pods.pop(name, None)
        if pod:
            pod.stop()

    # -- the scheduler and the kubelet -----------------------------------------------------

    def _kubelet(self) -> None:
        while not self._closed.is_set():
            with self.lock:
                live = [p for p in self.pods.values() if not (
                    p.deleted or p.external or p.deadline_exceeded)]  # fmt: skip
            for pod in live:
                try:
                    if self._past_deadline(pod):
                        continue
                    if pod.process is None:
                        self._advance(pod)
                except Exception as error:  # a stand-in bug must not hang the test silently
                    pod.waiting = ("StandInError", repr(error))
            time.sleep(0.05)

    def _past_deadline(self, pod: Pod) -> bool:
        """`spec.activeDeadlineSeconds` after the pod's start (its status.startTime: when the
        kubelet first takes it, here once scheduled): the kubelet kills it and fails it with
        reason DeadlineExceeded (pkg/kubelet/active_deadline.go), in a thread of its own so the
        others go on meanwhile."""
        deadline = pod.spec.get("activeDeadlineSeconds")
        if deadline is None or pod.started_at is None or pod.phase() in ("Succeeded", "Failed"):
            return False
        if time.monotonic() - pod.started_at <= float(deadline):
            return False
        pod.deadline_exceeded = True
        threading.Thread(target=pod.kill, daemon=True).start()
        return True

    def _advance(self, pod: Pod) -> None:
        if time.monotonic() - pod.created < self.schedule_seconds:
            return
        if pod.node is None:
            pod.node, pod.unschedulable = self._schedule(pod)
            if pod.node is None:
                return
            pod.started_at = time.monotonic()
        env, missing = self._environment(pod)
        if missing:
            pod.waiting = ("CreateContainerConfigError", missing)
            return
        pod.waiting = None
        if time.monotonic() - pod.created < self.schedule_seconds + pod.start_delay:
            return  # ContainerCreating
        command = [sys.executable if c == "python" else c for c in pod.container["command"]]
        command = [_expand(c, env) for c in command + pod.container.get("args", [])]
        pod.process = subprocess.Popen(
            command, env=env, cwd=REPO, stdout=open(pod.log_path, "wb"),  # noqa: SIM115
            stderr=subprocess.STDOUT, preexec_fn=die_with_parent,
        )  # fmt: skip

    def _schedule(self, pod: Pod) -> tuple[Node | None, str | None]:
        """The first node that fits, or kube-scheduler's FitError message."""
        reasons: dict[str, int] = {}
        asked = pod.requests()
        selector = pod.spec.get("nodeSelector", {})
        tolerated = {t.get("key") for t in pod.spec.get("tolerations", [])
                     if t.get("operator") == "Exists"}  # fmt: skip
        with self.lock:
            placed = [
                p for p in self.pods.values() if p.node and p.phase() in ("Pending", "Running")
            ]
        for node in self.nodes:
            why = []
            if any(node.labels.get(k) != v for k, v in selector.items()):
                why.append("node(s) didn't match Pod's node affinity/selector")
            taints = [
                t for t in node.taints if t["effect"] == "NoSchedule" and t["key"] not in tolerated
            ]
            if taints and not why:
                t = taints[0]
                why.append(f"node(s) had untolerated taint {{{t['key']}: {t.get('value', '')}}}")
            for resource, amount in asked.items():
                used = sum(p.requests().get(resource, 0) for p in placed if p.node is node)
                if amount + used > quantity(node.capacity.get(resource, "0")) and not why:
                    why.append(f"Insufficient {resource}")
            if not why:
                return node, None
            for reason in why:
                reasons[reason] = reasons.get(reason, 0) + 1
        listed = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        return None, f"0/{len(self.nodes)} nodes are available: {listed}."

    def _environment(self, pod: Pod) -> tuple[dict[str, str], str]:
        env = image_env(self.work / f"{pod.name}-home")
        for variable in pod.container.get("env", []):
            if "value" in variable:
                env[variable["name"]] = variable["value"]
            elif "secretKeyRef" in variable.get("valueFrom", {}):
                ref = variable["valueFrom"]["secretKeyRef"]
                secret = self.secrets.get(ref["name"])
                if secret is None:
                    return {}, f'secret "{ref["name"]}" not found'
                if ref["key"] not in secret:
                    return (
                        {},
                        f"couldn't find key {ref['key']} in Secret {self.namespace}/{ref['name']}",
                    )
                env[variable["name"]] = secret[ref["key"]]
            elif "fieldRef" in variable.get("valueFrom", {}):
                env[variable["name"]] = self._field(
                    pod, variable["valueFrom"]["fieldRef"]["fieldPath"]
                )
            else:
                raise ValueError(f"the stand-in cannot play env {variable}")
        env.update(pod.extra_env)
        return {k: self._resolve(v) for k, v in env.items()}, ""

    def _resolve(self, value: str) -> str:
        """The cluster's DNS and network, on loopback: `<hostname>.<subdomain>[.<namespace>.svc
        [.cluster.local]]:<port>` of a pod here (a headless Service's record) becomes
        127.0.0.1 with a port of its own, one per pod and port, the same in every pod's env;
        any other name is left as it is (and resolves nowhere)."""

        def address(match: re.Match) -> str:
            pod = self._by_dns_name(match[1])
            if pod is None:
                return match[0]
            with self.lock:
                key = (pod.name, match[2])
                if key not in self.loopback_ports:
                    self.loopback_ports[key] = local_workers.free_ports(1)[0]
                return f"127.0.0.1:{self.loopback_ports[key]}"

        return re.sub(r"\b([a-z0-9][-a-z0-9.]*[a-z0-9]):(\d+)\b", address, value)

    def _by_dns_name(self, name: str) -> Pod | None:
        with self.lock:
            for pod in self.pods.values():
                host, sub = pod.spec.get("hostname"), pod.spec.get("subdomain")
                if (
                    host
                    and sub
                    and name
                    in (
                        f"{host}.{sub}",
                        f"{host}.{sub}.{self.namespace}.svc",
                        f"{host}.{sub}.{self.namespace}.svc.cluster.local",
                    )
                ):
                    return pod
        return None

    def _field(self, pod: Pod, path: str) -> str:
        """The downward API (kubelet pkg/fieldpath): the fields the stand-in knows, else refuse."""
        meta = pod.manifest["metadata"]
        if path == "metadata.name":
            return pod.name
        if path == "metadata.namespace":
            return self.namespace
        if path == "status.podIP":
            return pod.ip
        if match := re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path):
            return meta.get(match[1], {}).get(match[2], "")
        raise ValueError(f"the stand-in cannot play the downward API field {path!r}")

    # -- for tests -------------------------------------------------------------------------

    def authorize(self, group: str, resource: str, verb: str, namespace: str | None,
                  name: str | None = None) -> None:  # fmt: skip
        """RBAC's refusal (apiserver pkg/endpoints/filters/authorization.go, the message of
        k8s.io/apiserver pkg/endpoints/handlers/responsewriters forbidden). A rule is
        (group, resource, verb), or with a fourth item the one object name it allows (a Role's
        resourceNames; a list or create names none, so such a rule never allows them)."""
        if self.rbac is None or (group, resource, verb) in self.rbac:
            return
        if name is not None and (group, resource, verb, name) in self.rbac:
            return
        user = f"system:serviceaccount:{self.namespace}:pipeline-runner"
        what, _, sub = resource.partition("/")
        qualified = f"{what}.{group}" if group else what
        raise ApiError(403, "Forbidden", f'{qualified}{"/" + sub if sub else ""} is forbidden: '
                       f'User "{user}" cannot {verb} resource "{what}"'
                       + (f' in API group "{group}"' if group else ' in API group ""')
                       + f' in the namespace "{namespace}"')  # fmt: skip

    def objects_of(self, plural: str) -> list[dict]:
        with self.lock:
            return [o for (p, _), o in self.objects.items() if p == plural]

    def pod(self, name: str) -> Pod | None:
        with self.lock:
            return self.pods.get(name)


def _field_validation(kind: str, version: str, unknown: list[str], validation: str) -> list[str]:
    """What `fieldValidation` does with the fields a kind does not know (pkg/endpoints/handlers
    rest.go; absent means Warn): Strict refuses them (400), Warn answers with a warning per
    field (returned), Ignore drops them silently; the caller drops them either way."""
    validation = validation or "Warn"
    if validation not in ("Strict", "Warn", "Ignore"):
        raise ApiError(400, "BadRequest", f'fieldValidation: Unsupported value: "{validation}": '
                       'supported values: "Ignore", "Strict", "Warn"')  # fmt: skip
    if unknown and validation == "Strict":
        fields = ", ".join(f'unknown field "{p[1:]}"' for p in unknown)
        raise ApiError(400, "BadRequest", f'{kind} in version "{version}" cannot be handled as '
                       f"a {kind}: strict decoding error: {fields}")  # fmt: skip
    return [f'unknown field "{p[1:]}"' for p in unknown] if validation == "Warn" else []


def _expand(text: str, env: dict[str, str]) -> str:
    """The kubelet's `$(VAR)` in a command or argument (third_party/forked/golang/expansion):
    a variable of the container's env is replaced, `$$` is a `$`, anything else stays."""
    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$" if m[0] == "$$" else env.get(m[1], m[0]), text)  # fmt: skip


def _merge_patch(target, patch):
    """RFC 7386 MergePatch."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge_patch(target.get(key), value)
    return target


def _selector(query: dict) -> tuple[str, str]:
    """One `key=value` label selector, the only kind played; any other is refused."""
    selector = query.get("labelSelector", "")
    key, equals, value = selector.partition("=")
    if selector and (not equals or "," in selector or value.startswith("=") or "!" in key):
        raise ApiError(400, "BadRequest", f"the stand-in plays only a `key=value` label "
                       f"selector, not {selector!r}")  # fmt: skip
    # apimachinery pkg/labels selector.go parse: the key and value are checked as in ObjectMeta
    invalid = metadata_errors({"labels": {key: value}}) if selector else []
    if invalid:
        where = invalid[0].partition("Invalid value: ")[2]
        raise ApiError(400, "BadRequest", f"unable to parse requirement: values[0][{key}]: "
                       f"Invalid value: {where}")  # fmt: skip
    return key, value


def _handler(api: KubeApi):
    objects_path = re.compile(
        r"^/apis/([^/]+)/([^/]+)/(?:namespaces/([^/]+)/)?([^/]+)(?:/([^/]+))?$"
    )
    pods_path = re.compile(r"^/api/v1/namespaces/([^/]+)/pods(?:/([^/]+)(/log)?)?$")

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, code: int, body, content_type="application/json", warnings=()):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for warning in warnings:
                self.send_header("Warning", f'299 - "{warning}"')
            self.end_headers()
            self.wfile.write(data)

        def _error(self, error: ApiError):
            self._reply(error.code, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "message": error.message, "reason": error.reason,
                                     "code": error.code})  # fmt: skip

        def _route(self, method: str):
            url = urlparse(self.path)
            query = {k: v[0] for k, v in parse_qs(url.query).items()}
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            try:
                if match := objects_path.match(url.path):
                    return self._objects(method, *match.groups(), body, query)
                if match := pods_path.match(url.path):
                    return self._pods(method, *match.groups(), body, query)
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            except ApiError as error:
                return self._error(error)
            except Exception as error:  # a stand-in bug: say so rather than drop the connection
                return self._error(ApiError(500, "InternalError", f"stand-in error: {error!r}"))

        def _objects(self, method, group, version, namespace, plural, name, body, query):
            resource = api.resource(group, version, plural)
            verb = {"POST": "create", "DELETE": "delete", "PATCH": "patch"}.get(method, "get")
            verb = "list" if verb == "get" and name is None else verb
            api.requests.add((group, plural, verb))
            api.authorize(group, plural, verb, namespace, name)
            if resource is None:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            if resource.namespaced and namespace != api.namespace:
                raise ApiError(403, "Forbidden", f'{plural}.{group} is forbidden: User '
                               f'"pipeline-runner" cannot {verb} resource "{plural}" in API '
                               f'group "{group}" in the namespace "{namespace}"')  # fmt: skip
            if method == "POST" and name is None:
                warnings = api.create(resource, body, namespace, query.get("fieldValidation", ""))
                with api.lock:
                    stored = api.objects[resource.plural, body["metadata"]["name"]]
                return self._reply(201, stored, warnings=warnings)
            if method == "GET" and name is None:
                key, value = _selector(query)
                with api.lock:
                    items = [
                        resource.on_get(o)
                        for (p, _), o in list(api.objects.items())
                        if p == plural
                        and (not key or o["metadata"].get("labels", {}).get(key) == value)
                    ]
                return self._reply(200, {"kind": f"{resource.kind}List", "items": items})
            with api.lock:
                found = api.objects.get((plural, name))
            if found is None:
                raise ApiError(404, "NotFound", f'{plural}.{group} "{name}" not found')
            if method == "GET":
                with api.lock:
                    return self._reply(200, resource.on_get(found))
            if method == "PATCH":
                content_type = self.headers.get("Content-Type", "").split(";")[0].strip()
                warnings = api.patch(resource, name, body, content_type,
                                     query.get("fieldValidation", ""))  # fmt: skip
                with api.lock:
                    return self._reply(200, resource.on_get(api.objects[plural, name]),
                                       warnings=warnings)  # fmt: skip
            if method == "DELETE":
                with api.lock:
                    api.objects.pop((plural, name))
                    api.deleted.append(name)
                resource.on_delete(found)
                return self._reply(200, {"kind": "Status", "status": "Success"})
            raise ApiError(405, "MethodNotAllowed", method)

        def _pods(self, method: str, namespace: str, pod: str | None, log: str | None,
                  body, query: dict):  # fmt: skip
            resource = "pods/log" if log else "pods"
            verb = {"POST": "create", "DELETE": "delete"}.get(method)
            verb = verb or ("get" if pod is not None else "list")
            if (method == "POST") != (pod is None) and method in ("POST", "DELETE"):
                raise ApiError(405, "MethodNotAllowed", method)
            api.requests.add(("", resource, verb))
            api.authorize("", resource, verb, namespace, pod)
            if namespace != api.namespace:
                raise ApiError(
                    403, "Forbidden", f'pods is forbidden in the namespace "{namespace}"'
                )
            if method == "POST":
                created, warnings = api.create_pod(body, namespace,
                                                   query.get("fieldValidation", ""))  # fmt: skip
                return self._reply(201, created.as_json(), warnings=warnings)
            if pod is None:
                key, value = _selector(query)
                with api.lock:
                    items = [p.as_json() for p in api.pods.values()
                             if not p.deleted and p.labels.get(key) == value]  # fmt: skip
                return self._reply(200, {"kind": "PodList", "apiVersion": "v1", "items": items})
            if not log:
                found = api.pod(pod)
                if found is None:
                    raise ApiError(404, "NotFound", f'pods "{pod}" not found')
                if method == "DELETE":
                    api.delete_pod(pod)
                    with api.lock:
                        api.deleted.append(pod)
                return self._reply(200, found.as_json())
            found = api.pod(pod)
            if found is None:
                raise ApiError(404, "NotFound", f'pods "{pod}" not found')
            container = query.get("container", found.container["name"])
            if container != found.container["name"]:  # kubelet/apiserver pod log validation
                raise ApiError(400, "BadRequest", f'container {container} is not valid for pod '
                               f"{pod}")  # fmt: skip
            if found.process is None:
                raise ApiError(400, "BadRequest", f'container "{found.container["name"]}" in pod '
                               f'"{pod}" is waiting to start: ContainerCreating')  # fmt: skip
            lines = found.log_path.read_text(errors="replace").splitlines()
            tail = int(query.get("tailLines", len(lines)))
            return self._reply(200, "\n".join(lines[-tail:]) + "\n", "text/plain")

        def do_GET(self):
            self._route("GET")

        def do_POST(self):
            self._route("POST")

        def do_DELETE(self):
            self._route("DELETE")

        def do_PATCH(self):
            self._route("PATCH")

    return Handler
