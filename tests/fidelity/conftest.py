"""Fixtures of the MongoDB fidelity suite.

Every test talks to MongoDB through pymongo's public API. By default the target is the MongoDB
simulator (``devtools/mongosim``); with ``MONGOCDC_TEST_MONGODB_URI`` set, the same tests run
against that real replica set and the tests that need a simulator-only command (marker
``simulator_only``) are skipped. Each test works in its own database (``fid_<test>_<random>``), so
the suite can share a real server with other users.
"""

from __future__ import annotations

import re
import uuid

import pytest
from pymongo import MongoClient

from tests.mongo_commands import Recorder

pytestmark = pytest.mark.fidelity


@pytest.fixture(scope="session")
def client(mongodb_uri):
    mongo = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    yield mongo
    mongo.close()


@pytest.fixture
def db_name(request) -> str:
    base = re.sub(r"\W", "_", request.node.name)[:32]
    return f"fid_{base}_{uuid.uuid4().hex[:6]}"


@pytest.fixture
def db(client, db_name):
    yield client[db_name]
    client.drop_database(db_name)


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
