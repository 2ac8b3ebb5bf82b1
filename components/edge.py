"""Edge export: the Trainer's `raw_features` signature as a TFLite flatbuffer.

DRAFT
"""

from __future__ import annotations

import os

# The SavedModel holds Transform's Keras-2 layer; pick Keras 2 before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from components import model  # noqa: E402


class EdgeExportError(ValueError):
    """A SavedModel that could not be converted to TFLite."""


def export_tflite(saved_model_dir: str) -> bytes:
    """The `raw_features` signature of `saved_model_dir` as a float32 TFLite model."""
    try:
        converter = tf.lite.TFLiteConverter.from_saved_model(
            saved_model_dir, signature_keys=[model.RAW_SIGNATURE]
        )
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS]
        return converter.convert()
    except Exception as error:
        raise EdgeExportError(
            f"Could not convert {saved_model_dir!r} ({model.RAW_SIGNATURE}) to TFLite: {error}"
        ) from error


def predict_tflite(tflite_model: bytes, columns: dict[str, list]) -> np.ndarray:
    """P(big tip) per row: `columns` maps each raw feature to one value per row."""
    interpreter = tf.lite.Interpreter(model_content=tflite_model)
    runner = interpreter.get_signature_runner(model.RAW_SIGNATURE)
    details = runner.get_input_details()
    inputs = {
        key: np.asarray(values, dtype=details[key]["dtype"]) for key, values in columns.items()
    }
    return runner(**inputs)["outputs"].reshape(-1)
