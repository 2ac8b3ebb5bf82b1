"""Artifact types that the Kubeflow Pipelines 2.5 UI draws: scalar metrics, an ROC curve and a
confusion matrix, and an HTML page.

The UI renders an artifact when its ML Metadata type is named exactly `system.Metrics`,
`system.ClassificationMetrics` or `system.HTML` (frontend/src/components/viewers/
MetricsVisualizations.tsx, filterLinkedArtifactsByType in frontend/src/mlmd/MlmdUtils.ts). TFX's
compiler writes a custom type's TYPE_NAME as the schema title, and the 2.5 launcher names the
MLMD type after that title (backend/src/v2/metadata/client.go SchemaToArtifactType). The shapes
of the custom properties are those the KFP SDK writes (kfp/dsl/types/artifact_types.py):
- Metrics: one number per property, each a row of the UI's table (every property but
  `display_name` is shown, so nothing else is set on these artifacts);
- ClassificationMetrics: `confidenceMetrics`, a list of {confidenceThreshold, falsePositiveRate,
  recall}, and `confusionMatrix`, {annotationSpecs: [{displayName}], rows: [{row: [...]}]};
- HTML: the page is the object at the artifact's URI itself, not a file under it.

These titles are not importable paths, which TFX's Kubeflow entry point expects of a custom
type; pipelines/kubeflow/tfx_v2_executor.py maps them to these classes (CLASS_PATHS).
"""

from __future__ import annotations

from tfx import types


class Metrics(types.Artifact):
    TYPE_NAME = "system.Metrics"


class ClassificationMetrics(types.Artifact):
    TYPE_NAME = "system.ClassificationMetrics"


class HTML(types.Artifact):
    TYPE_NAME = "system.HTML"


CLASS_PATHS = {
    cls.TYPE_NAME: f"{__name__}.{cls.__name__}" for cls in (Metrics, ClassificationMetrics, HTML)
}
