"""TFX's Kubeflow V2 executor entry point, importing only what the step's executor needs.

A copy, step for step, of tfx/orchestration/kubeflow/v2/container/kubeflow_v2_run_executor.py
(`_parse_flags`, `_run_executor`) and the parts of kubeflow_v2_entrypoint_utils.py they use, TFX
1.16 as the lock pins it; tests/pipelines/bench/test_bench_startup.py runs both on the same
ExecutorInput and requires the same inputs, properties and output files. Why a copy is below. Used
by pipelines/kubeflow/kfp_entrypoint.py.
"""

from __future__ import annotations

import os
import sys

# The entry point's command line (pipelines/kubeflow/kfp_entrypoint.py reads it too).
INVOCATION_FLAG = "--json_serialized_invocation_args"
INPUTS_SPEC_FLAG = "--json_serialized_inputs_spec_args"
STEP_FLAG = "--step_name"  # ours (pipelines/kubeflow/kubeflow_runner.py): the pipeline node's id
EXECUTOR_FLAG = "--executor_class_path"

# TFX's Kubeflow V2 executor entry point (tfx/orchestration/kubeflow/v2/container/
# kubeflow_v2_run_executor.py `_parse_flags` and `_run_executor`, with the parts of
# kubeflow_v2_entrypoint_utils.py they use), TFX 1.16 as the lock pins it, step for step. Those
# modules import at their top tfx.components (every stock component, so TFMA, TFDV, TFT, Beam),
# the Evaluator's executor, standard_component_specs (TFMA and TFDV again) and the whole KFP SDK,
# whatever the step runs; the steps with executors of their own (schema, span selection,
# baseline) need none of it, yet paid for it at every start (pipelines/bench/bench_startup.py).
# Here a step loads its executor, its artifact types and TFX's light artifact and IO modules; TFX's
# Beam and Evaluator branches are taken by looking for their classes among the modules the
# executor's imports loaded, since an executor can only derive from a class that is loaded.
_BEAM_EXECUTOR_MODULE = "tfx.dsl.components.base.base_beam_executor"
_EVALUATOR_EXECUTOR_MODULE = "tfx.components.evaluator.executor"
# kubeflow_v2_entrypoint_utils: an old name of standard_component_specs.INPUT_BASE_KEY (whose
# module imports TFMA and TFDV; tests/pipelines/bench/test_bench_startup.py keeps the two equal).
_OLD_INPUT_BASE_PROPERTY_NAME = "input_base_uri"
_INPUT_BASE_KEY = "input_base"
_INT64_MAX = 1 << 63


def defer_stock_components_package() -> None:
    """Makes `tfx.components` a package whose `__init__` runs at the first name taken from it.

    That `__init__` imports every stock component (the Evaluator's TFMA with matplotlib, the
    InfraValidator's Kubernetes client, ...), and every `tfx.components.<step>.executor` import
    runs it first, whatever the step. The submodules need only the package's path, which the
    deferred package has; a name of the package's own (`from tfx.components import Trainer`,
    `tfx.components.Evaluator`) runs the real `__init__` then (PEP 562's module `__getattr__`),
    so nothing sees a different package, it sees it later. Nothing changes if it is imported
    already."""
    if "tfx.components" in sys.modules:
        return
    import importlib.util

    import tfx

    spec = importlib.util.find_spec("tfx.components")
    package = importlib.util.module_from_spec(spec)

    def __getattr__(name: str):
        del package.__dict__["__getattr__"]  # from now on, the package as TFX made it
        spec.loader.exec_module(package)
        return getattr(package, name)

    package.__getattr__ = __getattr__
    sys.modules["tfx.components"] = package
    tfx.components = package


def _pipeline_spec_pb2():
    """kfp.pipeline_spec's protos without the KFP SDK: `kfp/__init__.py` imports kfp.dsl and the
    client unless _KFP_RUNTIME is "true", the switch KFP sets in its own step containers. Unset
    again afterwards, so that anything importing kfp.dsl later gets all of it, as before."""
    previous = os.environ.get("_KFP_RUNTIME")
    os.environ["_KFP_RUNTIME"] = "true"
    try:
        from kfp.pipeline_spec import pipeline_spec_pb2
    finally:
        if previous is None:
            del os.environ["_KFP_RUNTIME"]
        else:
            os.environ["_KFP_RUNTIME"] = previous
    return pipeline_spec_pb2


def _parse_flags(argv: list[str]):
    """kubeflow_v2_run_executor._parse_flags: (known flags, the rest as Beam arguments)."""
    from absl.flags import argparse_flags

    parser = argparse_flags.ArgumentParser()
    parser.add_argument(
        EXECUTOR_FLAG,
        type=str,
        required=True,
        help="Python class of executor in format of <module>.<class>.",
    )
    parser.add_argument(
        INVOCATION_FLAG,
        type=str,
        required=True,
        help="JSON-serialized metadata for this execution.",
    )
    parser.add_argument(
        INPUTS_SPEC_FLAG,
        type=str,
        required=False,
        help="JSON-serialized component inputs spec for this execution.",
    )
    # Ours, not TFX's: the pipeline node's name, under which the step's time is recorded.
    parser.add_argument(STEP_FLAG, type=str, required=False, help="The pipeline node's id.")
    return parser.parse_known_args(argv)


def load_executor(argv: list[str]):
    """What kubeflow_v2_run_executor._run_executor does before it logs and builds the executor:
    imports the executor class, parses the flags and the ExecutorInput into TFX artifacts (which
    imports their classes) and execution properties. Returns the rest as a call: the executor
    built, its Do, then the ExecutorOutput written for the launcher.

    Meant to run before the step's log is turned up to INFO, as TFX's entry point imported all
    it needed before that: at INFO, Beam's type hints alone log thousands of lines while their
    modules load, which costs seconds."""
    from absl import logging as absl_logging
    from tfx.dsl.components.base import base_executor
    from tfx.utils import import_utils

    defer_stock_components_package()  # ours, not TFX's: what a step does not use, not loaded
    executor_cls = import_utils.import_class_by_path(_parse_flags(argv)[0].executor_class_path)
    # Parsed again now that the executor's modules have defined their absl flags: TFX's entry
    # point, which had imported nearly everything before it parsed, took those out of the Beam
    # arguments too.
    args, beam_args = _parse_flags(argv)
    absl_logging.set_verbosity(absl_logging.INFO)

    from google.protobuf import json_format
    from tfx.dsl.io import fileio

    pipeline_spec_pb2 = _pipeline_spec_pb2()
    executor_input = pipeline_spec_pb2.ExecutorInput()
    json_format.Parse(
        args.json_serialized_invocation_args, executor_input, ignore_unknown_fields=True
    )
    inputs_spec = None
    if getattr(args, "json_serialized_inputs_spec_args", None):
        inputs_spec = pipeline_spec_pb2.ComponentInputsSpec()
        json_format.Parse(
            args.json_serialized_inputs_spec_args, inputs_spec, ignore_unknown_fields=True
        )
    inputs_parameter_value = executor_input.inputs.parameter_values
    inputs_parameter = executor_input.inputs.parameters
    outputs_parameters = executor_input.outputs.parameters
    task_root = os.path.dirname(executor_input.outputs.output_file)
    tmp_path = os.path.join(task_root, ".temp")
    task_unique_id = os.path.basename(task_root)
    if fileio.exists(executor_input.outputs.output_file):
        # A driver's output: updated execution properties.
        with fileio.open(executor_input.outputs.output_file, "rb") as output_meta_json:
            output_metadata = pipeline_spec_pb2.ExecutorOutput()
            json_format.Parse(output_meta_json.read(), output_metadata, ignore_unknown_fields=True)
            for k, v in output_metadata.parameter_values.items():
                inputs_parameter_value[k].CopyFrom(v)
            for k, v in output_metadata.parameters.items():
                inputs_parameter[k].CopyFrom(v)

    name_from_id: dict[int, str] = {}
    inputs = _parse_raw_artifact_dict(executor_input.inputs.artifacts, name_from_id)
    outputs = _parse_raw_artifact_dict(executor_input.outputs.artifacts, name_from_id)
    exec_properties = _parse_execution_properties(
        inputs_parameter_value, inputs_parameter, inputs_spec, pipeline_spec_pb2
    )
    beam_module = sys.modules.get(_BEAM_EXECUTOR_MODULE)
    uses_beam = beam_module is not None and issubclass(executor_cls, beam_module.BaseBeamExecutor)

    def run() -> None:
        from tfx.orchestration.portable import outputs_utils
        from tfx.types import artifact_utils, standard_artifacts, value_artifact

        absl_logging.info(
            "Executor %s do: inputs: %s, outputs: %s, exec_properties: %s",
            args.executor_class_path,
            inputs,
            outputs,
            exec_properties,
        )
        if uses_beam:
            from components.steps.beam_dependencies import skip_tfx_package_for_local_workers

            skip_tfx_package_for_local_workers()  # ours, not TFX's: 1-2 s and 45 MB per step
            executor_context = beam_module.BaseBeamExecutor.Context(
                beam_pipeline_args=beam_args, unique_id=task_unique_id, tmp_dir=tmp_path
            )
        else:
            executor_context = base_executor.BaseExecutor.Context(
                extra_flags=beam_args, unique_id=task_unique_id, tmp_dir=tmp_path
            )
        from components.steps.step_times import timed

        executor = timed(executor_cls(executor_context), args.step_name or executor_cls.__name__)
        absl_logging.info("Starting executor")
        executor.Do(inputs, outputs, exec_properties)
        # Not the KFP UI's own types: the UI lists every custom property of a system.Metrics
        # artifact as a metric (MetricsVisualizations.tsx ScalarMetricsSection).
        outputs_utils.tag_output_artifacts_with_version(
            {k: v for k, v in outputs.items() if not v or not v[0].TYPE_NAME.startswith("system.")}
        )
        # TFX's workaround (b/169583143) for ModelBlessing: IDs back to the managed MLMD names.
        evaluator_module = sys.modules.get(_EVALUATOR_EXECUTOR_MODULE)
        if evaluator_module and issubclass(executor_cls, evaluator_module.Executor):
            # Loaded by the Evaluator's executor already, everything these modules import.
            from tfx.orchestration.kubeflow.v2.container import kubeflow_v2_entrypoint_utils
            from tfx.types import standard_component_specs

            if standard_component_specs.BLESSING_KEY in outputs:
                kubeflow_v2_entrypoint_utils.refactor_model_blessing(
                    artifact_utils.get_single_instance(
                        outputs[standard_component_specs.BLESSING_KEY]
                    ),
                    name_from_id,
                )
        metadata_uri = executor_input.outputs.output_file
        executor_output = pipeline_spec_pb2.ExecutorOutput()
        for k, v in _translate_executor_output(outputs, name_from_id, pipeline_spec_pb2).items():
            executor_output.artifacts[k].CopyFrom(v)
        for key in outputs_parameters.keys():
            if key not in outputs.keys():
                raise ValueError(
                    "All OutputParameters must have corresponding OutputValueArtifacts."
                )
            assert len(outputs[key]) == 1 and isinstance(
                outputs[key][0], value_artifact.ValueArtifact
            ), "Parameter should have one corresponding ValueArtifact."
            artifact = outputs[key][0]
            if isinstance(artifact, standard_artifacts.String):
                executor_output.parameter_values[key].string_value = artifact.read()
            elif isinstance(artifact, standard_artifacts.Float) or isinstance(
                artifact, standard_artifacts.Integer
            ):
                executor_output.parameter_values[key].number_value = artifact.read()
            elif isinstance(artifact, standard_artifacts.Boolean):
                executor_output.parameter_values[key].bool_value = artifact.read()
            else:
                raise ValueError(
                    "Only String, Float, Int, and Boolean ValueArtifacts are supported."
                )
        fileio.makedirs(os.path.dirname(metadata_uri))
        with fileio.open(metadata_uri, "wb") as f:
            f.write(json_format.MessageToJson(executor_output))

    return run


def _parse_raw_artifact_dict(inputs_dict, name_from_id: dict[int, str]) -> dict[str, list]:
    """kubeflow_v2_entrypoint_utils.parse_raw_artifact_dict."""
    return {
        key: [_parse_raw_artifact(single, name_from_id) for single in value.artifacts]
        for key, value in inputs_dict.items()
    }


def _parse_raw_artifact(artifact_pb, name_from_id: dict[int, str]):
    """kubeflow_v2_entrypoint_utils._parse_raw_artifact: a TFX artifact of the class its type
    schema names, its properties from the RuntimeArtifact's metadata."""
    import hashlib

    from google.protobuf import json_format
    from ml_metadata.proto import metadata_store_pb2
    from tfx.orchestration.kubeflow.v2 import compiler_utils
    from tfx.types import artifact
    from tfx.utils import import_utils

    assert artifact_pb.type, "RuntimeArtifact is expected to have a type."
    artifact_cls = import_utils.import_class_by_path(_retrieve_class_path(artifact_pb.type))
    mlmd_artifact = metadata_store_pb2.Artifact()
    if artifact_pb.name:
        artifact_id = int(hashlib.sha256(artifact_pb.name.encode("utf-8")).hexdigest(), 16)
        mlmd_artifact.id = artifact_id % _INT64_MAX
        name_from_id[mlmd_artifact.id] = artifact_pb.name
    mlmd_artifact.uri = artifact_pb.uri
    for k, v in artifact_pb.properties.items():
        mlmd_artifact.properties[k].CopyFrom(compiler_utils.get_mlmd_value(v))
    for k, v in artifact_pb.custom_properties.items():
        mlmd_artifact.custom_properties[k].CopyFrom(compiler_utils.get_mlmd_value(v))
    mlmd_artifact_type = artifact_cls().artifact_type
    for k, v in json_format.MessageToDict(artifact_pb.metadata).items():
        if k in mlmd_artifact_type.properties:
            property_type = mlmd_artifact_type.properties[k]
            if property_type == metadata_store_pb2.INT and isinstance(v, float):
                mlmd_artifact.properties[k].int_value = int(v)
                continue
            elif property_type == metadata_store_pb2.DOUBLE and isinstance(v, float):
                mlmd_artifact.properties[k].double_value = v
                continue
            elif property_type == metadata_store_pb2.STRING and isinstance(v, str):
                mlmd_artifact.properties[k].string_value = v
                continue
            elif property_type == metadata_store_pb2.STRUCT:
                mlmd_artifact.properties[k].struct_value.CopyFrom(artifact._encode_struct_value(v))
                continue
            # Not of the property's type: kept as a custom property.
        if k.startswith(artifact.CUSTOM_PROPERTIES_PREFIX):
            stripped_k = k[len(artifact.CUSTOM_PROPERTIES_PREFIX) :]
            if stripped_k in mlmd_artifact_type.properties:
                k = stripped_k
        mlmd_artifact.custom_properties[k].struct_value.CopyFrom(artifact._encode_struct_value(v))
    result = artifact_cls()
    result.set_mlmd_artifact(mlmd_artifact)
    return result


def _retrieve_class_path(type_schema) -> str:
    """kubeflow_v2_entrypoint_utils._retrieve_class_path."""
    import yaml
    from tfx.orchestration.kubeflow.v2 import compiler_utils

    if type_schema.WhichOneof("kind") == "schema_title":
        title = type_schema.schema_title
    if type_schema.WhichOneof("kind") == "instance_schema":
        title = yaml.safe_load(type_schema.instance_schema).get("title", "tfx.Artifact")
    if title.startswith("system."):  # ours: the KFP UI's types, not importable by their title
        from components.steps.kfp_artifacts import CLASS_PATHS

        return CLASS_PATHS.get(title, title)
    return compiler_utils.TITLE_TO_CLASS_PATH.get(title, title)


def _parse_execution_properties(google_parameters, kubeflow_parameters, inputs_spec, pb2) -> dict:
    """kubeflow_v2_entrypoint_utils.parse_execution_properties: parameter values as Python
    values, integers where the inputs spec declares NUMBER_INTEGER."""
    from google.protobuf import struct_pb2

    result = {}
    exec_properties = google_parameters if inputs_spec else kubeflow_parameters
    for k, v in exec_properties.items():
        if k == _OLD_INPUT_BASE_PROPERTY_NAME:
            k = _INPUT_BASE_KEY
        if isinstance(v, struct_pb2.Value):
            result[k] = getattr(v, v.WhichOneof("kind"))
            if inputs_spec:
                parameter = inputs_spec.parameters.get(k)
                if parameter and parameter.parameter_type == pb2.ParameterType.NUMBER_INTEGER:
                    result[k] = int(result[k])
        elif isinstance(v, pb2.Value):
            result[k] = getattr(v, v.WhichOneof("value"))
        else:
            continue
        if result[k] is None:
            raise TypeError(
                f"Unrecognized type encountered at field {k} of execution properties "
                f"{exec_properties}"
            )
    return result


def _translate_executor_output(output_dict, name_from_id: dict[int, str], pb2) -> dict:
    """kubeflow_v2_entrypoint_utils.translate_executor_output: output key -> ArtifactList."""
    from tfx.types import artifact_utils

    return {
        k: pb2.ArtifactList(
            artifacts=[
                _to_runtime_artifact(artifact_utils.get_single_instance(v), name_from_id, pb2)
            ]
        )
        for k, v in output_dict.items()
    }


def _to_runtime_artifact(artifact_instance, name_from_id: dict[int, str], pb2):
    """kubeflow_v2_entrypoint_utils.to_runtime_artifact: properties and custom properties as
    metadata, the ID as the artifact's runtime name."""
    from absl import logging as absl_logging
    from google.protobuf import json_format, struct_pb2
    from tfx.types import artifact

    def json_values(mapping) -> dict:
        values = {}
        for key, value in mapping.items():
            kind = value.WhichOneof("value")
            if kind is None:
                values[key] = None
            elif kind == "int_value":
                values[key] = float(value.int_value)
            elif kind == "double_value":
                values[key] = value.double_value
            elif kind == "string_value":
                values[key] = value.string_value
            elif kind == "struct_value":
                values[key] = artifact._decode_struct_value(value.struct_value)
            else:
                raise TypeError(f"Get unknown type of value: {value}")
        return values

    metadata_dict = dict(json_values(artifact_instance.mlmd_artifact.properties))
    for key, value in json_values(artifact_instance.mlmd_artifact.custom_properties).items():
        if key in artifact_instance.artifact_type.properties:
            key = artifact.CUSTOM_PROPERTIES_PREFIX + key
        metadata_dict[key] = value
    metadata = struct_pb2.Struct()
    json_format.ParseDict(metadata_dict, metadata)
    result = pb2.RuntimeArtifact(uri=artifact_instance.uri, metadata=metadata)
    id_or_none = getattr(artifact_instance, "id", None)
    if id_or_none is not None and id_or_none in name_from_id:
        result.name = name_from_id[id_or_none]
    else:
        absl_logging.warning(
            "Cannot convert ID back to runtime name for artifact %s", artifact_instance
        )
    return result
