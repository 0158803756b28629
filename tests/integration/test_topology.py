"""Topology discovery and the first contact: replica sets, sharded clusters, and clear failures.

Tests taking ``mongodb_uri`` also run against a real replica set when MONGOCDC_TEST_MONGODB_URI
is set; the others need simulator topologies (``simulator_only``).
"""

from __future__ import annotations

import json
import logging
import uuid

import pytest
from pymongo import MongoClient, uri_parser

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionFailedError,
    TopologyError,
)
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails, connect
from airflow_provider_mongocdc.core.mongo.topology import CLUSTER_PARTITION, discover

pytestmark = pytest.mark.integration

FAST = BackoffPolicy(initial_delay_ms=10, max_delay_ms=40, max_attempts=3)
# The server selection timeout of the connections that must fail: it also bounds the direct probe
# of each seed that recognises a standalone server or another replica set (at most 2 s), which
# has to answer in time on a loaded machine.
PROBED_SELECTION_MS = 2000


def test_replica_set_is_discovered_with_members_primary_and_oplog_window(mongodb_uri, unique_name):
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=10000) as client:
        hello = client.admin.command("hello")
        inserted = client["mongocdc_test"].command({"insert": unique_name, "documents": [{"n": 1}]})
        write_time = inserted["operationTime"]

    topology = discover(MongoConnectionDetails(connection_string=mongodb_uri), policy=FAST)

    assert topology.kind == "replica_set"
    assert topology.shards == ()
    (rs,) = topology.replica_sets
    assert rs.name == hello["setName"]
    assert rs.primary == hello["primary"]
    assert [m.host for m in rs.members if m.state == "PRIMARY"] == [rs.primary]
    assert {m.host for m in rs.members} >= set(hello["hosts"])
    assert rs.oplog.readable
    assert rs.oplog.oldest <= write_time <= rs.oplog.newest
    assert rs.oplog.covers(write_time) is True
    assert rs.oplog.newest_time is not None and rs.oplog.window_seconds >= 0
    assert rs.oplog.max_size_bytes is None or rs.oplog.max_size_bytes >= rs.oplog.size_bytes > 0
    assert topology.partitions() == [rs.name] == topology.partitions("replica_set")
    data = json.loads(json.dumps(topology.to_dict()))  # JSON-serialisable
    assert data["replica_sets"][0]["oplog"]["newest"]["t"] >= write_time.time


@pytest.mark.simulator_only
def test_three_member_replica_set(mongosim):
    sim = mongosim("replset", members=3)
    topology = discover(MongoConnectionDetails(connection_string=sim.uri), policy=FAST)
    (rs,) = topology.replica_sets
    assert sorted(m.host for m in rs.members) == sorted(sim.member_addresses)
    assert sorted(m.state for m in rs.members) == ["PRIMARY", "SECONDARY", "SECONDARY"]
    assert all(m.health for m in rs.members)
    assert rs.primary in sim.member_addresses
    assert rs.seed_list.startswith(f"{rs.name}/")


@pytest.mark.simulator_only
def test_members_auto_discover_off_talks_to_the_first_seed_only(mongosim):
    sim = mongosim("replset", members=3)
    first = sim.member_addresses[0]
    details = MongoConnectionDetails(hosts=f"rs0/{first}", members_auto_discover=False)
    host, kwargs = details.client_arguments()
    assert host == first and kwargs["directConnection"] is True and "replicaSet" not in kwargs
    topology = discover(details, policy=FAST)
    assert topology.replica_sets[0].name == "rs0"
    assert len(topology.replica_sets[0].members) == 3


@pytest.mark.simulator_only
def test_sharded_cluster_through_mongos(mongosim):
    sim = mongosim("sharded", shards=2)
    topology = discover(MongoConnectionDetails(connection_string=sim.uri), policy=FAST)
    assert topology.kind == "sharded" and topology.via == "mongos"
    assert len(topology.shards) == 2
    with MongoClient(sim.uri, serverSelectionTimeoutMS=10000) as client:
        listed = {s["_id"]: s["host"] for s in client.admin.command("listShards")["shards"]}
    assert {shard.name: shard.host for shard in topology.shards} == listed
    for shard, _uri in zip(sorted(topology.shards, key=lambda s: s.name), sorted(sim.shard_uris)):
        rs = shard.replica_set
        assert shard.host.startswith(f"{rs.name}/")
        assert sorted(shard.host.split("/", 1)[1].split(",")) == sorted(m.host for m in rs.members)
        assert rs.primary is not None and rs.oplog.readable
    assert topology.replica_set_names == [shard.replica_set.name for shard in topology.shards]
    assert topology.partitions() == [CLUSTER_PARTITION]
    assert sorted(topology.partitions("replica_set")) == sorted(topology.replica_set_names)


@pytest.mark.simulator_only
def test_sharded_cluster_shards_are_reached_with_the_same_credentials(mongosim):
    sim = mongosim("sharded", shards=2, auth=("cdc", "shard-secret"))
    details = MongoConnectionDetails(connection_string=sim.uri, username="cdc", password="shard-secret")
    topology = discover(details, policy=FAST)
    assert len(topology.shards) == 2 and all(s.replica_set.primary for s in topology.shards)


@pytest.mark.simulator_only
def test_standalone_server_is_refused_with_the_fix(mongosim):
    sim = mongosim("standalone")
    with pytest.raises(TopologyError) as info:
        discover(MongoConnectionDetails(connection_string=sim.uri), policy=FAST)
    message = str(info.value)
    assert "standalone" in message and "oplog" in message
    assert "--replSet" in message and "rs.initiate()" in message

    # Configured as a replica set, the standalone is recognised at once instead of being retried.
    slept: list[float] = []
    address = sim.member_addresses[0]
    with pytest.raises(TopologyError, match="standalone"):
        connect(
            MongoConnectionDetails(hosts=f"rs0/{address}", server_selection_timeout_ms=PROBED_SELECTION_MS),
            BackoffPolicy(initial_delay_ms=1000, max_delay_ms=1000, max_attempts=16),
            sleep=slept.append,
        )
    assert slept == []


@pytest.mark.simulator_only
def test_wrong_replica_set_name_is_a_configuration_error(mongosim):
    sim = mongosim("replset")
    address = sim.member_addresses[0]
    with pytest.raises(ConfigError) as info:
        connect(
            MongoConnectionDetails(hosts=f"other/{address}", server_selection_timeout_ms=PROBED_SELECTION_MS),
            FAST,
        )
    assert "'rs0'" in str(info.value) and "'other'" in str(info.value)


def test_unreachable_host_is_retried_with_backoff_then_fails_clearly(caplog):
    slept: list[float] = []
    details = MongoConnectionDetails(
        hosts="127.0.0.1:9", server_selection_timeout_ms=200, connect_timeout_ms=200
    )
    with caplog.at_level(logging.WARNING):
        with pytest.raises(ConnectionFailedError) as info:
            connect(
                details,
                BackoffPolicy(initial_delay_ms=20, max_delay_ms=50, max_attempts=4),
                sleep=slept.append,
            )
    assert slept == [0.02, 0.04, 0.05, 0.05]  # doubling, capped, one wait per reconnection attempt
    message = str(info.value)
    assert "127.0.0.1:9" in message and "after 5 attempts" in message
    assert "Cause:" in message and "Fix:" in message and "connect.max.attempts" in message
    assert caplog.text.count("reconnection attempt") == 4


def _wrong_password_details(mongosim, real_mongodb: bool, mongodb_uri: str):
    if real_mongodb:
        parsed = uri_parser.parse_uri(mongodb_uri)
        if not parsed.get("username"):
            pytest.skip("MONGOCDC_TEST_MONGODB_URI has no user name, so wrong credentials cannot be tried")
        return MongoConnectionDetails(
            connection_string=mongodb_uri, username=parsed["username"], password="wrong-" + uuid.uuid4().hex
        )
    sim = mongosim("replset", auth=("cdc", "right-password"))
    return MongoConnectionDetails(
        connection_string=sim.uri, username="cdc", password="wrong-" + uuid.uuid4().hex
    )


def test_wrong_credentials_fail_at_once_with_a_clear_error(mongosim, real_mongodb, mongodb_uri, caplog):
    details = _wrong_password_details(mongosim, real_mongodb, mongodb_uri)
    slept: list[float] = []
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(AuthenticationError) as info:
            connect(details, BackoffPolicy(), sleep=slept.append)
    assert slept == []  # no retry: waiting does not fix a password
    message = str(info.value)
    assert "refused the credentials" in message and repr(details.username) in message
    assert "code 18" in message and "authentication database" in message and "Fix:" in message
    assert details.password not in message
    assert details.password not in repr(details) and details.password not in details.describe()
    assert details.password not in caplog.text


@pytest.mark.simulator_only
def test_right_credentials_connect_and_stay_secret(mongosim, caplog):
    sim = mongosim("replset", auth=("cdc", "the-right-password"))
    with_user_in_uri = sim.uri.replace("mongodb://", "mongodb://cdc:the-right-password@")
    for details in (
        MongoConnectionDetails(connection_string=sim.uri, username="cdc", password="the-right-password"),
        MongoConnectionDetails(connection_string=with_user_in_uri),
    ):
        with caplog.at_level(logging.DEBUG):
            topology = discover(details, policy=FAST)
        assert topology.replica_sets[0].primary
        assert "the-right-password" not in repr(details) and "the-right-password" not in details.describe()
    assert "the-right-password" not in caplog.text


def test_connection_details_carry_credentials_to_shards_and_redact_them():
    details = MongoConnectionDetails(
        connection_string="mongodb://cdc:p%40ss@router1:27017,router2/?authSource=users&tls=true"
        "&tlsAllowInvalidHostnames=true&readPreference=primaryPreferred"
    )
    assert (
        details.describe() == "mongodb://cdc:***@router1:27017,router2/?authSource=users&tls=true"
        "&tlsAllowInvalidHostnames=true&readPreference=primaryPreferred"
    )
    shard = details.for_replica_set("shard01", ["s1:27018", "s2:27018"])
    host, kwargs = shard.client_arguments()
    assert host == ["s1:27018", "s2:27018"]
    assert kwargs["replicaSet"] == "shard01"
    assert (kwargs["username"], kwargs["password"], kwargs["authSource"]) == ("cdc", "p@ss", "users")
    assert kwargs["tls"] is True and kwargs["tlsAllowInvalidHostnames"] is True
    assert "p@ss" not in repr(shard) and "p%40ss" not in repr(details)

    seeds = MongoConnectionDetails(
        hosts="rs0/h1,h2:27018", username="u", password="secret", auth_source="admin"
    )
    host, kwargs = seeds.client_arguments()
    assert host == ["h1:27017", "h2:27018"] and kwargs["replicaSet"] == "rs0"
    assert "secret" not in repr(seeds)
    with pytest.raises(ConfigError):
        MongoConnectionDetails()
    with pytest.raises(ConfigError):
        MongoConnectionDetails(hosts="h1", connection_string="mongodb://h1")
    with pytest.raises(ConfigError):
        MongoConnectionDetails(
            connection_string="mongodb+srv://cluster.example.com", members_auto_discover=False
        )


def test_connector_configuration_sets_driver_timeouts_and_can_turn_discovery_off():
    from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

    details = MongoConnectionDetails(hosts="rs0/h1:27017,h2:27017")
    tuned = details.with_config(
        ConnectorConfig.from_properties(
            {
                "topic.prefix": "p",
                "mongodb.connect.timeout.ms": 1234,
                "mongodb.server.selection.timeout.ms": 4321,
                "mongodb.heartbeat.frequency.ms": 2500,
                "mongodb.members.auto.discover": False,
            }
        )
    )
    host, kwargs = tuned.client_arguments()
    assert (
        kwargs["connectTimeoutMS"],
        kwargs["serverSelectionTimeoutMS"],
        kwargs["heartbeatFrequencyMS"],
    ) == (1234, 4321, 2500)
    assert host == "h1:27017" and kwargs["directConnection"] is True
    assert "socketTimeoutMS" not in kwargs  # 0 = no socket timeout
    assert details.with_config(ConnectorConfig.from_properties({"topic.prefix": "p"})).members_auto_discover
