"""ExampleGen that reads the spans chosen by SelectSpans, through Beam's FileSystems: CSV files
as stock CsvExampleGen does, or images in one folder per class (components/steps/image_input.py).

Stock CsvExampleGen resolves `{SPAN}` in a driver, which open-source Kubeflow Pipelines never runs
(it has no `preCacheCheck` hook), and reads through TensorFlow's `s3://` client, which is broken
against SeaweedFS (README.md, "Object storage notes"). Here the spans come resolved from the
SelectSpans step (components/steps/span_selection.py), so every runner reads the same files, and
Beam's boto3-based IO does all the reading. With a window of several spans, the newest span is
split into train and eval by hash as usual and the older spans all go to train: the model trains on
the window and is evaluated on the newest span only.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from typing import Any

import apache_beam as beam
from google.protobuf import text_format
from tensorflow_metadata.proto.v0 import schema_pb2
from tfx import types
from tfx.components.example_gen import write_split
from tfx.components.example_gen.csv_example_gen import executor as csv_executor
from tfx.components.util import examples_utils
from tfx.dsl.components.base import base_component, executor_spec
from tfx.proto import example_gen_pb2
from tfx.types import artifact_utils, component_spec, standard_artifacts
from tfx.types.standard_component_specs import FileBasedExampleGenSpec
from tfx.utils import io_utils, proto_utils
from tfx_bsl.coders import csv_decoder

from components.base import spans, storage
from components.steps import csv_examples, csv_input, image_input
from components.steps.span_selection import ExampleGenInputError, SpanSelection, read_selection
from components.steps.step_outputs import CLASS_NAMES_KEY

__all__ = ["ExampleGenInputError", "SpanExampleGen"]

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


def _files_to_example(exec_properties: dict[str, Any], split_pattern: str) -> beam.PTransform:
    """The reader of the span's input format."""
    if (exec_properties.get("input_format") or spans.CSV) == spans.CSV:
        return CsvFilesToExample(exec_properties, split_pattern)
    return image_input.ImageFilesToExample(exec_properties, split_pattern)


def cause_of(error: BaseException, kind: type) -> BaseException | None:
    """The first error of `kind` in the chain of causes (Beam wraps a DoFn's), else None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, kind):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


class Executor(csv_executor.Executor):
    def GetInputSourceToExamplePTransform(self) -> beam.PTransform:
        return _files_to_example

    def Do(self, input_dict, output_dict, exec_properties) -> None:
        selection = read_selection(artifact_utils.get_single_instance(input_dict["selection"]))
        newest, older = selection["span"], sorted(set(selection["spans"]) - {selection["span"]})
        if (exec_properties.get("input_format") or spans.CSV) == spans.CSV:
            exec_properties = self._csv_properties(selection, newest, older, exec_properties)
            if not self._write_typed_by_schema(input_dict, output_dict, exec_properties):
                super().Do(input_dict, output_dict, exec_properties)
        else:
            self._read_images(input_dict, output_dict, exec_properties, selection, newest, older)
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        examples.span = newest
        examples.set_string_custom_property("input_base", exec_properties["input_base"])
        examples.set_string_custom_property("spans", str(sorted(selection["spans"])))
        examples.set_string_custom_property("input_fingerprint", selection["fingerprint"])

    @staticmethod
    def _csv_properties(selection, newest: int, older: list[int], exec_properties) -> dict:
        files = [path for n in [newest, *older] for path in selection["spans"][n]["files"]]
        encoding = exec_properties.get("input_encoding") or "utf-8"
        # Each file's start (its encoding, its header, the column sets) checked before Beam
        # starts; its rows as the read streams them, with the same checks and messages.
        columns = csv_input.check_csv_files(files, encoding, rows=False)
        window = f" and older spans {older} for training" if older else ""
        _log.info("ExampleGen: reading span %d%s (%d files)", newest, window, len(files))
        return dict(
            exec_properties,
            _resolved_files=selection["spans"][newest]["files"],
            _older_files=[path for n in older for path in selection["spans"][n]["files"]],
            _resolved_columns=columns,
            _input_encoding=encoding,
        )

    def _write_typed_by_schema(self, input_dict, output_dict, exec_properties) -> bool:
        """The span's examples typed by the curated schema, in one streamed pass
        (components/steps/csv_examples.py); False, with nothing written, when the step has no
        schema, the schema lacks a column, or a cell does not fit its column's type: the span
        is then read with types inferred from the data."""
        if not input_dict.get("schema"):
            return False
        schema_dir = artifact_utils.get_single_uri(input_dict["schema"])
        schema = text_format.Parse(
            storage.read_bytes(io_utils.get_only_uri_in_dir(schema_dir)).decode(),
            schema_pb2.Schema(),
        )
        columns = exec_properties["_resolved_columns"]
        types = csv_examples.schema_types(schema, columns)
        if types is None:
            missing = sorted(set(columns) - {f.name for f in schema.feature})
            _log.info("ExampleGen: columns %s are not in the schema: their types are inferred "
                      "from the data (two passes)", missing)  # fmt: skip
            return False
        output_config = example_gen_pb2.Output()
        proto_utils.json_to_proto(exec_properties["output_config"], output_config)
        splits = [(s.name, s.hash_buckets) for s in output_config.split_config.splits]
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        files = [(path, True) for path in exec_properties["_resolved_files"]]
        files += [(path, False) for path in exec_properties["_older_files"]]
        try:
            with self._make_beam_pipeline() as pipeline:
                _ = pipeline | "WriteCsvExamples" >> csv_examples.WriteCsvExamples(
                    files, columns, types, exec_properties["_input_encoding"], splits,
                    examples.uri,
                )  # fmt: skip
        except Exception as error:
            mismatch = cause_of(error, csv_examples.SchemaTypeMismatch)
            if mismatch is None:
                raise
            _log.warning("ExampleGen: %s: reading the span with types inferred from the data, "
                         "so that the ExampleValidator reports every difference from the "
                         "schema", mismatch)  # fmt: skip
            storage.delete_tree(examples.uri)
            return False
        examples.split_names = artifact_utils.encode_split_names([name for name, _ in splits])
        examples_utils.set_payload_format(examples, exec_properties["output_data_format"])
        examples_utils.set_file_format(
            examples, write_split.to_file_format_str(exec_properties["output_file_format"])
        )
        return True

    def _read_images(self, input_dict, output_dict, exec_properties, selection, newest, older):
        """Checks the spans' layout and classes, writes the examples, then fails naming every
        file that is no usable image; records the classes once the span's images all are."""
        per_span = {}
        for number in [newest, *older]:
            chosen = selection["spans"][number]
            listed = {i.path: i for i in spans.span_files(chosen["folder"], spans.IMAGE_FOLDERS)}
            infos = [listed.get(p, storage.FileInfo(p, -1, 0.0)) for p in chosen["files"]]
            per_span[number] = image_input.check_layout(chosen["folder"], infos)
        record_path = image_input.classes_path(
            exec_properties["serving_root"], exec_properties["model_name"]
        )
        recorded = image_input.read_recorded_classes(record_path)
        configured = [c for c in (exec_properties.get("class_names") or "").split(",") if c]
        classes = image_input.choose_classes(per_span, configured, recorded, record_path)

        def labelled(numbers: list[int]) -> list[list]:
            return [[path, classes.index(name), name] for n in numbers
                    for name, paths in sorted(per_span[n].items()) for path in paths]  # fmt: skip

        images, older_images = labelled([newest]), labelled(older)
        window = f" and {len(older_images)} of older spans {older} for training" if older else ""
        _log.info("ExampleGen: reading %d images of span %d%s; classes %s", len(images), newest,
                  window, classes)  # fmt: skip
        rejects = storage.join(self._scratch_dir(), "rejected-images")
        self._write_unshuffled(output_dict, dict(
            exec_properties, _resolved_images=images, _older_images=older_images,
            _rejects_prefix=rejects,
        ))  # fmt: skip
        rejected = image_input.read_rejects(rejects)
        if rejected:
            raise image_input.rejected_error(rejected, len(images) + len(older_images))
        if recorded is None or list(recorded["classes"]) != classes:
            image_input.record_classes(record_path, classes, newest)
            _log.info("ExampleGen: the model's classes %s are recorded in %s", classes, record_path)
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        examples.set_string_custom_property(CLASS_NAMES_KEY, json.dumps(classes))

    def _write_unshuffled(self, output_dict, exec_properties) -> None:
        """What the base executor's Do does, but each split is written as it streams by: TFX's
        WriteSplit reshuffles before writing (a GroupByKey over every serialized example), which
        the in-memory runner holds whole, images included; here memory stays bounded by
        ImageFilesToExample's batches."""
        examples = artifact_utils.get_single_instance(output_dict["examples"])
        examples.split_names = artifact_utils.encode_split_names(["train", "eval"])
        with self._make_beam_pipeline() as pipeline:
            for name, split in self.GenerateExamplesByBeam(pipeline, exec_properties).items():
                path = os.path.join(artifact_utils.get_split_uri([examples], name),
                                    write_split.DEFAULT_FILE_NAME)  # fmt: skip
                serialized = split | f"Serialize[{name}]" >> beam.ParDo(
                    write_split.MaybeSerialize()
                )
                _ = serialized | f"Write[{name}]" >> beam.io.WriteToTFRecord(
                    path, file_name_suffix=".gz"
                )
        examples_utils.set_payload_format(examples, exec_properties["output_data_format"])
        examples_utils.set_file_format(
            examples, write_split.to_file_format_str(exec_properties["output_file_format"])
        )

    def _scratch_dir(self) -> str:
        """The execution's temporary folder (runners give one), else a local one."""
        try:
            return self._get_tmp_dir()
        except RuntimeError:
            return tempfile.mkdtemp(prefix="example-gen-")

    def GenerateExamplesByBeam(self, pipeline, exec_properties):
        """The stock hash split of the newest span; the older spans of a window all go to train."""
        splits = super().GenerateExamplesByBeam(pipeline, exec_properties)
        older = {"_resolved_files": exec_properties.get("_older_files"),
                 "_resolved_images": exec_properties.get("_older_images")}  # fmt: skip
        older = {key: value for key, value in older.items() if value}
        if older:
            rejects = exec_properties.get("_rejects_prefix", "") + "-older"
            read = _files_to_example(dict(exec_properties, **older, _rejects_prefix=rejects), "*")
            older = pipeline | "OlderSpans" >> read
            splits["train"] = (splits["train"], older) | "TrainOnWindow" >> beam.Flatten()
        return splits


class SpanExampleGenSpec(types.ComponentSpec):
    PARAMETERS = {
        **FileBasedExampleGenSpec.PARAMETERS,
        "input_encoding": component_spec.ExecutionParameter(type=str),
        # Image folders (components/steps/image_input.py): the reader's options (JSON), the
        # configured classes (comma-separated, "" for the recorded ones) and the served model's
        # folder, where the classes are recorded.
        "input_format": component_spec.ExecutionParameter(type=str, optional=True),
        "input_options": component_spec.ExecutionParameter(type=str, optional=True),
        "class_names": component_spec.ExecutionParameter(type=str, optional=True),
        "serving_root": component_spec.ExecutionParameter(type=str, optional=True),
        "model_name": component_spec.ExecutionParameter(type=str, optional=True),
    }
    INPUTS = {
        "selection": component_spec.ChannelParameter(type=SpanSelection),
        # The curated schema: a CSV span's column types (csv_examples.py), read in one pass.
        "schema": component_spec.ChannelParameter(type=standard_artifacts.Schema, optional=True),
    }
    OUTPUTS = FileBasedExampleGenSpec.OUTPUTS


class SpanExampleGen(base_component.BaseComponent):
    """Reads the spans of `selection` into train and eval splits; `input_base` is the data root
    they were chosen from (recorded on the examples). Image folders need `serving_root` and
    `model_name` (where the model's classes are recorded), and are split by a hash of each
    file's path, so a file stays on its side in every run."""

    SPEC_CLASS = SpanExampleGenSpec
    EXECUTOR_SPEC = executor_spec.BeamExecutorSpec(Executor)

    def __init__(self, selection: types.BaseChannel, input_base: str | Any,
                 input_encoding: str = "utf-8", eval_buckets: int = 1,
                 train_buckets: int = 4, input_format: str = spans.CSV,
                 input_options: dict | None = None, class_names: str = "",
                 serving_root: str | Any = None, model_name: str | Any = None,
                 schema: types.BaseChannel | None = None):  # fmt: skip
        images = input_format == spans.IMAGE_FOLDERS
        output_config = example_gen_pb2.Output(
            split_config=example_gen_pb2.SplitConfig(
                splits=[
                    example_gen_pb2.SplitConfig.Split(name="train", hash_buckets=train_buckets),
                    example_gen_pb2.SplitConfig.Split(name="eval", hash_buckets=eval_buckets),
                ],
                partition_feature_name=image_input.PATH_KEY if images else None,
            )
        )
        image_settings = dict(
            input_format=input_format,
            input_options=json.dumps(dict(input_options or {}), sort_keys=True),
            class_names=class_names,
            serving_root=serving_root,
            model_name=model_name,
        ) if images else {}  # fmt: skip
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
            **image_settings,
            selection=selection,
            schema=schema,
            examples=types.Channel(type=standard_artifacts.Examples),
        )
        super().__init__(spec=spec)
