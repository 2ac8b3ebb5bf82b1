"""How a slice's AUC and accuracy read everywhere (summary, report, `models`): light, for the
CLI.

A slice whose examples all carry one label has no ROC curve, so no AUC; TFMA still reports 0 or
1 there. The Evaluator (components/steps/evaluation.py) records None and the reason instead.
"""

from __future__ import annotations

# Beside a slice's metrics when its AUC is undefined (one label only): why, for every reader.
AUC_UNDEFINED_KEY = "auc_undefined"


def auc_text(values: dict) -> str:
    """A slice's AUC as every reader shows it: 4 decimals, "n/a: <why>", or "-" if absent."""
    if values.get("auc") is None and values.get(AUC_UNDEFINED_KEY):
        return str(values[AUC_UNDEFINED_KEY])
    return "-" if values.get("auc") is None else f"{values['auc']:.4f}"


def accuracy_of(values: dict) -> float | None:
    """A slice's accuracy: a binary model's (at the 0.5 threshold) or a multi-class one's (of
    the most probable class)."""
    value = values.get("binary_accuracy")
    return values.get("accuracy") if value is None else value
