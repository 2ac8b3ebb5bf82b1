"""What a model's serving signatures parse, written beside the exported model, and whether a
served model can read the rows a later run evaluates on.

TFMA scores the served model (the baseline) through its `serving_default` signature on the new
eval split: `tf.io.parse_example` over each batch (TFMA retries a failed batch row by row, then
fails the job), which refuses a row that lacks a feature it requires, holds another type, or
another number of values. After a schema change (a column made optional by `tkp schema
propose`, a type changed) the served model may be unable to read the new data; the Evaluator
(components/steps/evaluation.py) then evaluates the candidate alone and says why, instead of
crashing in TFMA.

The contract is {feature: {"dtype", "shape", "required"}}: shape null for a VarLen feature,
`required` for a FixedLen one without a default value (tf.Transform gives a schema feature with
a `default_value` one, which fills a missing value in).
"""

from __future__ import annotations

import json
import math
import os
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

# Beside the model, under the folder TF Serving reserves for extra files (it reads only the
# warm-up requests there): TF Serving and TFMA ignore it.
INPUT_CONTRACT_PATH = "assets.extra/raw_features.json"
# tf.Example's value list for each dtype a feature spec may have.
_KINDS = {"float32": "float_list", "int64": "int64_list", "string": "bytes_list"}


def write(serving_spec: Mapping[str, Any], serving_model_dir: str) -> None:
    """The contract of a model whose serving signatures parse `serving_spec`."""
    import tensorflow as tf

    contract = {}
    for key, spec in sorted(serving_spec.items()):
        fixed = isinstance(spec, tf.io.FixedLenFeature)
        contract[key] = {
            "dtype": spec.dtype.name,
            "shape": list(spec.shape) if fixed else None,
            "required": fixed and spec.default_value is None,
        }
    path = os.path.join(serving_model_dir, INPUT_CONTRACT_PATH)
    tf.io.gfile.makedirs(os.path.dirname(path))
    with tf.io.gfile.GFile(path, "w") as file:
        file.write(json.dumps(contract, indent=1))


def may_refuse(served: Mapping[str, dict], candidate: Mapping[str, dict]) -> bool:
    """Whether rows that the candidate's schema admits may be refused by the served model: it
    requires a feature the candidate's rows may lack, or reads one with another type or size.
    When not, the validated data parse for both, and no row needs to be looked at."""
    for key, was in served.items():
        now = candidate.get(key)
        if now is None:  # dropped or deprecated: no longer validated, rows may hold anything
            return True
        elif now["dtype"] != was["dtype"]:
            return True
        elif was["shape"] is None:
            continue  # VarLen: any number of values parses
        elif now["shape"] is None or _size(now) != _size(was):
            return True  # rows may hold no value (refused even with a default) or another count
        elif _required(was) and not _required(now):
            return True  # rows may lack it
    return False


def refusal(contract: Mapping[str, dict], example) -> str | None:
    """Why `tf.io.parse_example` with the contract's spec refuses the tf.train.Example `example`
    (None when it parses). tests/training/test_export_contract.py checks each rule against
    TensorFlow's own parser."""
    features = example.features.feature
    for key, want in sorted(contract.items()):
        feature = features[key] if key in features else None
        kind = feature.WhichOneof("kind") if feature is not None else None
        count = len(getattr(feature, kind).value) if kind else 0
        if kind is not None and kind != _KINDS[want["dtype"]]:
            return f"hold {key!r} as {kind}, which it reads as {want['dtype']}"
        if want["shape"] is None:
            continue
        if count == 0 and _required(want):
            return f"lack {key!r}, which it requires"
        if count == 0 and kind is not None:  # a default fills in an absent value, not an empty list
            return f"hold no value of {key!r}, which it reads as {_size(want)}"
        if count and count != _size(want):
            return f"hold {count} values of {key!r}, which it reads as {_size(want)}"
    return None


def refused_rows(contract: Mapping[str, dict], examples: Iterable) -> tuple[int, Counter]:
    """(rows seen, a count of rows per refusal reason)."""
    seen, refused = 0, Counter()
    for example in examples:
        seen += 1
        why = refusal(contract, example)
        if why:
            refused[why] += 1
    return seen, refused


def _required(entry: Mapping[str, Any]) -> bool:
    # Contracts written before "required" existed: tf.Transform's FixedLen features then had
    # no default value (schema_utils), so FixedLen meant required.
    return entry.get("required", entry["shape"] is not None)


def _size(entry: Mapping[str, Any]) -> int:
    return math.prod(entry["shape"] or [1])
