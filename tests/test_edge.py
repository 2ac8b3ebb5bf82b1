"""The TFLite edge export gives the served model's predictions from raw feature values."""

import numpy as np
import pandas as pd
import pytest
import tensorflow as tf

from components import edge, model


def raw_columns(frame: pd.DataFrame, input_dtypes: dict) -> dict[str, list]:
    """One list per raw feature; a missing optional value is "" or 0, as raw_features wants."""
    columns = {}
    for key, dtype in input_dtypes.items():
        if dtype == tf.string:
            columns[key] = frame[key].fillna("").astype(str).tolist()
        else:
            columns[key] = frame[key].fillna(0).tolist()
    return columns


def test_tflite_predictions_match_serving_default(trained, to_examples):
    fn_args, eval_frame = trained
    rows = eval_frame.copy()
    assert rows["company"].isna().any() and rows["pickup_community_area"].isna().any()

    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    examples = tf.constant(to_examples(rows, with_label=False))
    expected = loaded.signatures[model.SERVING_SIGNATURE](examples=examples)["outputs"].numpy()
    raw_spec = loaded.signatures[model.RAW_SIGNATURE].structured_input_signature[1]

    tflite_model = edge.export_tflite(fn_args.serving_model_dir)
    predicted = edge.predict_tflite(
        tflite_model, raw_columns(rows, {k: s.dtype for k, s in raw_spec.items()})
    )

    assert predicted.shape == (len(rows),)
    print("max abs diff", np.abs(predicted - expected[:, 0]).max())
    np.testing.assert_allclose(predicted, expected[:, 0], atol=1e-3, rtol=0)


def test_export_of_a_directory_that_is_no_saved_model_fails_clearly(tmp_path):
    with pytest.raises(edge.EdgeExportError, match=str(tmp_path)):
        edge.export_tflite(str(tmp_path))
