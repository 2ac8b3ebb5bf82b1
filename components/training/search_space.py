"""A use case's search space (its `search_space(hp)`), checked, and a search's values turned into
the Trainer's settings.

The space is declared with KerasTuner's types; a search tries the names it declares except
those the config pins (named in `hyperparameters`: declared Fixed first, so the use case's
declaration of that name returns the pinned value). A list-valued hyperparameter (taxi's
hidden_units) is searched as a Choice of JSON texts, decoded here. `apply` is the one place the
values reach the Trainer's custom_config: build_model's into `hyperparameters`, the
training's (learning_rate, batch_size) into the fields of that name.

KerasTuner is imported only by `declared` (the Trainer step imports this module too).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from components.base.errors import ActionableError
from components.base.use_case import TRAINING_HYPERPARAMETERS, UseCase


class SearchSpaceError(ActionableError, ValueError):
    """The search space cannot be searched; the message names the use case and what is wrong."""


def declared(use_case: UseCase, pinned: Mapping[str, Any]):
    """The use case's space as a keras_tuner.HyperParameters, `pinned` names Fixed; every
    problem found at once in a SearchSpaceError."""
    import keras_tuner

    where = f"use case {use_case.name!r}: search_space ({use_case.search_space or 'not set'})"
    if not use_case.search_space:
        raise SearchSpaceError(
            f"use case {use_case.name!r} declares no search space: add search_space(hp) "
            "beside its build_model and name it in its UseCase (README.md, Tuning), or run "
            "with tune=0"
        )
    space = keras_tuner.HyperParameters()
    for name, value in pinned.items():
        space.Fixed(name, json.dumps(value) if isinstance(value, list | tuple) else value)
    try:
        use_case.function("search_space")(space)
    except (ValueError, TypeError) as e:  # KerasTuner's: min above max, an empty Choice, ...
        raise SearchSpaceError(f"{where}: {e}") from e
    problems = []
    known = {**use_case.hyperparameters, **TRAINING_HYPERPARAMETERS}
    for parameter in space.space:
        name = parameter.name
        if name not in known:
            problems.append(f"{name!r} is not a hyperparameter of the use case (known: "
                            f"{', '.join(known)})")  # fmt: skip
            continue
        default = known[name]
        whole = isinstance(default, int) and not isinstance(default, bool)
        if type(parameter).__name__ == "Float" and whole:
            problems.append(f"{name!r} is a whole number (default {default!r}): search it with "
                            "hp.Int or an hp.Choice of whole numbers, not hp.Float")  # fmt: skip
            continue
        for value in _possible_values(parameter):
            problems += [f"{name!r}: {p}" for p in _value_problems(use_case, name, value)]
    searched = [p.name for p in space.space if type(p).__name__ != "Fixed"]
    if not problems and not searched:
        pinned_text = f" (pinned by `hyperparameters`: {', '.join(pinned)})" if pinned else ""
        problems.append(f"it declares nothing to search{pinned_text}")
    if problems:
        raise SearchSpaceError(f"{where}: " + "; ".join(problems))
    return space


def _possible_values(parameter) -> list:
    kind = type(parameter).__name__
    if kind == "Choice":
        return list(parameter.values)
    if kind in ("Int", "Float"):
        return [parameter.min_value, parameter.max_value]
    if kind == "Fixed":
        return [parameter.value]
    return [True, False]  # Boolean


def _value_problems(use_case: UseCase, name: str, value: Any) -> list[str]:
    try:
        decoded = decode(use_case, {name: value})
    except SearchSpaceError as e:
        return [str(e)]
    return use_case.hyperparameter_problems(decoded)


def decode(use_case: UseCase, values: Mapping[str, Any]) -> dict[str, Any]:
    """KerasTuner's values as the use case's types: JSON texts of list-valued hyperparameters
    decoded, whole floats of int-valued ones made ints."""
    known = {**use_case.hyperparameters, **TRAINING_HYPERPARAMETERS}
    decoded = {}
    for name, value in values.items():
        default = known.get(name)
        if isinstance(default, list | tuple) and isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise SearchSpaceError(
                    f"{name!r} is a list: search it as a Choice of JSON texts such as "
                    f"{json.dumps(json.dumps(list(default)))}, got {value!r}"
                ) from e
        elif isinstance(default, int) and not isinstance(default, bool):
            value = int(value) if isinstance(value, float) and value.is_integer() else value
        decoded[name] = value
    return decoded


def apply(custom_config: dict, values: Mapping[str, Any]) -> dict:
    """The Trainer's custom_config with `values` (decoded) in force: build_model's under
    `hyperparameters`, learning_rate and batch_size as the settings of that name."""
    config = dict(custom_config)
    model = dict(config.get("hyperparameters") or {})
    for name, value in values.items():
        if name in TRAINING_HYPERPARAMETERS:
            config[name] = value
        else:
            model[name] = value
    config["hyperparameters"] = model
    return config
