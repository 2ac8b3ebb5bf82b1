"""The images use case's test fixtures: what its tests train and run with (SETTINGS). Its data,
transformed examples and the session's one trained model come from tests/use_cases/kit.py, shared
with the generic tests. tests/conftest.py loads this module as a pytest plugin."""

from tests.use_cases import kit

SETTINGS = kit.TestSettings(
    # The session's model: 600 images, 500 steps of 32 (about 35 s here); it names most eval
    # images' class (tests/use_cases/images/test_serving.py), as a served model must (at 400
    # steps some seeds stayed near 0.56 accuracy).
    train_rows=600,
    eval_rows=120,
    epochs=2,
    learning_rate=0.003,
    train_steps=500,
    eval_steps=4,
    trainer={"batch_size": 32, "early_stopping_patience": 0},
    # Runs of the compiled spec: 400 images a span, 200 steps. Such a model of 4 classes
    # reaches a macro AUC above 0.9 and accuracy above 0.7 (a model that guesses: 0.5 and 0.25),
    # so only a broken step fails these bars; no model reaches an AUC of 0.9999 on 80 eval
    # images of noisy shapes.
    span_rows=400,
    run_bars={"min_auc": 0.6, "min_accuracy": 0.35},
    unreachable_auc=0.9999,
    separation=0.2,
)
