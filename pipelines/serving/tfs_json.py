"""TF Serving's REST JSON, read and written as TF Serving 2.16.1 does.

Each rule follows `tensorflow_serving/util/json_tensor.cc` (requests in, responses out) and
`model_servers/http_server.cc` (`ToHTTPStatusCode`) at tag 2.16.1; the error messages keep its
wording, so a client that matches on them works against both servers. JSON values quoted inside
an error message are rendered by Python's `json`, so their spacing may differ from rapidjson's.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.example import example_pb2, feature_pb2
from tensorflow.core.framework import types_pb2
from tensorflow_serving.apis import classification_pb2, predict_pb2, regression_pb2

# http_server.cc ToHTTPStatusCode; codes by their tensorflow.error.Code name.
HTTP_STATUS = {
    "CANCELLED": 499, "UNKNOWN": 500, "INVALID_ARGUMENT": 400, "DEADLINE_EXCEEDED": 504,
    "NOT_FOUND": 404, "ALREADY_EXISTS": 409, "PERMISSION_DENIED": 403,
    "RESOURCE_EXHAUSTED": 429, "FAILED_PRECONDITION": 400, "ABORTED": 409, "OUT_OF_RANGE": 400,
    "UNIMPLEMENTED": 501, "INTERNAL": 500, "UNAVAILABLE": 503, "DATA_LOSS": 500,
    "UNAUTHENTICATED": 401,
}  # fmt: skip


# tensorflow.error.Code by number (tsl/protobuf/error_codes.proto).
_CODES = ("OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS "
          "PERMISSION_DENIED RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE "
          "UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS UNAUTHENTICATED").split()  # fmt: skip


def code_name(error: tf.errors.OpError) -> str:
    """A TensorFlow error's code by name, as TF Serving reports it."""
    code = error.error_code
    return _CODES[code] if 0 <= code < len(_CODES) else "UNKNOWN"


class ServingError(Exception):
    """A TF Serving status: answered as {"error": message} with the code's HTTP status."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message

    @property
    def http_status(self) -> int:
        return HTTP_STATUS.get(self.code, 500)


def invalid(*parts: object) -> ServingError:
    return ServingError("INVALID_ARGUMENT", "".join(str(p) for p in parts))


def _show(value: Any) -> str:
    return json.dumps(value)


def _json_type(value: Any) -> str:
    if value is None:
        return "Null"
    if isinstance(value, bool):
        return "True" if value else "False"
    return {dict: "Object", list: "Array", str: "String"}.get(type(value), "Number")


def dtype_name(dtype: int) -> str:
    """DataTypeString: DT_FLOAT -> 'float'."""
    return types_pb2.DataType.Name(dtype)[3:].lower()


def parse(body: bytes) -> dict:
    """ParseJson: the request document, an object (NaN and Infinity accepted, as rapidjson's
    kParseNanAndInfFlag does)."""
    if not body:
        raise invalid("JSON Parse error: The document is empty")
    try:
        doc = json.loads(body)
    except RecursionError as e:
        raise invalid("JSON Parse error: The document is nested too deeply") from e
    except (ValueError, UnicodeDecodeError) as e:
        raise invalid(f"JSON Parse error: {getattr(e, 'msg', e)} at offset: "
                      f"{getattr(e, 'pos', 0)}") from e  # fmt: skip
    if not isinstance(doc, dict):
        raise invalid(f"JSON Value: {_show(doc)} Is not object")
    return doc


def signature_name(doc: dict) -> str:
    name = doc.get("signature_name", "")
    if not isinstance(name, str):
        raise invalid(f"JSON Value: {_show(doc)} not formatted correctly. 'signature_name' key "
                      "must be a string value.")  # fmt: skip
    return name


# ---------------------------------------------------------------------------------------------
# :predict requests: "instances" (row format) or "inputs" (columnar format).
# ---------------------------------------------------------------------------------------------


def _is_b64(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _b64(value: Any) -> bytes:
    """absl::Base64Unescape: whitespace ignored, padding ('=' or '.') optional."""
    if not _is_b64(value):
        raise invalid(f"JSON Value: {_show(value)} not formatted correctly for base64 data")
    text = re.sub(r"\s+", "", value["b64"]).rstrip("=.")
    if len(text) % 4 == 1 or not re.fullmatch(r"[A-Za-z0-9+/]*", text):
        raise invalid("Unable to base64 decode")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError) as e:
        raise invalid("Unable to base64 decode") from e


def _scalar(value: Any, dtype: int) -> Any:
    """AddValueToTensor: JSON numbers for numeric types (an integer type takes no 1.0), strings
    or {"b64": ...} for DT_STRING, true/false for DT_BOOL."""
    is_int = isinstance(value, int) and not isinstance(value, bool)
    ok = {
        types_pb2.DT_FLOAT: is_int or isinstance(value, float),
        types_pb2.DT_DOUBLE: is_int or isinstance(value, float),
        types_pb2.DT_INT64: is_int and -(2**63) <= value < 2**63,
        types_pb2.DT_INT32: is_int and -(2**31) <= value < 2**31,
        types_pb2.DT_STRING: isinstance(value, str),
        types_pb2.DT_BOOL: isinstance(value, bool),
    }
    if dtype not in ok:
        raise ServingError("UNIMPLEMENTED", f"Conversion of JSON Value: {_show(value)} to type: "
                           f"{dtype_name(dtype)}")  # fmt: skip
    if isinstance(value, dict) and dtype == types_pb2.DT_STRING:
        return _b64(value)
    if not ok[dtype]:
        raise invalid(f"JSON Value: {_show(value)} Type: {_json_type(value)} is not of expected "
                      f"type: {dtype_name(dtype)}")  # fmt: skip
    return value.encode() if isinstance(value, str) else value


def _dense_shape(value: Any) -> list[int]:
    shape = []
    while isinstance(value, list):
        shape.append(len(value))
        if not value:
            break
        value = value[0]
    return shape


def _fill(value: Any, level: int, shape: list[int], dtype: int, out: list) -> None:
    """FillTensorProto: every list at a level has that level's size; values only at the last."""
    if not isinstance(value, list):
        if level != len(shape):
            raise invalid(f"JSON Value: {_show(value)} found at incorrect level: {level + 1} in "
                          f"the JSON DOM. Expected at level: {len(shape)}")  # fmt: skip
        out.append(_scalar(value, dtype))
        return
    if level >= len(shape):
        raise invalid(f"Encountered list at unexpected level: {level} expected < {len(shape)}")
    if len(value) != shape[level]:
        raise invalid(f"Encountered list at unexpected size: {len(value)} at level: {level} "
                      f"expected size: {shape[level]}")  # fmt: skip
    for item in value:
        _fill(item, level + 1, shape, dtype, out)


def _tensor(values: list, shape: list[int], dtype: int):
    np_dtype = object if dtype == types_pb2.DT_STRING else tf.dtypes.as_dtype(dtype).as_numpy_dtype
    try:
        array = np.array(values, dtype=np_dtype).reshape(shape)
    except (OverflowError, ValueError) as e:  # e.g. a 400-digit number for a float
        raise invalid(f"JSON Value out of range for type {dtype_name(dtype)}: {e}") from e
    return tf.make_tensor_proto(array, dtype=tf.dtypes.as_dtype(dtype), shape=shape)


def _instances(instances: list, inputs: dict[str, int]) -> dict:
    """FillTensorMapFromInstancesList: a list of values for a one-input signature, else a list
    of objects with exactly the signature's input names."""
    if not isinstance(instances[0], dict) and len(inputs) > 1:  # IsObject, b64 objects too
        raise invalid("instances is a plain list, but expecting list of objects as multiple "
                      "input tensors required as per tensorinfo_map")  # fmt: skip
    objects = isinstance(instances[0], dict) and not _is_b64(instances[0])
    values: dict[str, list] = {}
    shapes: dict[str, list[int]] = {}

    def add(item: Any, name: str) -> None:
        if name not in inputs:
            raise invalid(f"JSON object: does not have named input: {name}")
        shape, out = _dense_shape(item), []
        _fill(item, 0, shape, inputs[name], out)
        if name in shapes and len(out) != int(np.prod(shapes[name], dtype=int)):
            raise invalid(f"Expecting tensor size: {int(np.prod(shapes[name]))} but got: "
                          f"{len(out)}")  # fmt: skip
        if name in shapes and shape != shapes[name]:
            raise invalid(f"Expecting shape [{','.join(map(str, shapes[name]))}] but got: "
                          f"[{','.join(map(str, shape))}]")  # fmt: skip
        shapes[name] = shape
        values.setdefault(name, []).extend(out)

    for index, element in enumerate(instances):
        is_object = isinstance(element, dict) and not _is_b64(element)
        if objects:
            if not is_object:
                raise invalid(f"Expecting object but got list at item {index} of input list")
            for name, item in element.items():
                try:
                    add(item, name)
                except ServingError as e:
                    raise invalid(f"Failed to process element: {index} key: {name} of "
                                  f"'instances' list. Error: {_status(e)}") from e  # fmt: skip
            if set(element) != set(inputs):
                raise invalid(f"Failed to process element: {index} of 'instances' list. JSON "
                              f"object: {_show(element)} keys must be equal to: "
                              f"{','.join(sorted(inputs))}")  # fmt: skip
        else:
            if is_object:
                raise invalid(f"Expecting value/list but got object at item {index} of input "
                              "list")  # fmt: skip
            try:
                add(element, next(iter(inputs)))
            except ServingError as e:
                raise invalid(f"Failed to process element: {index} of 'instances' list. "
                              f"Error: {_status(e)}") from e  # fmt: skip
    count = len(instances)
    return {n: _tensor(values[n], [count, *shapes[n]], inputs[n]) for n in values}


def _inputs(value: Any, inputs: dict[str, int]) -> dict:
    """FillTensorMapFromInputsMap: a value for a one-input signature, else an object."""
    if not isinstance(value, dict) or _is_b64(value):
        if len(inputs) > 1:
            raise invalid("inputs is a plain value/list, but expecting an object as multiple "
                          "input tensors required as per tensorinfo_map")  # fmt: skip
        value = {next(iter(inputs)): value}
    tensors = {}
    for name, dtype in inputs.items():
        if name not in value:
            raise invalid(f"Missing named input: {name} in 'inputs' object.")
        shape, out = _dense_shape(value[name]), []
        _fill(value[name], 0, shape, dtype, out)
        tensors[name] = _tensor(out, shape, dtype)
    return tensors


def predict_request(doc: dict, inputs: dict[str, int]) -> tuple[predict_pb2.PredictRequest, str]:
    """FillPredictRequestFromJson: the request and its format ('row' or 'columnar'). `inputs`
    maps the signature's input names to their dtypes."""
    request = predict_pb2.PredictRequest()
    request.model_spec.signature_name = signature_name(doc)
    if not inputs:
        raise invalid("Failed to get input map for signature: "
                      f"{request.model_spec.signature_name or 'DEFAULT'}")  # fmt: skip
    both = ("Not formatted correctly expecting only one of 'inputs' or 'instances' keys to "
            "exist ")  # fmt: skip
    if "instances" in doc:
        if "inputs" in doc:
            raise invalid(f"JSON Value: {_show(doc)} {both}")
        if not isinstance(doc["instances"], list):
            raise invalid(f"JSON Value: {_show(doc)} Expecting 'instances' to be an list/array")
        if not doc["instances"]:
            raise invalid(f"JSON Value: {_show(doc)} No values in 'instances' array")
        tensors, form = _instances(doc["instances"], inputs), "row"
    elif "inputs" in doc:
        tensors, form = _inputs(doc["inputs"], inputs), "columnar"
    else:
        raise invalid("Missing 'inputs' or 'instances' key")
    for name, tensor in tensors.items():
        request.inputs[name].CopyFrom(tensor)
    return request, form


def _status(error: ServingError) -> str:
    """absl::Status::ToString, as nested messages quote it."""
    return f"{error.code}: {error.message}"


# ---------------------------------------------------------------------------------------------
# :classify and :regress requests: tf.Examples as JSON objects.
# ---------------------------------------------------------------------------------------------


def _add_to_feature(value: Any, name: str, kinds: list, feature: feature_pb2.Feature) -> None:
    """AddValueToFeature: one kind per feature; integers (and booleans) int64, other numbers
    float, strings and {"b64": ...} bytes."""
    if value is None or isinstance(value, list) or (isinstance(value, dict) and not _is_b64(value)):
        raise invalid(f"Feature: {name} has element with unexpected JSON type: "
                      f"{_json_type(value)}")  # fmt: skip
    if isinstance(value, bool) or isinstance(value, int):
        kind, item = "int64", int(value)
        if not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise invalid(f"Feature: {name} has uint64_t element. Only int64_t is supported.")
    elif isinstance(value, float):
        kind, item = "float", value
    else:
        kind, item = "bytes", _b64(value) if isinstance(value, dict) else value.encode()
    if kinds and kinds[0] != kind:
        raise invalid(f"Unexpected element type in feature: {name} expecting type: {kinds[0]}")
    kinds[:1] = [kind]
    getattr(feature, f"{kind}_list").value.append(item)


def example(value: Any) -> example_pb2.Example:
    """MakeExampleFromJsonObject."""
    if not isinstance(value, dict):
        raise invalid(f"Example must be JSON object but got JSON {_json_type(value)}")
    result = example_pb2.Example()
    for name, content in value.items():
        feature, kinds = result.features.feature[name], []
        for item in content if isinstance(content, list) else [content]:
            _add_to_feature(item, name, kinds, feature)
    return result


def examples_request(doc: dict, method: str):
    """FillClassifyRegressRequestFromJson: a ClassificationRequest or RegressionRequest."""
    request = (classification_pb2.ClassificationRequest() if method == "classify"
               else regression_pb2.RegressionRequest())  # fmt: skip
    request.model_spec.signature_name = signature_name(doc)
    target = request.input.example_list
    if "context" in doc:
        request.input.example_list_with_context.context.CopyFrom(example(doc["context"]))
        target = request.input.example_list_with_context
    if "examples" not in doc:
        raise invalid(f"JSON Value: {_show(doc)} When method is classify, key 'examples' is "
                      "expected and was not found")  # fmt: skip
    if not isinstance(doc["examples"], list):
        raise invalid(f"JSON Value: {_show(doc)} Expecting 'examples' value to be an list/array")
    if not doc["examples"]:
        raise invalid(f"JSON Value: {_show(doc)} 'examples' value is an empty array")
    for item in doc["examples"]:
        target.examples.add().CopyFrom(example(item))
    return request


# ---------------------------------------------------------------------------------------------
# Responses.
# ---------------------------------------------------------------------------------------------


def write_decimal(value: float, float32: bool = True) -> float:
    """WriteDecimal: %g, or %.9g (%.17g for a double) when %g does not read back as the same
    number. Returned as the float parsed from that text, whose repr (what json writes) is that
    text again; NaN and Infinity stay as they are (json writes them as bare words, as TF
    Serving does)."""
    value = float(value)
    if not np.isfinite(value):
        return value
    text = f"{value:g}"
    same = np.float32(float(text)) == np.float32(value) if float32 else float(text) == value
    return float(text if same else f"{value:.{9 if float32 else 17}g}")


def _values(array: np.ndarray, as_bytes: bool) -> Any:
    """AddTensorValues: numbers as WriteDecimal writes them, strings as text or, for an output
    named *_bytes, as {"b64": ...}."""
    if array.dtype == object:
        convert = (lambda b: {"b64": base64.b64encode(b).decode()}) if as_bytes else (
            lambda b: b.decode("utf-8", errors="replace"))  # fmt: skip
        return np.vectorize(convert, otypes=[object])(array).tolist() if array.size else (
            np.empty(array.shape).tolist())  # fmt: skip
    if array.dtype in (np.float32, np.float64):
        float32 = array.dtype == np.float32
        return np.vectorize(lambda v: write_decimal(v, float32), otypes=[object])(array).tolist()
    return array.tolist()


def predict_response(response: predict_pb2.PredictResponse, form: str) -> dict:
    """MakeJsonFromTensors: {"predictions": [...]} for the row format (one object per row when
    there are several outputs), {"outputs": ...} for the columnar one."""
    if not response.outputs:
        raise invalid("Cannot convert empty tensor map to JSON")
    arrays = {name: tf.make_ndarray(t) for name, t in sorted(response.outputs.items())}
    values = {n: _values(a, n.endswith("_bytes") and a.dtype == object) for n, a in arrays.items()}
    if form == "columnar":
        return {"outputs": next(iter(values.values())) if len(values) == 1 else values}
    batch = None
    for name, array in arrays.items():
        if array.ndim == 0:
            raise invalid(f"Tensor name: {name} has no shape information ")
        if batch is not None and len(array) != batch:
            raise invalid(f"Tensor name: {name} has inconsistent batch size: {len(array)} "
                          f"expecting: {batch}")  # fmt: skip
        batch = len(array)
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{n: v[i] for n, v in values.items()} for i in range(batch)]}


# kClassifyRegressResponseKey is "results" (plural), for both APIs.


def classify_response(response: classification_pb2.ClassificationResponse) -> dict:
    if not response.result.classifications:
        raise invalid("Cannot convert empty ClassificationResults to JSON")
    return {"results": [[[c.label, write_decimal(c.score)] for c in item.classes]
                       for item in response.result.classifications]}  # fmt: skip


def regress_response(response: regression_pb2.RegressionResponse) -> dict:
    if not response.result.regressions:
        raise invalid("Cannot convert empty RegressionResults to JSON")
    return {"results": [write_decimal(r.value) for r in response.result.regressions]}
