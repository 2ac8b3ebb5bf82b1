"""A span's CSV files to train and eval tf.Examples in one streamed pass, typed by the schema.

Stock CsvExampleGen (and the inference path in example_gen.py, kept for data the schema does not
cover) reads every row twice through Beam, once to infer each column's type over all rows and
once to convert it, holds the parsed rows between the two, then shuffles every example through
a GroupByKey: its cost per row and its memory grow with the span. Here the curated schema gives
the types, so each file is one Beam element whose DoFn streams it once: the rows checked by
csv_input as they come (the same checks, the same messages), converted a batch at a time by
Arrow, encoded to tf.Examples by tfx_bsl's C++ encoder, split by a hash of the row, shuffled in
a bounded buffer and written to gzip TFRecord shards. Memory is bounded by the batch and the
buffer, whatever the span's size; a span of several files spreads over the runner's workers.

The examples are the ones the stock conversion makes (an empty cell is an empty list of the
column's type, a FLOAT is the cell's Python float stored as float32), in another byte order of
their features. A cell that is not of the schema's type stops the fast read
(SchemaTypeMismatch): the executor then reads the span with inferred types, as before, so that
the ExampleValidator reports every difference from the schema with its statistics.
"""

from __future__ import annotations

import bisect
import hashlib
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tensorflow_metadata.proto.v0 import schema_pb2

from components.base import storage
from components.steps import csv_input

_log = logging.getLogger(__name__)

BATCH_ROWS = 65_536  # rows converted and encoded at a time
# Examples each split's writer holds and shuffles before writing them (stock ExampleGen
# shuffles the whole split through a GroupByKey, which holds it all): about 50 MB of taxi rows.
SHUFFLE_RECORDS = 200_000
FILE_NAME = "data_tfrecord"  # tfx's write_split.DEFAULT_FILE_NAME: -<shard>-of-<shards>.gz
_TYPE_NAMES = {schema_pb2.INT: "INT", schema_pb2.FLOAT: "FLOAT", schema_pb2.BYTES: "BYTES"}
_INT64 = np.iinfo(np.int64)


class SchemaTypeMismatch(Exception):
    """A cell the schema's type does not fit: the span is read with inferred types instead."""

    def __init__(self, path: str, line: int, column: str, value: str, kind: int):
        self.path, self.line, self.column, self.value = path, line, column, value
        super().__init__(f"{path}, line {line}: column {column!r} holds {value[:80]!r}, not "
                         f"the schema's {_TYPE_NAMES[kind]}")  # fmt: skip


def schema_types(schema: schema_pb2.Schema, columns: list[str]) -> dict[str, int] | None:
    """Each column's type in the schema; None when a column is not in it (or has no type
    ExampleGen writes), which only inferring from the data can type."""
    declared = {f.name: f.type for f in schema.feature if f.type in _TYPE_NAMES}
    if any(name not in declared for name in columns):
        return None
    return {name: declared[name] for name in columns}


def _python_values(cells, lines: list[int], column: str, kind: int, path: str) -> pa.Array:
    """The non-empty cells converted as the stock conversion does (int(), float()): what Arrow
    refused (a space around a number, say) may still be a number to Python."""
    convert = int if kind == schema_pb2.INT else float
    values = []
    for index, cell in enumerate(cells):
        if not cell:
            continue
        try:
            value = convert(cell)
        except ValueError:
            raise SchemaTypeMismatch(path, lines[index], column, cell, kind) from None
        if kind == schema_pb2.INT and not _INT64.min <= value <= _INT64.max:
            raise SchemaTypeMismatch(path, lines[index], column, cell, kind)
        values.append(value)
    return pa.array(values, type=pa.int64() if kind == schema_pb2.INT else pa.float64())


def typed_batch(rows: list[list[str]], lines: list[int], columns: list[str],
                types: dict[str, int], path: str) -> pa.RecordBatch:  # fmt: skip
    """The rows as tf.Example-ready lists, one column a list array: an empty cell an empty
    list, any other a list of its one value of the schema's type."""
    arrays = []
    for name, cells in zip(columns, zip(*rows, strict=True), strict=True):
        kind = types[name]
        strings = pa.array(cells, type=pa.string())
        present = pc.not_equal(strings, "")
        values = strings.filter(present)
        if kind == schema_pb2.BYTES:
            values = values.cast(pa.binary())
        else:
            target = pa.int64() if kind == schema_pb2.INT else pa.float64()
            try:
                values = values.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                values = _python_values(cells, lines, name, kind, path)
            if kind == schema_pb2.FLOAT:  # a FloatList holds float32, rounded as protobuf does
                values = values.cast(pa.float32(), safe=False)
        counts = present.cast(pa.int32()).to_numpy(zero_copy_only=False)
        offsets = np.zeros(len(cells) + 1, dtype=np.int32)
        np.cumsum(counts, out=offsets[1:])
        arrays.append(pa.ListArray.from_arrays(pa.array(offsets), values))
    return pa.RecordBatch.from_arrays(arrays, columns)


class _Shard:
    """One split's TFRecord shard of one input file: examples shuffled in a bounded buffer,
    written gzip-compressed by TensorFlow's writer to a local file, uploaded when closed."""

    def __init__(self, local: str, seed: str):
        import tensorflow as tf

        os.makedirs(os.path.dirname(local), exist_ok=True)
        self._writer = tf.io.TFRecordWriter(local, tf.io.TFRecordOptions(compression_type="GZIP"))
        self._buffer: list[bytes] = []
        self._random = random.Random(seed)  # the same files in the same order every run
        self.count = 0

    def add(self, records: list[bytes]) -> None:
        self._buffer.extend(records)
        self.count += len(records)
        if len(self._buffer) >= SHUFFLE_RECORDS:
            self._flush()

    def _flush(self) -> None:
        self._random.shuffle(self._buffer)
        for record in self._buffer:
            self._writer.write(record)
        self._buffer.clear()

    def close(self) -> None:
        self._flush()
        self._writer.close()


@beam.typehints.with_input_types(tuple[int, str, bool])
class _WriteCsvFile(beam.DoFn):
    """(shard index, path, hash-split?) -> the file's examples in each split's folder; yields
    {split: examples written}. Older spans of a window go to train whole (split=False)."""

    def __init__(self, columns: list[str], types: dict[str, int], encoding: str,
                 splits: list[tuple[str, int]], examples_uri: str, shards: int):  # fmt: skip
        self._columns, self._types, self._encoding = columns, types, encoding
        self._names = [name for name, _ in splits]
        self._bounds = [int(b) for b in np.cumsum([buckets for _, buckets in splits])]
        self._examples_uri, self._shards = examples_uri, shards
        # The split key: the row's cells in column-name order, so a file whose columns come in
        # another order splits its rows as the first file does.
        self._key_order = [columns.index(name) for name in sorted(columns)]

    def process(self, element: tuple[int, str, bool]) -> Iterator[dict[str, int]]:
        from tfx_bsl.coders import example_coder

        index, path, split = element
        started = time.monotonic()
        local = tempfile.mkdtemp(prefix="example-gen-")
        try:
            name = f"{FILE_NAME}-{index:05d}-of-{self._shards:05d}.gz"
            shards = {s: _Shard(os.path.join(local, f"Split-{s}", name), f"{path}:{s}")
                      for s in (self._names if split else ["train"])}  # fmt: skip
            encoder = example_coder.RecordBatchToExamplesEncoder()
            rows = csv_input.numbered_rows(path, self._columns, self._encoding)
            for lines, batch in _batches(rows):
                records = encoder.encode(typed_batch(batch, lines, self._columns, self._types,
                                                     path))  # fmt: skip
                if not split:
                    shards["train"].add(records)
                    continue
                chosen: dict[str, list[bytes]] = {s: [] for s in shards}
                for row, record in zip(batch, records, strict=True):
                    chosen[self._split_of(row)].append(record)
                for name_, part in chosen.items():
                    shards[name_].add(part)
            for shard in shards.values():
                shard.close()
            storage.copy_tree(local, self._examples_uri)
            counts = {s: shard.count for s, shard in shards.items()}
            _log.info("ExampleGen: %s: %s examples in %.1f s", path,
                      ", ".join(f"{n} {s}" for s, n in counts.items()),
                      time.monotonic() - started)  # fmt: skip
            yield counts
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _split_of(self, row: list[str]) -> str:
        """Stock ExampleGen's bucketing (sha256, modulo the buckets, bisect), of the row."""
        key = "\x1f".join([row[i] for i in self._key_order]).encode()
        bucket = int.from_bytes(hashlib.sha256(key).digest(), "big") % self._bounds[-1]
        return self._names[bisect.bisect(self._bounds, bucket)]


def _batches(rows: Iterator) -> Iterator[tuple[list[int], list[list[str]]]]:
    lines, batch = [], []
    for line, row in rows:
        lines.append(line)
        batch.append(row)
        if len(batch) == BATCH_ROWS:
            yield lines, batch
            lines, batch = [], []
    if batch:
        yield lines, batch


class WriteCsvExamples(beam.PTransform):
    """Writes the examples of `files` ((path, hash-split?) each) into `examples_uri`'s split
    folders; a PCollection of one {split: examples} per file."""

    def __init__(self, files: list[tuple[str, bool]], columns: list[str], types: dict[str, int],
                 encoding: str, splits: list[tuple[str, int]], examples_uri: str):  # fmt: skip
        super().__init__()
        self._files = [(index, path, split) for index, (path, split) in enumerate(files)]
        self._writer = _WriteCsvFile(columns, types, encoding, splits, examples_uri, len(files))

    def expand(self, pbegin: beam.pvalue.PBegin) -> beam.PCollection:
        return (
            pbegin
            | "Files" >> beam.Create(self._files)
            | "Spread" >> beam.Reshuffle()  # one file per worker where the runner has several
            | "Write" >> beam.ParDo(self._writer)
        )
