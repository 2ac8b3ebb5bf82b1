"""CsvExampleGen that reads the spans chosen by SelectSpans, through Beam's FileSystems.

Stock CsvExampleGen resolves `{SPAN}` in a driver, which open-source Kubeflow Pipelines never runs
(it has no `preCacheCheck` hook), and reads through TensorFlow's `s3://` client, which is broken
against SeaweedFS (README.md, "Object storage notes"). Here the spans come resolved from the
SelectSpans step (components/steps/span_selection.py), so every runner reads the same files, and
Beam's boto3-based IO does all the reading. With a window of several spans, the newest span is
split into train and eval by hash as usual and the older spans all go to train: the model trains on
the window and is evaluated on the newest span only.
"""

from __future__ import annotations

import logging
from typing import Any

import apache_beam as beam
from tfx import types
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types.standard_component_specs import FileBasedExampleGenSpec
from tfx.utils import proto_utils
from tfx_bsl.coders import csv_decoder

from components.steps import csv_input
from components.steps.span_selection import ExampleGenInputError, SpanSelection, read_selection

__all__ = ["ExampleGenInputError", "SpanCsvExampleGen"]

_log = logging.getLogger(__name__)


class CsvFilesToExample(beam.PTransform):
    """Stock type inference and tf.Example conversion over an explicit file list (no gfile glob),
    read by csv_input: checked, decoded from `_input_encoding`, columns in `_resolved_columns`'
    order."""

    def __init__(self, exec_properties: dict[str, Any], split_pattern: str):
        super().__init__()
        self._files = list(exec_properties["_resolved_files"])
        self._columns = list(exec_properties["_resolved_columns"])
        self._encoding = exec_properties.get("_input_encoding") or "utf-8"

    def expand(self, pipeline: beam.Pipeline) -> beam.PCollection:
        parsed = pipeline | "ReadCsvRecords" >> csv_input.ReadCsvRecords(
            self._files, self._columns, self._encoding
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
        return CsvFilesToExample

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        selection = read_selection(artifact_utils.get_single_instance(input_dict["selection"]))
        newest, older = selection["span"], sorted(set(selection["spans"]) - {selection["span"]})
        files = [path for n in [newest, *older] for path in selection["spans"][n]["files"]]
        encoding = exec_properties.get("input_encoding") or "utf-8"
        # Every file read to its end before Beam starts: a bad file stops the step with its name,
        # line and problem, not with an error from inside Beam.
        columns = csv_input.check_csv_files(files, encoding)
        window = f" and older spans {older} for training" if older else ""
        _log.info("ExampleGen: reading span %d%s (%d files)", newest, window, len(files))
        exec_properties = dict(
            exec_properties,
            _resolved_files=selection["spans"][newest]["files"],
            _older_files=[path for n in older for path in selection["spans"][n]["files"]],
            _resolved_columns=columns,
            _input_encoding=encoding,
        )
        super().Do(input_dict, output_dict, exec_properties)
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        examples.span = newest
        examples.set_string_custom_property("input_base", exec_properties["input_base"])
        examples.set_string_custom_property("spans", str(sorted(selection["spans"])))
        examples.set_string_custom_property("input_fingerprint", selection["fingerprint"])

    def GenerateExamplesByBeam(self, pipeline, exec_properties):
        """The stock hash split of the newest span; the older spans of a window all go to train."""
        splits = super().GenerateExamplesByBeam(pipeline, exec_properties)
        if exec_properties["_older_files"]:
            older = pipeline | "OlderSpans" >> CsvFilesToExample(
                dict(exec_properties, _resolved_files=exec_properties["_older_files"]), "*"
            )
            splits["train"] = (splits["train"], older) | "TrainOnWindow" >> beam.Flatten()
        return splits


class SpanExampleGenSpec(types.ComponentSpec):
    PARAMETERS = {
        **FileBasedExampleGenSpec.PARAMETERS,
        "input_encoding": component_spec.ExecutionParameter(type=str),
    }
    INPUTS = {"selection": component_spec.ChannelParameter(type=SpanSelection)}
    OUTPUTS = FileBasedExampleGenSpec.OUTPUTS


class SpanCsvExampleGen(base_component.BaseComponent):
    """Reads the spans of `selection` into train and eval splits; `input_base` is the data root
    they were chosen from (recorded on the examples)."""

    SPEC_CLASS = SpanExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, selection: types.BaseChannel, input_base: str | Any,
                 input_encoding: str = "utf-8", eval_buckets: int = 1,
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
            input_encoding=input_encoding,
            selection=selection,
            examples=types.Channel(type=standard_artifacts.Examples),
        )
        super().__init__(spec=spec)
