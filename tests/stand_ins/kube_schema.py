"""Custom resources as the Kubernetes API server reads their CRDs (for kube_api.py): the
structural schema's unknown fields (pruning, apiextensions-apiserver
pkg/apiserver/schema/pruning), defaults (pkg/apiserver/schema/defaulting), OpenAPI validation,
and CEL rules (`x-kubernetes-validations`), each played in Python where the stand-in knows the
rule's text and refused where it does not."""

from __future__ import annotations

import functools
import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
import yaml

# k8s.io/apimachinery pkg/util/validation IsDNS1035Label (a name Kubernetes uses for pods, Jobs).
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
# Label keys and values, annotation keys (apimachinery pkg/util/validation IsQualifiedName,
# IsValidLabelValue, IsDNS1123Subdomain; pkg/apis/meta/v1/validation ValidateLabels).
_NAME_PART = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_1123_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_QUALIFIED_NAME_TEXT = (
    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an "
    "alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for "
    "validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')"
)
_SUBDOMAIN_TEXT = (
    "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used "
    "for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
)
_LABEL_VALUE_TEXT = (
    "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or "
    "'.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',"
    "  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
)
# ObjectMeta's fields (k8s.io/apimachinery pkg/apis/meta/v1/types.go): a CRD's schema says only
# `metadata: {type: object}`, the API server knows the rest.
OBJECT_META = {
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation",
    "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "labels",
    "annotations", "ownerReferences", "finalizers", "managedFields",
}  # fmt: skip


@functools.cache
def crd_schema(path: Path, version: str, name: str = "") -> tuple[dict, dict]:
    """(the CRD's names and scope, the version's openAPIV3Schema); a `.gz` file is read as
    it is; `name`: the CRD's in a file of several."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    crds = yaml.load_all(data, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    (crd,) = [c for c in crds if c and (not name or c["metadata"]["name"] == name)]
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    names = dict(crd["spec"]["names"], group=crd["spec"]["group"], scope=crd["spec"]["scope"])
    return names, served["schema"]["openAPIV3Schema"]


CORE_SWAGGER = Path(__file__).parent / "schemas" / "kubernetes-1.29-swagger.json.gz"


@functools.cache
def core_definitions() -> dict[str, dict]:
    """Kubernetes 1.29's OpenAPI definitions of its built-in kinds (`io.k8s.api.core.v1.Pod`:
    what the API server decodes a pod into, so what it knows of one)."""
    return json.loads(gzip.decompress(CORE_SWAGGER.read_bytes()))["definitions"]


def unknown_fields(value, schema: dict, path: str = "",
                   definitions: dict | None = None) -> list[str]:  # fmt: skip
    """The paths of the fields a structural schema does not know (what pruning drops; for a
    built-in kind, what strict decoding names). `definitions` resolve a schema's `$ref`."""
    if isinstance(schema, dict) and "$ref" in schema and definitions is not None:
        schema = definitions[schema["$ref"].rsplit("/", 1)[1]]
    if not isinstance(schema, dict) or schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found = []
    if isinstance(value, dict):
        properties = schema.get("properties")
        for key, item in value.items():
            here = f"{path}.{key}"
            if path == "" and key in ("apiVersion", "kind"):
                continue
            if path == "" and key == "metadata":
                found += [f".metadata.{k}" for k in item if k not in OBJECT_META]
            elif properties is not None and key in properties:
                found += unknown_fields(item, properties[key], here, definitions)
            elif isinstance(schema.get("additionalProperties"), dict):
                found += unknown_fields(item, schema["additionalProperties"], here, definitions)
            elif properties is not None or schema.get("type") == "object":
                found.append(here)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            found += unknown_fields(item, schema["items"], f"{path}[{index}]", definitions)
    return found


def defaulted(value, schema: dict):
    """`value` with the schema's defaults filled in where a present object lacks a field
    (apiextensions-apiserver pkg/apiserver/schema/defaulting: after pruning, before
    validation)."""
    if isinstance(value, dict) and isinstance(schema, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key not in value and "default" in sub:
                value[key] = json.loads(json.dumps(sub["default"]))
            if key in value:
                defaulted(value[key], sub)
        if isinstance(schema.get("additionalProperties"), dict):
            for item in value.values():
                defaulted(item, schema["additionalProperties"])
    elif (
        isinstance(value, list)
        and isinstance(schema, dict)
        and isinstance(schema.get("items"), dict)
    ):
        for item in value:
            defaulted(item, schema["items"])
    return value


def drop(body: dict, paths: list[str]) -> dict:
    """The body without the fields at `paths` (`.a.b[2].c`)."""
    body = json.loads(json.dumps(body))
    for path in paths:
        steps = re.findall(r"\.([^.\[]+)|\[(\d+)\]", path)
        node = body
        for key, index in steps[:-1]:
            node = node[int(index)] if index else node[key]
        key, index = steps[-1]
        del node[int(index) if index else key]
    return body


def cel_rules(schema, path: str = "") -> list[tuple[str, str, dict]]:
    """Every x-kubernetes-validations rule in a schema: (schema path, rule, the rule's entry)."""
    found = []
    if isinstance(schema, dict):
        for rule in schema.get("x-kubernetes-validations", []):
            found.append((path, rule["rule"], rule))
        for key, sub in (schema.get("properties") or {}).items():
            found += cel_rules(sub, f"{path}.{key}")
        if isinstance(schema.get("items"), dict):
            found += cel_rules(schema["items"], f"{path}[*]")
        if isinstance(schema.get("additionalProperties"), dict):
            found += cel_rules(schema["additionalProperties"], f"{path}.*")
    return found


def values_at(body, path: str) -> list:
    """The values at a schema path (`.spec.x[*].y`), those present."""
    values = [body]
    for key, star in re.findall(r"\.([^.\[]+)|(\[\*\])", path):
        nxt = []
        for value in values:
            if star and isinstance(value, list):
                nxt += value
            elif key == "*" and isinstance(value, dict):
                nxt += list(value.values())
            elif key and isinstance(value, dict) and key in value:
                nxt.append(value[key])
        values = nxt
    return values


def duplicate_keys(value, schema: dict, path: str = "") -> list[str]:
    """Lists whose schema says `x-kubernetes-list-type: map` (or `set`) may not repeat a key
    (apiextensions-apiserver pkg/apiserver/validation: "Duplicate value")."""
    found = []
    if isinstance(value, list) and isinstance(schema, dict):
        kind = schema.get("x-kubernetes-list-type")
        if kind in ("map", "set"):
            keys = schema.get("x-kubernetes-list-map-keys", [])
            seen = set()
            for index, item in enumerate(value):
                key = (json.dumps([item.get(k) for k in keys]) if kind == "map"
                       else json.dumps(item, sort_keys=True))  # fmt: skip
                if key in seen:
                    found.append(f"{path}[{index}]: Duplicate value: {key}")
                seen.add(key)
        if isinstance(schema.get("items"), dict):
            for index, item in enumerate(value):
                found += duplicate_keys(item, schema["items"], f"{path}[{index}]")
    elif isinstance(value, dict) and isinstance(schema, dict):
        properties = schema.get("properties") or {}
        for key, item in value.items():
            sub = properties.get(key, schema.get("additionalProperties"))
            if isinstance(sub, dict):
                found += duplicate_keys(item, sub, f"{path}.{key}")
    return found


def _qualified_name(key: str) -> list[str]:
    """IsQualifiedName's messages, every one (validation.go)."""
    parts = key.split("/")
    if len(parts) > 2:
        return [f"a qualified name {_QUALIFIED_NAME_TEXT} with an optional DNS subdomain prefix "
                "and '/' (e.g. 'example.com/MyName')"]  # fmt: skip
    errors, name = [], parts[-1]
    if len(parts) == 2:
        prefix = parts[0]
        if not prefix:
            errors.append("prefix part must be non-empty")
        else:
            if len(prefix) > 253:
                errors.append("prefix part must be no more than 253 characters")
            if not _DNS_1123_SUBDOMAIN.match(prefix):
                errors.append(f"prefix part {_SUBDOMAIN_TEXT}")
    if not name:
        errors.append("name part must be non-empty")
    elif len(name) > 63:
        errors.append("name part must be no more than 63 characters")
    if not _NAME_PART.match(name):
        errors.append(f"name part {_QUALIFIED_NAME_TEXT}")
    return errors


def metadata_errors(meta: dict) -> list[str]:
    """ObjectMeta's label keys and values and annotation keys (annotations lower-cased first),
    as the API server checks every object (ValidateObjectMeta, ValidateLabels,
    ValidateAnnotations): one `metadata.labels: Invalid value: "<key>": <why>` per message."""
    errors = []
    for key, value in (meta.get("labels") or {}).items():
        errors += [f'metadata.labels: Invalid value: "{key}": {e}' for e in _qualified_name(key)]
        if not isinstance(value, str):
            continue  # the schema's type error
        if len(value) > 63:
            errors.append(f'metadata.labels: Invalid value: "{value}": must be no more than 63 '
                          "characters")  # fmt: skip
        if value and not _NAME_PART.match(value):
            errors.append(f'metadata.labels: Invalid value: "{value}": {_LABEL_VALUE_TEXT}')
    for key in meta.get("annotations") or {}:
        errors += [f'metadata.annotations: Invalid value: "{key}": {e}'
                   for e in _qualified_name(key.lower())]  # fmt: skip
    return errors


@dataclass
class Resource:
    """A served kind: its CRD's schema, the CEL rules the stand-in can play (rule text ->
    function of the value at the rule's path returning True when valid), the admission
    webhook's checks, and the controller's hooks."""

    crd: Path
    version: str
    webhook: str = ""  # the validating webhook's name, for its denials
    cel: dict[str, Callable] = field(default_factory=dict)
    admit: Callable[[dict], list[str]] = lambda body: []
    on_create: Callable[[dict], None] = lambda body: None
    on_get: Callable[[dict], dict] = lambda body: body
    on_delete: Callable[[dict], None] = lambda body: None
    crd_name: str = ""  # the CRD's name, in a file that holds several

    def __post_init__(self):
        self.names, self.schema = crd_schema(self.crd, self.version, self.crd_name)
        self.group, self.plural, self.kind = (
            self.names["group"], self.names["plural"], self.names["kind"]
        )  # fmt: skip
        self.namespaced = self.names["scope"] == "Namespaced"
        self.rules = cel_rules(self.schema)

    def check(self, body: dict) -> list[str]:
        """Schema and CEL errors, as the API server reports an Invalid object."""
        errors = [
            f"{'.'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
            for e in jsonschema.Draft7Validator(self.schema).iter_errors(body)
        ]
        for path, rule, entry in self.rules:
            if "oldSelf" in rule:  # a transition rule: evaluated on update only, never served
                continue
            for value in values_at(body, path):
                play = self.cel.get(rule)
                if play is None:
                    errors.append(
                        f"{path}: the stand-in cannot play the CEL rule {rule!r}, so "
                        "it refuses the object rather than accept it unchecked"
                    )
                elif not play(value):
                    errors.append(
                        f"{path or '<root>'}: Invalid value: {entry.get('message', rule)}"
                    )
        return (
            metadata_errors(body.get("metadata") or {}) + errors + duplicate_keys(body, self.schema)
        )
