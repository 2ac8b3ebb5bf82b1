"""run_fn end to end on a tiny, really transformed data set; plus the device decisions."""

import logging
import os

import attr
import numpy as np
import pytest
import tensorflow as tf
from sklearn.metrics import roc_auc_score
from tfx.components.trainer import fn_args_utils

from components import features, model
from tests.trained_model import EPOCHS, EVAL_ROWS, fn_args_for


def test_exported_model_scores_raw_examples(trained, to_examples):
    fn_args, eval_frame = trained
    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    serve = loaded.signatures["serving_default"]
    outputs = serve(examples=tf.constant(to_examples(eval_frame, with_label=False)))
    probabilities = outputs["outputs"].numpy()
    assert outputs["outputs"].dtype == tf.float32
    assert probabilities.shape == (EVAL_ROWS, 1)
    assert ((probabilities > 0) & (probabilities < 1)).all()
    # The generator's label is learnable: payment type alone separates most of it.
    auc = roc_auc_score(eval_frame[features.LABEL_KEY], probabilities[:, 0])
    assert auc > 0.75, auc


def test_exported_transform_features_signature(trained, to_examples):
    fn_args, eval_frame = trained
    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    transformed = loaded.signatures["transform_features"](
        examples=tf.constant(to_examples(eval_frame.head(4)))
    )
    np.testing.assert_array_equal(
        transformed[features.LABEL_KEY].numpy(), eval_frame[features.LABEL_KEY].head(4)
    )
    assert transformed[features.transformed_name("trip_miles")].shape == (4,)


def test_tensorboard_logs_and_epoch_checkpoints(trained):
    fn_args, _ = trained
    logs = tf.io.gfile.glob(f"{fn_args.model_run_dir}/logs/*/events.out.tfevents.*")
    assert {os.path.basename(os.path.dirname(p)) for p in logs} == {"train", "validation"}
    latest = tf.train.latest_checkpoint(f"{fn_args.model_run_dir}/checkpoints")
    assert latest.endswith(model.CHECKPOINT_NAME.format(epoch=EPOCHS))


def _run_and_get_log_line(fn_args: fn_args_utils.FnArgs, caplog) -> str:
    """Runs run_fn and returns its one 'Training:' log line."""
    with caplog.at_level(logging.INFO, logger="components.model"):
        model.run_fn(fn_args)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Training:")]
    return line


def test_restarted_trainer_resumes_from_the_last_checkpoint(trained, tmp_path, to_examples, caplog):
    """Same model_run_dir, as when the orchestrator retries: nothing left to train."""
    fn_args, eval_frame = trained
    retry = attr.evolve(fn_args, serving_model_dir=str(tmp_path / "serving_model"))
    assert f"epochs={EPOCHS} (from {EPOCHS})" in _run_and_get_log_line(retry, caplog)
    examples = tf.constant(to_examples(eval_frame.head(20), with_label=False))
    first, second = (
        tf.saved_model.load(d).signatures["serving_default"](examples=examples)["outputs"]
        for d in (fn_args.serving_model_dir, retry.serving_model_dir)
    )
    np.testing.assert_allclose(first.numpy(), second.numpy(), rtol=1e-6)


def test_mixed_precision_run_serves_float32(tmp_path, transformed, to_examples, caplog):
    """mixed_float16 as on a GPU (slow but valid on a CPU): the export still takes raw float32."""
    fn_args = fn_args_for(
        transformed,
        tmp_path,
        train_steps=2,
        eval_steps=1,
        custom_config={"epochs": 1, "mixed_precision": "on"},
    )
    line = _run_and_get_log_line(fn_args, caplog)
    assert "strategy=OneDeviceStrategy" in line and "CPU:0" in line
    assert "mixed_precision=True" in line and "steps_per_epoch=2" in line
    assert tf.keras.mixed_precision.global_policy().name == "float32"  # reset for the export
    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    outputs = loaded.signatures["serving_default"](
        examples=tf.constant(to_examples(transformed[2].head(3), with_label=False))
    )["outputs"]
    assert outputs.dtype == tf.float32 and outputs.shape == (3, 1)


# The test machine has no GPU, so GPUs are faked at the device-list boundary: choose_strategy
# takes the visible devices as an argument. MirroredStrategy only names its devices when built,
# so it can be constructed for GPUs that aren't there as long as nothing runs on them.


@pytest.mark.parametrize(
    ("num_gpus", "kind"), [(0, "cpu"), (1, "gpu"), (2, "mirrored"), (8, "mirrored")]
)
def test_strategy_kind(num_gpus, kind):
    assert model.strategy_kind(num_gpus) == kind


def test_choose_strategy_without_gpus_uses_the_cpu():
    strategy = model.choose_strategy(gpus=[])
    assert isinstance(strategy, tf.distribute.OneDeviceStrategy)
    assert strategy.extended.worker_devices[0].endswith("CPU:0")


def test_choose_strategy_with_two_fake_gpus_mirrors():
    """Boundary: a fake device list; the strategy is built but never runs anything."""
    strategy = model.choose_strategy(gpus=["fake-gpu-0", "fake-gpu-1"])
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert [d[-5:] for d in strategy.extended.worker_devices] == ["GPU:0", "GPU:1"]


@pytest.mark.parametrize(
    ("setting", "num_gpus", "expected"),
    [
        ("auto", 0, False),
        ("auto", 1, True),
        ("auto", 4, True),
        ("on", 0, True),
        ("off", 1, False),
    ],
)
def test_use_mixed_precision(setting, num_gpus, expected):
    assert model.use_mixed_precision(setting, num_gpus) is expected


def test_use_mixed_precision_rejects_unknown_setting():
    with pytest.raises(ValueError, match="mixed_precision"):
        model.use_mixed_precision("fp16", 1)


def test_classify_and_raw_feature_signatures_agree_with_serving_default(trained, to_examples):
    """The ways TF Serving reaches the model (tf.Examples, :classify, :regress, plain JSON
    values) give one probability per row; a missing optional feature is "" or 0 in the raw
    form."""
    fn_args, eval_frame = trained
    loaded = tf.saved_model.load(fn_args.serving_model_dir)
    rows = eval_frame.head(8).copy()
    rows.loc[rows.index[0], "company"] = None
    rows.loc[rows.index[1], "pickup_community_area"] = None
    examples = tf.constant(to_examples(rows, with_label=False))
    expected = loaded.signatures[model.SERVING_SIGNATURE](examples=examples)["outputs"].numpy()

    classified = loaded.signatures[model.CLASSIFY_SIGNATURE](inputs=examples)
    assert [c.decode() for c in classified["classes"].numpy()[0]] == list(model.CLASS_LABELS)
    np.testing.assert_allclose(classified["scores"].numpy()[:, 1], expected[:, 0], rtol=1e-6)
    np.testing.assert_allclose(classified["scores"].numpy().sum(axis=1), 1.0, rtol=1e-6)
    regressed = loaded.signatures[model.REGRESS_SIGNATURE](inputs=examples)["outputs"]
    np.testing.assert_allclose(regressed.numpy(), expected, rtol=1e-6)

    raw = loaded.signatures[model.RAW_SIGNATURE]
    inputs = {}
    for key, spec in raw.structured_input_signature[1].items():
        column = rows[key]
        if spec.dtype == tf.string:
            inputs[key] = tf.constant(column.fillna("").astype(str).tolist())
        else:
            inputs[key] = tf.constant(column.fillna(0).tolist(), dtype=spec.dtype)
    np.testing.assert_allclose(raw(**inputs)["outputs"].numpy(), expected, rtol=1e-5)
