"""Handshake and topology: hello, replSetGetStatus, cluster time, standalone and mongos."""

from __future__ import annotations

import os

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import NotPrimaryError, OperationFailure

pytestmark = pytest.mark.fidelity


def test_real_replica_set_is_the_target_when_configured(client):
    if not os.environ.get("MONGOCDC_TEST_MONGODB_URI"):
        pytest.skip(
            "MONGOCDC_TEST_MONGODB_URI is not set: the fidelity suite runs against the MongoDB "
            "simulator only; set it to a replica set URI to run the same tests against MongoDB"
        )
    hello = client.admin.command("hello")
    assert hello.get("setName"), (
        "MONGOCDC_TEST_MONGODB_URI must point to a replica set (change streams need one)"
    )


def test_hello_describes_a_replica_set_primary(client):
    hello = client.admin.command("hello")
    assert hello["isWritablePrimary"] is True
    assert hello["secondary"] is False
    assert hello["setName"]
    assert hello["me"] in hello["hosts"]
    assert hello["primary"] == hello["me"]
    assert hello["maxWireVersion"] >= 21
    assert hello["logicalSessionTimeoutMinutes"] > 0
    assert set(hello["topologyVersion"]) == {"processId", "counter"}
    assert isinstance(hello["$clusterTime"]["clusterTime"], Timestamp)
    assert isinstance(hello["operationTime"], Timestamp)
    assert hello["maxBsonObjectSize"] == 16 * 1024 * 1024


def test_legacy_is_master_answers_with_ismaster(client):
    reply = client.admin.command("isMaster")
    assert reply["ismaster"] is True
    assert "isWritablePrimary" not in reply


def test_replica_set_status_lists_members_with_state_and_optime(client):
    status = client.admin.command("replSetGetStatus")
    assert status["set"] == client.admin.command("hello")["setName"]
    assert status["myState"] == 1
    states = [m["stateStr"] for m in status["members"]]
    assert states.count("PRIMARY") == 1
    for member in status["members"]:
        assert member["health"] == 1
        assert isinstance(member["optime"]["ts"], Timestamp)
        assert member["name"]


def test_cluster_time_and_operation_time_advance_with_writes(db):
    first = db.command("ping")["$clusterTime"]["clusterTime"]
    reply = db.command("insert", "c", documents=[{"_id": 1}])
    assert reply["operationTime"] > first or reply["operationTime"] >= first
    assert reply["$clusterTime"]["clusterTime"] >= reply["operationTime"]


def test_unknown_command_fails_with_command_not_found(client):
    with pytest.raises(OperationFailure) as error:
        client.admin.command("noSuchCommandAtAll")
    assert error.value.code == 59


@pytest.mark.simulator_only
def test_three_member_set_has_one_primary_and_two_secondaries(mongosim):
    sim = mongosim(members=3)
    with sim.client() as mongo:
        hello = mongo.admin.command("hello")
        assert len(hello["hosts"]) == 3
        status = mongo.admin.command("replSetGetStatus")
        assert sorted(m["stateStr"] for m in status["members"]) == ["PRIMARY", "SECONDARY", "SECONDARY"]
        secondary = next(h for h in hello["hosts"] if h != hello["primary"])
    with MongoClient(
        f"mongodb://{secondary}/?directConnection=true", serverSelectionTimeoutMS=5000
    ) as direct:
        hello = direct.admin.command("hello")
        assert hello["isWritablePrimary"] is False and hello["secondary"] is True
        with pytest.raises(NotPrimaryError) as error:
            direct.get_database("x").command("insert", "c", documents=[{"_id": 1}])
        assert error.value.details["code"] == 10107
        assert error.value.details["codeName"] == "NotWritablePrimary"
        # A direct connection reads from a secondary (drivers always send secondaryOk for it).
        assert direct.get_database("x").command("find", "c")["ok"] == 1


@pytest.mark.simulator_only
def test_standalone_has_no_set_name_and_no_change_streams(mongosim):
    sim = mongosim(mode="standalone")
    with sim.client() as mongo:
        hello = mongo.admin.command("hello")
        assert "setName" not in hello and hello["isWritablePrimary"] is True
        assert "$clusterTime" not in hello
        mongo.db.c.insert_one({"_id": 1})
        assert mongo.db.c.find_one() == {"_id": 1}
        with pytest.raises(OperationFailure) as error:
            mongo.db.c.watch()
        assert error.value.code == 40573
        assert error.value.details["errmsg"] == "The $changeStream stage is only supported on replica sets"
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command("replSetGetStatus")
        assert error.value.code == 76
        assert "oplog.rs" not in mongo.local.list_collection_names()


@pytest.mark.simulator_only
def test_wire_version_of_mongodb_8(mongosim):
    sim = mongosim(max_wire_version=25)
    with sim.client() as mongo:
        assert mongo.admin.command("hello")["maxWireVersion"] == 25
        assert mongo.server_info()["version"].startswith("8.0")
