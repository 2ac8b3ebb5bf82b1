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
import re
from pathlib import Path

os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from google.protobuf import any_pb2, text_format  # noqa: E402
from google.protobuf.message import DecodeError  # noqa: E402
from tensorflow.core.framework import types_pb2  # noqa: E402
from tensorflow.core.protobuf import saved_model_pb2  # noqa: E402
from tensorflow_serving.apis import (  # noqa: E402
    classification_pb2,
    get_model_metadata_pb2,
    predict_pb2,
    prediction_log_pb2,
    regression_pb2,
)

from pipelines.serving.batching import BatchScheduler  # noqa: E402
from pipelines.serving.tfs_json import ServingError, code_name, invalid  # noqa: E402

DEFAULT_SIGNATURE = "serving_default"
WARMUP_FILE = Path("assets.extra") / "tf_serving_warmup_requests"
MAX_WARMUP_RECORDS = 1000  # saved_model_warmup_util.h WarmupConsts::kMaxNumRecords


class Servable:
    """Version `version` of `model_name`, loaded from the SavedModel in `path`."""

    def __init__(self, model_name: str, version: int, path: Path,
                 batcher: BatchScheduler | None = None):  # fmt: skip
        self.model_name, self.version, self.path = model_name, version, Path(path)
        self._batcher = batcher  # --enable_batching: requests merged with concurrent ones
        saved_model = saved_model_pb2.SavedModel.FromString((self.path / "saved_model.pb")
                                                            .read_bytes())  # fmt: skip
        serve = [g for g in saved_model.meta_graphs if "serve" in g.meta_info_def.tags]
        if not serve:
            raise ServingError("NOT_FOUND", f"no MetaGraphDef tagged 'serve' in {self.path}")
        self.signature_defs = serve[0].signature_def
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
        if self._batcher is not None:
            call = lambda **merged: self._call(signature, merged)  # noqa: E731
            return self._batcher.run(self, signature, call, inputs)
        return self._call(signature, inputs)

    def unload(self) -> None:
        """Its batch queues go once drained (a request already holding it still answers)."""
        if self._batcher is not None:
            self._batcher.forget(self)

    def _call(self, signature: str, inputs: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
        try:
            return self._functions[signature](**inputs)
        except tf.errors.OpError as e:
            raise ServingError(code_name(e), _session_message(e.message)) from e
        except (TypeError, ValueError) as e:  # shape or dtype refused when the graph is called
            raise invalid(str(e).splitlines()[0]) from e

    def predict(self, request: predict_pb2.PredictRequest) -> predict_pb2.PredictResponse:
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise ServingError("FAILED_PRECONDITION", f'Serving signature key "{name}" not found.')
        signature = self.signature_defs[name]
        sent, wanted = set(request.inputs), set(signature.inputs)
        if len(sent) > len(wanted) or (len(sent) < len(wanted) and not signature.defaults):
            raise invalid(  # predict_util.cc VerifyRequestInputsSize
                f"input size does not match signature: {len(sent)}!={len(wanted)} "
                f"len({{{','.join(sorted(sent))}}}) != len({{{','.join(sorted(wanted))}}}). "
                f"Sent extra: {{{','.join(sorted(sent - wanted))}}}. Missing but required: "
                f"{{{','.join(sorted(wanted - sent))}}}."
            )
        for alias in sorted(sent - wanted):  # saved_model::GetInputValues
            raise invalid(f"input tensor alias not found in signature: {alias}. Inputs expected "
                          f"to be in the set {{{','.join(sorted(wanted))}}}.")  # fmt: skip
        for index, alias in enumerate(request.output_filter):
            if alias in request.output_filter[:index]:
                raise invalid(f"duplicate output tensor alias: {alias}")
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

    def _examples(self, request, api: str) -> tuple[str, dict[str, tf.Tensor]]:
        """The signature and its input, named "inputs" as classifier.cc and regressor.cc
        require: the request's examples serialized (util.cc InputToSerializedExampleTensor:
        with a context, context bytes + example bytes, which parse as the example merged over
        the context)."""
        name = request.model_spec.signature_name or DEFAULT_SIGNATURE
        if name not in self.signature_defs:
            raise invalid(f"No signature was found with the name: {name}")
        signature = self.signature_defs[name]
        if len(signature.inputs) != 1:
            raise invalid("Expected one input Tensor.")
        wanted_outputs = (1, 2) if api == "classification" else (1,)
        count = len(signature.outputs)
        if count not in wanted_outputs:
            raise invalid("Expected one output Tensor." if api == "regression" else
                          f"Expected one or two output Tensors, found {count}")  # fmt: skip
        if "inputs" not in signature.inputs:
            raise invalid(f"No {api} inputs found in SignatureDef: {_debug(signature)}")
        kind = request.input.WhichOneof("kind")
        if kind == "example_list_with_context":
            context = request.input.example_list_with_context.context.SerializeToString()
            examples = request.input.example_list_with_context.examples
            serialized = [context + e.SerializeToString() for e in examples]
        else:
            serialized = [e.SerializeToString() for e in request.input.example_list.examples]
        if not serialized:
            raise invalid("Input is empty.")
        return name, {"inputs": tf.constant(serialized)}

    def classify(self, request: classification_pb2.ClassificationRequest):
        name, inputs = self._examples(request, "classification")
        signature = self.signature_defs[name]
        if not set(signature.outputs) & {"classes", "scores"}:
            raise invalid('Expected classification signature outputs to contain at least one of '
                          f'"classes" or "scores". Signature was: {_debug(signature)}')  # fmt: skip
        outputs = self._run(name, inputs)
        count = int(inputs["inputs"].shape[0])
        classes = outputs["classes"].numpy() if "classes" in outputs else None
        scores = outputs["scores"].numpy() if "scores" in outputs else None
        for tensor, kind, dtype in ((classes, "classes", object), (scores, "scores", np.float32)):
            if tensor is None:
                continue
            if tensor.ndim != 2:
                raise invalid(f"Expected Tensor shape: [batch_size num_classes] but got "
                              f"{_shape(tensor)}")  # fmt: skip
            if tensor.dtype != dtype:
                want = "DT_STRING" if kind == "classes" else "DT_FLOAT"
                got = tf.dtypes.as_dtype(tensor.dtype).as_datatype_enum
                raise invalid(f"Expected {kind} Tensor of {want}. Got: {_dtype(got)}")
            if tensor.shape[0] != count:
                raise invalid(f"Expected {kind} output batch size of {count}. Got: "
                              f"{tensor.shape[0]}")  # fmt: skip
        if classes is not None and scores is not None and classes.shape[1] != scores.shape[1]:
            raise invalid(f"Tensors class and score should match in dim_size(1). Got "
                          f"{classes.shape[1]} vs. {scores.shape[1]}")  # fmt: skip
        response = classification_pb2.ClassificationResponse()
        self._spec(response.model_spec, name)
        width = (classes if classes is not None else scores).shape[1]
        for row in range(count):
            item = response.result.classifications.add()
            for column in range(width):
                entry = item.classes.add()
                if classes is not None:
                    entry.label = classes[row, column]
                if scores is not None:
                    entry.score = float(scores[row, column])
        return response

    def regress(self, request: regression_pb2.RegressionRequest):
        name, inputs = self._examples(request, "regression")
        if "outputs" not in self.signature_defs[name].outputs:
            raise invalid(f"No regression outputs found in SignatureDef: "
                          f"{_debug(self.signature_defs[name])}")  # fmt: skip
        values = self._run(name, inputs)["outputs"].numpy()
        count = int(inputs["inputs"].shape[0])
        if not (values.ndim == 1 or (values.ndim == 2 and values.shape[1] == 1)):
            raise invalid("Expected output Tensor shape to be either [batch_size] or "
                          f"[batch_size, 1] but got {_shape(values)}")  # fmt: skip
        if values.shape[0] != count:
            raise invalid(f"Input batch size did not match output batch size: {count} vs. "
                          f"{values.shape[0]}")  # fmt: skip
        if values.dtype != np.float32:
            got = _dtype(tf.dtypes.as_dtype(values.dtype).as_datatype_enum)
            raise invalid(f"Expected output Tensor of DT_FLOAT.  Got: {got}")
        response = regression_pb2.RegressionResponse()
        self._spec(response.model_spec, name)
        for value in values.reshape(count):
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
            try:
                log = prediction_log_pb2.PredictionLog.FromString(record)
            except DecodeError as e:
                raise invalid(f"Failed to parse warmup record: {record[:64]!r} from {path}") from e
            kind = log.WhichOneof("log_type")
            if kind == "predict_log":
                self.predict(log.predict_log.request)
            elif kind == "classify_log":
                self.classify(log.classify_log.request)
            elif kind == "regress_log":
                self.regress(log.regress_log.request)
            elif kind is not None:  # multi_inference_log and session_log: not played here
                raise ServingError("UNIMPLEMENTED", f"Unsupported log_type for warmup: {kind}")
            count += 1
            if count > MAX_WARMUP_RECORDS:
                raise invalid(f"Number of warmup records exceeds the maximum "
                              f"({MAX_WARMUP_RECORDS}) at {path}")  # fmt: skip
        return count


def _session_message(message: str) -> str:
    """The error as TF Serving's Session::Run reports it: without the eager runtime's
    "Graph execution error" / "Detected at node" preamble and its "[Op:__inference_...]" tail."""
    lines = [line for line in message.splitlines()
             if line.strip() and not line.startswith(("Graph execution error", "Detected at node"))
             and "stack traces unavailable" not in line]  # fmt: skip
    text = "\n".join(lines)
    return re.sub(r"\s*\[Op:__inference_[^\]]*\]$", "", text)


def _debug(signature) -> str:
    """SignatureDef::DebugString, as TF Serving quotes a signature in its messages."""
    return text_format.MessageToString(signature)


def _shape(array: np.ndarray) -> str:
    return "[" + ",".join(str(d) for d in array.shape) + "]"


def _dtype(enum: int) -> str:
    return types_pb2.DataType.Name(enum)
