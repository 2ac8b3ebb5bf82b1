"""The Evaluator step on a real trained model and real TFMA: a slice whose examples all carry one
label has no AUC, and every reader says so ("n/a" and why) instead of the 0 or 1 TFMA reports.
The tests with a model run once per shipped use case (`use_case_model`): the label, the slice
key and the class names are the use case's.
"""

import json
import shutil

import pytest
import tensorflow as tf
from tfx.types import artifact_utils, standard_artifacts
from tfx.utils import path_utils

from components.base import storage
from components.steps import kfp_artifacts, report_html, run_report
from components.steps.auc_text import AUC_UNDEFINED_KEY
from components.steps.baseline import BASELINE_VERSION_KEY, NO_BASELINE
from components.steps.evaluation import (
    VERDICT_FILE,
    ThresholdEvaluatorExecutor,
    one_class_present,
)
from components.steps.example_gen import CLASS_NAMES_KEY
from components.training.export import CLASS_NAMES_PATH
from pipelines.run_summary import RunSummary, format_summary

ONE_LABEL = "n/a: every example of this slice has label 0 (AUC needs both labels)"


def one_label(model, label) -> str:
    """The reason an undefined AUC gives for a slice whose examples all carry `label` (an index):
    a binary model names the label's value, a multi-class one its class."""
    if model.kit.images:
        return (f"n/a: every example of this slice has label {model.kit.class_names[label]} "
                "(AUC needs several labels)")  # fmt: skip
    return ONE_LABEL.replace("label 0", f"label {label}")


def _evaluate(tmp_path, fn_args, use_case, rows: list[bytes], class_names=None,
              baseline_dir: str | None = None):  # fmt: skip
    """The ThresholdEvaluator's executor as the pipeline runs it (first model: no baseline, else
    the served model in `baseline_dir`, as version 3); returns its verdict.json and the
    blessing. `class_names`: the classes ExampleGen records on the examples of an image use
    case."""
    model = standard_artifacts.Model()
    model.uri = str(tmp_path / "model")
    shutil.copytree(fn_args.serving_model_dir, path_utils.serving_model_dir(model.uri))
    examples = standard_artifacts.Examples()
    examples.uri = str(tmp_path / "examples")
    examples.split_names = artifact_utils.encode_split_names(["eval"])
    if class_names:
        examples.set_string_custom_property(CLASS_NAMES_KEY, json.dumps(class_names))
    path = f"{examples.uri}/Split-eval/data_tfrecord-00000-of-00001.gz"
    storage.write_bytes(path, b"")
    with tf.io.TFRecordWriter(path, options="GZIP") as writer:
        for row in rows:
            writer.write(row)
    baseline = standard_artifacts.Model()
    baseline.uri = str(tmp_path / "no_baseline")
    baseline.set_int_custom_property(BASELINE_VERSION_KEY, NO_BASELINE)
    if baseline_dir:
        baseline.uri = str(tmp_path / "baseline")
        shutil.copytree(baseline_dir, path_utils.serving_model_dir(baseline.uri))
        baseline.set_int_custom_property(BASELINE_VERSION_KEY, 3)
    evaluation = standard_artifacts.ModelEvaluation()
    evaluation.uri = str(tmp_path / "evaluation")
    blessing = standard_artifacts.ModelBlessing()
    blessing.uri = str(tmp_path / "blessing")
    ThresholdEvaluatorExecutor().Do(
        {"examples": [examples], "model": [model], "baseline_model": [baseline]},
        {"evaluation": [evaluation], "blessing": [blessing]},
        {"min_auc": 0.0, "min_accuracy": 0.0, "max_auc_drop": 1.0,
         "label_key": use_case.label_key, "slice_keys": json.dumps(list(use_case.slice_keys))},
    )  # fmt: skip
    return json.loads(storage.read_bytes(f"{blessing.uri}/{VERDICT_FILE}")), blessing


def one_slice(frame, key: str):
    """The first value of slice key `key` (by value) whose slice holds more than 10 rows and
    leaves more than 10 outside, and the mask of its rows."""
    for value, count in sorted(frame[key].value_counts().items()):
        if 10 < count < len(frame) - 10:
            return value, frame[key] == value
    raise AssertionError(f"no value of slice key {key!r} has between 10 and "
                         f"{len(frame) - 10} of the eval rows: give this use case's tests more "
                         "eval rows")  # fmt: skip


def test_a_slice_of_one_label_has_no_auc_and_every_reader_says_why(use_case_model, tmp_path):
    fn_args, use_case = use_case_model.fn_args, use_case_model.use_case
    label, key = use_case.label_key, use_case.slice_keys[0]
    frame = use_case_model.eval_frame.copy()
    value, chosen = one_slice(frame, key)
    frame.loc[chosen, label] = 0  # one label in that slice
    assert frame.loc[~chosen, label].nunique() >= 2
    name = f"{key}={value}"

    classes = use_case_model.kit.class_names if use_case_model.kit.images else None
    verdict, _ = _evaluate(tmp_path, fn_args, use_case, use_case_model.to_examples(frame), classes)

    metrics = verdict["metrics"]  # also what the Pusher records in the registry
    assert metrics[name]["example_count"] == chosen.sum()
    # Every slice of one label (the chosen one, and any small one that happens to be) says n/a
    # and why; every slice of both labels has a number, whatever it is (0 can be a real AUC).
    labels = frame.groupby(key)[label].agg(["nunique", "first"])
    sliced = [m for m in metrics if m.startswith(f"{key}=")]
    assert {str(v) for v in labels.index} == {m.split("=", 1)[1] for m in sliced}
    assert all(m == "overall" or m.split("=", 1)[0] in use_case.slice_keys for m in metrics)
    summary = format_summary(RunSummary(steps=[], span=0, metrics=metrics, blessed=True))
    for slice_value, (count, first) in labels.iterrows():
        values = metrics[f"{key}={slice_value}"]
        if count == 1:
            reason = one_label(use_case_model, first)
            assert values["auc"] is None and values[AUC_UNDEFINED_KEY] == reason
            assert f"{key + '=' + str(slice_value):<32} auc={reason}" in summary
        else:
            assert 0 <= values["auc"] <= 1 and AUC_UNDEFINED_KEY not in values, slice_value
    facts = {"span": 0, "spans": [0], "fingerprint": "f", "data": {"splits": {}, "features": []},
             "validation": {"columns": {}, "drift_baseline_span": -1, "drift": []},
             "metrics": metrics, "failures": [], "auc": metrics["overall"]["auc"],
             "auc_change": None, "baseline_auc": None, "blessed": True, "pushed_version": 1,
             "not_pushed_reason": "", "curve": [], "confusion": {}, "steps": {},
             "class_names": verdict.get("class_names") or list(use_case.class_names),
             "multi_class": bool(classes), "matrix": verdict.get("confusion_matrix"),
             "samples": verdict.get("samples", [])}  # fmt: skip
    page = report_html.render(facts)
    reason = one_label(use_case_model, 0)
    assert f"<td>{name}</td><td>{chosen.sum()}</td><td>{reason}</td>" in page


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


def test_eval_data_of_one_label_blesses_no_model(use_case_model, tmp_path):
    """With one label in the whole eval split, TFMA still reports an AUC (0 or 1) and would
    bless on it with bars of 0: the Evaluator refuses instead, and says why."""
    use_case = use_case_model.use_case
    frame = use_case_model.eval_frame.assign(**{use_case.label_key: 0})

    classes = use_case_model.kit.class_names if use_case_model.kit.images else None
    verdict, blessing = _evaluate(tmp_path, use_case_model.fn_args, use_case,
                                  use_case_model.to_examples(frame), classes)  # fmt: skip

    assert blessing.get_int_custom_property("blessed") == 0
    assert verdict["metrics"]["overall"]["auc"] is None
    reason = one_label(use_case_model, 0)
    assert f"AUC {reason}: the model cannot be judged on this eval data" in verdict["failures"]


def test_a_slice_without_every_class_has_no_macro_auc():
    classes = ["circle", "cross", "square"]
    missing = [[5, 0, 0], [0, 0, 0], [1, 0, 3]]
    assert one_class_present(missing, classes) == (
        "n/a: no example of class cross in this slice (the macro-averaged AUC needs every class)"
    )
    alone = [[5, 1], [0, 0]]  # TFMA leaves trailing classes without entries out
    assert one_class_present(alone, classes) == (
        "n/a: every example of this slice has label circle (AUC needs several labels)"
    )
    assert one_class_present([[5, 0, 0], [1, 2, 0], [0, 0, 3]], classes) is None


def test_a_served_model_of_other_classes_is_not_compared(session_models, tmp_path):
    """After a config change of class_names the served model predicts other classes: TFMA
    cannot compare the two (class ids out of its range, or meaning other classes), so the
    candidate is judged on the thresholds alone and the verdict says why."""
    model = session_models.trained("images")
    served = tmp_path / "served"
    shutil.copytree(model.fn_args.serving_model_dir, served)
    (served / CLASS_NAMES_PATH).write_text(json.dumps(["circle", "cross", "square"]))
    rows = model.to_examples(model.eval_frame)

    verdict, blessing = _evaluate(tmp_path, model.fn_args, model.use_case, rows,
                                  model.kit.class_names, baseline_dir=str(served))  # fmt: skip

    assert verdict["not_compared"].startswith(
        "served version 3 predicts the classes ['circle', 'cross', 'square'], this model "
        f"{model.kit.class_names}: judged on the thresholds alone"
    )
    assert verdict["auc_change"] is None and blessing.get_int_custom_property("blessed") == 1
    # The same classes: compared, the AUC difference read (0 against itself).
    (served / CLASS_NAMES_PATH).write_text(json.dumps(model.kit.class_names))
    verdict, _ = _evaluate(tmp_path / "same", model.fn_args, model.use_case, rows,
                           model.kit.class_names, baseline_dir=str(served))  # fmt: skip
    assert verdict["not_compared"] is None and verdict["auc_change"] == pytest.approx(0, abs=1e-6)
