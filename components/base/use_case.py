"""What the product needs to know of a use case (a data set and its model), and how one is found.

A use case is one package: `components/use_cases/<name>/` for the shipped ones, or any
importable package (`use_case=mycompany.churn`) for a user's own. Its `__init__` defines
`USE_CASE`, a `UseCase`, and must stay light (no TensorFlow): the CLI reads it for the config's
defaults. Its heavy parts (preprocessing, model, generator) are named by import path and imported
where they run, in the step that needs them.

Steps, runners, serving and the report take everything specific to a data set from here, so
none of them names a column or a class. The lookup by name happens at run time
(`importlib`), which is why the layering contracts in pyproject.toml never see the base import a
use case.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.base.errors import ActionableError

SHIPPED_PACKAGE = "components.use_cases"
# How a use case's spans hold their data (components/base/spans.py says what each means).
CSV = "csv"
IMAGE_FOLDERS = "image_folders"
INPUT_FORMATS = (CSV, IMAGE_FOLDERS)
# Hyperparameters of the training rather than of build_model: a search space and the
# `hyperparameters` setting may name them too; they replace the config's fields of that name.
TRAINING_HYPERPARAMETERS = {"learning_rate": 0.003, "batch_size": 128}


class UseCaseError(ActionableError, ValueError):
    """A use case cannot be found or is incomplete; the message names it and the fix."""


@dataclasses.dataclass(frozen=True)
class UseCase:
    name: str
    # The label column; its values are 0..len(class_names)-1.
    label_key: str
    # How people read the label's values (the report's confusion matrix, the sample printout).
    class_names: tuple[str, ...]
    # Raw columns the Evaluator slices its metrics by (the summary and the report show them).
    slice_keys: tuple[str, ...]
    # Raw columns printed beside the served model's sample predictions.
    sample_columns: tuple[str, ...]
    # The curated schema (schemas/<name>/schema.pbtxt for a shipped one).
    schema_path: Path
    # Import paths of the heavy parts:
    # - preprocessing_fn(inputs) -> features: tf.Transform's, also in the serving signature;
    # - build_model(hyperparameters: dict, learning_rate: float) -> a compiled Keras model over
    #   the transformed features (or prepare_batch's inputs), with the metric `quality_metric`;
    #   a use case whose classes come from the data (IMAGE_FOLDERS) also gets `class_names`
    #   (a list, in label order; the output has one probability per class) and `weights_path`
    #   (a local copy of the config's initial_weights, or None);
    # - generate_span(num_rows, span, seed, drift, label_noise) -> the span's data, the same for
    #   the same arguments (`make run` on an empty data root, `add-span`, the tests and the
    #   bench): a pandas DataFrame of raw columns for CSV input; for IMAGE_FOLDERS input a list
    #   of (path in the span, file bytes), and it may take `corrupt` (how many broken files).
    preprocessing_fn: str
    build_model: str
    generate_span: str
    # build_model's hyperparameters and their defaults; `--set hyperparameters={...}` overrides
    # them one by one, and a name not listed here is an error.
    hyperparameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Config fields whose default this use case sets (names, data root, thresholds, ...).
    config_defaults: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # How its spans hold the data (components/base/spans.py INPUT_FORMATS): CSV files, or
    # images in one folder per class, whose ExampleGen (components/steps/image_input.py) writes
    # the features image, label, label_name, height, width, channels and path; `input_options`
    # are that reader's settings (image_input.IMAGE_OPTIONS: size bounds).
    input_format: str = CSV
    input_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Optional import path of prepare_batch(features, hyperparameters, training) -> the model's
    # inputs from a batch of transformed features: work that must happen per batch at training
    # time (decoding images, augmenting them when `training`), in the input pipeline and in
    # front of the model in the exported signatures, so both do it alike.
    prepare_batch: str = ""
    # The compiled Keras metric (higher is better) that early stopping watches on the eval split.
    quality_metric: str = "auc"
    # Optional import path of search_space(hp): declares the hyperparameters a search tries, with
    # KerasTuner's types (hp.Float, hp.Int, hp.Choice, hp.Boolean) on a
    # keras_tuner.HyperParameters; names are build_model's hyperparameters or
    # TRAINING_HYPERPARAMETERS. A list-valued hyperparameter is searched as an hp.Choice of
    # JSON texts ("[64, 32]"). components/training/search_space.py checks it.
    search_space: str = ""
    # Hyperparameters `tkp gpu-check` measures over the defaults (the network GPUs are for, where
    # the default run's is one a CPU trains); the config's `hyperparameters` override them.
    gpu_check_hyperparameters: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def function(self, part: str) -> Callable:
        """The function behind `preprocessing_fn`, `build_model`, `generate_span`,
        `prepare_batch` or `search_space`."""
        return _resolve(getattr(self, part), f"use case {self.name!r}: {part}")

    def hyperparameter_problems(self, given: Mapping[str, Any]) -> list[str]:
        """Names not declared, and values whose type differs from the default's."""
        found = []
        known = {**self.hyperparameters, **TRAINING_HYPERPARAMETERS}
        for key, value in given.items():
            if key not in known:
                found.append(f"{key!r} is not a hyperparameter of use case {self.name!r} "
                             f"(known: {', '.join(known)})")  # fmt: skip
            elif not _same_kind(value, known[key]):
                found.append(f"hyperparameter {key!r} must be like {known[key]!r}, "
                             f"got {value!r}")  # fmt: skip
            elif key == "batch_size" and value < 1 or key == "learning_rate" and value <= 0:
                found.append(f"hyperparameter {key!r} must be positive, got {value!r}")
        return found

    def resolved_hyperparameters(self, given: Mapping[str, Any]) -> dict[str, Any]:
        """build_model's hyperparameters: the defaults, then `given`'s (its training ones,
        learning_rate and batch_size, are not build_model's)."""
        model = {k: v for k, v in given.items() if k not in TRAINING_HYPERPARAMETERS}
        return {**self.hyperparameters, **model}


def _same_kind(value: Any, default: Any) -> bool:
    if isinstance(default, bool) or isinstance(value, bool):
        return type(value) is type(default)
    if isinstance(default, float):
        return isinstance(value, int | float)
    if isinstance(default, list | tuple):
        if not isinstance(value, list | tuple):
            return False
        return all(_same_kind(item, default[0]) for item in value) if default else True
    return type(value) is type(default)


def module_of(name: str) -> str:
    """`taxi` -> components.use_cases.taxi; a dotted name is a package of its own."""
    return name if "." in name else f"{SHIPPED_PACKAGE}.{name}"


def shipped() -> list[str]:
    """The use cases under components/use_cases/ (each a folder with an __init__.py)."""
    folder = Path(__file__).resolve().parent.parent / "use_cases"
    return sorted(p.parent.name for p in folder.glob("*/__init__.py"))


@functools.cache
def load(name: str) -> UseCase:
    """The use case called `name`; UseCaseError naming what is missing otherwise."""
    try:
        module = importlib.import_module(module_of(name))
    except ModuleNotFoundError as e:
        if e.name and module_of(name).startswith(e.name):
            raise UseCaseError(
                f"unknown use case {name!r}: no package {module_of(name)} (shipped: "
                f"{', '.join(shipped())}; your own: a package on PYTHONPATH, named with its dots)"
            ) from e
        raise
    use_case = getattr(module, "USE_CASE", None)
    if not isinstance(use_case, UseCase):
        raise UseCaseError(
            f"use case {name!r}: {module.__name__} defines no USE_CASE = UseCase(...)"
        )
    if use_case.input_format not in INPUT_FORMATS:
        raise UseCaseError(f"use case {name!r}: input_format must be one of {INPUT_FORMATS}, got "
                           f"{use_case.input_format!r}")  # fmt: skip
    return use_case


def _resolve(path: str, what: str) -> Callable:
    module_name, _, attribute = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        raise UseCaseError(f"{what}: cannot import {path} ({e})") from e
