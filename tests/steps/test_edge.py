"""The TFLite edge export gives the served model's predictions from raw feature values (an
image use case: the encoded image), at each quantization."""

import pathlib

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from components.steps import edge
from components.training import export


def raw_columns(frame: pd.DataFrame, dtypes: dict[str, tf.DType]) -> dict[str, list]:
    """One list per raw feature; a missing optional value is "" or 0, as raw_features wants;
    bytes (an encoded image) stay bytes."""
    columns = {}
    for key, dtype in dtypes.items():
        if dtype == tf.string:
            columns[key] = [value if isinstance(value, bytes) else "" if pd.isna(value)
                            else str(value) for value in frame[key]]  # fmt: skip
        else:
            columns[key] = frame[key].fillna(0).tolist()
    return columns


def test_tflite_predictions_match_serving_default(trained, to_examples):
    """Every eval row, missing company / pickup_community_area included (OOV and area 0)."""
    fn_args, eval_frame = trained
    assert eval_frame["company"].isna().any() and eval_frame["pickup_community_area"].isna().any()
    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    examples = tf.constant(to_examples(eval_frame, with_label=False))
    expected = loaded.signatures[export.SERVING_SIGNATURE](examples=examples)["outputs"].numpy()
    raw_spec = loaded.signatures[export.RAW_SIGNATURE].structured_input_signature[1]

    tflite_model = edge.export_tflite(fn_args.serving_model_dir)
    columns = raw_columns(eval_frame, {key: spec.dtype for key, spec in raw_spec.items()})
    predicted = edge.predict_tflite(tflite_model, columns)["outputs"].reshape(-1)

    assert predicted.shape == (len(eval_frame),)
    np.testing.assert_allclose(predicted, expected[:, 0], rtol=0, atol=1e-3)


def _class_scores(outputs: dict) -> np.ndarray:
    """[rows, classes]: a multi-class model's scores, or a binary one's (1 - p, p)."""
    if "scores" in outputs:
        return np.asarray(outputs["scores"])
    positive = np.asarray(outputs["outputs"]).reshape(-1)
    return np.stack([1 - positive, positive], axis=1)


# Rows the SavedModel itself scores this close between its top two classes may flip under a
# quantization: float16 moves a score by thousandths; dynamic range (int8 weights) by a few
# hundredths on the image model (a CI run flipped a row outside 0.01 under "dynamic").
TIE = {"none": 0.01, "float16": 0.01, "dynamic": 0.05}


def test_each_quantization_names_the_class_the_saved_model_names(use_case_model):
    """On the eval rows (images), float32, float16 and dynamic-range models give the top class
    the SavedModel gives, and each quantization makes the model smaller. Rows whose two best
    classes the SavedModel scores within TIE of each other may flip under quantization: they
    are left out, and must be few."""
    model_dir = use_case_model.fn_args.serving_model_dir
    raw = tf.saved_model.load(model_dir).signatures[export.RAW_SIGNATURE]
    spec = raw.structured_input_signature[1]
    columns = raw_columns(use_case_model.eval_frame, {k: s.dtype for k, s in spec.items()})
    scores = _class_scores(raw(**{k: tf.constant(v, spec[k].dtype) for k, v in columns.items()}))
    expected = scores.argmax(axis=1)
    assert len(set(expected)) > 1  # a model that names one class for everything proves nothing
    best_two = np.sort(scores, axis=1)[:, -2:]
    margin = best_two[:, 1] - best_two[:, 0]
    assert (margin >= TIE["none"]).mean() >= 0.98, "too many rows are near ties"

    sizes = {}
    for quantization in edge.QUANTIZATIONS:
        tflite_model = edge.export_tflite(model_dir, quantization)
        sizes[quantization] = len(tflite_model)
        named = _class_scores(edge.predict_tflite(tflite_model, columns)).argmax(axis=1)
        clear = margin >= TIE[quantization]
        differ = np.flatnonzero((named != expected) & clear).tolist()
        assert differ == [], f"{quantization}: rows {differ} get another class"
    assert sizes["none"] > sizes["float16"] > sizes["dynamic"], sizes


def test_an_unknown_quantization_is_refused_naming_the_choices(tmp_path):
    with pytest.raises(edge.EdgeExportError, match="tflite_quantization must be one of none, "
                       "float16, dynamic, got 'int4'"):  # fmt: skip
        edge.export_tflite(str(tmp_path), "int4")


def test_export_of_a_directory_that_is_no_saved_model_fails_clearly(tmp_path):
    (tmp_path / "model.txt").write_text("not a SavedModel")
    with pytest.raises(edge.EdgeExportError, match="SavedModel file does not exist") as failure:
        edge.export_tflite(str(tmp_path))
    assert str(tmp_path) in str(failure.value)


def test_the_pusher_puts_warm_up_requests_and_the_edge_model_into_the_version(
    object_store, trained, to_examples, tmp_path
):
    """A real model through the Pusher with export_tflite=1: the version TF Serving loads holds
    the warm-up requests (replayed here as `tkp serve` does) and the TFLite model."""
    from components.base import storage
    from components.steps.pusher import EDGE_MODEL_PATH
    from pipelines.serving.servable import Servable
    from tests.steps.test_components import (
        MODEL_NAME,
        _blessing,
        _eval_examples,
        _push,
        _trained_model,
    )

    fn_args, eval_frame = trained
    root = fn_args.serving_model_dir
    files = {
        str(path.relative_to(root)): path.read_bytes()
        for path in pathlib.Path(root).rglob("*")
        if path.is_file()
    }
    serving_root = f"s3://{object_store.new_bucket('edge-push')}/serving"
    examples = _eval_examples(tmp_path, to_examples(eval_frame.head(20)))  # labelled, as stored
    pushed = _push(serving_root, _trained_model(tmp_path, files), _blessing(tmp_path, True),
                   tmp_path, export_tflite=1, examples=examples)  # fmt: skip

    version_dir = pushed.get_string_custom_property("pushed_destination")
    local = tmp_path / "version"
    storage.copy_tree(version_dir, str(local))
    tflite_model = (local / EDGE_MODEL_PATH).read_bytes()
    row = eval_frame.head(1)
    dtypes = {"trip_start_timestamp": tf.int64, "trip_miles": tf.float32, "trip_seconds": tf.int64,
              "fare": tf.float32, "payment_type": tf.string, "company": tf.string,
              "pickup_community_area": tf.int64}  # fmt: skip
    assert edge.predict_tflite(tflite_model, raw_columns(row, dtypes))["outputs"].shape == (1, 1)
    servable = Servable(MODEL_NAME, 1, local)
    assert servable.warm_up() == 5  # :predict x2, :classify, :regress, raw :predict
