"""What a failed object-store call means, for a message that names the store: botocore only, so
that the CLI can tell "the store gave no answer" without loading Beam."""

from __future__ import annotations

import os
import re

from components.base.errors import ActionableError


class StorageError(ActionableError, RuntimeError):
    """An object store could not be reached or answered with an error."""


def _answerless(error: BaseException) -> BaseException | None:
    """The botocore error in `error`'s chain that says the store gave no answer at all
    (connection refused, reset or closed, a timeout), or None when it answered (4xx, 5xx,
    throttling) or the error is not a store call's: a refused connection of anything else (KFP,
    an HTTP client) is not the store's. Follows `raise ... from`, exceptions raised while
    handling another (Beam wraps boto3's errors so, and so does a Beam pipeline when a step's
    transform fails) and BeamIOError's per-path details."""
    from botocore.exceptions import ConnectionError as NoConnection
    from botocore.exceptions import HTTPClientError

    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        if isinstance(current, NoConnection | HTTPClientError):
            return current
        pending += [current.__cause__, current.__context__]
        details = getattr(current, "exception_details", None)
        if isinstance(details, dict):
            pending += [e for e in details.values() if isinstance(e, BaseException)]
    return None


def unreachable(error: BaseException) -> bool:
    """True when the store did not answer at all (see _answerless)."""
    return _answerless(error) is not None


def short_reason(error: BaseException) -> str:
    """The line that says why: the answerless cause's, else the error's own first line."""
    cause = _answerless(error) or error
    return (str(cause).strip().splitlines() or [type(cause).__name__])[0]


def store_error(what: str, error: Exception, hint: str = "") -> StorageError:
    """The error for a failed store call: one that names the endpoint when the store gave no
    answer, else `what`, the library's reason and `hint`."""
    if unreachable(error):
        reason = short_reason(error)
        # The address the call went to, as boto3 names it; else the configured one.
        called = re.search(r"https?://[^/\"' ]+", reason)
        endpoint = (
            called.group(0) if called else os.environ.get("AWS_ENDPOINT_URL_S3")
        ) or "AWS's default S3 endpoint"
        return StorageError(
            f"{what}: the object store at {endpoint} does not answer ({reason}). "
            "Is it running? A local command starts the work folder's embedded store; another "
            "store is named by AWS_ENDPOINT_URL_S3."
        )
    return StorageError(f"{what}: {error}{hint}")
