"""`tkp serve` answering an image model as TF Serving 2.16.1 would: base64 images to :predict
(the raw_features signature) and inside examples to :classify, class names with their scores,
warm-up from real eval images, and TF Serving-shaped errors for what is not an image, after
which the server keeps serving. The model is the session's one of the images use case
(tests/use_cases/kit.py); the versions come from a real SeaweedFS store."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import requests
import tensorflow as tf

from components.steps.image_input import IMAGE_KEY
from components.training.export import CLASSIFY_SIGNATURE, RAW_SIGNATURE, SERVING_SIGNATURE
from tests.pipelines.serving.served import push, serving

IMAGES = 6


@pytest.fixture(scope="module")
def served(object_store, session_models, tmp_path_factory):
    model = session_models.trained("images")
    name, eval_frame = model.model_name, model.eval_frame
    folder = f"s3://{object_store.new_bucket('serve-images')}/serving/{name}"
    push(folder, name, model.fn_args.serving_model_dir, 1,
         model.to_examples(eval_frame.head(8), with_label=False))  # fmt: skip
    chosen = eval_frame.groupby("label_name").head(IMAGES // 3).head(IMAGES)  # several classes
    images = list(chosen[IMAGE_KEY])
    saved = tf.saved_model.load(model.fn_args.serving_model_dir)
    expected = saved.signatures[RAW_SIGNATURE](image=tf.constant(images))
    with serving(name, folder, tmp_path_factory.mktemp("cache"), max_request_bytes=1 << 20) as on:
        yield dict(url=f"{on.url}/v1/models/{name}", said=on.said, images=images,
                   classes=model.kit.class_names, scores=expected["scores"].numpy(),
                   labels=list(chosen["label_name"]))  # fmt: skip


def b64(data: bytes) -> dict[str, str]:
    return {"b64": base64.b64encode(data).decode()}


def post(served, verb: str, signature: str, **body) -> tuple[int, dict]:
    """POST {"signature_name": signature, **body} to the model's :verb."""
    body = {"signature_name": signature, **body}
    response = requests.post(f"{served['url']}:{verb}", data=json.dumps(body), timeout=30)
    assert response.headers["content-type"] == "application/json"
    return response.status_code, response.json()


def test_the_version_is_warmed_up_with_its_eval_images(served):
    # :predict on examples (one, then a batch), :classify, and :predict on raw images: no
    # :regress, which a multi-class model does not answer.
    assert served["said"][0].startswith("Version 1 serves (loaded and warmed up with 4 requests")


def test_predict_takes_base64_images_and_answers_classes_and_scores(served):
    status, body = post(
        served, "predict", RAW_SIGNATURE, instances=[b64(i) for i in served["images"]]
    )
    assert status == 200, body
    predictions = body["predictions"]
    assert [p["classes"] for p in predictions] == [served["classes"]] * IMAGES
    np.testing.assert_allclose([p["scores"] for p in predictions], served["scores"], atol=1e-5)
    np.testing.assert_allclose(np.sum(served["scores"], axis=1), 1.0, atol=1e-5)
    # Columnar: the one input, named.
    status, body = post(
        served, "predict", RAW_SIGNATURE, inputs={IMAGE_KEY: [b64(served["images"][0])]}
    )
    assert status == 200
    np.testing.assert_allclose(body["outputs"]["scores"][0], served["scores"][0], atol=1e-5)


def test_the_model_names_the_class_of_most_eval_images(served):
    predicted = [served["classes"][int(np.argmax(s))] for s in served["scores"]]
    right = sum(p == label for p, label in zip(predicted, served["labels"], strict=True))
    assert right >= IMAGES // 2, (predicted, served["labels"])


def test_classify_takes_images_inside_examples(served):
    status, body = post(
        served,
        "classify",
        CLASSIFY_SIGNATURE,
        examples=[{IMAGE_KEY: b64(i)} for i in served["images"]],
    )
    assert status == 200, body
    for result, scores in zip(body["results"], served["scores"], strict=True):
        assert [name for name, _ in result] == served["classes"]
        np.testing.assert_allclose([score for _, score in result], scores, atol=1e-5)


def test_predict_on_examples_gives_one_probability_per_class(served):
    example = tf.train.Example(features=tf.train.Features(feature={IMAGE_KEY: tf.train.Feature(
        bytes_list=tf.train.BytesList(value=[served["images"][0]]))}))  # fmt: skip
    status, body = post(
        served, "predict", SERVING_SIGNATURE, instances=[b64(example.SerializeToString())]
    )
    assert status == 200
    np.testing.assert_allclose(body["predictions"][0], served["scores"][0], atol=1e-5)


@pytest.mark.parametrize(
    "instance, message",
    [
        ({"b64": "not base64!"}, "Unable to base64 decode"),
        (b64(b"hello, I am not an image"), "Unknown image file format"),
        (b64(b""), "Input is empty"),
        ({"b64": ""}, "Input is empty"),
    ],
)  # fmt: skip
def test_what_is_no_image_gets_a_400_and_the_server_keeps_serving(served, instance, message):
    status, body = post(served, "predict", RAW_SIGNATURE, instances=[instance])
    assert status == 400 and list(body) == ["error"] and message in body["error"], body
    status, _ = post(served, "predict", RAW_SIGNATURE, instances=[b64(served["images"][0])])
    assert status == 200


def test_regress_is_refused_as_tf_serving_refuses_a_missing_signature(served):
    status, body = post(
        served, "regress", "regress", examples=[{IMAGE_KEY: b64(served["images"][0])}]
    )
    assert status == 400 and "regress" in body["error"], body
