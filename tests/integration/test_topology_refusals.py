"""Discovery when the server refuses a command or drops the connection: a TopologyError that names
the command and the role to grant, or a ConnectionFailedError that says to check the servers."""

from __future__ import annotations

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError, TopologyError
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.mongo.topology import discover

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

FAST = BackoffPolicy(initial_delay_ms=10, max_delay_ms=40, max_attempts=3)


def fail_list_shards_once(uri: str, **data) -> None:
    with MongoClient(uri, serverSelectionTimeoutMS=10000) as client:
        client.admin.command(
            "configureFailPoint",
            "failCommand",
            mode={"times": 1},
            data={"failCommands": ["listShards"], **data},
        )


def test_a_refused_list_shards_names_the_command_and_the_role_to_grant(mongosim):
    sim = mongosim("sharded", shards=1)
    details = MongoConnectionDetails(connection_string=sim.uri)
    fail_list_shards_once(sim.uri, errorCode=13)
    with pytest.raises(TopologyError) as refused:
        discover(details, policy=FAST)
    message = str(refused.value)
    assert message.startswith(f"MongoDB at {details.describe()} refused 'listShards'. Cause: ")
    assert "Failing command via 'failCommand' failpoint" in message
    assert message.endswith("Fix: grant the connector's user the clusterMonitor role.")


def test_a_connection_lost_during_discovery_says_to_check_the_servers(mongosim):
    sim = mongosim("sharded", shards=1)
    details = MongoConnectionDetails(connection_string=sim.uri)
    fail_list_shards_once(sim.uri, closeConnection=True)
    with pytest.raises(ConnectionFailedError) as lost:
        discover(details, policy=FAST)
    message = str(lost.value)
    assert message.startswith(
        f"Lost the connection to MongoDB at {details.describe()} during discovery. Cause: "
    )
    assert message.endswith("Fix: check the servers and retry.")
