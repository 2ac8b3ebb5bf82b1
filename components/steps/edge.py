"""Edge export: the Trainer's `raw_features` signature as a TFLite flatbuffer.

The TFLite model takes the same inputs as `raw_features` (one [batch] tensor per raw feature, a
missing optional value as "" or 0; an image use case: the encoded image bytes) and returns what
it returns (a binary model: {"outputs": [batch, 1]}, the positive class's probability; a
multi-class one: {"classes": [batch, N], "scores": [batch, N]}); the tf.Transform graph and the
use case's decoding run inside it, so a device needs no preprocessing code of its own.

Quantization (config `tflite_quantization`): "none" keeps float32 weights, as served; "float16"
stores the weights as float16 (half the size; GPU delegates compute in float16, the CPU expands
them back); "dynamic" stores them as int8 and quantizes activations on the fly (a quarter of
the size, faster on CPUs). tests/steps/test_edge.py checks each against the SavedModel.

Vocabularies: TF 2.16's converter drops the initialization of tables that a TF2 SavedModel
reads from asset files (it imports the init op without the ops that read the asset-path
variable), and the interpreter then fails with "hashtable need to be initialized". So
`export_tflite` re-traces the signature behind imports of each table's contents as constants:
builtin HASHTABLE_IMPORT ops, which TFLite runs once per interpreter (later calls are no-ops).

Flex: some ops a tf.Transform graph uses have no TFLite builtin kernel (for these dtypes), so
the model is converted with SELECT_TF_OPS. For the taxi use case, five: UpperBound
(tft.bucketize), StringToHashBucketFast (the out-of-vocabulary bucket of
compute_and_apply_vocabulary), FloorDiv on int64 (hour and weekday of a timestamp),
SparseToDense on strings (an optional string column made dense) and ZerosLike on strings
(tf.sparse.from_dense of an optional string in `raw_features`); an image use case, two:
DecodeImage and ResizeBilinear on uint8 (its `prepare_batch`). A device build must
therefore link TFLite's Flex delegate (Android: tensorflow-lite-select-tf-ops; C++:
tensorflow/lite/delegates/flex), which brings TensorFlow's kernels and makes the binary
considerably larger (a selective build for this model's ops trims it). The tf.lite.Interpreter
of the full tensorflow pip package has it built in; `tflite-runtime` does not. Everything else
(table lookups, z-scores, embeddings, dense layers) runs on builtin ops.
"""

from __future__ import annotations

import os

# The SavedModel holds Transform's Keras-2 layer; pick Keras 2 before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tempfile  # noqa: E402

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from components.base.config import TFLITE_QUANTIZATIONS  # noqa: E402
from components.base.errors import ActionableError  # noqa: E402
from components.training import export  # noqa: E402


class EdgeExportError(ActionableError, ValueError):
    """A SavedModel that could not be converted to TFLite (nothing is pushed)."""


def _with_tables_imported(
    raw: tf.types.experimental.ConcreteFunction,
) -> tf.types.experimental.ConcreteFunction:
    """`raw`, first importing its vocabulary tables' contents, so TFLite gets them as constants."""
    # The other captured resources are the trained weights' variables.
    variables = {id(v.handle) for v in raw.variables}
    tables = []
    for handle in raw.captured_inputs:
        if handle.dtype == tf.resource and id(handle) not in variables:
            # tf.Transform vocabularies map strings to int64 ids.
            keys, values = tf.raw_ops.LookupTableExportV2(
                table_handle=handle, Tkeys=tf.string, Tvalues=tf.int64
            )
            tables.append((handle, keys, values))

    @tf.function
    def raw_features(**inputs):
        # Same resources as raw's lookups, so automatic control dependencies order the imports
        # before them.
        for handle, keys, values in tables:
            tf.raw_ops.LookupTableImportV2(table_handle=handle, keys=keys, values=values)
        return raw(**inputs)

    return raw_features.get_concrete_function(**raw.structured_input_signature[1])


QUANTIZATIONS = TFLITE_QUANTIZATIONS


def export_tflite(saved_model_dir: str, quantization: str = "none") -> bytes:
    """The `raw_features` signature of the Trainer's SavedModel as a TFLite model, its weights
    quantized as `quantization` (one of QUANTIZATIONS) says."""
    if quantization not in QUANTIZATIONS:
        raise EdgeExportError(
            f"tflite_quantization must be one of {', '.join(QUANTIZATIONS)}, got {quantization!r}"
        )
    try:
        loaded = tf.saved_model.load(saved_model_dir)
        if export.RAW_SIGNATURE not in loaded.signatures:
            raise LookupError(f"no such signature, only {list(loaded.signatures)}")
        signature = _with_tables_imported(loaded.signatures[export.RAW_SIGNATURE])
        with tempfile.TemporaryDirectory() as tmp:
            # `loaded` tracks the tables and variables the signature captures.
            tf.saved_model.save(loaded, tmp, signatures={export.RAW_SIGNATURE: signature})
            converter = tf.lite.TFLiteConverter.from_saved_model(
                tmp, signature_keys=[export.RAW_SIGNATURE]
            )
            converter.target_spec.supported_ops = [
                tf.lite.OpsSet.TFLITE_BUILTINS,
                tf.lite.OpsSet.SELECT_TF_OPS,  # the ops listed in the module docstring
            ]
            if quantization != "none":  # alone: dynamic range (int8 weights)
                converter.optimizations = [tf.lite.Optimize.DEFAULT]
            if quantization == "float16":  # ...unless float16 is the smallest type allowed
                converter.target_spec.supported_types = [tf.float16]
            return converter.convert()
    except Exception as error:
        raise EdgeExportError(
            f"Could not convert the {export.RAW_SIGNATURE!r} signature of SavedModel "
            f"{saved_model_dir!r} to TFLite: {type(error).__name__}: {error}"
        ) from error


def predict_tflite(tflite_model: bytes, columns: dict[str, list]) -> dict[str, np.ndarray]:
    """The model's outputs for a batch (see the module docstring): `columns` maps each raw
    feature to one value per row (an image: its encoded bytes)."""
    interpreter = tf.lite.Interpreter(model_content=tflite_model)
    runner = interpreter.get_signature_runner(export.RAW_SIGNATURE)
    inputs = {}
    for key, detail in runner.get_input_details().items():
        if detail["dtype"] == np.bytes_:
            # UTF-8 bytes, as TF strings are; numpy's bytes_ would refuse non-ASCII text.
            inputs[key] = np.array(
                [v.encode() if isinstance(v, str) else v for v in columns[key]], dtype=object
            )
        else:
            inputs[key] = np.asarray(columns[key], dtype=detail["dtype"])
    # The runner resizes the inputs to the batch and allocates the tensors itself.
    return runner(**inputs)
