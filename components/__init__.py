"""The pipeline's steps and the model code they run.

The custom artifact types are reachable as `components.<Type>`, the path their TYPE_NAME gives:
TFX's Kubeflow entry point imports an artifact's class by that name (TFX allows one dot in it),
and importing them lazily keeps `import components` light for the CLI.
"""

_ARTIFACT_TYPES = ("SpanSelection", "TrainingDecision")


def __getattr__(name: str):
    if name in _ARTIFACT_TYPES:
        from components.steps import span_selection

        return getattr(span_selection, name)
    raise AttributeError(f"module 'components' has no attribute {name!r}")
