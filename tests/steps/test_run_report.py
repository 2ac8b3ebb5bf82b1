"""The run report as the Kubeflow UI reads it, from real local runs
(tests/pipelines/test_pipeline_e2e.py
makes them): metrics, ROC points and confusion matrix equal to the run's evaluation, and a page
that a real browser (headless Chromium, Debian's `chromium`) renders with the decision visible.
The same artifacts on the KFP 2.5 launcher contract:
tests/pipelines/kubeflow/test_kubeflow_spec.py."""

from __future__ import annotations

import html
import math
import re
import shutil
import subprocess

import pytest
from google.protobuf import json_format

from components.base import registry, storage, use_case
from components.steps.evaluation import ROC_THRESHOLDS
from pipelines.run_summary import STEP_ORDER
from tests.use_cases import kit

# One process runs this file and the other reader of the session's retraining loop
# (tests/conftest.py): the loop is trained once.
pytestmark = pytest.mark.xdist_group("retraining_loop")

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
PUSHED_GREEN, REFUSED_RED = (0x2E, 0x7D, 0x32), (0xC6, 0x28, 0x28)  # report_html.STYLE


def ui_view(outputs: dict) -> dict:
    """The RunReport's outputs as KFP's UI gets them: the custom properties of `metrics` and
    `classification_metrics`, and the page at the report's URI."""
    metrics = {k: v.double_value for k, v in outputs["metrics"].custom_properties.items()}
    curves = {}
    for name, value in outputs["classification_metrics"].custom_properties.items():
        decoded = json_format.MessageToDict(value.struct_value)
        curves[name] = decoded.get("__value__", decoded)  # TFX wraps a non-dict JSON value
    page = storage.read_bytes(outputs["report"].uri).decode()
    return {"metrics": metrics, "curves": curves, "page": page}


def approx(value: float):
    """ML Metadata's SQLite store keeps a double to 6 decimal places (0.011559344 -> 0.011559)."""
    return pytest.approx(value, abs=1e-6)


def check_against_the_evaluation(view: dict, summary, class_names: tuple[str, ...]) -> None:
    """Every figure the UI shows equals the Evaluator's; the confusion matrix's classes are
    `class_names`, the use case's."""
    overall = summary.metrics["overall"]
    metrics, curves = view["metrics"], view["curves"]
    assert metrics["auc"] == approx(overall["auc"])
    assert metrics["accuracy"] == approx(overall["binary_accuracy"])
    assert metrics["example_count"] == overall["example_count"]
    assert metrics["span"] == summary.span
    assert metrics["blessed"] == (1.0 if summary.blessed else 0.0)
    if summary.auc_change is None:
        assert "baseline_auc" not in metrics and "auc_change" not in metrics
    else:
        assert metrics["auc_change"] == approx(summary.auc_change)
        assert metrics["baseline_auc"] == approx(overall["auc"] - summary.auc_change)
    # ROC: ConfusionMatrixPlot's thresholds, finite numbers in [0, 1] as the UI's runtype checks.
    points = curves["confidenceMetrics"]
    assert len(points) == ROC_THRESHOLDS + 2
    for point in points:
        assert set(point) == {"confidenceThreshold", "recall", "falsePositiveRate"}
        assert all(math.isfinite(v) for v in point.values())
        assert 0 <= point["recall"] <= 1 and 0 <= point["falsePositiveRate"] <= 1
    recalls = [p["recall"] for p in sorted(points, key=lambda p: p["confidenceThreshold"])]
    assert recalls[0] == 1 and recalls == sorted(recalls, reverse=True)
    # The confusion matrix at 0.5 holds every eval example and gives the Evaluator's accuracy.
    matrix = curves["confusionMatrix"]
    assert [spec["displayName"] for spec in matrix["annotationSpecs"]] == list(class_names)
    (tn, fp), (fn, tp) = (row["row"] for row in matrix["rows"])
    assert tn + fp + fn + tp == overall["example_count"]
    assert (tn + tp) / overall["example_count"] == approx(overall["binary_accuracy"])


# Which of the loop's runs push and which are refused does not hang on training noise: the
# loop's bars sit far from what its models measured (tests/pipelines/retraining_loop.py,
# loop_config), and tests/pipelines/test_pipeline_e2e.py checks each verdict against the metrics it
# recorded. The loop runs the use case of its config: its class names are the ones expected.


def class_names(loop) -> tuple[str, ...]:
    return use_case.load(loop.config.use_case).class_names


def test_a_pushed_run_reports_what_the_evaluation_found(loop):
    view = ui_view(loop.first_report)
    check_against_the_evaluation(view, loop.first, class_names(loop))
    assert view["metrics"]["pushed_version"] == 1
    page = view["page"]
    assert "Pushed: version 1" in page and "No served model to compare with" in page
    record = registry.read_record(loop.config.serving_model_dir, 1)
    assert f"fingerprint <code>{record['input_fingerprint']}</code>" in page
    # The data as StatisticsGen saw it: the eval split is what the Evaluator counted, and every
    # column of the span has a line.
    eval_examples = re.search(r"<th>feature</th><th>train</th><th>eval</th></tr><tr><td>"
                              r"examples</td><td>[\d,]+</td><td>([\d,]+)</td>", page)  # fmt: skip
    assert eval_examples, page
    assert int(eval_examples[1].replace(",", "")) == loop.first.metrics["overall"]["example_count"]
    # A number's range ("2.5 to 10"), a category's counts ("Cash 1,204 · Credit Card 980"),
    # free text ("1,204 values").
    columns = set(re.findall(r"<tr><td>(\w+)</td><td>[^<]*(?: to | · |\d values)", page))
    assert set(kit.of(loop.config.use_case).raw_feature_spec) <= columns, columns
    # Step times of every step before the report, carried along the DAG.
    shown = re.findall(r"<tr><td>(\w+)(?: \(cached[^<]*)?</td><td>[\d.]+</td></tr>", page)
    assert set(shown) == set(STEP_ORDER) - {"RunReport"}, shown
    assert shown[0] in ("SelectSpans", "CuratedSchema")  # in the order they ran


def test_a_run_against_the_served_model_reports_the_baseline(loop):
    view = ui_view(loop.second_report)
    check_against_the_evaluation(view, loop.second, class_names(loop))
    assert view["metrics"]["pushed_version"] == 2
    assert "against the served model" in view["page"] and "Drift of the eval split" in view["page"]


def test_a_refused_run_says_why_it_was_not_pushed(loop):
    view = ui_view(loop.noisy_report)
    check_against_the_evaluation(view, loop.noisy, class_names(loop))
    assert view["metrics"]["pushed_version"] == 0 and view["metrics"]["blessed"] == 0
    refusal = re.search(r'<p class="decision refused">Not pushed: (.*?)</p>', view["page"])
    assert refusal and "not blessed" in refusal.group(1) and "auc" in refusal.group(1)


def _visible_text(dom: str) -> str:
    body = re.sub(r"<style>.*?</style>", "", dom, flags=re.S)
    return html.unescape(re.sub(r"<[^>]+>", " ", body))


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium (Debian package chromium): .ci/run "
                    "installs it")  # fmt: skip
@pytest.mark.parametrize(("run", "banner", "colour"), [
    ("first_report", "Pushed: version 1", PUSHED_GREEN),
    ("noisy_report", "Not pushed: not blessed", REFUSED_RED),
])  # fmt: skip
def test_the_report_renders_in_a_real_browser(loop, tmp_path, run, banner, colour):
    from PIL import Image

    page = tmp_path / "report.html"
    page.write_text(ui_view(getattr(loop, run))["page"])
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
               "--disable-dev-shm-usage", "--force-color-profile=srgb",
               f"--user-data-dir={tmp_path / 'profile'}"]  # fmt: skip
    dom = subprocess.run([*browser, "--dump-dom", page.as_uri()], capture_output=True,
                         text=True, timeout=120, check=True).stdout  # fmt: skip
    text = _visible_text(dom)
    assert banner in text
    assert not re.search(r"[{}]|\bNone\b|\bnan\b", text), "a raw template marker or value"
    tables = {re.search(r"<th>(.*?)</th>", t).group(1): t.count("<tr>")
              for t in re.findall(r"<table>.*?</table>", dom, flags=re.S)}  # fmt: skip
    # Metrics (overall and the slices), the confusion matrix, the step times.
    assert tables["slice"] >= 3 and tables["true \\ predicted"] == 3 and tables["step"] >= 11
    shot = tmp_path / "report.png"
    subprocess.run([*browser, f"--screenshot={shot}", "--window-size=1280,1600", page.as_uri()],
                   capture_output=True, timeout=120, check=True)  # fmt: skip
    image = Image.open(shot).convert("RGB")
    pixels = list(image.getdata())
    # The decision's banner is drawn in its colour, across the page's width.
    banner_rows = {i // image.width for i, p in enumerate(pixels) if p == colour}
    assert len(banner_rows) > 20, "the decision banner is not visible"
    assert (
        sum(1 for p in pixels[min(banner_rows) * image.width :][: image.width] if p == colour)
        > image.width // 2
    )
