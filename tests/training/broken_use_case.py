"""A use case (taxi's, copied) whose model cannot be built with any value its search space
offers: every trial of a search fails, while the defaults' model, which the search's objective
check builds, is fine."""

import dataclasses

from components.use_cases.taxi import USE_CASE as TAXI
from components.use_cases.taxi import model

USE_CASE = dataclasses.replace(
    TAXI, name=__name__, build_model=f"{__name__}.build_model",
    search_space=f"{__name__}.search_space",
)  # fmt: skip


def build_model(hyperparameters: dict, learning_rate: float):
    if hyperparameters["embedding_dim"] != TAXI.hyperparameters["embedding_dim"]:
        raise ValueError(f"no embedding of width {hyperparameters['embedding_dim']} today")
    return model.build_model(hyperparameters, learning_rate)


def search_space(hp) -> None:
    hp.Choice("embedding_dim", [4, 16])
