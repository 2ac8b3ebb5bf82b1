"""TF Serving warm-up requests for a pushed version, built from real evaluation rows.

TF Serving replays `<version>/assets.extra/tf_serving_warmup_requests` (a TFRecord file of
PredictionLog protos) when it loads a version, before the version takes traffic, so the first
user request does not pay for graph tracing and lazy initialisation (TFX's InfraValidator
writes the same file). One record per API the version answers: :predict on tf.Examples (one
example, then a batch), :classify, :regress, and :predict on raw feature values.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import struct
import tempfile
from collections.abc import Iterator

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import prediction_log_pb2  # noqa: E402

from components.base import storage  # noqa: E402
from components.base.errors import ActionableError  # noqa: E402
from components.training.export import (  # noqa: E402
    CLASSIFY_SIGNATURE,
    RAW_SIGNATURE,
    REGRESS_SIGNATURE,
    SERVING_SIGNATURE,
)

WARMUP_PATH = "assets.extra/tf_serving_warmup_requests"
BATCH = 16  # rows per batch request; TF Serving caps the file at 1000 records


class WarmupError(ActionableError, ValueError):
    """The warm-up requests cannot be built; nothing is pushed."""


def _records(path: str) -> Iterator[bytes]:
    """The records of a TFRecord file (gzip by its name, as ExampleGen writes them), streamed:
    a reader that stops early reads only the start of the shard, whatever its size."""
    with storage.open_stream(path) as stream:
        while True:
            header = stream.read(12)  # length (uint64 LE) and its CRC
            if len(header) < 12:
                return
            (length,) = struct.unpack("<Q", header[:8])
            yield stream.read(length)
            stream.read(4)  # the data's CRC


def eval_rows(examples_uri: str) -> Iterator[tf.train.Example]:
    """Every row of ExampleGen's eval split, streamed."""
    for path in sorted(storage.list_files(storage.join(examples_uri, "Split-eval", "*"))):
        for record in _records(path):
            yield tf.train.Example.FromString(record)


def eval_examples(examples_uri: str, label_key: str, limit: int = BATCH) -> list[tf.train.Example]:
    """The first `limit` rows of ExampleGen's eval split, without the label `label_key` (a
    serving request has none)."""
    # Closed at once: the shard being read is left as soon as `limit` rows are in.
    with contextlib.closing(eval_rows(examples_uri)) as all_rows:
        rows = list(itertools.islice(all_rows, max(limit, 0)))
    for example in rows:
        del example.features.feature[label_key]
    if not rows:
        raise WarmupError(
            f"no eval rows under {examples_uri}/Split-eval to build TF Serving's warm-up "
            "requests from: nothing was pushed. The eval split of this run is empty; check the "
            "span's size and ExampleGen's split."
        )
    return rows


def _raw_columns(rows: list[tf.train.Example], inputs) -> dict[str, tf.Tensor]:
    """Raw feature values by column, as a client of the raw_features signature sends them; a
    missing optional value is "" or 0, as that signature reads it."""
    columns = {}
    for name, info in inputs.items():
        values = []
        for row in rows:
            feature = row.features.feature.get(name)
            kind = feature.WhichOneof("kind") if feature is not None else None
            listed = list(getattr(feature, kind).value) if kind else []
            values.append(listed[0] if listed else (b"" if info.dtype == types_pb2.DT_STRING
                                                    else 0))  # fmt: skip
        columns[name] = tf.constant(values, dtype=tf.dtypes.as_dtype(info.dtype))
    return columns


def warmup_records(model_name: str, saved_model_pb: bytes, rows: list[tf.train.Example]) -> bytes:
    """The warm-up file's content for a version whose saved_model.pb is `saved_model_pb`:
    only requests for signatures it has (a request TF Serving refuses fails the version's load,
    so a model exported before a signature existed must not be warmed up through it)."""
    signatures = saved_model_pb2.SavedModel.FromString(saved_model_pb).meta_graphs[0].signature_def
    serialized = tf.constant([row.SerializeToString() for row in rows])
    logs = []

    def request(kind: str, signature: str):
        log = prediction_log_pb2.PredictionLog()
        logs.append(log)
        message = getattr(log, kind).request
        message.model_spec.name, message.model_spec.signature_name = model_name, signature
        return message

    for batch in (serialized[:1], serialized):
        predict = request("predict_log", SERVING_SIGNATURE)
        predict.inputs["examples"].CopyFrom(tf.make_tensor_proto(batch))
    for kind, signature in (
        ("classify_log", CLASSIFY_SIGNATURE),
        ("regress_log", REGRESS_SIGNATURE),
    ):
        if signature in signatures:
            request(kind, signature).input.example_list.examples.extend(rows)
    if RAW_SIGNATURE in signatures:
        predict = request("predict_log", RAW_SIGNATURE)
        for name, tensor in _raw_columns(rows, signatures[RAW_SIGNATURE].inputs).items():
            predict.inputs[name].CopyFrom(tf.make_tensor_proto(tensor))
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as local:
        with tf.io.TFRecordWriter(local.name) as writer:
            for log in logs:
                writer.write(log.SerializeToString())
        return open(local.name, "rb").read()


def sample_request(version_dir: str) -> dict | None:
    """The REST body of the largest :predict request on the default signature in a pushed
    version's warm-up file (its evaluation rows as serialized tf.Examples), for comparing two
    versions' predictions on the same rows; None without one."""
    import base64

    best = None
    for record in _records(storage.join(version_dir, WARMUP_PATH)):
        log = prediction_log_pb2.PredictionLog.FromString(record)
        request = log.predict_log.request
        if log.WhichOneof("log_type") != "predict_log" or "examples" not in request.inputs:
            continue
        if request.model_spec.signature_name != SERVING_SIGNATURE:
            continue
        rows = tf.make_ndarray(request.inputs["examples"]).tolist()
        if best is None or len(rows) > len(best):
            best = rows
    if best is None:
        return None
    instances = [{"b64": base64.b64encode(row).decode()} for row in best]
    return {"signature_name": SERVING_SIGNATURE, "instances": instances}
