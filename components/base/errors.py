"""Errors whose message tells the user what is wrong and what to do next."""

from __future__ import annotations


class ActionableError(Exception):
    """Base of the project's user-facing errors: bad input, bad config, unreachable storage."""


def actionable_cause(error: BaseException) -> BaseException:
    """The first ActionableError in the chain of causes (TFX and Beam wrap executor errors),
    or the innermost error when there is none."""
    seen = error
    while True:
        if isinstance(seen, ActionableError):
            return seen
        following = seen.__cause__ or seen.__context__
        if following is None:
            return seen
        seen = following
