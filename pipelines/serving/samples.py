"""Loading a pushed model and asking it for predictions on raw rows, as a serving client would."""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from google.protobuf import text_format  # noqa: E402
from tensorflow_metadata.proto.v0 import schema_pb2  # noqa: E402

from components.base import spans, storage  # noqa: E402
from components.base.use_case import UseCase  # noqa: E402
from components.steps.csv_input import first_rows  # noqa: E402


@functools.cache
def feature_types(schema_path: Path) -> dict[str, int]:
    """Column name to schema_pb2.FeatureType, from a curated schema."""
    schema = text_format.Parse(schema_path.read_text(), schema_pb2.Schema())
    return {feature.name: feature.type for feature in schema.feature}


def row_to_example(row: dict[str, str], use_case: UseCase) -> bytes:
    """A serialized tf.Example of one raw CSV row (label left out; empty cells left out)."""
    feature = {}
    types = feature_types(use_case.schema_path)
    for key, value in row.items():
        if key == use_case.label_key or value in ("", None):
            continue
        if types.get(key) == schema_pb2.FLOAT:
            feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=[float(value)]))
        elif types.get(key) == schema_pb2.INT:
            feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))
        else:
            feature[key] = tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode()]))
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def read_rows(csv_path: str, limit: int, encoding: str = "utf-8") -> list[dict[str, str]]:
    """The first `limit` data rows of a span's CSV file, read as ExampleGen reads it."""
    return first_rows(csv_path, limit, encoding)


def predict(model_dir: str, rows: list[dict[str, str]], use_case: UseCase) -> list[float]:
    """Probabilities from a pushed SavedModel's serving signature for raw rows.

    The model is copied to local disk first, as TF Serving's own storage layer does; TensorFlow's
    `s3://` client is not reliable against SeaweedFS (README.md, "Object storage notes").
    """
    with tempfile.TemporaryDirectory() as local_dir:
        signature = _local_model(model_dir, local_dir).signatures["serving_default"]
        examples = tf.constant([row_to_example(row, use_case) for row in rows])
        outputs = signature(examples=examples)
        return [float(p) for p in next(iter(outputs.values())).numpy().reshape(-1)]


def _local_model(model_dir: str, local_dir: str):
    if "://" in model_dir:
        storage.copy_tree(model_dir, local_dir)
        return tf.saved_model.load(local_dir)
    return tf.saved_model.load(model_dir)


def images_by_class(span_dir: str) -> dict[str, list[str]]:
    """An image span's files per class folder, in listing order."""
    span_dir = span_dir.rstrip("/") + "/"
    found: dict[str, list[str]] = {}
    for info in spans.span_files(span_dir, spans.IMAGE_FOLDERS):
        found.setdefault(info.path[len(span_dir) :].split("/")[0], []).append(info.path)
    return found


def image_scores(model_dir: str, paths: list[str]) -> dict[str, tf.Tensor]:
    """A pushed model's outputs (classes, scores) for image files, sent as a client sends them:
    the files' bytes to the raw_features signature."""
    from components.training.export import RAW_SIGNATURE

    with tempfile.TemporaryDirectory() as local_dir:
        signature = _local_model(model_dir, local_dir).signatures[RAW_SIGNATURE]
        return signature(image=tf.constant([storage.read_bytes(path) for path in paths]))


def image_predictions(model_dir: str, span_dir: str, limit: int = 5) -> list[str]:
    """The served model's answer to the first image of each class folder (up to `limit`)."""
    paths = sorted(found[0] for found in images_by_class(span_dir).values())[:limit]
    if not paths:
        return [f"No image under {span_dir}: no predictions to show."]
    outputs = image_scores(model_dir, paths)
    lines = [f"Predictions of {model_dir} on the first image of each class in {span_dir}:"]
    width = max(len(path) for path in paths)
    for path, classes, scores in zip(paths, outputs["classes"].numpy(),
                                     outputs["scores"].numpy(), strict=True):  # fmt: skip
        best = int(scores.argmax())
        lines.append(f"  {path:<{width}}  predicted {classes[best].decode()} ({scores[best]:.3f})"
                     f"  folder {path.split('/')[-2]}")  # fmt: skip
    return lines


def sample_predictions(
    model_dir: str, span_dir: str, use_case: UseCase, limit: int = 5, encoding: str = "utf-8"
) -> list[str]:
    """Lines for the console: the model's predictions on the first rows of a span's first data
    file (the span the run trained and evaluated on), beside the use case's sample columns; for
    images, on the first image of each class folder."""
    if use_case.input_format == spans.IMAGE_FOLDERS:
        return image_predictions(model_dir, span_dir, limit)
    files = [f.path for f in spans.span_files(span_dir.rstrip("/") + "/")]
    if not files:
        return [f"No data file under {span_dir}: no predictions to show."]
    rows = read_rows(files[0], limit, encoding)
    probabilities = predict(model_dir, rows, use_case)
    columns = [c for c in use_case.sample_columns if c in rows[0]] if rows else []
    widths = {c: max(len(c), *(len(row[c]) for row in rows)) for c in columns}
    positive = f"P({use_case.class_names[-1]})"
    lines = [
        f"Predictions of {model_dir} on the first rows of {files[0]}:",
        "  " + " ".join(f"{c:<{widths[c]}}" for c in columns) + f"  {positive}  actual",
    ]
    for row, p in zip(rows, probabilities, strict=True):
        cells = " ".join(f"{row[c]:<{widths[c]}}" for c in columns)
        lines.append(f"  {cells}  {p:{len(positive)}.3f}  {row.get(use_case.label_key, '')}")
    return lines
