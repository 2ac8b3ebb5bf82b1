"""One loaded model version, answering TF Serving's Predict, Classify, Regress and metadata
requests (as protos) the way TF Serving 2.16.1 runs them on a SavedModel.

The rules and messages follow `tensorflow_serving/servables/tensorflow/predict_util.cc`,
`classifier.cc`, `regressor.cc` and `util.cc`, with `--enable_signature_method_name_check`
at its default (off), so a Keras signature serves `:classify` and `:regress` when its inputs
and outputs have the shapes those APIs need. Warm-up replays
`assets.extra/tf_serving_warmup_requests` (`saved_model_warmup_util.cc`): a version whose
warm-up fails does not load.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import tensorflow as tf  # noqa: E402
from google.protobuf import any_pb2  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from pipelines.tfs_json import ServingError, invalid  # noqa: E402

DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # saved_model_warmup_util.h WarmupConsts::kMaxNumRecords


class Servable:
    """Version `version` of `model_name`, loaded from the SavedModel in `path`."""

    def __init__(self, model_name: str, version: int, path: Path):
        self.model_name, self.version, self.path = model_name, version, Path(path)
        saved_model = saved_model_pb2.SavedModel.FromString((self.path / "saved_model.pb")
                                                            .read_bytes())  # fmt: skip
        self.signature_defs = saved_model.meta_graphs[0].signature_def
        self._model = tf.saved_model.load(str(self.path))
        self._functions = dict(self._model.signatures)

    # -- what the REST layer asks before it parses a request ------------------------------------

    def input_types(self, signature: str) -> dict[str, int]:
        """GetInfoMap: the signature's inputs and their dtypes."""
        name = signature or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise invalid(f'Serving signature name: "{name}" not found in signature def')
        return {k: v.dtype for k, v in self.signature_defs[name].inputs.items()}

    def metadata(self) -> get_model_metadata_pb2.GetModelMetadataResponse:
        response = get_model_metadata_pb2.GetModelMetadataResponse()
        response.model_spec.name = self.model_name
        response.model_spec.version.value = self.version
        signatures = get_model_metadata_pb2.SignatureDefMap()
        for name, signature in self.signature_defs.items():
            signatures.signature_def[name].CopyFrom(signature)
        packed = any_pb2.Any()
        packed.Pack(signatures)
        response.metadata["signature_def"].CopyFrom(packed)
        return response

    # -- requests -------------------------------------------------------------------------------

    def _run(self, signature: str, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        try:
            return self._functions[signature](**inputs)
        except tf.errors.OpError as e:
            raise ServingError(_code_name(e), e.message) from e
        except (TypeError, ValueError) as e:  # shape or dtype refused when the graph is called
            raise invalid(str(e).splitlines()[0]) from e

    def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise ServingError("FAILED_PRECONDITION", f'Serving signature key "{name}" not found.')
        signature = self.signature_defs[name]
        sent, wanted = set(request.inputs), set(signature.inputs)
        if sent != wanted:  # VerifyRequestInputsSize (no signature here has defaults)
            raise invalid(
                f"input size does not match signature: {len(sent)}!={len(wanted)} "
                f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(wanted))}}}). "
                f"Sent extra: {{{','.join(sorted(sent - wanted))}}}. Missing but required: "
                f"{{{','.join(sorted(wanted - sent))}}}."
            )
        for alias in request.output_filter:
            if alias not in signature.outputs:
                known = ",".join(sorted(signature.outputs))
                raise invalid(f"output tensor alias not found in signature: {alias} Outputs "
                              f"expected to be in the set {{{known}}}.")  # fmt: skip
        inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in request.inputs.items()}
        outputs = self._run(name, inputs)
        response = predict_pb2.PredictResponse()
        self._spec(response.model_spec, name)
        for alias in request.output_filter or outputs:
            response.outputs[alias].CopyFrom(tf.make_tensor_proto(outputs[alias].numpy()))
        return response

    def _examples(self, request) -> tuple[str, dict[str, tf.Tensor]]:
        """The signature and its one input: the request's examples, serialized (util.cc
        InputToSerializedExampleTensor: with a context, context bytes + example bytes, which
        parse as the example merged over the context)."""
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise invalid(f"No signature was found with the name: {name}")
        signature = self.signature_defs[name]
        if len(signature.inputs) != 1:
            raise invalid("Expected one input Tensor.")
        kind = request.input.WhichOneof("kind")
        if kind == "example_list_with_context":
            context = request.input.example_list_with_context.context.SerializeToString()
            examples = request.input.example_list_with_context.examples
            serialized = [context + e.SerializeToString() for e in examples]
        else:
            serialized = [e.SerializeToString() for e in request.input.example_list.examples]
        if not serialized:
            raise invalid("Input is empty.")
        return name, {next(iter(signature.inputs)): tf.constant(serialized)}

    def classify(self, request: classification_pb2.ClassificationRequest):
        name, inputs = self._examples(request)
        outputs_wanted = set(self.signature_defs[name].outputs)
        if len(outputs_wanted) not in (1, 2):
            raise invalid(f"Expected one or two output Tensors, found {len(outputs_wanted)}")
        if not outputs_wanted & {"classes", "scores"}:
            raise invalid('Expected classification signature outputs to contain at least one '
                          'of "classes" or "scores". Signature was: ' + name)  # fmt: skip
        outputs = self._run(name, inputs)
        count = int(inputs[next(iter(inputs))].shape[0])
        classes = outputs["classes"].numpy() if "classes" in outputs else None
        scores = outputs["scores"].numpy() if "scores" in outputs else None
        for tensor, kind in ((classes, "classes"), (scores, "scores")):
            if tensor is not None and (tensor.ndim != 2 or tensor.shape[0] != count):
                raise invalid(f"Expected {kind} Tensor shape: [batch_size num_classes] of batch "
                              f"size {count} but got {list(tensor.shape)}")  # fmt: skip
        response = classification_pb2.ClassificationResponse()
        self._spec(response.model_spec, name)
        width = (classes if classes is not None else scores).shape[1]
        for row in range(count):
            item = response.result.classifications.add()
            for column in range(width):
                entry = item.classes.add()
                if classes is not None:
                    entry.label = classes[row, column].decode()
                if scores is not None:
                    entry.score = float(scores[row, column])
        return response

    def regress(self, request: regression_pb2.RegressionRequest):
        name, inputs = self._examples(request)
        if len(self.signature_defs[name].outputs) != 1:
            raise invalid("Expected one output Tensor.")
        if "outputs" not in self.signature_defs[name].outputs:
            raise ServingError("FAILED_PRECONDITION", "No regression outputs found in "
                               f"SignatureDef: {name}")  # fmt: skip
        values = self._run(name, inputs)["outputs"]
        count = int(inputs[next(iter(inputs))].shape[0])
        if not (values.shape.rank == 1 or (values.shape.rank == 2 and values.shape[1] == 1)):
            raise invalid("Expected output Tensor shape to be either [batch_size] or "
                          f"[batch_size, 1] but got {values.shape}")  # fmt: skip
        if values.dtype != tf.float32:
            raise invalid(f"Expected output Tensor of DT_FLOAT.  Got: {values.dtype.name}")
        response = regression_pb2.RegressionResponse()
        self._spec(response.model_spec, name)
        for value in values.numpy().reshape(count):
            response.result.regressions.add().value = float(value)
        return response

    def _spec(self, spec, signature: str) -> None:
        spec.name, spec.signature_name = self.model_name, signature
        spec.version.value = self.version

    # -- warm-up --------------------------------------------------------------------------------

    def warm_up(self) -> int:
        """Replays the version's warm-up records; returns how many. A failing one raises."""
        path = self.path / WARMUP_FILE
        if not path.exists():
            return 0
        count = 0
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            log = prediction_log_pb2.PredictionLog.FromString(record)
            kind = log.WhichOneof("log_type")
            if kind == "predict_log":
                self.predict(log.predict_log.request)
            elif kind == "classify_log":
                self.classify(log.classify_log.request)
            elif kind == "regress_log":
                self.regress(log.regress_log.request)
            else:
                raise ServingError("UNIMPLEMENTED", f"Unsupported log_type for warmup: {kind}")
            count += 1
            if count > MAX_WARMUP_RECORDS:
                raise invalid(f"Number of warmup records exceeds the maximum "
                              f"({MAX_WARMUP_RECORDS}) at {path}")  # fmt: skip
        return count


# tensorflow.error.Code by number (tsl/protobuf/error_codes.proto).
_CODES = ("OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS "
          "PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE "
          "UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS UNAUTHENTICATED").split()  # fmt: skip


def _code_name(error: tf.errors.OpError) -> str:
    code = error.error_code
    return _CODES[code] if 0 <= code < len(_CODES) else "UNKNOWN"
