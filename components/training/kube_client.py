"""The few Kubernetes API calls a multi-worker Trainer's step makes for its job (the only part
tests stand in for, tests/stand_ins/kube_stand_in.py), and what their refusals mean for a
person: a missing API, the runtime not applied, a webhook that does not answer, RBAC."""

from __future__ import annotations

import json
import os
from pathlib import Path

from components.training.job_kind import JobKind, TrainingJobFailed

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
# (connect, read) seconds for every call: a half-open connection must not outlast the step's
# own timeouts, which are checked between calls.
REQUEST_TIMEOUT = (10, 60)
# Fields the product uses that an older controller's CRD lacks (Trainer v2.1: both).
NEWER = ("activeDeadlineSeconds", "runtimePatches")
RBAC_HINT = "Apply kubeflow/training-rbac.yaml for it (kubeflow/README.md, multi-worker training)"


def connect():
    """(a kubernetes ApiClient, the namespace to work in): the pod's service account inside a
    cluster, else KUBECONFIG's current context (e.g. a developer's cluster)."""
    from kubernetes import client, config

    try:
        config.load_incluster_config()
        namespace = SERVICE_ACCOUNT_NAMESPACE.read_text().strip()
    except config.ConfigException:
        # Read here: the client reads KUBECONFIG at import.
        kubeconfig = os.environ.get("KUBECONFIG") or None
        config.load_kube_config(config_file=kubeconfig)
        _, context = config.list_kube_config_contexts(config_file=kubeconfig)
        namespace = context["context"].get("namespace", "default")
    # No urllib3 retries (its default is 3): each would wait REQUEST_TIMEOUT again; the
    # caller's own loop decides how long failing calls are tolerated.
    configuration = client.Configuration.get_default_copy()
    configuration.retries = False
    return client.ApiClient(configuration), namespace


class Kubernetes:
    """The few Kubernetes API calls the step makes (the only part tests stand in for)."""

    def __init__(self, kind: JobKind):
        from kubernetes import client

        self.kind = kind
        api_client, self.namespace = connect()
        self.custom = client.CustomObjectsApi(api_client)
        self.core = client.CoreV1Api(api_client)

    def _path(self, name: str = "") -> str:
        k = self.kind
        path = f"/apis/{k.group}/{k.version}/namespaces/{self.namespace}/{k.plural}"
        return f"{path}/{name}" if name else path

    def _post(self, body: dict) -> None:
        # kubernetes-client 26 (the newest kfp 2.5 allows) has no field_validation argument for
        # custom objects, so the request is made as the generated method makes it, plus the
        # query parameter.
        self.custom.api_client.call_api(
            self._path(), "POST", query_params=[("fieldValidation", "Strict")], body=body,
            header_params={"Content-Type": "application/json", "Accept": "application/json"},
            auth_settings=["BearerToken"], response_type="object", _return_http_data_only=True,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip

    def get(self, name: str) -> dict:
        k = self.kind
        return self.custom.get_namespaced_custom_object(
            k.group, k.version, self.namespace, k.plural, name, _request_timeout=REQUEST_TIMEOUT
        )

    def delete(self, name: str) -> None:
        from kubernetes.client.exceptions import ApiException

        k = self.kind
        try:
            self.custom.delete_namespaced_custom_object(
                k.group, k.version, self.namespace, k.plural, name,
                propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT,
            )  # fmt: skip
        except ApiException as error:
            if error.status != 404:
                raise

    def list(self, label_selector: str) -> list[str]:
        k = self.kind
        found = self.custom.list_namespaced_custom_object(
            k.group, k.version, self.namespace, k.plural, label_selector=label_selector,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip
        return [item["metadata"]["name"] for item in found.get("items", [])]

    def pods(self, name: str) -> list:
        selector = self.kind.pod_selector(name)
        return self.core.list_namespaced_pod(
            self.namespace, label_selector=selector, _request_timeout=REQUEST_TIMEOUT
        ).items

    def log(self, pod: str, lines: int) -> str:
        return self.core.read_namespaced_pod_log(
            pod, self.namespace, container=self.kind.container, tail_lines=lines,
            _request_timeout=REQUEST_TIMEOUT,
        )  # fmt: skip


def create(api: Kubernetes, body: dict) -> None:
    """Creates the job; a refusal is a TrainingJobFailed naming what to do, with the HTTP
    `status` (a 5xx may come after the job was stored)."""
    from kubernetes.client.exceptions import ApiException

    try:
        api._post(body)
    except ApiException as error:
        refused = _refusal(api, body, error)
        refused.status = error.status
        raise refused from None


def _refusal(api: Kubernetes, body: dict, error) -> TrainingJobFailed:
    kind, reason = api.kind, _api_message(error)
    if error.status == 404:  # the API server serves no such resource: no CRD installed
        return TrainingJobFailed(
            f"This cluster has no {kind.kind} API ({kind.group}/{kind.version}, "
            f"{kind.plural}): {reason}. {kind.install_hint}"
        )
    if error.status == 403 and not reason.startswith("admission webhook"):
        return forbidden(api, "create", reason)
    hint = ""
    if error.status == 400 and any(f'unknown field "spec.{f}"' in reason for f in NEWER):
        hint = f" {kind.install_hint}"  # an older controller's CRD
    if "failed calling webhook" in reason:
        hint = f" The controller's webhook does not answer: {kind.install_hint}"
    if "must be created before the TrainJob is created" in reason:  # Trainer's webhook
        hint = (
            " Apply the runtime this project ships (kubectl apply -f "
            "kubeflow/trainjob-runtime.yaml) or name one with trainjob_runtime."
        )
    return TrainingJobFailed(
        f"The API server refused {kind.kind} {body['metadata']['name']} "
        f"({error.status}): {reason}.{hint}"
    )


def forbidden(api: Kubernetes, verb: str, reason: str) -> TrainingJobFailed:
    return TrainingJobFailed(
        f"The step's service account may not {verb} in namespace {api.namespace}: {reason}. "
        + RBAC_HINT
    )


def refused(api: Kubernetes, error, doing: str) -> Exception:
    """What an ApiException of a read means for a person: RBAC, else the error as it is."""
    if getattr(error, "status", None) == 403:
        return forbidden(api, doing, _api_message(error))
    return error


def _api_message(error) -> str:
    try:
        return json.loads(error.body)["message"]
    except (TypeError, ValueError, KeyError):
        return str(error.reason or error)


def get(api: Kubernetes, name: str) -> dict:
    from kubernetes.client.exceptions import ApiException

    try:
        return api.get(name)
    except ApiException as error:
        if error.status == 404:
            raise TrainingJobFailed(
                f"{api.kind.kind} {name} was deleted while it ran (by someone else: the "
                "step deletes it only when it ends); run the step again"
            ) from None
        raise refused(api, error, f"get {api.kind.plural}") from None
