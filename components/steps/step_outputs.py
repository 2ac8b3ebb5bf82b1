"""What one step writes on its artifacts and a later step reads: custom property names, file
names and their readers.

Here, not beside the steps that write them, because those import TFMA, TFDV or Beam at module
level (and any `tfx.components.*` or `tfx.types.standard_component_specs` import pulls in all
three: tfx/components/__init__.py imports every component). The Pusher, the Tuner and the
RunReport read only these, so on Kubeflow they start in about the time of a bare `import
tensorflow` (pipelines/bench/bench_startup.py measures it; tests/pipelines/kubeflow/
test_light_steps.py keeps the heavy modules out of their imports).
"""

from __future__ import annotations

import json

from tensorflow_metadata.proto.v0 import statistics_pb2

from components.base import storage

# ExampleGen's, on the examples: the model's classes (JSON list, label-index order) when they
# come from the data (image folders).
CLASS_NAMES_KEY = "class_names"
# The Trainer's, on the model: what it was trained with, and the search those values came
# from (JSON); the Tuner writes the same search under the same name on its best values.
HYPERPARAMETERS_KEY = "hyperparameters"
SEARCH_KEY = "search"
# The Pusher's, on pushed_model: why it pushed nothing.
NOT_PUSHED_REASON_KEY = "not_pushed_reason"
# The ExampleValidator's: the split drift is measured on, and the span it was measured against.
DRIFT_SPLIT = "eval"
DRIFT_BASELINE_SPAN_KEY = "drift_baseline_span"
# TFX's ExampleValidator writes each split's Anomalies here
# (tfx/components/example_validator/executor.py DEFAULT_FILE_NAME, TFX 1.16).
ANOMALIES_FILE = "SchemaDiff.pb"
# StatisticsGen's statistics of a split, a binary DatasetFeatureStatisticsList (TFX 1.16's
# stats_artifact_utils.BINARY_PB_BASENAME; artifacts older than TFX 1.7 are not read here).
STATISTICS_FILE = "FeatureStats.pb"
# The Evaluator's, in the blessing: metrics by slice, failed thresholds, the AUC change, and
# what the report draws (the ROC curve and the confusion matrix at the serving threshold).
VERDICT_FILE = "verdict.json"
NOT_COMPARED_KEY = "not_compared"  # blessing's custom property and verdict's key: why not


def read_statistics(path: str) -> statistics_pb2.DatasetFeatureStatisticsList:
    """A STATISTICS_FILE (StatisticsGen's, or a span's recorded by the ExampleValidator)."""
    return statistics_pb2.DatasetFeatureStatisticsList.FromString(storage.read_bytes(path))


def read_verdict(blessing) -> dict:
    """The Evaluator's verdict.json from a blessing artifact."""
    return json.loads(storage.read_bytes(storage.join(blessing.uri, VERDICT_FILE)))
