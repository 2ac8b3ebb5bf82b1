"""The curated schema as a pipeline step: copies the use case's `schemas/<use case>/schema.pbtxt`
into a Schema artifact.

Replaces TFX's Importer node: open-source Kubeflow's importer accepts only object-store URIs, and
the schema ships inside the image with the code, so the step that reads it runs in that image.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from tfx import types
from tfx.dsl.components.base import base_component, base_executor, executor_spec
from tfx.types import artifact_utils, component_spec, standard_artifacts

from components.base.config import REPO_ROOT


class CuratedSchemaExecutor(base_executor.BaseExecutor):
    def Do(self, input_dict, output_dict, exec_properties) -> None:
        source = REPO_ROOT / exec_properties["schema_path"]
        if not source.is_file():
            raise FileNotFoundError(f"curated schema {source} not found (schema_path parameter)")
        schema = artifact_utils.get_single_instance(output_dict["schema"])
        os.makedirs(schema.uri, exist_ok=True)
        shutil.copyfile(source, os.path.join(schema.uri, "schema.pbtxt"))


class CuratedSchemaSpec(types.ComponentSpec):
    PARAMETERS = {
        "schema_path": component_spec.ExecutionParameter(type=str),
        # Only part of the step's cache key: TFX's local cache would otherwise serve the first
        # run's copy after the schema file was edited (a threshold raised, a column added).
        "schema_sha256": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {}
    OUTPUTS = {"schema": component_spec.ChannelParameter(type=standard_artifacts.Schema)}


class CuratedSchema(base_component.BaseComponent):
    """`schema_path` is relative to the project root, so it means the same file in every image."""

    SPEC_CLASS = CuratedSchemaSpec
    EXECUTOR_SPEC = executor_spec.ExecutorClassSpec(CuratedSchemaExecutor)

    def __init__(self, schema_path: str | Path):
        content = (REPO_ROOT / schema_path).read_bytes()
        super().__init__(
            spec=CuratedSchemaSpec(
                schema_path=str(schema_path),
                schema_sha256=hashlib.sha256(content).hexdigest(),
                schema=types.Channel(type=standard_artifacts.Schema),
            )
        )
