"""The exported SavedModel's signatures, the same for every use case.

The transform graph (tf.Transform's `transform_features_layer`) sits in front of the model in
every signature, so a client sends raw features and training and serving cannot drift apart.
"""

from __future__ import annotations

import json
import os

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402

from components.training import input_contract  # noqa: E402

# Signatures of the exported SavedModel, as TF Serving's REST API reaches them:
# - SERVING_SIGNATURE takes serialized raw tf.Examples ("examples") and returns {"outputs":
#   [batch, 1]} P(positive class), or [batch, classes] probabilities for a multi-class model:
#   `:predict` with base64 examples (the TFX convention); TFMA evaluates through it.
# - CLASSIFY_SIGNATURE and REGRESS_SIGNATURE take the same examples under the name "inputs",
#   which TF Serving's :classify and :regress require (classifier.cc, regressor.cc): "classes"
#   ["0", "1"] (or the class names) and their "scores"; "outputs" [batch, 1] (binary only:
#   a multi-class model has nothing to regress).
# - RAW_SIGNATURE takes one [batch] tensor per raw feature of the SERVING environment:
#   `:predict` with plain JSON values (an image as {"b64": ...}). Every feature is required
#   there (TF Serving wants every input of a signature); an optional feature says "missing"
#   with the value preprocessing_fn gives a missing one ("" or 0). Binary: {"outputs"}; multi-
#   class: {"classes", "scores"} as :classify returns them.
SERVING_SIGNATURE = "serving_default"
CLASSIFY_SIGNATURE = "classify"
REGRESS_SIGNATURE = "regress"
RAW_SIGNATURE = "raw_features"
TRANSFORM_SIGNATURE = "transform_features"
CLASS_LABELS = ("0", "1")


SERVING_ENVIRONMENT = "SERVING"
# A multi-class model's classes in output order, beside it (TF Serving ignores assets.extra/ but
# the warm-up file): the Evaluator compares a candidate only with a served model of the same.
CLASS_NAMES_PATH = "assets.extra/class_names.json"


def serving_features(tf_transform_output, label_key: str) -> dict:
    """The raw feature spec of what a request carries: the schema's SERVING environment
    (schema.proto: in in_environment or default_environment, not in not_in_environment), or
    every feature when the schema declares no environment; never the label."""
    schema = tf_transform_output.raw_metadata.schema
    raw_spec = tf_transform_output.raw_feature_spec()
    if not schema.default_environment and not any(f.in_environment for f in schema.feature):
        return {k: v for k, v in raw_spec.items() if k != label_key}
    serving = {
        feature.name
        for feature in schema.feature
        if (SERVING_ENVIRONMENT in feature.in_environment
            or SERVING_ENVIRONMENT in schema.default_environment)
        and SERVING_ENVIRONMENT not in feature.not_in_environment
    }  # fmt: skip
    return {k: v for k, v in raw_spec.items() if k != label_key and k in serving}


def export(
    model: tf.keras.Model,
    tf_transform_output,
    serving_model_dir: str,
    label_key: str,
    class_names: list[str] | None = None,
    prepare=None,
) -> None:
    """Saves `model` with the signatures above, the transform graph (and `prepare`, the use
    case's prepare_batch) in front of it. A model with one output is binary (P(positive),
    classes CLASS_LABELS); one with an output per class in `class_names` is multi-class."""
    # A layer built under mixed_float16 would cast the raw floats to half before the transform
    # graph, which takes float32; the trained layers keep the policy they were built with.
    tf.keras.mixed_precision.set_global_policy("float32")
    model.tft_layer = tf_transform_output.transform_features_layer()  # tracks the vocab assets
    raw_spec = tf_transform_output.raw_feature_spec()
    serving_spec = serving_features(tf_transform_output, label_key)
    examples_spec = tf.TensorSpec([None], tf.string, name="examples")
    binary = model.outputs[0].shape[-1] == 1
    labels = tf.constant([list(CLASS_LABELS if binary else class_names)])
    if not binary and len(class_names or ()) != model.outputs[0].shape[-1]:
        raise ValueError(f"the model has {model.outputs[0].shape[-1]} outputs but class_names "
                         f"are {class_names}")  # fmt: skip

    def probability(parsed: dict) -> tf.Tensor:
        transformed = model.tft_layer(parsed)
        transformed.pop(label_key, None)
        if prepare is not None:
            transformed = prepare(transformed, False)
        return tf.cast(model(transformed), tf.float32)

    def classes_and_scores(p: tf.Tensor) -> dict:
        scores = tf.concat([1.0 - p, p], axis=1) if binary else p
        return {"classes": tf.tile(labels, [tf.shape(p)[0], 1]), "scores": scores}

    @tf.function(input_signature=[examples_spec])
    def serve(examples):
        return {"outputs": probability(tf.io.parse_example(examples, serving_spec))}

    inputs_spec = tf.TensorSpec([None], tf.string, name="inputs")

    @tf.function(input_signature=[inputs_spec])
    def classify(inputs):
        return classes_and_scores(probability(tf.io.parse_example(inputs, serving_spec)))

    @tf.function(input_signature=[inputs_spec])
    def regress(inputs):
        return {"outputs": probability(tf.io.parse_example(inputs, serving_spec))}

    raw_inputs = {
        key: tf.TensorSpec([None], spec.dtype, name=key) for key, spec in serving_spec.items()
    }

    @tf.function
    def raw_features(**inputs):
        parsed = {}
        for key, spec in serving_spec.items():
            column = tf.reshape(inputs[key], [-1, 1])
            # A VarLen feature is sparse after parsing; from_dense drops the "missing" 0 / "".
            varlen = isinstance(spec, tf.io.VarLenFeature)
            parsed[key] = tf.sparse.from_dense(column) if varlen else column
        p = probability(parsed)
        return {"outputs": p} if binary else classes_and_scores(p)

    # TFMA evaluates on labelled examples, so this one parses the label too.
    @tf.function(input_signature=[examples_spec])
    def transform_features(examples):
        return model.tft_layer(tf.io.parse_example(examples, raw_spec))

    signatures = {
        SERVING_SIGNATURE: serve,
        CLASSIFY_SIGNATURE: classify,
        **({REGRESS_SIGNATURE: regress} if binary else {}),
        RAW_SIGNATURE: raw_features.get_concrete_function(**raw_inputs),
        TRANSFORM_SIGNATURE: transform_features,
    }
    model.save(serving_model_dir, save_format="tf", signatures=signatures)
    input_contract.write(serving_spec, serving_model_dir)
    if not binary:
        with tf.io.gfile.GFile(os.path.join(serving_model_dir, CLASS_NAMES_PATH), "w") as file:
            file.write(json.dumps(list(class_names)))
