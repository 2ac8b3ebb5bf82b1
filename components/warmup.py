"""TF Serving warm-up requests for a pushed version, built from real evaluation rows.

TF Serving replays `<version>/assets.extra/tf_serving_warmup_requests` (a TFRecord file of
PredictionLog protos) when it loads a version, before the version takes traffic, so the first
user request does not pay for graph tracing and lazy initialisation (TFX's InfraValidator
writes the same file). One record per API the version answers: :predict on tf.Examples (one
example, then a batch), :classify, :regress, and :predict on raw feature values.
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import prediction_log_pb2  # noqa: E402

from components import features  # noqa: E402
from components.model import CLASSIFY_SIGNATURE, RAW_SIGNATURE, SERVING_SIGNATURE  # noqa: E402
from pipelines import storage  # noqa: E402

WARMUP_PATH = "assets.extra/tf_serving_warmup_requests"
BATCH = 16  # rows per batch request; TF Serving caps the file at 1000 records


def eval_examples(examples_uri: str, limit: int = BATCH) -> list[tf.train.Example]:
    """The first `limit` rows of ExampleGen's eval split, without the label (a serving request
    has none)."""
    files = sorted(storage.list_files(storage.join(examples_uri, "Split-eval", "*")))
    rows: list[tf.train.Example] = []
    for path in files:
        with tempfile.NamedTemporaryFile(suffix=".gz") as local:
            local.write(storage.read_bytes(path))
            local.flush()
            dataset = tf.data.TFRecordDataset(local.name, compression_type="GZIP")
            for record in dataset.take(limit - len(rows)).as_numpy_iterator():
                example = tf.train.Example.FromString(record)
                del example.features.feature[features.LABEL_KEY]
                rows.append(example)
        if len(rows) >= limit:
            break
    if not rows:
        raise ValueError(f"no eval rows under {examples_uri}/Split-eval to build warm-up from")
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
    only requests for signatures it has."""
    signatures = saved_model_pb2.SavedModel.FromString(saved_model_pb).meta_graphs[0].signature_def
    serialized = tf.constant([row.SerializeToString() for row in rows])
    logs = []
    for batch in (serialized[:1], serialized):
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name, request.model_spec.signature_name = model_name, SERVING_SIGNATURE
        request.inputs["examples"].CopyFrom(tf.make_tensor_proto(batch))
        logs.append(log)
    if CLASSIFY_SIGNATURE in signatures:
        log = prediction_log_pb2.PredictionLog()
        request = log.classify_log.request
        request.model_spec.name, request.model_spec.signature_name = model_name, CLASSIFY_SIGNATURE
        request.input.example_list.examples.extend(rows)
        logs.append(log)
    log = prediction_log_pb2.PredictionLog()
    request = log.regress_log.request
    request.model_spec.name, request.model_spec.signature_name = model_name, SERVING_SIGNATURE
    request.input.example_list.examples.extend(rows)
    logs.append(log)
    if RAW_SIGNATURE in signatures:
        log = prediction_log_pb2.PredictionLog()
        request = log.predict_log.request
        request.model_spec.name, request.model_spec.signature_name = model_name, RAW_SIGNATURE
        for name, tensor in _raw_columns(rows, signatures[RAW_SIGNATURE].inputs).items():
            request.inputs[name].CopyFrom(tf.make_tensor_proto(tensor))
        logs.append(log)
    with tempfile.NamedTemporaryFile(suffix=".tfrecord") as local:
        with tf.io.TFRecordWriter(local.name) as writer:
            for log in logs:
                writer.write(log.SerializeToString())
        return open(local.name, "rb").read()
