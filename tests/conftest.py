"""Shared pytest fixtures: the object store and CLI processes every test may use. What the tests
need of any use case (its data, one trained model per session, `use_case_model`) is in
tests/use_cases/kit.py; what is specific to one, in tests/use_cases/<name>/fixtures.py; both are
loaded here as plugins, the latter for every shipped use case."""

import os

# Transform and TFMA need Keras 2 (tf_keras); this must be set before TensorFlow is imported.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")

import pytest  # noqa: E402

from components.base import use_case  # noqa: E402
from components.base.object_store import EmbeddedObjectStore  # noqa: E402
from tests.pipelines.retraining_loop import loop  # noqa: E402, F401  (shared fixtures)
from tests.use_cases.kit import fixtures_module  # noqa: E402

# The generic use case fixtures, then each shipped use case's own (one module each).
pytest_plugins = [
    "tests.use_cases.kit",
    *(fixtures_module(name) for name in use_case.shipped()),
]


# --------------------------------------------------------------------------------------------
# A real SeaweedFS server on loopback (used by the end-to-end and Kubeflow-spec tests)
# --------------------------------------------------------------------------------------------


class _TestObjectStore(EmbeddedObjectStore):
    _buckets = 0

    def new_bucket(self, prefix: str) -> str:
        """A fresh bucket, so that tests sharing the server never see each other's objects."""
        _TestObjectStore._buckets += 1
        bucket = f"{prefix}-{_TestObjectStore._buckets}"
        self.create_bucket(bucket)
        return bucket


@pytest.fixture(scope="session")
def object_store(tmp_path_factory):
    """SeaweedFS on free loopback ports; its endpoint and made-up credentials in os.environ."""
    store = _TestObjectStore(tmp_path_factory.mktemp("seaweedfs") / "data").start()
    yield store
    store.stop()


@pytest.fixture
def cli_in_background(tmp_path):
    """Starts `python -m pipelines.cli ARGS...` with tmp_path as its work folder; whatever still
    runs at the end of the test is killed, so a failed test leaves no command or store behind."""
    from tests.pipelines.cli_process import Background

    started: list[Background] = []

    def start(*args: str, **extra_env: str) -> Background:
        started.append(Background(tmp_path, *args, **extra_env))
        return started[-1]

    yield start
    for command in started:
        command.__exit__(None, None, None)


# --------------------------------------------------------------------------------------------
# The shipped use cases: a generic test takes `shipped_use_case` (the name) or, when it needs a
# trained model, `use_case_model` (tests/use_cases/kit.py), and runs once for each.
# --------------------------------------------------------------------------------------------


@pytest.fixture(params=use_case.shipped())
def shipped_use_case(request) -> str:
    """The name of each use case under components/use_cases/, in turn."""
    return request.param


# `make test` runs on several processes (pytest-xdist --dist loadgroup): a file's tests go to one
# process together (its module fixtures are built once), and so do the files marked with one
# xdist_group (those that share a costly session fixture, such as the retraining loop).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
