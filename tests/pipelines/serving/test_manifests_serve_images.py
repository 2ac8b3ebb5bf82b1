"""The serving manifests (kubeflow/serving/) serve the image use case's model with only the
model's name changed, as their comments say (`sed s/taxi-tips/image-classes/g`).

For each manifest, renamed: every object still validates against its pinned schema; the readiness
probe asks for the image model; the sync init container, run as written (its command and plain
environment; the test store's endpoint and keys for the Secret's), mirrors a pushed image model
into the folder and model config that TF Serving reads; and that copy, loaded as TF Serving
loads a version (tkp serve's Servable: its warm-up records replayed, then a request in TF
Serving's JSON), names the class of base64 images. TF Serving's own binary cannot run here: what
it does with the folder is the behaviour tests/pipelines/serving/test_serve*.py play.
"""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
import tensorflow as tf
import yaml

from components.training.export import RAW_SIGNATURE
from pipelines.serving import tfs_json
from pipelines.serving.servable import Servable
from tests.pipelines import cli_process
from tests.pipelines.serving.served import push
from tests.pipelines.serving.test_serving_manifests import (
    SERVING,
    _StrictLoader,
    schema_errors,
    sync_containers,
    tf_serving,
)

SHIPPED_NAME = "taxi-tips"  # the name the manifests are written with
WORKLOADS = {  # manifest: (the kind that holds the pod, where the pod is in it)
    "tf-serving.yaml": ("Deployment", lambda d: d["spec"]["template"]["spec"]),
    "inferenceservice.yaml": ("InferenceService", lambda d: d["spec"]["predictor"]),
}


@pytest.mark.parametrize("manifest", sorted(WORKLOADS))
def test_the_image_model_is_served_with_only_its_name_changed(
    manifest, object_store, session_models, tmp_path
):
    model = session_models.trained("images")
    name = model.model_name
    assert name != SHIPPED_NAME
    text = (SERVING / manifest).read_text()
    assert SHIPPED_NAME in text
    documents = [d for d in yaml.load_all(text.replace(SHIPPED_NAME, name), _StrictLoader) if d]
    for document in documents:
        assert schema_errors(document) == "", document["kind"]
    kind, pod_of = WORKLOADS[manifest]
    workload = [d for d in documents if d["kind"] == kind][0]  # tf-serving.yaml: stable first
    pod = pod_of(workload)
    assert tf_serving(pod)["readinessProbe"]["httpGet"]["path"] == f"/v1/models/{name}/metadata"
    # The ConfigMap of TF Serving's settings, renamed the same way, is the one the pod mounts.
    config_text = (SERVING / "tf-serving-config.yaml").read_text().replace(SHIPPED_NAME, name)
    (config_map,) = [d for d in yaml.load_all(config_text, _StrictLoader) if d]
    assert schema_errors(config_map) == ""
    mounted = {v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v}
    assert mounted == {config_map["metadata"]["name"]} and name in config_map["metadata"]["name"]

    bucket = object_store.new_bucket("manifest-images")
    eval_frame = model.eval_frame.head(8)
    push(f"s3://{bucket}/serving/{name}", name, model.fn_args.serving_model_dir, 1,
         model.to_examples(eval_frame.head(4), with_label=False))  # fmt: skip
    secret = {"AWS_ENDPOINT_URL_S3": object_store.endpoint, "AWS_REGION": "us-east-1",
              "AWS_ACCESS_KEY_ID": "any", "AWS_SECRET_ACCESS_KEY": "any"}  # fmt: skip
    init, sidecar = sync_containers(pod)
    environments = []
    for container in (init, sidecar):
        environments.append({
            v["name"]: v["value"] if "value" in v else secret[v["valueFrom"]["secretKeyRef"]["key"]]
            for v in container["env"]
        })  # fmt: skip
    assert environments[0] == environments[1] and environments[0]["PIPELINE_MODEL_NAME"] == name
    target = tmp_path / "models"
    command = [str(target) if part == "/models" else part for part in init["command"]]
    assert command[:1] == ["tkp"] and "--once" in command
    env = dict(
        environments[0],
        PIPELINE_WORK_DIR=str(tmp_path / "work"),
        HOME=str(tmp_path),
        PIPELINE_SERVING_ROOT=f"s3://{bucket}/serving",
    )  # the store's bucket for the test
    synced = cli_process.run(tmp_path, *command[1:], **env)
    assert synced.returncode == 0, synced.stdout + synced.stderr
    config = (target / "models.config").read_text()
    assert f'name: "{name}"' in config and f'base_path: "{target / name}"' in config, config

    servable = Servable(name, 1, target / name / "1")
    assert servable.warm_up() > 0
    images = [{"b64": base64.b64encode(image).decode()} for image in eval_frame["image"]]
    body = {"signature_name": RAW_SIGNATURE, "instances": images}
    request, form = tfs_json.predict_request(
        tfs_json.parse(json.dumps(body).encode()), servable.input_types(RAW_SIGNATURE)
    )
    answer = tfs_json.predict_response(servable.predict(request), form)["predictions"]
    named = [p["classes"][int(np.argmax(p["scores"]))] for p in answer]
    # What the trained model itself names for these images.
    raw = tf.saved_model.load(model.fn_args.serving_model_dir).signatures[RAW_SIGNATURE]
    scores = raw(image=tf.constant(list(eval_frame["image"])))["scores"].numpy()
    assert named == [model.kit.class_names[i] for i in scores.argmax(axis=1)]
