"""Loading a pushed model and asking it for predictions on raw rows, as a serving client would."""

from __future__ import annotations

import csv
import functools
import io
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from components import features  # noqa: E402
from pipelines import storage  # noqa: E402
from pipelines.config import REPO_ROOT  # noqa: E402


@functools.cache
def feature_types(schema_path: Path = REPO_ROOT / "schemas" / "schema.pbtxt") -> dict[str, int]:
    """Column name to schema_pb2.FeatureType, from the curated schema."""
    schema = text_format.Parse(schema_path.read_text(), schema_pb2.Schema())
    return {feature.name: feature.type for feature in schema.feature}


def row_to_example(row: dict[str, str]) -> bytes:
    """A serialized tf.Example of one raw CSV row (label left out; empty cells left out)."""
    feature = {}
    types = feature_types()
    for key, value in row.items():
        if key == features.LABEL_KEY or value in ("", None):
            continue
        if types.get(key) == schema_pb2.FLOAT:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        elif types.get(key) == schema_pb2.INT:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        else:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def read_rows(csv_path: str, limit: int) -> list[dict[str, str]]:
    """The first `limit` data rows of a CSV file in object storage."""
    text = storage.read_bytes(csv_path).decode()
    return [row for _, row in zip(range(limit), csv.DictReader(io.StringIO(text)), strict=False)]


def predict(model_dir: str, rows: list[dict[str, str]]) -> list[float]:
    """Probabilities from a pushed SavedModel's serving signature for raw rows.

    The model is copied to local disk first, as TF Serving's own storage layer does; TensorFlow's
    `s3://` client is not reliable against SeaweedFS (README.md, "Object storage notes").
    """
    with tempfile.TemporaryDirectory() as local_dir:
        if "://" in model_dir:
            storage.copy_tree(model_dir, local_dir)
        else:
            local_dir = model_dir
        model = tf.saved_model.load(local_dir)
        signature = model.signatures["serving_default"]
        examples = tf.constant([row_to_example(row) for row in rows])
        outputs = signature(examples=examples)
        return [float(p) for p in next(iter(outputs.values())).numpy().reshape(-1)]


def sample_predictions(model_dir: str, span_dir: str, limit: int = 5) -> list[str]:
    """Lines for the console: the model's predictions on the first rows of a span's first CSV
    file (the span the run trained and evaluated on)."""
    files = storage.list_files(span_dir.rstrip("/") + "/*.csv")
    if not files:
        return [f"No .csv file under {span_dir}: no predictions to show."]
    rows = read_rows(files[0], limit)
    probabilities = predict(model_dir, rows)
    lines = [
        f"Predictions of {model_dir} on the first rows of {files[0]}:",
        f"  {'payment_type':<12} {'fare':>7} {'miles':>6}  P(big tip)  actual",
    ]
    for row, p in zip(rows, probabilities, strict=True):
        lines.append(f"  {row['payment_type']:<12} {row['fare']:>7} {row['trip_miles']:>6}  "
                     f"{p:10.3f}  {row[features.LABEL_KEY]}")  # fmt: skip
    return lines
