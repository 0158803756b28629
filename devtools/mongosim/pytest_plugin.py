"""pytest fixtures for MongoDB-facing tests: the simulator, or a real MongoDB when configured.

Registered by ``tests/conftest.py``. Fixtures:

``mongodb_uri`` (session)
    ``MONGOCDC_TEST_MONGODB_URI`` when set, else the URI of a 1-member replica-set simulator
    started once for the session.
``mongosim`` (function)
    A factory ``mongosim(mode="replset", **options) -> MongoSim`` starting a fresh simulator that
    is stopped after the test.
``real_mongodb`` (bool)
    True when the tests run against a real MongoDB (``MONGOCDC_TEST_MONGODB_URI`` is set).

Marker ``simulator_only``: the test needs a simulator-only command and is skipped, saying why,
when the tests run against a real MongoDB.
"""

from __future__ import annotations

import os

import pytest

REAL_URI_ENV = "MONGOCDC_TEST_MONGODB_URI"


def _real_uri() -> str | None:
    return os.environ.get(REAL_URI_ENV) or None


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "simulator_only: needs a simulator-only test command; skipped against a real MongoDB"
    )


def pytest_runtest_setup(item):
    if item.get_closest_marker("simulator_only") is not None and _real_uri():
        pytest.skip(f"needs a MongoDB simulator test command; {REAL_URI_ENV} points to a real MongoDB")


@pytest.fixture(scope="session")
def real_mongodb() -> bool:
    """True when the tests run against a real MongoDB given by MONGOCDC_TEST_MONGODB_URI."""
    return _real_uri() is not None


@pytest.fixture(scope="session")
def mongodb_uri():
    """MONGOCDC_TEST_MONGODB_URI when set, else a 1-member replica-set simulator for the session."""
    real = _real_uri()
    if real:
        yield real
        return
    from devtools.mongosim.launcher import MongoSim

    sim = MongoSim(mode="replset", members=1)
    sim.start()
    try:
        yield sim.uri
    finally:
        sim.stop()


@pytest.fixture
def mongosim():
    """Factory starting fresh simulators, all stopped after the test."""
    from devtools.mongosim.launcher import MongoSim

    started: list[MongoSim] = []

    def factory(mode: str = "replset", **options) -> MongoSim:
        sim = MongoSim(mode=mode, **options)
        sim.start()
        started.append(sim)
        return sim

    try:
        yield factory
    finally:
        for sim in reversed(started):
            sim.stop()
