"""The image use case's retraining loop with LocalDagRunner against a real SeaweedFS server, span
by span as a user lives it: span 0 gives version 1, which answers a base64 image over TF
Serving's REST API; span 0 again trains nothing; a span with a cut-off file stops at ExampleGen
naming it; a span with a new class stops naming it; a span whose class balance drifted stops at
validation; a span with broken labels is not blessed and version 1 keeps serving. Nothing a
stopped run read is pushed."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import types

import pytest
import requests
from google.protobuf import json_format

from components.base import registry, serving_state, storage
from components.base.config import DEFAULT_DRIFT, PipelineConfig
from components.base.errors import actionable_cause
from components.training.export import RAW_SIGNATURE
from components.use_cases.images import data as images_data
from pipelines import data
from pipelines.local.local_runner import run_pipeline
from pipelines.run_summary import format_summary, latest_step_outputs
from tests.pipelines.serving.served import serving

IMAGES = 600  # per span: a 120-image eval split
ASKED = 10  # images of each class sent to the served model


def image_config(bucket: str, work) -> PipelineConfig:
    config = PipelineConfig.load({"use_case": "images"}, environ={})
    return dataclasses.replace(
        config,
        data_root=f"s3://{bucket}/data",
        serving_root=f"s3://{bucket}/serving",
        pipeline_root=str(work / "pipeline_root"),
        metadata_path=str(work / "metadata.sqlite"),
        train_steps=800,
        eval_steps=8,
        epochs=2,
        # At 800 steps a model of a clean span reached accuracy 0.95 on the worst of the seeds
        # tried (at 400 steps the seeds gave 0.56-0.93: too close to the bar); one of a span
        # whose labels are 60 % wrong stays below 0.45 (its eval labels are wrong too).
        min_accuracy=0.6,
        min_auc=0.8,
        max_auc_drop=0.1,
    )


def _failure(config: PipelineConfig) -> Exception:
    with pytest.raises(Exception) as raised:
        run_pipeline(config)
    return actionable_cause(raised.value)


def _write(config: PipelineConfig, span: int, files: list[tuple[str, bytes]]) -> None:
    for name, content in files:
        storage.write_bytes(f"{data.span_dir(config.data_root, span)}/{name}", content)
    storage.write_bytes(f"{data.span_dir(config.data_root, span)}/_SUCCESS", b"")


@pytest.fixture(scope="module")
def image_loop(object_store, tmp_path_factory) -> types.SimpleNamespace:
    bucket = object_store.new_bucket("image-loop")
    config = image_config(bucket, tmp_path_factory.mktemp("image-loop"))
    seen = types.SimpleNamespace(config=config)

    def served() -> int | None:
        return serving_state.read(config.serving_model_dir, config.model_name).stable

    data.write_span(config.data_root, 0, IMAGES, use_case="images")
    seen.first = run_pipeline(config)
    seen.first_report = latest_step_outputs(config, "RunReport")
    seen.answer = _ask_served_model(config, tmp_path_factory.mktemp("cache"))
    seen.again = run_pipeline(config)
    data.write_span(config.data_root, 1, IMAGES, use_case="images", corrupt=1)
    seen.corrupt_error = _failure(config)
    seen.versions_after_corrupt = sorted(registry.complete_versions(config.serving_model_dir))
    clean = dict(images_data.generate_span(IMAGES, 1))
    (seen.corrupt_file,) = [p for p, d in images_data.generate_span(IMAGES, 1, corrupt=1)
                            if d != clean[p]]  # fmt: skip
    new_class = images_data.generate_span(IMAGES, 2)
    new_class.append(("hexagon/h-0.png", new_class[0][1]))
    _write(config, 2, new_class)
    seen.new_class_error = _failure(config)
    data.write_span(config.data_root, 3, IMAGES, use_case="images", drift=DEFAULT_DRIFT)
    seen.drift_error = _failure(config)
    data.write_span(config.data_root, 4, IMAGES, use_case="images", label_noise=0.6)
    seen.noisy = run_pipeline(config)
    seen.served_after_noisy = served()
    seen.versions = sorted(registry.complete_versions(config.serving_model_dir))
    return seen


def _ask_served_model(config: PipelineConfig, cache) -> dict:
    """`tkp serve`'s server on the serving folder, asked what the first ASKED images of each class
    of span 0 show, as a client asks: base64 JPEG or PNG bytes to :predict."""
    with serving(config.model_name, config.serving_model_dir, cache) as server:
        firsts: dict[str, list[bytes]] = {}
        for path, content in images_data.generate_span(IMAGES, 0):
            firsts.setdefault(path.split("/")[0], []).append(content)
        asked = [(folder, c) for folder, contents in firsts.items() for c in contents[:ASKED]]
        instances = [{"b64": base64.b64encode(c).decode()} for _, c in asked]
        body = {"signature_name": RAW_SIGNATURE, "instances": instances}
        response = requests.post(f"{server.url}/v1/models/{config.model_name}:predict",
                                 data=json.dumps(body), timeout=60)  # fmt: skip
        return {"status": response.status_code, "body": response.json(),
                "folders": [folder for folder, _ in asked]}  # fmt: skip


def test_span_0_is_served_as_version_1_and_names_the_class_of_a_base64_image(image_loop):
    summary, config = image_loop.first, image_loop.config
    assert summary.blessed is True and summary.pushed_path == f"{config.serving_model_dir}/1"
    overall = summary.metrics["overall"]
    assert overall["accuracy"] >= config.min_accuracy and overall["auc"] >= config.min_auc
    assert overall["top_2_accuracy"] >= overall["accuracy"]
    for name in images_data.CLASSES:  # each class against the rest, named
        assert 0 <= overall[f"recall[{name}]"] <= 1 and f"label_name={name}" in summary.metrics
    answer = image_loop.answer
    assert answer["status"] == 200, answer
    predictions = answer["body"]["predictions"]
    assert [p["classes"] for p in predictions] == [sorted(images_data.CLASSES)] * 4 * ASKED
    named = [p["classes"][p["scores"].index(max(p["scores"]))] for p in predictions]
    right = sum(n == f for n, f in zip(named, answer["folders"], strict=True))
    assert right >= 0.6 * len(named), named  # the bar the gate set on the eval split
    assert "accuracy=" in format_summary(summary)


def test_the_run_report_shows_the_confusion_matrix_classes_and_eval_images(image_loop):
    report = image_loop.first_report
    page = storage.read_bytes(report["report"].uri).decode()
    assert "Confusion matrix (the most probable class)" in page
    assert page.count('<img src="data:image/jpeg;base64,') == 8
    for name in images_data.CLASSES:
        assert f"<td>{name}</td>" in page
    # The N x N matrix, as the Kubeflow UI draws it (system.ClassificationMetrics).
    artifact = report["classification_metrics"]
    matrix = json_format.MessageToDict(artifact.custom_properties["confusionMatrix"].struct_value)
    names = [spec["displayName"] for spec in matrix["annotationSpecs"]]
    assert names == sorted(images_data.CLASSES)
    rows = [row["row"] for row in matrix["rows"]]
    assert len(rows) == 4 and all(len(row) == 4 for row in rows)
    assert sum(map(sum, rows)) == image_loop.first.metrics["overall"]["example_count"]
    assert "confidenceMetrics" not in artifact.custom_properties  # no ROC curve: multi-class
    # The data: examples per split, class counts and image sizes, from StatisticsGen.
    header = r"<tr><th>feature</th><th>(\w+)</th><th>(\w+)</th></tr>"
    splits = re.search(header + r"<tr><td>examples</td><td>([\d,]+)</td><td>([\d,]+)</td>", page)
    assert splits and {splits[1], splits[2]} == {"train", "eval"}, page
    assert int(splits[3].replace(",", "")) + int(splits[4].replace(",", "")) == IMAGES
    (counts,) = re.findall(r"<tr><td>label_name</td><td>([^<]*)</td>", page)
    found = dict(re.findall(r"(\w+) (\d{1,3}(?:,\d{3})*)(?: · |$)", counts))
    assert set(found) == set(images_data.CLASSES), counts
    # The first column is the first split's.
    assert sum(int(n.replace(",", "")) for n in found.values()) == int(splits[3].replace(",", ""))
    assert re.search(r"<tr><td>height</td><td>\d+ to \d+, mean [\d.]+</td>", page)
    assert re.search(r"<tr><td>image</td><td>[\d.]+ KB on average", page)


def test_the_same_span_again_trains_nothing(image_loop):
    again = image_loop.again
    assert again.trained is False and "no new data since span 0" in again.decision


def test_a_cut_off_image_stops_the_run_naming_it_and_nothing_is_pushed(image_loop):
    message = str(image_loop.corrupt_error)
    span_dir = data.span_dir(image_loop.config.data_root, 1)
    assert f"{span_dir}/{image_loop.corrupt_file}: does not decode as " in message
    assert f"1 of {IMAGES} images cannot be used" in message
    assert image_loop.versions_after_corrupt == [1]  # nothing pushed


def test_a_new_class_stops_the_run_naming_it(image_loop):
    message = str(image_loop.new_class_error)
    assert "span 2 has a new class 'hexagon' (1 image(s))" in message
    assert "--set class_names=circle,cross,square,triangle,hexagon" in message


def test_a_drifted_class_balance_stops_at_validation(image_loop):
    message = str(image_loop.drift_error)
    assert "span 3 drifted from span 0" in message
    assert "feature 'label_name': L-infinity distance" in message
    assert "feature 'height': Jensen-Shannon divergence" in message


def test_broken_labels_are_not_blessed_and_version_1_keeps_serving(image_loop):
    noisy = image_loop.noisy
    assert noisy.span == 4 and noisy.trained is True
    assert noisy.blessed is False and noisy.pushed_path is None
    assert any(f.startswith("accuracy value") for f in noisy.validation_failures), noisy
    # Compared with the served version 1 on this eval data: TFMA's macro AUC difference.
    assert noisy.baseline_version == 1 and noisy.auc_change is not None
    assert noisy.metrics["overall"]["auc_diff"] == pytest.approx(noisy.auc_change)
    assert image_loop.served_after_noisy == 1 and image_loop.versions == [1]
