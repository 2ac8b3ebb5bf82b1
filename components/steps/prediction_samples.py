"""A handful of eval images with the candidate's prediction, for the run report.

The Evaluator (components/steps/evaluation.py) scores the first SAMPLES rows of the eval split
with the candidate's `classify` signature (what a client of :classify gets) and keeps, for each,
the file it came from, the true and the predicted class, the score, and the image as a small
JPEG thumbnail (base64), so that the report stays one self-contained page.
"""

from __future__ import annotations

import base64
import contextlib
import io
import itertools
from typing import Any

SAMPLES = 8
THUMBNAIL_PIXELS = 96  # the longer side


def thumbnail(encoded: bytes) -> str:
    """A JPEG of at most THUMBNAIL_PIXELS a side, base64, or "" when the bytes are no image."""
    from PIL import Image

    try:
        image = Image.open(io.BytesIO(encoded)).convert("RGB")
    except Exception:  # an image that TensorFlow decodes but Pillow does not: no thumbnail
        return ""
    image.thumbnail((THUMBNAIL_PIXELS, THUMBNAIL_PIXELS))
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=85)
    return base64.b64encode(buffer.getvalue()).decode()


def prediction_samples(model, examples, class_names: list[str], label_key: str = "label",
                       image_key: str = "image", path_key: str = "path",
                       count: int = SAMPLES) -> list[dict[str, Any]]:  # fmt: skip
    """[{path, label, predicted, score, thumbnail}] for the first `count` eval rows."""
    import tensorflow as tf
    from tfx.utils import path_utils

    from components.steps.warmup import eval_rows
    from components.training.export import CLASSIFY_SIGNATURE

    with contextlib.closing(eval_rows(examples.uri)) as rows:
        first = list(itertools.islice(rows, count))
    if not first:
        return []
    loaded = tf.saved_model.load(path_utils.serving_model_path(model.uri))
    classify = loaded.signatures[CLASSIFY_SIGNATURE]
    scores = classify(inputs=tf.constant([row.SerializeToString() for row in first]))["scores"]
    samples = []
    for row, row_scores in zip(first, scores.numpy(), strict=True):
        feature = row.features.feature
        best = int(row_scores.argmax())
        label = feature[label_key].int64_list.value[0] if label_key in feature else None
        samples.append({
            "path": feature[path_key].bytes_list.value[0].decode() if path_key in feature else "",
            "label": class_names[label] if label is not None else None,
            "predicted": class_names[best],
            "score": float(row_scores[best]),
            "thumbnail": thumbnail(feature[image_key].bytes_list.value[0])
            if image_key in feature else "",
        })  # fmt: skip
    return samples
