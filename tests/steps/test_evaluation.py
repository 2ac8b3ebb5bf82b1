"""The Evaluator step on a real trained model and real TFMA: a slice whose examples all carry one
label has no AUC, and every reader says so ("n/a" and why) instead of the 0 or 1 TFMA reports.
"""

import json
import shutil

import tensorflow as tf
from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import path_utils

from components.base import storage
from components.steps import kfp_artifacts, report_html, run_report
from components.steps.auc_text import AUC_UNDEFINED_KEY
from components.steps.baseline import BASELINE_VERSION_KEY, NO_BASELINE
from components.steps.evaluation import VERDICT_FILE, ThresholdEvaluatorExecutor
from components.use_cases.taxi import USE_CASE
from pipelines.run_summary import RunSummary, format_summary

ONE_LABEL = "n/a: every example of this slice has label 0 (AUC needs both labels)"


def _evaluate(tmp_path, fn_args, rows: list[bytes]):
    """The ThresholdEvaluator's executor as the pipeline runs it (first model: no baseline);
    returns its verdict.json and the blessing."""
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    shutil.copytree(fn_args.serving_model_dir, path_utils.serving_model_dir(model.uri))
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = artifact_utils.encode_split_names(["eval"])
    path = f"{examples.uri}/Split-eval/data_tfrecord-00000-of-00001.gz"
    storage.write_bytes(path, b"")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for row in rows:
            writer.write(row)
    baseline = standard_artifacts.Model()
    baseline.uri = str(tmp_path / "no_baseline")
    baseline.set_int_custom_property(BASELINE_VERSION_KEY, NO_BASELINE)
    evaluation = standard_artifacts.ModelEvaluation()
    evaluation.uri = str(tmp_path / "evaluation")
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "blessing")
    ThresholdEvaluatorExecutor().Do(
        {"examples": [examples], "model": [model], "baseline_model": [baseline]},
        {"evaluation": [evaluation], "blessing": [blessing]},
        {"min_auc": 0.0, "min_accuracy": 0.0, "max_auc_drop": 1.0,
         "label_key": USE_CASE.label_key, "slice_keys": json.dumps(list(USE_CASE.slice_keys))},
    )  # fmt: skip
    return json.loads(storage.read_bytes(f"{blessing.uri}/{VERDICT_FILE}")), blessing


def test_a_slice_of_one_label_has_no_auc_and_every_reader_says_why(trained, tmp_path, to_examples):
    fn_args, eval_frame = trained
    frame = eval_frame.copy()
    cash = frame["payment_type"] == "Cash"
    assert 10 < cash.sum() < len(frame) - 10
    frame.loc[cash, "big_tipper"] = 0  # no cash payer tips: one label in that slice
    assert frame.loc[~cash, "big_tipper"].nunique() == 2

    verdict, _ = _evaluate(tmp_path, fn_args, to_examples(frame))

    metrics = verdict["metrics"]  # also what the Pusher records in the registry
    assert metrics["payment_type=Cash"]["example_count"] == cash.sum()
    # Every slice of one label (Cash, and any small one that happens to be) says n/a and why;
    # every slice of both labels has a number, whatever it is (0 can be a real AUC).
    labels = frame.groupby("payment_type")["big_tipper"].agg(["nunique", "first"])
    assert set(labels.index) == {name.split("=")[1] for name in metrics if name != "overall"}
    summary = format_summary(RunSummary(steps=[], span=0, metrics=metrics, blessed=True))
    for payment, (count, label) in labels.iterrows():
        values = metrics[f"payment_type={payment}"]
        if count == 1:
            reason = ONE_LABEL.replace("label 0", f"label {label}")
            assert values["auc"] is None and values[AUC_UNDEFINED_KEY] == reason
            assert f"{'payment_type=' + payment:<32} auc={reason}" in summary
        else:
            assert 0 <= values["auc"] <= 1 and AUC_UNDEFINED_KEY not in values, payment
    facts = {"span": 0, "spans": [0], "fingerprint": "f",
             "validation": {"columns": {}, "drift_baseline_span": -1, "drift": []},
             "metrics": metrics, "failures": [], "auc": metrics["overall"]["auc"],
             "auc_change": None, "baseline_auc": None, "blessed": True, "pushed_version": 1,
             "not_pushed_reason": "", "curve": [], "confusion": {}, "steps": {},
             "class_names": list(USE_CASE.class_names)}  # fmt: skip
    page = report_html.render(facts)
    assert f"<td>payment_type=Cash</td><td>{cash.sum()}</td><td>{ONE_LABEL}</td>" in page


def test_kubeflow_metrics_carry_the_reason_when_the_overall_auc_is_undefined():
    """system.Metrics holds numbers only; an undefined overall AUC is left out, and the reason
    is a text property beside the numbers (the UI lists both)."""
    metrics = kfp_artifacts.Metrics()
    overall = {"auc": None, AUC_UNDEFINED_KEY: ONE_LABEL, "example_count": 40.0}
    facts = {"metrics": {"overall": overall}, "baseline_auc": None, "auc_change": None,
             "blessed": False, "pushed_version": None, "span": 3}  # fmt: skip
    run_report.write_metrics(metrics, facts)
    assert not metrics.has_custom_property("auc")
    assert metrics.get_string_custom_property(AUC_UNDEFINED_KEY) == ONE_LABEL
    assert metrics.get_float_custom_property("example_count") == 40.0


def test_eval_data_of_one_label_blesses_no_model(trained, tmp_path, to_examples):
    """With one label in the whole eval split, TFMA still reports an AUC (0 or 1) and would
    bless on it with bars of 0: the Evaluator refuses instead, and says why."""
    fn_args, eval_frame = trained
    frame = eval_frame.assign(big_tipper=0)

    verdict, blessing = _evaluate(tmp_path, fn_args, to_examples(frame))

    assert blessing.get_int_custom_property("blessed") == 0
    assert verdict["metrics"]["overall"]["auc"] is None
    assert f"AUC {ONE_LABEL}: the model cannot be judged on this eval data" in verdict["failures"]
