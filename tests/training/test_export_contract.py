"""The input contract an export writes beside the model (components/training/input_contract.py),
and the rules the Evaluator applies with it: which rows a served model's parser refuses, checked
row by row against TensorFlow's own `tf.io.parse_example`, the call every serving signature makes
(components/training/export.py)."""

import json

import pytest
import tensorflow as tf

from components.training import input_contract

FLOAT_REQUIRED = {"dtype": "float32", "shape": [1], "required": True}
FLOAT_DEFAULTED = {"dtype": "float32", "shape": [1], "required": False}
FLOAT_OPTIONAL = {"dtype": "float32", "shape": None, "required": False}
TEXT_REQUIRED = {"dtype": "string", "shape": [1], "required": True}
PAIR_REQUIRED = {"dtype": "int64", "shape": [2], "required": True}
GRID_REQUIRED = {"dtype": "int64", "shape": [2, 2], "required": True}
CONTRACT = {"charge": FLOAT_REQUIRED, "discount": FLOAT_DEFAULTED, "note": FLOAT_OPTIONAL,
            "plan": TEXT_REQUIRED, "size": PAIR_REQUIRED, "grid": GRID_REQUIRED}  # fmt: skip


def _spec(contract: dict) -> dict:
    """The feature spec the contract describes, as the export's spec was."""
    spec = {}
    for key, entry in contract.items():
        dtype = tf.as_dtype(entry["dtype"])
        if entry["shape"] is None:
            spec[key] = tf.io.VarLenFeature(dtype)
        else:
            default = None if entry["required"] else tf.zeros(entry["shape"], dtype)
            spec[key] = tf.io.FixedLenFeature(entry["shape"], dtype, default_value=default)
    return spec


def _example(**features) -> tf.train.Example:
    example = tf.train.Example()
    for key, (kind, values) in features.items():
        feature = example.features.feature[key]  # present; with kind None, no value list
        if kind is not None:
            getattr(feature, kind).value.extend(values)
    return example


COMPLETE = dict(charge=("float_list", [9.5]), discount=("float_list", [1.0]),
                note=("float_list", [2.0]), plan=("bytes_list", [b"pro"]),
                size=("int64_list", [3, 4]), grid=("int64_list", [1, 2, 3, 4]))  # fmt: skip


def _without(key: str) -> dict:
    return {k: v for k, v in COMPLETE.items() if k != key}


ROWS = {
    "complete": (COMPLETE, None),
    "no optional": (_without("note"), None),
    "no defaulted": (_without("discount"), None),
    # A default fills in an absent feature, not an empty value list.
    "empty defaulted": (
        {**COMPLETE, "discount": ("float_list", [])},
        "hold no value of 'discount', which it reads as 1",
    ),  # fmt: skip
    "empty optional": ({**COMPLETE, "note": ("float_list", [])}, None),
    "no required": (_without("charge"), "lack 'charge', which it requires"),
    "empty required": (
        {**COMPLETE, "charge": ("float_list", [])},
        "lack 'charge', which it requires",
    ),  # fmt: skip
    "int for float": (
        {**COMPLETE, "charge": ("int64_list", [9])},
        "hold 'charge' as int64_list, which it reads as float32",
    ),  # fmt: skip
    "text for optional float": (
        {**COMPLETE, "note": ("bytes_list", [b"x"])},
        "hold 'note' as bytes_list, which it reads as float32",
    ),  # fmt: skip
    "two for one": (
        {**COMPLETE, "charge": ("float_list", [1.0, 2.0])},
        "hold 2 values of 'charge', which it reads as 1",
    ),  # fmt: skip
    "one for two": (
        {**COMPLETE, "size": ("int64_list", [3])},
        "hold 1 values of 'size', which it reads as 2",
    ),  # fmt: skip
    "three for a 2x2 grid": (
        {**COMPLETE, "grid": ("int64_list", [1, 2, 3])},
        "hold 3 values of 'grid', which it reads as 4",
    ),  # fmt: skip
    "two plans": (
        {**COMPLETE, "plan": ("bytes_list", [b"pro", b"plus"])},
        "hold 2 values of 'plan', which it reads as 1",
    ),  # fmt: skip
    # A feature present with no value list set counts as absent.
    "required without kind": (
        {**COMPLETE, "charge": (None, [])},
        "lack 'charge', which it requires",
    ),  # fmt: skip
    "defaulted without kind": ({**COMPLETE, "discount": (None, [])}, None),
}


@pytest.mark.parametrize("row", ROWS)
def test_a_row_is_refused_exactly_when_tensorflows_parser_refuses_it(row):
    features, expected = ROWS[row]
    example = _example(**features)
    try:
        tf.io.parse_example([example.SerializeToString()], _spec(CONTRACT))
        parsed = True
    except (tf.errors.InvalidArgumentError, ValueError):
        parsed = False
    assert parsed == (expected is None), "the stated rule disagrees with TensorFlow"
    assert input_contract.refusal(CONTRACT, example) == expected


def test_rows_are_read_only_when_the_contracts_say_some_may_be_refused():
    same = dict(CONTRACT)
    assert not input_contract.may_refuse(CONTRACT, same)
    # Stricter (required where it was optional, a new column): every row the new schema
    # admits still parses for the served model.
    stricter = {**CONTRACT, "note": FLOAT_REQUIRED, "extra": TEXT_REQUIRED}
    assert not input_contract.may_refuse(CONTRACT, stricter)
    # A contract written before "required" existed: FixedLen meant required.
    old = {k: {"dtype": v["dtype"], "shape": v["shape"]} for k, v in stricter.items()}
    assert not input_contract.may_refuse(old, {**stricter, "discount": FLOAT_REQUIRED})
    assert input_contract.may_refuse(old, {**stricter, "charge": FLOAT_DEFAULTED})
    for changed in (
        {**CONTRACT, "charge": FLOAT_OPTIONAL},  # made optional
        {**CONTRACT, "charge": FLOAT_DEFAULTED},  # a default now fills it in
        {**CONTRACT, "plan": {**TEXT_REQUIRED, "dtype": "int64"}},  # retyped
        {**CONTRACT, "size": {**PAIR_REQUIRED, "shape": [3]}},  # resized
        {**CONTRACT, "discount": FLOAT_OPTIONAL},  # may now hold an empty list
        {k: v for k, v in CONTRACT.items() if k != "charge"},  # dropped
        {k: v for k, v in CONTRACT.items() if k != "note"},  # dropped: no longer validated
    ):
        assert input_contract.may_refuse(CONTRACT, changed), changed
    seen, refused = input_contract.refused_rows(
        CONTRACT, [_example(**COMPLETE), _example(**_without("charge")),
                   _example(**_without("charge"))]
    )  # fmt: skip
    assert seen == 3 and refused == {"lack 'charge', which it requires": 2}


def test_the_trained_model_carries_its_contract(use_case_model):
    """The export writes what its serving signatures parse: the SERVING features, required
    exactly where the spec is FixedLen without a default."""
    spec = use_case_model.kit.serving_feature_spec
    path = f"{use_case_model.fn_args.serving_model_dir}/{input_contract.INPUT_CONTRACT_PATH}"
    contract = json.loads(open(path).read())
    assert set(contract) == set(spec)
    for key, feature in spec.items():
        fixed = isinstance(feature, tf.io.FixedLenFeature)
        assert contract[key] == {
            "dtype": feature.dtype.name,
            "shape": list(feature.shape) if fixed else None,
            "required": fixed and feature.default_value is None,
        }, key
