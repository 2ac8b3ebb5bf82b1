"""The serving manifests (kubeflow/serving/) against the official schemas, and against each other.

The schemas are upstream files pinned in tests/stand_ins/schemas/ (README.md there: where each
comes from, its sha256, and how it is made strict): Kubernetes 1.29's OpenAPI for the Deployment
and the Service, KServe v0.13.1's InferenceService CRD for the InferenceService. Validation is
strict, as `kubectl apply` is: an unknown field fails. Broken copies of the manifests prove that it
can fail. The rest checks what no schema can: pinned images, TF Serving's flags, ports and probes
agreeing with each other and with the config, the sync sidecar sharing TF Serving's model config
directory, the Secret's keys, and that no credential is written down. No network.
"""

from __future__ import annotations

import copy
import functools
import gzip
import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from google.protobuf import text_format

from components.base.config import REPO_ROOT, PipelineConfig
from pipelines.bench.bench_serving import SHIPPED_BATCHING
from pipelines.cli import build_parser, cmd_serving_sync
from pipelines.serving import metrics as serving_metrics
from pipelines.serving import tf_serving_protos
from pipelines.serving.batching import load_parameters
from tests.stand_ins.kube_schema import CORE_SWAGGER, core_definitions

SCHEMAS = REPO_ROOT / "tests" / "stand_ins" / "schemas"
K8S_SWAGGER = CORE_SWAGGER  # Kubernetes 1.29's definitions
KSERVE_CRD = SCHEMAS / "kserve-v0.13.1-inferenceservices-crd.yaml.gz"
ISTIO_CRDS = SCHEMAS / "istio-1.28.0-crds.yaml.gz"
SERVING = REPO_ROOT / "kubeflow" / "serving"
TF_SERVING_YAML = SERVING / "tf-serving.yaml"
ISVC_YAML = SERVING / "inferenceservice.yaml"
CONFIG_YAML = SERVING / "tf-serving-config.yaml"
ISTIO_ACCESS = SERVING / "istio-access.yaml"
CRONJOB = REPO_ROOT / "kubeflow" / "watch-cronjob.yaml"

TF_SERVING_IMAGE = "tensorflow/serving:2.16.1"
MODEL_SERVER = "tfx-taxi-tips-serving"  # the stable Deployment, the clients' Service
KSERVE_CONTAINER = "kserve-container"  # pkg/constants: InferenceServiceContainerName
KSERVE_TRANSFORMER_CONTAINER = "transformer-container"  # would take over the Service's port
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
POD_SPEC = "io.k8s.api.core.v1.PodSpec"
ROOTS = {
    ("apps/v1", "Deployment"): "io.k8s.api.apps.v1.Deployment",
    ("v1", "Service"): "io.k8s.api.core.v1.Service",
    ("v1", "ConfigMap"): "io.k8s.api.core.v1.ConfigMap",
}


# ---------------------------------------------------------------------------------------------
# Loading: YAML as the API server reads it, schemas made strict
# ---------------------------------------------------------------------------------------------


class _StrictLoader(yaml.SafeLoader):
    """A duplicated key is an error (strict field validation refuses duplicate fields)."""

    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(key, deep=deep) for key, _ in node.value]
        duplicated = sorted({k for k in keys if keys.count(k) > 1}, key=str)
        if duplicated:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated keys {duplicated}", node.start_mark
            )
        return super().construct_mapping(node, deep=deep)


def load_documents(path: Path) -> list[dict]:
    return [doc for doc in yaml.load_all(path.read_text(), Loader=_StrictLoader) if doc]


def strict(schema: dict, *, crd: bool) -> dict:
    """`schema` as a strict API server applies it (tests/stand_ins/schemas/README.md): unknown
    fields refused, int-or-string and Quantity as decoded, nullable and embedded resources
    honoured."""
    out = dict(schema)
    if "properties" in schema:
        out["properties"] = {k: strict(v, crd=crd) for k, v in schema["properties"].items()}
    for key in ("items", "additionalProperties", "not"):
        if isinstance(schema.get(key), dict):
            out[key] = strict(schema[key], crd=crd)
    for key in ("allOf", "anyOf", "oneOf"):
        if key in schema:
            out[key] = [strict(s, crd=crd) for s in schema[key]]
    if schema.get("x-kubernetes-int-or-string") or schema.get("format") == "int-or-string":
        out.pop("type", None)
        out.setdefault("anyOf", [{"type": "integer"}, {"type": "string"}])
    if schema.get("nullable") and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    if schema.get("x-kubernetes-embedded-resource"):
        out["properties"] = {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            **out.get("properties", {}),
        }
    is_open = schema.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in schema
    if not is_open and ("properties" in out or (crd and schema.get("type") == "object")):
        out["additionalProperties"] = False
    return out


def _api_version(group: str, version: str) -> str:
    return f"{group}/{version}" if group else version


@functools.cache
def kubernetes_definitions() -> dict[str, dict]:
    raw = core_definitions()
    definitions = {name: strict(d, crd=False) for name, d in raw.items()}
    definitions[QUANTITY] = {"anyOf": [{"type": "string"}, {"type": "number"}]}
    for name, definition in definitions.items():
        kinds = raw[name].get("x-kubernetes-group-version-kind", [])
        if len(kinds) == 1 and "kind" in definition.get("properties", {}):
            (gvk,) = kinds
            api_version = _api_version(gvk["group"], gvk["version"])
            definition["properties"]["apiVersion"] = {"type": "string", "enum": [api_version]}
            definition["properties"]["kind"] = {"type": "string", "enum": [gvk["kind"]]}
    return definitions


def _object_schema(root: dict) -> dict:
    """`root` as a whole document: apiVersion, kind and metadata.name required."""
    return {
        "allOf": [root],
        "required": ["apiVersion", "kind", "metadata"],
        "properties": {"metadata": {"required": ["name"]}},
        "definitions": kubernetes_definitions(),
    }


@functools.cache
def kubernetes_validator(definition: str) -> jsonschema.Draft4Validator:
    schema = _object_schema({"$ref": f"#/definitions/{definition}"})
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


@functools.cache
def kserve_crd() -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(gzip.decompress(KSERVE_CRD.read_bytes()), Loader=loader)


@functools.cache
def istio_crd(name: str) -> dict:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds = yaml.load_all(gzip.decompress(ISTIO_CRDS.read_bytes()), Loader=loader)
    (crd,) = [c for c in crds if c and c["metadata"]["name"] == name]
    return crd


@functools.cache
def kserve_validator() -> jsonschema.Draft4Validator:
    return crd_validator(kserve_crd(), "v1beta1")


@functools.cache
def virtual_service_validator() -> jsonschema.Draft4Validator:
    return crd_validator(istio_crd("virtualservices.networking.istio.io"), "v1")


def crd_validator(crd: dict, served: str) -> jsonschema.Draft4Validator:
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == served]
    assert version["served"] and version["storage"]
    root = strict(version["schema"]["openAPIV3Schema"], crd=True)
    root["properties"]["apiVersion"] = {
        "type": "string",
        "enum": [_api_version(crd["spec"]["group"], version["name"])],
    }
    root["properties"]["kind"] = {"type": "string", "enum": [crd["spec"]["names"]["kind"]]}
    # The API server checks a custom resource's metadata as ObjectMeta, whatever the CRD says.
    root["properties"]["metadata"] = {"$ref": f"#/definitions/{OBJECT_META}"}
    schema = _object_schema(root)
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(schema)


@functools.cache
def istio_validator(api_version: str, kind: str) -> jsonschema.Draft4Validator:
    """The vendored Istio CRD of that group and kind, at the version `api_version` names."""
    group, _, version = api_version.partition("/")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    crds = yaml.load_all(gzip.decompress(ISTIO_CRDS.read_bytes()), Loader=loader)
    (crd,) = [c for c in crds if c and (c["spec"]["group"], c["spec"]["names"]["kind"]) ==
              (group, kind)]  # fmt: skip
    return crd_validator(crd, version)


def validator_for(document: dict) -> jsonschema.Draft4Validator:
    if document.get("apiVersion") == "serving.kserve.io/v1beta1":
        return kserve_validator()
    if document.get("apiVersion") == "networking.istio.io/v1":
        return virtual_service_validator()
    if str(document.get("apiVersion")).split("/")[0].endswith(".istio.io"):
        return istio_validator(document["apiVersion"], document["kind"])
    key = (document.get("apiVersion"), document.get("kind"))
    assert key in ROOTS, f"no schema here for {key}"
    return kubernetes_validator(ROOTS[key])


def schema_errors(document: dict, validator: jsonschema.Draft4Validator | None = None) -> str:
    """Every error, one a line, each with the path of the value it is about."""
    validator = validator or validator_for(document)
    errors = validator.iter_errors(document)
    return "\n".join(sorted(f"{e.json_path}: {e.message}" for e in errors))


# ---------------------------------------------------------------------------------------------
# The manifests
# ---------------------------------------------------------------------------------------------


@functools.cache
def _documents(path: Path) -> tuple[dict, ...]:
    return tuple(load_documents(path))


def documents(path: Path) -> list[dict]:
    return copy.deepcopy(list(_documents(path)))


def one(path: Path, kind: str, name: str = "") -> dict:
    """The file's object of `kind`; where it has several, the one named `name` (default: the
    model server's own name: the stable Deployment, the clients' Service; else the first)."""
    found = [d for d in documents(path) if d["kind"] == kind]
    if len(found) > 1:
        named = name or MODEL_SERVER
        if not name and all(d["metadata"]["name"] != named for d in found):
            named = found[0]["metadata"]["name"]
        found = [d for d in found if d["metadata"]["name"] == named]
    (document,) = found
    return document


def pod_specs() -> dict[str, dict]:
    """The pod of each manifest: the Deployment's template, the InferenceService's predictor."""
    return {
        "tf-serving.yaml": one(TF_SERVING_YAML, "Deployment")["spec"]["template"]["spec"],
        "inferenceservice.yaml": one(ISVC_YAML, "InferenceService")["spec"]["predictor"],
    }


def tf_serving(pod: dict) -> dict:
    (container,) = [c for c in pod["containers"] if c["image"].startswith("tensorflow/serving")]
    return container


def sync_containers(pod: dict) -> list[dict]:
    return [c for c in pod["initContainers"] + pod["containers"] if c["command"][:1] == ["tkp"]]


def all_containers(path: Path) -> list[dict]:
    found = []
    for document in documents(path):
        if document["kind"] == "CronJob":
            pod = document["spec"]["jobTemplate"]["spec"]["template"]["spec"]
        elif document["kind"] == "Deployment":
            pod = document["spec"]["template"]["spec"]
        elif document["kind"] == "InferenceService":
            pod = document["spec"]["predictor"]
        else:
            continue
        found += pod.get("initContainers", []) + pod["containers"]
    return found


def flags(container: dict) -> dict[str, str]:
    """TF Serving's `--name=value` arguments."""
    parsed = {}
    for argument in container["args"]:
        match = re.fullmatch(r"--([a-z_]+)=(.+)", argument)
        assert match, f"not --name=value: {argument!r}"
        assert match[1] not in parsed, f"--{match[1]} given twice"
        parsed[match[1]] = match[2]
    return parsed


def sync_options(container: dict) -> dict[str, str | bool]:
    """`tkp serving-sync` options: --target DIR, --interval N, --once, --model-server URL,
    --label TRACK."""
    command = container["command"]
    assert command[:2] == ["tkp", "serving-sync"], command
    options: dict[str, str | bool] = {}
    rest = list(command[2:])
    while rest:
        option = rest.pop(0)
        if option == "--once":
            options["once"] = True
        else:
            known = ("--target", "--interval", "--model-server", "--label")
            assert option in known, f"unknown {option}"
            options[option[2:]] = rest.pop(0)
    return options


def mount_of(container: dict, volume: str) -> dict:
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume]
    return mount


MANIFESTS = [
    pytest.param(TF_SERVING_YAML, "Deployment", "", id="tf-serving.yaml:Deployment"),
    pytest.param(TF_SERVING_YAML, "Service", "", id="tf-serving.yaml:Service"),
    *[
        pytest.param(
            TF_SERVING_YAML, kind, f"{MODEL_SERVER}-{name}", id=f"tf-serving.yaml:{kind}-{name}"
        )  # fmt: skip
        for kind, name in (
            ("Deployment", "canary"),
            ("Service", "stable"),
            ("Service", "canary"),
            ("Service", "pods"),
        )  # fmt: skip
    ],
    pytest.param(TF_SERVING_YAML, "VirtualService", "", id="tf-serving.yaml:VirtualService"),
    pytest.param(ISVC_YAML, "InferenceService", "", id="inferenceservice.yaml:InferenceService"),
    pytest.param(CONFIG_YAML, "ConfigMap", "", id="tf-serving-config.yaml:ConfigMap"),
    *[
        pytest.param(ISTIO_ACCESS, "AuthorizationPolicy", name, id=f"istio-access.yaml:{name}")
        for name in ("tfx-taxi-tips-serving-clients", "tfx-taxi-tips-inferenceservice-clients")
    ],
]


# ---------------------------------------------------------------------------------------------
# The schemas are the recorded upstream files
# ---------------------------------------------------------------------------------------------


def test_vendored_schemas_are_the_upstream_files_recorded_in_the_readme():
    recorded = dict(
        re.findall(
            r"^\| `([^`]+)` \| `([0-9a-f]{64})` \|$", (SCHEMAS / "README.md").read_text(), re.M
        )
    )
    vendored = {p.name for p in SCHEMAS.iterdir() if p.suffix == ".gz"}
    assert vendored == set(recorded) == {K8S_SWAGGER.name, KSERVE_CRD.name, ISTIO_CRDS.name}
    for name, sha256 in recorded.items():
        content = gzip.decompress((SCHEMAS / name).read_bytes())
        assert hashlib.sha256(content).hexdigest() == sha256, f"{name} is not the recorded file"
    swagger = json.loads(gzip.decompress(K8S_SWAGGER.read_bytes()))
    assert "io.k8s.api.core.v1.SleepAction" in swagger["definitions"]  # new in 1.29
    assert "io.k8s.api.core.v1.AppArmorProfile" not in swagger["definitions"]  # new in 1.30
    assert kserve_crd()["metadata"]["name"] == "inferenceservices.serving.kserve.io"
    served = {
        v["name"] for v in istio_crd("virtualservices.networking.istio.io")["spec"]["versions"]
    }
    assert served == {"v1", "v1beta1", "v1alpha3"}


# ---------------------------------------------------------------------------------------------
# Schema validation, and proof that it can fail
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("path, kind, name", MANIFESTS)
def test_manifest_validates_against_its_pinned_schema(path, kind, name):
    document = one(path, kind, name)
    assert schema_errors(document) == ""


def test_each_file_holds_exactly_the_expected_objects():
    assert [(d["kind"], d["metadata"]["name"]) for d in documents(TF_SERVING_YAML)] == [
        ("Deployment", MODEL_SERVER), ("Deployment", f"{MODEL_SERVER}-canary"),
        ("Service", MODEL_SERVER), ("Service", f"{MODEL_SERVER}-stable"),
        ("Service", f"{MODEL_SERVER}-canary"), ("Service", f"{MODEL_SERVER}-pods"),
        ("VirtualService", MODEL_SERVER),
    ]  # fmt: skip
    assert [d["kind"] for d in documents(ISVC_YAML)] == ["InferenceService"]
    assert [d["kind"] for d in documents(CONFIG_YAML)] == ["ConfigMap"]
    assert [d["kind"] for d in documents(ISTIO_ACCESS)] == ["AuthorizationPolicy"] * 2


def _pod(document: dict) -> dict:
    spec = document["spec"]
    return spec["template"]["spec"] if "template" in spec else spec["predictor"]


def _set(key: str, value: Any) -> Callable[[dict], None]:
    def mutate(target: dict) -> None:
        target[key] = value

    return mutate


def _delete(key: str) -> Callable[[dict], None]:
    def mutate(target: dict) -> None:
        del target[key]

    return mutate


def _broken(path: Path, kind: str, reach, mutate, where: str, text: str):
    """A copy of `kind` in `path`, with `mutate` applied to what `reach` finds in it, must fail
    with an error at `where` (a JSON path) that contains `text`."""
    return pytest.param(path, kind, reach, mutate, where, text, id=f"{kind}:{where}:{text}")


CONTAINER_0 = "$.spec.template.spec.containers[0]"
KSERVE_0 = "$.spec.predictor.containers[0]"
BROKEN = [
    # A misspelled field, a wrong type, a missing required field: in the Deployment ...
    _broken(TF_SERVING_YAML, "Deployment", lambda d: _pod(d)["containers"][0],
            _set("imagePullPolicyy", "Always"), CONTAINER_0, "'imagePullPolicyy'"),
    _broken(TF_SERVING_YAML, "Deployment", lambda d: d["spec"],
            _set("replicas", "one"), "$.spec.replicas", "is not of type 'integer'"),
    _broken(TF_SERVING_YAML, "Deployment", lambda d: _pod(d)["containers"][0],
            _delete("name"), CONTAINER_0, "'name' is a required property"),
    _broken(TF_SERVING_YAML, "Deployment", lambda d: _pod(d)["containers"][0]["readinessProbe"],
            _set("httpGett", {"path": "/", "port": "http"}), f"{CONTAINER_0}.readinessProbe",
            "'httpGett'"),
    _broken(TF_SERVING_YAML, "Deployment",
            lambda d: _pod(d)["containers"][0]["readinessProbe"]["httpGet"],
            _set("port", True), f"{CONTAINER_0}.readinessProbe.httpGet.port",
            "is not valid under any of the given schemas"),
    _broken(TF_SERVING_YAML, "Deployment", lambda d: d, _set("apiVersion", "apps/v1beta2"),
            "$.apiVersion", "is not one of ['apps/v1']"),
    _broken(TF_SERVING_YAML, "Deployment", lambda d: d["metadata"], _set("labelz", {}),
            "$.metadata", "'labelz'"),
    # ... in the Service ...
    _broken(TF_SERVING_YAML, "Service", lambda d: d["spec"], _set("selectorr", {}),
            "$.spec", "'selectorr'"),
    _broken(TF_SERVING_YAML, "Service", lambda d: d["spec"]["ports"][0], _set("port", "8500"),
            "$.spec.ports[0].port", "is not of type 'integer'"),
    _broken(TF_SERVING_YAML, "Service", lambda d: d["spec"]["ports"][0], _delete("port"),
            "$.spec.ports[0]", "'port' is a required property"),
    # ... and in the InferenceService (the CRD's schema, its ObjectMeta, its int-or-string).
    _broken(ISVC_YAML, "InferenceService", lambda d: d["spec"]["predictor"],
            _set("containerz", []), "$.spec.predictor", "'containerz'"),
    _broken(ISVC_YAML, "InferenceService", lambda d: d["spec"]["predictor"],
            _set("minReplicas", "one"), "$.spec.predictor.minReplicas",
            "is not of type 'integer'"),
    _broken(ISVC_YAML, "InferenceService",
            lambda d: d["spec"]["predictor"]["containers"][0]["ports"][0],
            _delete("containerPort"), f"{KSERVE_0}.ports[0]",
            "'containerPort' is a required property"),
    _broken(ISVC_YAML, "InferenceService", lambda d: d["spec"]["predictor"]["containers"][0],
            _set("volumeMountz", []), KSERVE_0, "'volumeMountz'"),
    _broken(ISVC_YAML, "InferenceService",
            lambda d: d["spec"]["predictor"]["containers"][0]["livenessProbe"]["tcpSocket"],
            _set("port", 8501.5), f"{KSERVE_0}.livenessProbe.tcpSocket.port",
            "is not valid under any of the given schemas"),
    _broken(ISVC_YAML, "InferenceService", lambda d: d["metadata"], _set("annotationz", {}),
            "$.metadata", "'annotationz'"),
    _broken(ISVC_YAML, "InferenceService", lambda d: d, _set("kind", "InferenceServices"),
            "$.kind", "is not one of ['InferenceService']"),
    # ... and in Istio's AuthorizationPolicy (ports are strings; an unknown field).
    _broken(ISTIO_ACCESS, "AuthorizationPolicy",
            lambda d: d["spec"]["rules"][0]["to"][0]["operation"], _set("ports", [8501]),
            "$.spec.rules[0].to[0].operation.ports[0]", "is not of type 'string'"),
    _broken(ISTIO_ACCESS, "AuthorizationPolicy",
            lambda d: d["spec"]["rules"][0]["from"][0]["source"], _set("namespace", ["x"]),
            "$.spec.rules[0].from[0].source", "'namespace'"),
    _broken(ISTIO_ACCESS, "AuthorizationPolicy", lambda d: d["spec"], _set("action", "PERMIT"),
            "$.spec.action", "is not one of"),
]  # fmt: skip


@pytest.mark.parametrize("path, kind, reach, mutate, where, text", BROKEN)
def test_a_broken_copy_fails_naming_the_path(path, kind, reach, mutate, where, text):
    document = one(path, kind)
    validator = validator_for(document)  # the schema of the object as written
    mutate(reach(document))
    errors = schema_errors(document, validator)
    assert any(
        line.startswith(f"{where}: ") and text in line for line in errors.splitlines()
    ), f"expected an error at {where} with {text!r}, got:\n{errors}"


def test_int_or_string_quantities_and_preserved_fields_accept_what_the_api_server_accepts():
    deployment = one(TF_SERVING_YAML, "Deployment")
    container = _pod(deployment)["containers"][0]
    container["readinessProbe"]["httpGet"]["port"] = 8501  # int-or-string: a number
    container["resources"]["limits"]["cpu"] = 2  # Quantity: a number
    container["resources"]["requests"]["cpu"] = 0.5
    assert schema_errors(deployment) == ""

    isvc = one(ISVC_YAML, "InferenceService")
    container = isvc["spec"]["predictor"]["containers"][0]
    container["readinessProbe"]["httpGet"]["port"] = 8501
    container["resources"]["limits"]["cpu"] = 2  # the CRD's quantities are int-or-string
    isvc["status"] = {"anything": {"the": "controller writes"}}  # preserve-unknown-fields
    assert schema_errors(isvc) == ""
    container["resources"]["requests"]["cpu"] = 0.5  # but not a float there
    assert "$.spec.predictor.containers[0].resources.requests.cpu: " in schema_errors(isvc)


def test_duplicated_keys_are_refused(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("apiVersion: v1\nkind: Service\nkind: Service\n")
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicated keys"):
        load_documents(path)


def test_the_predictor_pod_fields_are_a_valid_core_v1_pod_spec():
    """What KServe copies into the Deployment it creates must pass Kubernetes' PodSpec."""
    predictor = one(ISVC_YAML, "InferenceService")["spec"]["predictor"]
    pod_fields = kubernetes_definitions()[POD_SPEC]["properties"]
    pod = {k: v for k, v in predictor.items() if k in pod_fields}
    extension = set(predictor) - set(pod)
    assert extension == {"minReplicas", "maxReplicas", "deploymentStrategy"}
    schema = {"$ref": f"#/definitions/{POD_SPEC}", "definitions": kubernetes_definitions()}
    assert schema_errors(pod, jsonschema.Draft4Validator(schema)) == ""


# ---------------------------------------------------------------------------------------------
# What the schemas cannot see
# ---------------------------------------------------------------------------------------------


def test_images_are_exact_tags_and_the_sync_image_is_the_pipeline_cpu_image():
    watch_image = all_containers(CRONJOB)[0]["image"]
    for path in (TF_SERVING_YAML, ISVC_YAML):
        for container in all_containers(path):
            image = container["image"]
            name, _, tag = image.rpartition(":")
            assert name and "/" not in tag and tag, f"{image}: no tag"
            assert tag != "latest" and "@" not in image, f"{image}: not an exact tag"
            if image.startswith("tensorflow/serving"):
                assert image == TF_SERVING_IMAGE
            else:
                assert image == watch_image == PipelineConfig.load(environ={}).cpu_image


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_tf_serving_flags_ports_and_probes_agree(manifest):
    pod = pod_specs()[manifest]
    server = tf_serving(pod)
    assert server["command"] == ["/usr/bin/tensorflow_model_server"]
    assert flags(server) == {
        "port": "8500",
        "rest_api_port": "8501",
        "model_config_file": "/models/models.config",
        "model_config_file_poll_wait_seconds": "10",
        "allow_version_labels_for_unavailable_models": "true",
        "enable_batching": "true",
        "batching_parameters_file": "/etc/tf-serving/batching_parameters.txt",
        "monitoring_config_file": "/etc/tf-serving/monitoring.config",
    }
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {
        "grpc": int(flags(server)["port"]),
        "http": int(flags(server)["rest_api_port"]),
    }

    def port_of(handler: dict) -> int:
        port = handler["port"]
        assert port in ports or port in ports.values(), f"probe port {port} is not declared"
        return ports.get(port, port)

    model_name = PipelineConfig.load(environ={}).model_name
    readiness = server["readinessProbe"]
    assert readiness["httpGet"]["path"] == f"/v1/models/{model_name}/metadata"
    assert port_of(readiness["httpGet"]) == ports["http"]
    # Liveness must hold while a version loads or after one failed to load (the server keeps
    # serving the previous one): a TCP check, never the model's metadata.
    for probe in ("startupProbe", "livenessProbe"):
        assert set(server[probe]) & {"httpGet", "tcpSocket", "exec", "grpc"} == {"tcpSocket"}
        port_of(server[probe]["tcpSocket"])
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # the first load
    for container in sync_containers(pod):
        for variable in container["env"]:
            if variable["name"] == "PIPELINE_MODEL_NAME":
                assert variable["value"] == model_name, "the probe's path names another model"


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_sync_containers_write_where_tf_serving_reads_its_model_config(manifest):
    pod = pod_specs()[manifest]
    server = tf_serving(pod)
    config_dir = str(Path(flags(server)["model_config_file"]).parent)
    (volume,) = [m["name"] for m in server["volumeMounts"] if m["mountPath"] == config_dir]
    assert mount_of(server, volume).get("readOnly") is True
    assert "emptyDir" in {v["name"]: v for v in pod["volumes"]}[volume]

    (init,) = pod["initContainers"]
    (sidecar,) = [c for c in pod["containers"] if c is not server]
    assert sync_containers(pod) == [init, sidecar]
    # The Deployment's pod serves one track (its label); the InferenceService's both labels.
    track = {"label": "stable"} if manifest == "tf-serving.yaml" else {}
    assert sync_options(init) == {"target": config_dir, "once": True, **track}
    port = flags(server)["rest_api_port"]  # labels follow what this TF Serving has loaded
    assert sync_options(sidecar) == {"target": config_dir, "interval": "10",
                                     "model-server": f"http://localhost:{port}",
                                     **track}  # fmt: skip
    for container in (init, sidecar):
        mount = mount_of(container, volume)
        assert mount["mountPath"] == config_dir and not mount.get("readOnly")
        env = {v["name"]: v.get("value") for v in container["env"]}
        assert env["PIPELINE_WORK_DIR"] == "/tmp/tkp" and env["HOME"] == "/tmp"
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"])


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_the_sync_commands_are_what_the_cli_accepts(manifest):
    for container in sync_containers(pod_specs()[manifest]):
        command = container["command"]
        args = build_parser().parse_args(command[1:])
        assert args.handler is cmd_serving_sync and args.target == "/models", command
        assert args.once or args.interval == 10, command


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_names_are_unique_and_every_mount_has_its_volume(manifest):
    pod = pod_specs()[manifest]
    containers = pod["initContainers"] + pod["containers"]
    names = [c["name"] for c in containers]
    assert len(names) == len(set(names))
    volumes = [v["name"] for v in pod["volumes"]]
    assert len(volumes) == len(set(volumes))
    for container in containers:
        assert {m["name"] for m in container["volumeMounts"]} <= set(volumes)
        ports = container.get("ports", [])
        assert len(ports) == len({p["name"] for p in ports})
        assert len(ports) == len({p["containerPort"] for p in ports})


def test_the_canary_deployment_is_the_stable_one_but_its_name_track_and_label():
    stable, canary = (one(TF_SERVING_YAML, "Deployment", f"{MODEL_SERVER}{suffix}")
                      for suffix in ("", "-canary"))  # fmt: skip
    text = json.dumps(stable).replace(f"{MODEL_SERVER}-stable", f"{MODEL_SERVER}-canary")
    text = text.replace('"--label", "stable"', '"--label", "canary"')
    expected = json.loads(text)
    expected["metadata"]["name"] = f"{MODEL_SERVER}-canary"
    assert canary == expected
    for pod in (_pod(stable), _pod(canary)):  # each track's sync mirrors its own label only
        assert [c["command"][-2:] for c in sync_containers(pod)] == [
            ["--label", "stable" if pod is _pod(stable) else "canary"]] * 2  # fmt: skip


def test_the_virtual_service_splits_each_port_between_the_track_services_all_to_stable_at_rest():
    from pipelines.serving import cluster, cluster_release

    virtual_service = one(TF_SERVING_YAML, "VirtualService")
    assert virtual_service["spec"]["hosts"] == [MODEL_SERVER]
    assert cluster.service("taxi-tips") == MODEL_SERVER
    http = virtual_service["spec"]["http"]
    # What `watch` writes at rest is what is shipped: applying the file changes nothing.
    assert cluster_release.routed(http, MODEL_SERVER, 0, False) == http
    ports = {route["match"][0]["port"]: route["route"] for route in http}
    assert set(ports) == set(cluster_release.PORTS) == {8500, 8501}
    for port, destinations in ports.items():
        assert [(d["destination"]["host"], d["destination"]["port"]["number"], d["weight"])
                for d in destinations] == [(f"{MODEL_SERVER}-stable", port, 100),
                                           (f"{MODEL_SERVER}-canary", port, 0)]  # fmt: skip
    by_name = {d["metadata"]["name"]: d for d in documents(TF_SERVING_YAML)}
    for track in cluster.TRACKS:
        service, deployment = by_name[f"{MODEL_SERVER}-{track}"], None
        deployment = one(
            TF_SERVING_YAML,
            "Deployment",
            MODEL_SERVER if track == "stable" else f"{MODEL_SERVER}-canary",
        )
        selector = {cluster.TRACK_LABEL: f"{MODEL_SERVER}-{track}"}
        assert (
            service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"] == selector
        )
    # Shadow and a share, as `watch` writes them, are valid VirtualServices too.
    for shadow, share in ((True, 10), (False, 25)):
        changed = copy.deepcopy(virtual_service)
        changed["spec"]["http"] = cluster_release.routed(http, MODEL_SERVER, share, shadow)
        assert schema_errors(changed) == ""


def test_service_routes_grpc_and_http_to_the_deployment_pods():
    deployment = one(TF_SERVING_YAML, "Deployment")
    service = one(TF_SERVING_YAML, "Service")
    template_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= template_labels.items()
    assert service["spec"]["selector"] == selector  # without Istio, clients get stable only
    assert deployment["metadata"]["labels"] == template_labels
    assert service["metadata"]["labels"].items() <= template_labels.items()
    container_ports = {p["name"]: p["containerPort"] for p in tf_serving(_pod(deployment))["ports"]}
    routes = {p["name"]: (p["port"], p["targetPort"]) for p in service["spec"]["ports"]}
    assert routes == {"grpc": (8500, "grpc"), "http": (8501, "http")}
    assert {name: container_ports[target] for name, (_, target) in routes.items()} == {
        "grpc": 8500,
        "http": 8501,
    }


def test_inferenceservice_is_the_deployment_pod_as_a_raw_kserve_custom_predictor():
    isvc = one(ISVC_YAML, "InferenceService")
    deployment = one(TF_SERVING_YAML, "Deployment")
    assert isvc["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "RawDeployment"
    predictor = isvc["spec"]["predictor"]
    pod = _pod(deployment)
    # KServe v0.13.1 renames containers[0] to kserve-container (CustomPredictor.Default) and
    # exposes its first port as the Service's port 80: TF Serving first, REST first.
    server = predictor["containers"][0]
    assert server["name"] == KSERVE_CONTAINER and server is tf_serving(predictor)
    assert server["ports"][0]["name"] == "http"
    assert KSERVE_TRANSFORMER_CONTAINER not in [c["name"] for c in predictor["containers"]]
    # Otherwise the same pod as tf-serving.yaml's stable track, but one server for both labels
    # (no traffic split: a client names the label), so its sync mirrors every label.
    for container in sync_containers(pod):
        assert container["command"][-2:] == ["--label", "stable"]
        container["command"] = container["command"][:-2]
    assert {**server, "name": "tf-serving"} == tf_serving(pod)
    assert predictor["containers"][1:] == [c for c in pod["containers"] if c is not tf_serving(pod)]
    for field in ("initContainers", "volumes", "securityContext"):
        assert predictor[field] == pod[field], field
    assert predictor["minReplicas"] == predictor["maxReplicas"] == deployment["spec"]["replicas"]
    assert predictor["deploymentStrategy"] == deployment["spec"]["strategy"]
    track = deployment["metadata"]["labels"].pop("app.kubernetes.io/instance")
    assert track == f"{MODEL_SERVER}-stable"
    assert isvc["metadata"]["labels"] == deployment["metadata"]["labels"]


def _secret_refs(container: dict) -> set[tuple[str, str, str]]:
    refs = set()
    for variable in container.get("env", []):
        ref = variable.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            refs.add((variable["name"], ref["name"], ref["key"]))
    return refs


def test_sync_containers_take_the_watch_cronjobs_secret_keys():
    (watch,) = all_containers(CRONJOB)
    expected = _secret_refs(watch)
    assert {secret for _, secret, _ in expected} == {
        PipelineConfig.load(environ={}).credentials_secret
    }
    assert {key for _, _, key in expected} == {
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_ENDPOINT_URL_S3",
        "AWS_REGION",
    }
    for manifest, pod in pod_specs().items():
        for container in sync_containers(pod):
            assert _secret_refs(container) == expected, (manifest, container["name"])
        assert _secret_refs(tf_serving(pod)) == set(), "TF Serving reads no store"


CREDENTIAL_PATTERNS = [
    r"AKIA[0-9A-Z]{16}",  # an AWS access key id
    r"(?i)(secret|password|passwd|token|accesskey)\w*\s*[:=]\s*['\"]?[A-Za-z0-9/+=]{8,}",
    r"(?i)minio123|minioadmin",  # MinIO's well-known default credentials
    r"(?im)^\s*(data|stringData):",
]


@pytest.mark.parametrize("path", [TF_SERVING_YAML, ISVC_YAML], ids=lambda p: p.name)
def test_no_secret_object_and_no_credential_value(path):
    assert "Secret" not in {d["kind"] for d in documents(path)}
    for container in all_containers(path):
        for variable in container.get("env", []):
            if "value" in variable:  # written down: only settings, never a credential
                assert variable["name"] == "HOME" or variable["name"].startswith("PIPELINE_")
            else:
                assert set(variable["valueFrom"]) == {"secretKeyRef"}, variable
    text = path.read_text()
    for pattern in CREDENTIAL_PATTERNS:
        assert not re.search(pattern, text), f"{path.name} matches {pattern}"


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_every_container_is_locked_down_and_bounded(manifest):
    pod = pod_specs()[manifest]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for container in pod["initContainers"] + pod["containers"]:
        context = container["securityContext"]
        assert context["readOnlyRootFilesystem"] is True, container["name"]
        assert context["allowPrivilegeEscalation"] is False, container["name"]
        assert context["capabilities"]["drop"] == ["ALL"], container["name"]
        assert {"cpu", "memory"} <= set(container["resources"]["limits"]), container["name"]
        assert any(m["mountPath"] == "/tmp" for m in container["volumeMounts"]), container["name"]
    for volume in pod["volumes"]:
        assert "configMap" in volume or volume["emptyDir"].get("sizeLimit"), volume["name"]


@pytest.mark.parametrize("manifest", ["tf-serving.yaml", "inferenceservice.yaml"])
def test_tf_serving_batches_and_exports_metrics_as_the_config_map_says(manifest):
    """The files TF Serving's flags name come from tf-serving-config.yaml's ConfigMap: the
    batching parameters are `tkp serve`'s shipped file word for word, parse as TF Serving parses
    them, and give one batch thread per CPU of the container's limit; the monitoring config turns
    on Prometheus at the path `tkp serve` answers too."""
    pod = pod_specs()[manifest]
    server = tf_serving(pod)
    config_map = one(CONFIG_YAML, "ConfigMap")
    files = {name: flags(server)[f"{name}_file"] for name in ("batching_parameters",
                                                                 "monitoring_config")}  # fmt: skip
    folder = {str(Path(path).parent) for path in files.values()}.pop()
    (volume,) = [m["name"] for m in server["volumeMounts"] if m["mountPath"] == folder]
    assert mount_of(server, volume).get("readOnly") is True
    source = {v["name"]: v for v in pod["volumes"]}[volume]["configMap"]
    assert source == {"name": config_map["metadata"]["name"]}
    data = config_map["data"]
    assert set(data) == {Path(path).name for path in files.values()}

    text = data[Path(files["batching_parameters"]).name]
    assert text == SHIPPED_BATCHING.read_text()
    parameters = load_parameters(SHIPPED_BATCHING)
    assert parameters.num_batch_threads == int(server["resources"]["limits"]["cpu"])

    monitoring = tf_serving_protos.message("MonitoringConfig")
    text_format.Parse(data[Path(files["monitoring_config"]).name], monitoring)
    assert monitoring.prometheus_config.enable is True
    assert monitoring.prometheus_config.path == serving_metrics.PATH


def test_the_config_map_holds_no_credential():
    text = CONFIG_YAML.read_text()
    for pattern in CREDENTIAL_PATTERNS[:-1]:  # `data:` is a ConfigMap's own field
        assert not re.search(pattern, text), f"{CONFIG_YAML.name} matches {pattern}"


# ---------------------------------------------------------------------------------------------
# Istio in a Kubeflow profile namespace
# ---------------------------------------------------------------------------------------------


def _pod_templates() -> list[tuple[str, dict, dict]]:
    """(where, pod metadata, pod spec) of every pod the serving files and the CronJob create."""
    found = []
    for document in documents(TF_SERVING_YAML) + documents(CRONJOB):
        if document["kind"] == "Deployment":
            template = document["spec"]["template"]
        elif document["kind"] == "CronJob":
            template = document["spec"]["jobTemplate"]["spec"]["template"]
        else:
            continue
        found.append((document["metadata"]["name"], template["metadata"], template["spec"]))
    isvc = one(ISVC_YAML, "InferenceService")  # KServe copies its annotations to the pods
    found.append((isvc["metadata"]["name"], isvc["metadata"], isvc["spec"]["predictor"]))
    return found


def test_every_pod_asks_istio_for_a_native_sidecar_and_none_opts_out_of_the_mesh():
    """A profile namespace injects Istio's proxy. An init container that needs the network
    (model-sync-init) only has it when the proxy runs first, as a native sidecar; a Job's pod only
    ends when its proxy does (Istio pkg/kube/inject/webhook.go reorderPod). No pod opts out of
    injection or takes its traffic out of the mesh (traffic.sidecar.istio.io/exclude*)."""
    for where, metadata, _ in _pod_templates():
        annotations = metadata.get("annotations", {})
        assert annotations.get("sidecar.istio.io/nativeSidecar") == "true", where
        assert not [key for key in {**annotations, **metadata.get("labels", {})}
                    if key.startswith("traffic.sidecar.istio.io/exclude")
                    or key == "sidecar.istio.io/inject"], where  # fmt: skip


def test_the_optional_access_policies_select_the_serving_pods_and_their_ports():
    """istio-access.yaml: one policy per serving form, each selecting exactly that form's pods
    (the Deployments' template labels; the pods KServe labels with the InferenceService's name,
    kserve components/predictor.go) and TF Serving's container ports, as strings. The CRD's CEL
    rules no JSON schema checks: selector or targetRefs, not both; no serviceAccounts (absent
    from Istio 1.24.3, Kubeflow 1.10's); no wildcard or empty key in matchLabels."""
    serving, isvc = documents(ISTIO_ACCESS)
    deployments = [d for d in documents(TF_SERVING_YAML) if d["kind"] == "Deployment"]
    isvc_name = one(ISVC_YAML, "InferenceService")["metadata"]["name"]
    pods = {
        "tf-serving.yaml": [d["spec"]["template"]["metadata"]["labels"] for d in deployments],
        "inferenceservice.yaml": [{"serving.kserve.io/inferenceservice": isvc_name}],
    }
    for policy, manifest in ((serving, "tf-serving.yaml"), (isvc, "inferenceservice.yaml")):
        spec = policy["spec"]
        assert "targetRef" not in spec and "targetRefs" not in spec
        selector = spec["selector"]["matchLabels"]
        assert all(key and "*" not in key + value for key, value in selector.items())
        assert all(selector.items() <= labels.items() for labels in pods[manifest]), manifest
        ports = {str(p["containerPort"]) for p in tf_serving(pod_specs()[manifest])["ports"]}
        assert spec["action"] == "ALLOW"
        for rule in spec["rules"]:
            assert {p for op in rule["to"] for p in op["operation"]["ports"]} == ports
            for source in (entry["source"] for entry in rule["from"]):
                assert "serviceAccounts" not in source
                assert source["namespaces"] == ["CLIENT_NAMESPACE"]  # the operator fills it in
