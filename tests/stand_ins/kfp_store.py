"""What the KFP 2.5 backend keeps between tasks and between runs: ML Metadata and the cache table.

Part of the launcher-contract harness (`tests/stand_ins/kfp_harness.py`). Every rule names the file
of kubeflow/pipelines at tag 2.5.0 (backend/src/v2/...) that it follows.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any


class ArtifactRecordError(RuntimeError):
    """The launcher could not record an output artifact (the task fails)."""


def to_mlmd_value(value: Any) -> Any:
    """metadata/converter.go StructValueToMLMDValue: what a metadata value becomes in MLMD.

    Numbers are stored as doubles, booleans as ints (0/1), lists and structs wrapped in a struct
    under "list" / "struct"; a null value is an error.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return {"list": value}
    if isinstance(value, dict):
        return {"struct": value}
    raise ArtifactRecordError(f"unknown/unsupported value type for metadata value {value!r}")


def from_mlmd_value(value: Any) -> Any:
    """metadata/converter.go toRuntimeArtifact: MLMD values back to metadata (ints as numbers)."""
    return float(value) if isinstance(value, int) else value


def artifact_type_name(artifact_type: dict) -> str:
    """The MLMD type an output artifact is recorded as: component/launcher_v2.go
    getArtifactSchema (an instanceSchema as it is, a schemaTitle as `title: <it>`), then
    metadata/client.go SchemaToArtifactType (the YAML's `title`; none is fatal). The UI draws
    an artifact by this name (frontend/src/mlmd/MlmdUtils.ts filterLinkedArtifactsByType)."""
    import yaml

    if "instanceSchema" in artifact_type:
        schema = artifact_type["instanceSchema"]
    elif "schemaTitle" in artifact_type:
        schema = "title: " + artifact_type["schemaTitle"]
    else:
        raise ArtifactRecordError(f"unknown artifact type schema {artifact_type}")
    title = (yaml.safe_load(schema) or {}).get("title")
    if not title:
        raise ArtifactRecordError("No title specified")
    return title


@dataclass
class Artifact:
    id: int
    uri: str
    custom_properties: dict[str, Any]
    type_name: str = ""


@dataclass
class Execution:
    id: int
    task: str
    run_id: str
    state: str  # "COMPLETE", "CACHED" or "FAILED"
    outputs: dict[str, int] = field(default_factory=dict)  # output key -> artifact id


@dataclass
class CacheEntry:
    fingerprint: str
    pipeline_name: str
    namespace: str
    execution_id: int


class MetadataStore:
    """ML Metadata's artifacts and executions, plus the API server's cache table (task rows)."""

    def __init__(self, store_session_info: dict):
        self.artifacts: dict[int, Artifact] = {}
        self.executions: dict[int, Execution] = {}
        self.cache: list[CacheEntry] = []
        self._store_session_info = json.dumps(store_session_info)

    def record_artifact(self, output_name: str, runtime_artifact: dict) -> int:
        """metadata/client.go RecordArtifact via converter.go toMLMDArtifact: every metadata key
        becomes a custom property; `display_name` (the output key) and `store_session_info`
        (the pipeline root's store session) are added when absent."""
        properties = {k: to_mlmd_value(v) for k, v in runtime_artifact.get("metadata", {}).items()}
        properties.setdefault("display_name", output_name)
        properties.setdefault("store_session_info", self._store_session_info)
        type_name = artifact_type_name(runtime_artifact["type"])
        artifact_id = len(self.artifacts) + 1
        self.artifacts[artifact_id] = Artifact(
            artifact_id, runtime_artifact["uri"], properties, type_name
        )
        return artifact_id

    def find(self, uri: str) -> Artifact:
        """The recorded artifact with this URI."""
        return next(a for a in self.artifacts.values() if a.uri == uri)

    def runtime_artifact(self, artifact_id: int) -> dict:
        """What the driver hands a consumer (driver.go resolveUpstreamArtifacts ->
        metadata/client.go GetOutputArtifactsByExecutionId, whose Schema is always ""): the
        artifact id as name, an empty instanceSchema, the URI, custom properties as metadata."""
        artifact = self.artifacts[artifact_id]
        return {
            "name": str(artifact.id),
            "type": {"instanceSchema": ""},
            "uri": artifact.uri,
            "metadata": {k: from_mlmd_value(v) for k, v in artifact.custom_properties.items()},
        }

    def new_execution(self, task: str, run_id: str, state: str, outputs: dict[str, int]) -> int:
        execution_id = len(self.executions) + 1
        self.executions[execution_id] = Execution(execution_id, task, run_id, state, outputs)
        return execution_id

    def cached_execution(self, fingerprint: str, pipeline_name: str, namespace: str) -> int | None:
        """cacheutils/cache.go GetExecutionCache: the newest row with this fingerprint, pipeline
        ("pipeline/<name>") and namespace."""
        for entry in reversed(self.cache):
            key = (entry.fingerprint, entry.pipeline_name, entry.namespace)
            if key == (fingerprint, f"pipeline/{pipeline_name}", namespace):
                return entry.execution_id
        return None

    def add_cache_entry(
        self, fingerprint: str, pipeline_name: str, namespace: str, execution_id: int
    ) -> None:
        """component/launcher_v2.go Execute: written only after the step succeeded, and only
        when the task has caching on (a non-empty fingerprint)."""
        self.cache.append(
            CacheEntry(fingerprint, f"pipeline/{pipeline_name}", namespace, execution_id)
        )


def fingerprint(
    executor_input: dict, output_parameter_types: dict, command_and_args: list[str], image: str
) -> str:
    """cacheutils/cache.go GenerateCacheKey + GenerateFingerPrint, called from driver.go
    getFingerPrint: input artifact *names* (= MLMD ids, not contents), input parameter values,
    output artifact specs with their URIs wiped, output parameter types, the image and the
    unresolved command and args (placeholders such as {{$}} as written in the spec)."""
    inputs, outputs = executor_input["inputs"], executor_input["outputs"]
    key = {
        "inputArtifactNames": {
            name: [a["name"] for a in listed["artifacts"]]
            for name, listed in inputs.get("artifacts", {}).items()
        },
        "inputParameterValues": inputs.get("parameterValues", {}),
        "outputArtifactsSpec": {
            name: {k: v for k, v in listed["artifacts"][0].items() if k != "uri"}
            for name, listed in outputs.get("artifacts", {}).items()
            if listed["artifacts"]
        },
        "outputParametersSpec": {
            name: output_parameter_types[name] for name in outputs.get("parameters", {})
        },
        "containerSpec": {"image": image, "cmdArgs": command_and_args},
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
