"""Shared pytest set-up: the repository root on sys.path, the ``slow`` marker, the plan cache
in a folder of the session, and plans bound whatever they save for the modules that ask."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from mxmirror.planning.cache import cache_path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: takes more than ~20 s (big binds in child processes); "
        "deselect with -m 'not slow'",
    )


@pytest.fixture(autouse=True, scope="session")
def _plans_in_session_dir(tmp_path_factory):
    """Plans kept by the tests go to a folder of the test session, not the user's cache
    (templates still come from the user's cache: learning them takes child binds)."""
    from mxmirror.planning import cache

    folder = tmp_path_factory.mktemp("plans")
    saved = cache.plans_dir
    cache.plans_dir = lambda: None if cache_path() is None else folder
    yield
    cache.plans_dir = saved


@pytest.fixture
def plans_bound_regardless():
    """For a test module that compares what plans compute on graphs too small for a plan to
    pay (``pytestmark = pytest.mark.usefixtures("plans_bound_regardless")``):
    tests.helpers.bound_regardless around each test."""
    from tests.helpers import bound_regardless

    with bound_regardless():
        yield
