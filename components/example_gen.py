"""CsvExampleGen that resolves its span inside the executor, reading CSV through Beam's FileSystems.

Stock CsvExampleGen resolves `{SPAN}` in a driver, which open-source Kubeflow Pipelines never runs
(it has no `preCacheCheck` hook), and reads through TensorFlow's `s3://` client, which is broken
against SeaweedFS (README.md, "Object storage notes"). Here the executor lists
`<input_base>/span-N/` itself, so the same component behaves the same under every runner, and
Beam's boto3-based IO does all the reading.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from typing import Any

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from tfx import types
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx.dsl.components.base import base_component, base_driver, executor_spec
from tfx.orchestration import data_types_utils
from tfx.orchestration.portable import base_driver as portable_base_driver
from tfx.proto import example_gen_pb2
from tfx.proto.orchestration import driver_output_pb2
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types.standard_component_specs import FileBasedExampleGenSpec
from tfx.utils import proto_utils
from tfx_bsl.coders import csv_decoder

from components.features import SPAN_PREFIX
from pipelines import storage
from pipelines.config import check_run_parameters
from pipelines.errors import ActionableError

_log = logging.getLogger(__name__)

LATEST_SPAN = -1


class ExampleGenInputError(ActionableError, ValueError):
    """The input data cannot be turned into examples; the message names the file and the fix."""


def resolve_span(input_base: str, span: int) -> tuple[int, list[storage.FileInfo]]:
    """The span to read (the newest when `span` is -1) and its CSV files with their sizes."""
    spans = storage.numbered_children(input_base, SPAN_PREFIX)
    if not spans:
        raise ExampleGenInputError(
            f"no {SPAN_PREFIX}N/ folders under {input_base}: write data there first "
            "(`make add-span` generates the next span)."
        )
    chosen = max(spans) if span == LATEST_SPAN else span
    if chosen not in spans:
        raise ExampleGenInputError(
            f"span {span} requested but {input_base} has spans {sorted(spans)}: "
            "set the span parameter to one of them or -1 for the newest."
        )
    files = storage.list_file_infos(spans[chosen] + "*.csv")
    if not files:
        raise ExampleGenInputError(
            f"{spans[chosen]} holds no .csv files: write the span's CSV files there, or remove "
            "the folder (a span folder counts as soon as it holds any file), or set the span "
            "parameter to another span."
        )
    return chosen, files


def fingerprint(files: list[storage.FileInfo]) -> str:
    return hashlib.sha256(
        "\n".join(f"{f.path}:{f.size}:{f.mtime}" for f in files).encode()
    ).hexdigest()[:16]


def _check_csv_files(files: list[storage.FileInfo]) -> list[str]:
    """The header shared by all files; each must hold a header and at least one row."""
    header: list[str] | None = None
    for info in files:
        if info.size == 0:
            raise ExampleGenInputError(
                f"{info.path} is empty (0 bytes): remove it or write a header and rows"
            )
        with FileSystems.open(info.path) as f:
            head = f.read(64 * 1024).decode("utf-8", errors="replace").splitlines()
        if len(head) < 2 or not any(line.strip() for line in head[1:]):
            raise ExampleGenInputError(f"{info.path} has a header but no data rows")
        columns = [c.strip() for c in head[0].split(",")]
        if header is None:
            header = columns
        elif columns != header:
            raise ExampleGenInputError(
                f"{info.path} has columns {columns}, but {files[0].path} has {header}: "
                "all files of a span must share one header"
            )
    return header or []


class _CsvFilesToExample(beam.PTransform):
    """Stock CSV decoding and type inference, over an explicit file list (no gfile glob)."""

    def __init__(self, exec_properties: dict[str, Any], split_pattern: str):
        self._files = exec_properties["_resolved_files"]
        self._columns = exec_properties["_resolved_columns"]

    def expand(self, pipeline: beam.Pipeline) -> beam.PCollection:
        parsed = (
            pipeline
            | "CreateFilenames" >> beam.Create(self._files)
            | "ReadFromText" >> beam.ParDo(csv_executor._ReadCsvRecordsFromTextFile())
            | "ParseCSVLine" >> beam.ParDo(csv_decoder.ParseCSVLine(delimiter=","))
            | "ExtractParsedCSVLines" >> beam.Keys()
        )
        column_infos = beam.pvalue.AsSingleton(
            parsed
            | "InferColumnTypes"
            >> beam.CombineGlobally(
                csv_decoder.ColumnTypeInferrer(self._columns, skip_blank_lines=True)
            )
        )
        return parsed | "ToTFExample" >> beam.ParDo(
            csv_executor._ParsedCsvToTfExample(), column_infos
        )


class Executor(csv_executor.Executor):
    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:
        return _CsvFilesToExample

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        input_base = exec_properties["input_base"]
        requested = exec_properties.get("span", LATEST_SPAN)
        check_run_parameters("ExampleGen", {"data_root": input_base, "span": requested})
        span, files = resolve_span(input_base, requested)
        columns = _check_csv_files(files)
        _log.info("ExampleGen: reading span %d (%d files) from %s", span, len(files), input_base)
        exec_properties = dict(
            exec_properties, _resolved_files=[f.path for f in files], _resolved_columns=columns
        )
        super().Do(input_dict, output_dict, exec_properties)
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        examples.span = span
        examples.set_string_custom_property("input_base", input_base)
        examples.set_string_custom_property("input_fingerprint", fingerprint(files))


class CacheKeyDriver(base_driver.BaseDriver, portable_base_driver.BaseDriver):
    """Adds the newest span's fingerprint to the step's cache key, for runners that run drivers.

    It resolves nothing the executor relies on: the executor lists the spans again itself. Its only
    effect is that TFX's local cache serves ExampleGen (and so the whole pipeline) when no data
    changed, and re-runs it when a span was added. Kubeflow runs no driver; there the compiled
    step has caching turned off instead (kubeflow/).
    """

    def run(self, execution_info) -> driver_output_pb2.DriverOutput:
        properties = dict(execution_info.exec_properties)
        try:
            span, files = resolve_span(
                properties["input_base"], int(properties.get("span", LATEST_SPAN))
            )
            properties["input_fingerprint"] = f"span-{span}:{fingerprint(files)}"
        except (ExampleGenInputError, storage.StorageError):
            # The executor reports the error. A key that no other run can have: a key derived
            # from the error would let a later run with the same error (an unreachable store)
            # reuse an execution that succeeded after this one's store came back.
            properties["input_fingerprint"] = f"unresolved:{uuid.uuid4().hex}"
        result = driver_output_pb2.DriverOutput()
        for key, value in properties.items():
            if value is not None:
                data_types_utils.set_metadata_value(result.exec_properties[key], value)
        for key, artifacts in execution_info.output_dict.items():
            result.output_artifacts[key].artifacts.extend(a.mlmd_artifact for a in artifacts)
        return result


class SpanExampleGenSpec(types.ComponentSpec):
    PARAMETERS = {
        **FileBasedExampleGenSpec.PARAMETERS,
        "span": component_spec.ExecutionParameter(type=int),
    }
    INPUTS = {}
    OUTPUTS = FileBasedExampleGenSpec.OUTPUTS


class SpanCsvExampleGen(base_component.BaseComponent):
    """Reads `<input_base>/span-<span>/*.csv` (span -1: the newest) into train and eval splits."""

    SPEC_CLASS = SpanExampleGenSpec
    DRIVER_CLASS = CacheKeyDriver
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, input_base: str | Any, span: int | Any = LATEST_SPAN, eval_buckets: int = 1,
                 train_buckets: int = 4):  # fmt: skip
        output_config = example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(
                splits=[
                    example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=train_buckets),
                    example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=eval_buckets),
                ]
            )
        )
        spec = SpanExampleGenSpec(
            input_base=input_base,
            input_config=proto_utils.proto_to_json(
                example_gen_pb2.Input(
                    splits=[example_gen_pb2.Input.Split(name="single_split", pattern="*")]
                )
            ),
            output_config=proto_utils.proto_to_json(output_config),
            output_data_format=example_gen_pb2.FORMAT_TF_EXAMPLE,
            output_file_format=example_gen_pb2.FORMAT_TFRECORDS_GZIP,
            span=span,
            examples=types.Channel(type=standard_artifacts.Examples),
        )
        super().__init__(spec=spec)
