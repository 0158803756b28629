"""SCRAM authentication of the simulator (one user in admin), with mongod's error codes."""

from __future__ import annotations

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

pytestmark = [pytest.mark.fidelity, pytest.mark.simulator_only]

USER, PASSWORD = "app", "s3cret-pässword"


@pytest.fixture
def secured(mongosim):
    return mongosim(auth=(USER, PASSWORD))


def test_uri_has_no_credentials(secured):
    assert "@" not in secured.uri and PASSWORD not in secured.uri


@pytest.mark.parametrize("mechanism", [None, "SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_correct_credentials_authenticate(secured, mechanism):
    options = {"authMechanism": mechanism} if mechanism else {}
    with MongoClient(
        secured.uri, username=USER, password=PASSWORD, serverSelectionTimeoutMS=5000, **options
    ) as mongo:
        mongo.db.c.insert_one({"_id": 1})
        assert mongo.db.c.find_one() == {"_id": 1}
        status = mongo.admin.command("connectionStatus")
        assert status["authInfo"]["authenticatedUsers"] == [{"user": USER, "db": "admin"}]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-1"])
def test_wrong_password_fails_with_authentication_failed(secured, mechanism):
    with MongoClient(
        secured.uri, username=USER, password="wrong", authMechanism=mechanism, serverSelectionTimeoutMS=5000
    ) as mongo:
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command("ping")
    assert error.value.code == 18
    assert error.value.details["codeName"] == "AuthenticationFailed"
    assert error.value.details["errmsg"] == "Authentication failed."


def test_unknown_user_fails_the_same_way(secured):
    with MongoClient(
        secured.uri, username="nobody", password=PASSWORD, serverSelectionTimeoutMS=5000
    ) as mongo:
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command("ping")
    assert error.value.code == 18


def test_unauthenticated_commands_are_unauthorized(secured):
    with MongoClient(secured.uri, serverSelectionTimeoutMS=5000) as mongo:
        assert mongo.admin.command("ping")["ok"] == 1  # ping needs no authentication
        with pytest.raises(OperationFailure) as error:
            mongo.db.c.find_one()
    assert error.value.code == 13
    assert error.value.details["codeName"] == "Unauthorized"
    assert error.value.details["errmsg"] == "Command find requires authentication"
