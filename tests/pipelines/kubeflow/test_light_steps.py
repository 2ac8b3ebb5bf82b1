"""Steps that run no Beam, TFMA, TFDV or TF Transform do not import them: on Kubeflow each step
is a fresh process, and those imports alone took the Pusher's and the RunReport's start-up from
about 1.1 to 2.1 times a bare `import tensorflow` (bench/results.md, start-up section).

Each executor of the committed spec is imported as the container's entry point imports it
(pipelines/kubeflow/tfx_v2_executor.py's class path), in a fresh interpreter; the steps that
use those libraries by design are named with the reason.
"""

from __future__ import annotations

import json
import subprocess
import sys

from components.base.config import REPO_ROOT, SPEC_PATH
from pipelines.bench.bench_startup import load_spec, step_commands

HEAVY = ("apache_beam", "tensorflow_model_analysis", "tensorflow_data_validation",
         "tensorflow_transform")  # fmt: skip
USES_THEM = {  # task: why it imports them
    "example-gen": "reads the CSV or image files with Beam",
    "statistics-gen": "TFX's executor: TFDV on Beam",
    "example-validator": "TFDV's schema and drift checks",
    "transform": "TFX's executor: TF Transform on Beam",
    "trainer": "TFX's trainer executor; the use case's model reads TF Transform's output",
    "evaluator": "TFMA on Beam",
}


def _imported(class_path: str) -> list[str]:
    module = class_path.rsplit(".", 1)[0]
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            "from pipelines.kubeflow import kfp_entrypoint, tfx_v2_executor; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_steps_without_beam_tfma_tfdv_or_transform_do_not_import_them():
    steps = step_commands(load_spec(SPEC_PATH))
    assert set(USES_THEM) < set(steps)  # a renamed task must be renamed here too
    light = {task: step["executor"] for task, step in steps.items() if task not in USES_THEM}
    assert {"pusher", "run-report", "tuner", "select-spans"} <= set(light)
    imported = {task: _imported(executor) for task, executor in light.items()}
    assert imported == {task: [] for task in light}
    # The check sees those imports where they happen.
    assert _imported(steps["evaluator"]["executor"]) == list(HEAVY)
