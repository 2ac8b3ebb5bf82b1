"""`tkp serve` against TF Serving's REST contract, on a really trained and pushed model.

Expected shapes, status codes and messages are those of TF Serving 2.16.1's REST API
(https://www.tensorflow.org/tfx/serving/api_rest, and its source as cited in
pipelines/serving/tfs_json.py and pipelines/serving/servable.py). The server runs in a thread on
loopback; the versions come from a real SeaweedFS store through the same mirror the Kubernetes
sidecar uses.

Every test runs once per shipped use case of CSV rows, on the session's model of it
(`tabular_use_case_model`, tests/use_cases/kit.py): the model's name is the use case's, and each
feature a check needs is picked from its serving spec by kind and presence (`required_feature`,
`feature_of_kind`). An image model's requests (base64 images) are tested in
tests/use_cases/images/test_serving.py.
"""

import base64
import json

import numpy as np
import pytest
import requests
import tensorflow as tf
from tensorflow.core.framework import types_pb2

from components.base import storage
from components.steps import warmup
from components.training.export import (
    CLASSIFY_SIGNATURE,
    RAW_SIGNATURE,
    REGRESS_SIGNATURE,
    SERVING_SIGNATURE,
)
from pipelines.serving.samples import row_to_example
from pipelines.serving.serving_client import ServingClient, ServingRequestError
from tests.pipelines.serving.served import frame_rows, push, serving

ROWS = 8


def required_feature(spec: dict, use_case: str) -> str:
    """The first required feature of a serving spec by name (FixedLen: every request must carry
    it); a use case without one fails the check that needs it, saying so."""
    required = sorted(k for k, s in spec.items() if isinstance(s, tf.io.FixedLenFeature))
    if not required:
        pytest.fail(f"use case {use_case!r}: its serving spec has no required feature (FixedLen), "
                    "which this check needs; give the check another way in")  # fmt: skip
    return required[0]


def feature_of_kind(spec: dict, dtype: tf.DType) -> str | None:
    """The first feature of `dtype` by name, a required one before an optional one."""
    names = sorted(spec, key=lambda k: (not isinstance(spec[k], tf.io.FixedLenFeature), k))
    return next((k for k in names if spec[k].dtype == dtype), None)


@pytest.fixture(scope="module")
def served(object_store, tabular_use_case_model, tmp_path_factory):
    fn_args, eval_frame = tabular_use_case_model.fn_args, tabular_use_case_model.eval_frame
    to_examples, model_name = tabular_use_case_model.to_examples, tabular_use_case_model.model_name
    folder = f"s3://{object_store.new_bucket('serve')}/serving/{model_name}"
    examples = to_examples(eval_frame.head(16), with_label=False)
    push(folder, model_name, fn_args.serving_model_dir, 1, examples)
    model = tf.saved_model.load(fn_args.serving_model_dir)
    expected = model.signatures[SERVING_SIGNATURE](
        examples=tf.constant(to_examples(eval_frame.head(ROWS), with_label=False))
    )["outputs"].numpy()[:, 0]
    cache = tmp_path_factory.mktemp("cache")
    with serving(model_name, folder, cache, max_request_bytes=1 << 20) as server:
        yield dict(url=server.url, manager=server.manager, folder=folder, said=server.said,
                   rows=frame_rows(eval_frame.head(ROWS)), expected=expected,
                   model_dir=fn_args.serving_model_dir, examples=examples, model=model_name,
                   use_case=tabular_use_case_model.use_case,
                   spec=tabular_use_case_model.kit.serving_feature_spec)  # fmt: skip


def at(served, tail: str = "") -> str:
    """The served model's path, then `tail` (":predict", "/versions/1", ...)."""
    return f"/v1/models/{served['model']}{tail}"


def call(served, method: str, path: str, body=None, raw: bytes | None = None):
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    response = requests.request(method, served["url"] + path, data=data, timeout=30)
    assert response.headers["content-type"] == "application/json"
    return response.status_code, response.json()


def b64_instances(served) -> list[dict]:
    use_case = served["use_case"]
    return [{"b64": base64.b64encode(row_to_example(r, use_case)).decode()} for r in served["rows"]]


def client(served, model: str | None = None) -> ServingClient:
    """A client of the served model (or of `model`) that encodes rows as the use case says."""
    return ServingClient(served["url"], model or served["model"], use_case=served["use_case"].name)


# -- status and metadata ----------------------------------------------------------------------


def test_model_status_lists_the_served_version_available(served):
    assert served["said"][0].startswith("Version 1 serves (loaded and warmed up with 5 requests")
    status, body = call(served, "GET", at(served))
    assert status == 200
    assert body == {"model_version_status": [
        {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
    ]}  # fmt: skip
    assert call(served, "GET", at(served, "/versions/1"))[1] == body
    assert call(served, "GET", at(served, "/versions/7")) == (
        404, {"error": f"Could not find version 7 of model {served['model']}"})  # fmt: skip
    assert call(served, "GET", "/v1/models/nope") == (
        404, {"error": "Could not find any versions of model nope"})  # fmt: skip


def test_metadata_has_each_signature_with_typed_inputs(served):
    status, body = call(served, "GET", at(served, "/metadata"))
    assert status == 200
    assert body["model_spec"] == {"name": served["model"], "signature_name": "", "version": "1"}
    signatures = body["metadata"]["signature_def"]["signature_def"]
    assert {SERVING_SIGNATURE, CLASSIFY_SIGNATURE, REGRESS_SIGNATURE, RAW_SIGNATURE} <= set(
        signatures
    )
    # :classify and :regress need the examples under "inputs" (TF Serving's classifier.cc).
    assert set(signatures[CLASSIFY_SIGNATURE]["inputs"]) == {"inputs"}
    assert set(signatures[REGRESS_SIGNATURE]["inputs"]) == {"inputs"}
    assert signatures[SERVING_SIGNATURE]["inputs"]["examples"]["dtype"] == "DT_STRING"
    assert signatures[SERVING_SIGNATURE]["method_name"] == "tensorflow/serving/predict"
    # One input per feature of the serving spec, of the schema's type; never the label.
    raw = signatures[RAW_SIGNATURE]["inputs"]
    assert {name: raw[name]["dtype"] for name in raw} == {
        name: types_pb2.DataType.Name(spec.dtype.as_datatype_enum)
        for name, spec in served["spec"].items()
    }
    assert served["use_case"].label_key not in raw


# -- the four ways in -------------------------------------------------------------------------


def test_predict_rows_and_columns_of_base64_examples_match_the_saved_model(served):
    instances = b64_instances(served)
    path = at(served, ":predict")
    status, body = call(served, "POST", path, {"instances": instances})
    assert status == 200 and list(body) == ["predictions"]
    assert np.array(body["predictions"]).shape == (ROWS, 1)  # one [p] per instance
    np.testing.assert_allclose(np.array(body["predictions"])[:, 0], served["expected"], atol=1e-6)
    # Columnar form, and a signature with one input takes the bare list too.
    for inputs in ({"examples": instances}, instances):
        status, body = call(served, "POST", path, {"signature_name": "", "inputs": inputs})
        assert status == 200 and list(body) == ["outputs"]
        np.testing.assert_allclose(np.array(body["outputs"])[:, 0], served["expected"], atol=1e-6)
    versioned = call(served, "POST", at(served, "/versions/1:predict"),
                     {"instances": instances})  # fmt: skip
    assert versioned[0] == 200


def test_predict_plain_json_values_through_the_raw_signature(served):
    np.testing.assert_allclose(client(served).predict_raw(served["rows"]), served["expected"],
                               atol=1e-5)  # fmt: skip
    # Columnar: one list per feature.
    typed = [client_typed(served, r) for r in served["rows"]]
    columns = {key: [row[key] for row in typed] for key in typed[0]}
    status, body = call(served, "POST", at(served, ":predict"),
                        {"signature_name": RAW_SIGNATURE, "inputs": columns})  # fmt: skip
    assert status == 200, body
    np.testing.assert_allclose(np.array(body["outputs"])[:, 0], served["expected"], atol=1e-5)


def client_typed(served, row: dict[str, str]) -> dict:
    """A row's feature values with the schema's types; a missing optional one as "" or 0, as the
    raw signature takes it."""
    from pipelines.serving.serving_client import _typed

    typed = _typed(row, served["use_case"])
    for name, spec in served["spec"].items():
        typed.setdefault(name, "" if spec.dtype == tf.string else 0)
    return typed


def test_classify_and_regress_take_examples_as_json_objects(served):
    through = client(served)
    result = through.classify(served["rows"])
    classes = [str(index) for index in range(len(served["use_case"].class_names))]
    assert [[label for label, _ in item] for item in result] == [classes] * ROWS
    np.testing.assert_allclose([item[1][1] for item in result], served["expected"], atol=1e-6)
    np.testing.assert_allclose([item[0][1] + item[1][1] for item in result], 1.0, atol=1e-6)
    np.testing.assert_allclose(through.regress(served["rows"]), served["expected"], atol=1e-6)
    np.testing.assert_allclose(through.predict_examples(served["rows"]), served["expected"],
                               atol=1e-6)  # fmt: skip
    # A context holds features every example shares; an example's own value wins.
    shared = required_feature(served["spec"], served["use_case"].name)
    typed = [client_typed(served, r) for r in served["rows"][:2]]
    own = [{k: v for k, v in t.items() if k != shared} for t in typed[:1]]
    body = {"signature_name": REGRESS_SIGNATURE, "context": {shared: typed[0][shared]},
            "examples": own}  # fmt: skip
    status, answer = call(served, "POST", at(served, ":regress"), body)
    assert status == 200 and answer["results"][0] == pytest.approx(served["expected"][0], abs=1e-6)


def test_floats_are_written_as_tf_serving_writes_them(served):
    """WriteDecimal: %g, or %.9g when %g does not read back as the same float32."""
    status, _ = call(served, "POST", at(served, ":predict"),
                     {"instances": b64_instances(served)})  # fmt: skip
    text = requests.post(served["url"] + at(served, ":predict"),
                         data=json.dumps({"instances": b64_instances(served)})).text  # fmt: skip
    for p in served["expected"]:
        short = f"{p:g}"
        written = short if np.float32(float(short)) == p else f"{p:.9g}"
        assert f"[{written}]" in text, (written, text)


def test_base64_as_absl_reads_it_padding_optional_whitespace_ignored(served):
    (instance,) = b64_instances(served)[:1]
    loose = instance["b64"].rstrip("=")
    loose = loose[:10] + "\n" + loose[10:]
    status, body = call(served, "POST", at(served, ":predict"),
                        {"instances": [{"b64": loose}]})  # fmt: skip
    assert status == 200
    assert body["predictions"][0][0] == pytest.approx(served["expected"][0], abs=1e-6)


def test_checks_come_in_tf_servings_order_and_a_label_lists_every_version(served):
    # The body is parsed before the model is looked up...
    assert call(served, "POST", "/v1/models/nope:predict", raw=b"{bad")[0] == 400
    assert call(served, "POST", "/v1/models/nope:classify", {"examples": []})[0] == 400
    # ...and GET status reads only the version, so a label lists every version.
    assert call(served, "GET", at(served, "/labels/stable"))[0] == 200
    labelled = at(served, "/labels/canary:predict")  # no release under way: no canary label
    assert call(served, "POST", labelled, {"instances": [1]}) == (
        400, {"error": "Unrecognized servable version label: canary"})  # fmt: skip
    # A signature without inputs, and :regress on one whose input is not named "inputs".
    status, body = call(served, "POST", at(served, ":predict"),
                        {"signature_name": "__saved_model_init_op", "instances": [1]})  # fmt: skip
    assert (status, body["error"]) == (
        400, "Failed to get input map for signature: __saved_model_init_op")  # fmt: skip
    examples = [client_typed(served, r) for r in served["rows"][:1]]
    status, body = call(served, "POST", at(served, ":regress"), {"examples": examples})
    assert status == 400 and body["error"].startswith("No regression inputs found in SignatureDef")


# -- bad input: 4xx in TF Serving's error shape, and the server keeps serving ----------------


# "{model}" in a message is the served model's name; "{feature}" in a body or a message is a
# required feature of the use case (required_feature).
@pytest.mark.parametrize(
    "path, body, status, message",
    [
        (":predict", b"{not json", 400, "JSON Parse error: "),
        (":predict", b"", 400, "JSON Parse error: The document is empty"),
        (":predict", b"[1, 2]", 400, "Is not object"),
        (":predict", {"signature_name": SERVING_SIGNATURE}, 400,
         "Missing 'inputs' or 'instances' key"),
        (":predict", {"instances": [], "inputs": []}, 400,
         "expecting only one of 'inputs' or 'instances' keys"),
        (":predict", {"signature_name": "nope", "instances": [1]}, 400,
         'Serving signature name: "nope" not found in signature def'),
        (":predict", {"instances": [{"b64": "not base64!"}]}, 400, "Unable to base64 decode"),
        (":predict", {"instances": [{"b64": base64.b64encode(b"\x00garbage").decode()}]}, 400,
         "Could not parse example input"),
        (":predict", b"[" * 5000, 400, "JSON Parse error: "),
        ("/versions/2:predict", {"instances": [1]}, 404,
         "Servable not found for request: Specific({model}, 2)"),
        (":classify", {"examples": {}}, 400, "Expecting 'examples' value to be an list/array"),
        (":regress", {"examples": [{"{feature}": None}]}, 400,
         "Feature: {feature} has element with unexpected JSON type: Null"),
        (":regress", {"examples": [{"{feature}": [1.0, "x"]}]}, 400,
         "Unexpected element type in feature: {feature} expecting type: float"),
        (":explain", {"instances": [1]}, 400,
         "Malformed request: POST /v1/models/{model}:explain"),
    ],
)  # fmt: skip
def test_bad_requests_get_tf_servings_error_and_status(served, path, body, status, message):
    feature = required_feature(served["spec"], served["use_case"].name)
    message = message.format(model=served["model"], feature=feature)
    if not isinstance(body, bytes):
        body = json.dumps(body).replace('"{feature}"', json.dumps(feature))
    raw = body if isinstance(body, bytes) else body.encode()
    got_status, got = call(served, "POST", at(served, path), raw=raw)
    assert got_status == status and list(got) == ["error"] and message in got["error"], got
    assert call(served, "POST", at(served, ":predict"),
                {"instances": b64_instances(served)})[0] == 200  # fmt: skip


# For each kind of feature: values of the wrong JSON type or out of its range, and what the
# error says ("{name}": the feature's name).
NAMED = "key: {name} of 'instances' list"
WRONG_VALUES = {
    tf.float32: [
        ("cheap", [NAMED, 'JSON Value: "cheap" Type: String is not of expected type: float']),
        (10**400, ["out of range for type float"]),
    ],
    tf.int64: [(12.5, ["is not of expected type: int64"])],
    tf.string: [(5, [NAMED, "JSON Value: 5 Type: Number is not of expected type: string"])],
}


def test_a_missing_feature_or_a_wrong_type_names_the_feature(served):
    spec, use_case = served["spec"], served["use_case"]
    typed = [client_typed(served, r) for r in served["rows"][:2]]
    path = at(served, ":predict")
    needed = required_feature(spec, use_case.name)
    missing = [{k: v for k, v in t.items() if k != needed} for t in typed]
    status, body = call(
        served, "POST", path, {"signature_name": RAW_SIGNATURE, "instances": missing}
    )
    assert status == 400 and "keys must be equal to: " in body["error"] and needed in body["error"]
    # Each kind of input the raw signature has refuses a value of the wrong type, naming it.
    kinds = {s.dtype for s in spec.values()}
    unchecked = kinds - set(WRONG_VALUES)
    assert not unchecked, f"use case {use_case.name!r}: add wrong values for {unchecked}"
    for dtype in sorted(kinds, key=lambda d: d.name):
        name = feature_of_kind(spec, dtype)
        for value, messages in WRONG_VALUES[dtype]:
            wrong = [dict(typed[0], **{name: value}), typed[1]]
            status, body = call(
                served, "POST", path, {"signature_name": RAW_SIGNATURE, "instances": wrong}
            )
            assert status == 400, (name, value, body)
            for message in messages:
                assert message.format(name=name) in body["error"], (name, value, body)
    # A tf.Example without a required feature: the model's own parse error, as a 400.
    row = {k: v for k, v in served["rows"][0].items() if k != needed}
    instance = {"b64": base64.b64encode(row_to_example(row, use_case)).decode()}
    status, body = call(served, "POST", path, {"instances": [instance]})
    assert status == 400 and needed in body["error"] and "required" in body["error"], body
    unknown = call(served, "POST", "/v1/models/nope:predict", {"instances": [instance]})
    assert unknown == (404, {"error": "Servable not found for request: Latest(nope)"})


def test_an_oversized_body_is_refused_with_413_without_reading_it_all(served):
    too_big = {"instances": [{"b64": "A" * 4096}] * 400}  # ~1.6 MB, the fixture's limit is 1 MiB
    status, body = call(served, "POST", at(served, ":predict"), too_big)
    assert status == 413 and "larger than this server's limit" in body["error"]
    # Chunked, without a Content-Length: counted as it arrives.
    chunks = (b" " * 65536 for _ in range(20))
    response = requests.post(served["url"] + at(served, ":predict"), data=chunks)
    assert response.status_code == 413 and "error" in response.json()
    # Far past the limit, declared or chunked: still the 413, never a connection reset (uvicorn
    # reads and drops the rest of a body the app left unread, so the client finishes sending).
    huge = b"x" * (24 << 20)
    for data in (huge, (huge[i : i + 65536] for i in range(0, len(huge), 65536))):
        response = requests.post(served["url"] + at(served, ":predict"), data=data, timeout=60)
        assert response.status_code == 413, response.text
        assert "larger than this server's limit of 1048576 bytes" in response.json()["error"]
    assert call(served, "POST", at(served, ":predict"),
                {"instances": b64_instances(served)})[0] == 200  # fmt: skip


def test_client_errors_carry_status_and_message(served):
    with pytest.raises(ServingRequestError) as raised:
        client(served, "nope").predict_examples(served["rows"])
    assert raised.value.status == 404 and "Latest(nope)" in raised.value.message
    assert storage.list_files(f"{served['folder']}/1/{warmup.WARMUP_PATH}")
