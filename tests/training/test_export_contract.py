"""The input contract an export writes beside the model, and what the Evaluator reads from two
of them: whether the served model can parse every example the candidate's schema admits.
tf.io.parse_example (what every serving signature runs) fails a batch on a missing FixedLen
feature or a type it does not expect; a VarLen feature may be absent or empty."""

import json

from components.training.export import INPUT_CONTRACT_PATH, contract_gaps

REQUIRED_FLOAT = {"dtype": "float32", "shape": [1]}
OPTIONAL_FLOAT = {"dtype": "float32", "shape": None}
REQUIRED_TEXT = {"dtype": "string", "shape": [1]}


def test_the_same_or_a_stricter_schema_leaves_the_models_comparable():
    served = {"charge": REQUIRED_FLOAT, "note": OPTIONAL_FLOAT}
    assert contract_gaps(served, served) == []
    # Required now where it was optional, a column added, an optional one dropped: every
    # example the new schema admits still parses with the served model's spec.
    stricter = {"charge": REQUIRED_FLOAT, "note": REQUIRED_FLOAT, "plan": REQUIRED_TEXT}
    assert contract_gaps(served, stricter) == []
    assert contract_gaps(served, {"charge": REQUIRED_FLOAT}) == []


def test_each_change_the_served_model_cannot_parse_is_named():
    served = {"charge": REQUIRED_FLOAT, "plan": REQUIRED_TEXT, "tenure": REQUIRED_FLOAT,
              "size": {"dtype": "int64", "shape": [2]}}  # fmt: skip
    candidate = {"charge": OPTIONAL_FLOAT, "plan": {"dtype": "int64", "shape": [1]},
                 "size": {"dtype": "int64", "shape": [3]}}  # fmt: skip
    assert contract_gaps(served, candidate) == [
        "it requires 'charge', which the schema now lets be missing",
        "it reads 'plan' as string, the schema now as int64",
        "it reads 'size' with shape [2], the schema now [3]",
        "it requires 'tenure', which the schema no longer has",
    ]


def test_the_trained_model_carries_its_contract(use_case_model):
    """The export writes what its serving signatures parse: the SERVING features, required
    exactly where the spec is FixedLen."""
    spec = use_case_model.kit.serving_feature_spec
    path = f"{use_case_model.fn_args.serving_model_dir}/{INPUT_CONTRACT_PATH}"
    contract = json.loads(open(path).read())
    assert set(contract) == set(spec)
    for key, feature in spec.items():
        shape = list(feature.shape) if hasattr(feature, "shape") else None
        assert contract[key] == {"dtype": feature.dtype.name, "shape": shape}, key
