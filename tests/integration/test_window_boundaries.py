"""Where a window stops and commits: MongoDB transactions are never cut by a Kafka transaction (with
or without transaction metadata), and a window whose end lies in the past but whose server's
cluster time never reaches it fails (retryably) instead of reporting a covered interval.

Runs against the simulator (or MONGOCDC_TEST_MONGODB_URI where no simulator command is needed), the
real Kafka broker and, for the operator, spark-submit.
"""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from airflow.providers.common.compat.sdk import AirflowException
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import open_stream
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.keys import parse_key
from airflow_provider_mongocdc.core.offsets.model import OffsetState
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    insert_at,
    next_second,
    pass_second,
    seed_offset,
    topic_events,
    write_time,
)

pytestmark = pytest.mark.integration

TRANSACTION_SIZE = 5


def _committed_states(store, partition) -> list[OffsetState]:
    """Every offset the stream committed, oldest first (each in the Kafka transaction of its events)."""
    states = []
    for key, value in store.read_committed_records():
        parsed = parse_key(key)
        if parsed is None or value is None:
            continue
        record_partition, chunk = parsed
        same = (record_partition.server_id, record_partition.rs) == (partition.server_id, partition.rs)
        if same and chunk is None:
            states.append(OffsetState.from_bytes(value))
    return states


def _keys(bootstrap: str, topic: str) -> list:
    """The ``_id`` of every committed event of ``topic``, in order."""
    return [json.loads(event.key["id"]) for event in topic_events(bootstrap, topic)]


def _changes(client: MongoClient, config: ConnectorConfig, position, count: int) -> list[dict]:
    """The first ``count`` changes of the connector's stream after ``position``."""
    changes: list[dict] = []
    deadline = time.monotonic() + 120
    with open_stream(client, config, position, max_await_time_ms=500) as stream:
        while len(changes) < count:
            assert time.monotonic() < deadline, f"only {len(changes)} of {count} changes in the stream"
            change = stream.try_next()
            if change is not None:
                changes.append(change)
    return changes


@pytest.mark.parametrize("metadata", [False, True], ids=["no-metadata", "metadata"])
def test_batch_commits_never_cut_a_mongodb_transaction(mongodb_uri, kafka_bootstrap, unique_name, metadata):
    db_name = f"txn_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    # max.batch.size 2: a commit is due at nearly every change, also inside the transaction.
    props = connector(unique_name, db_name, {"max.batch.size": 2, "provide.transaction.metadata": metadata})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    seeded = store.read(partition)
    config = ConnectorConfig.from_properties(props)

    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        items.insert_one({"_id": "before"})

        def transaction(session):
            with session.start_transaction():
                for n in range(TRANSACTION_SIZE):
                    items.insert_one({"_id": f"t{n}"}, session=session)

        write_time(client, transaction)
        end = end_after_insert(items, {"_id": "after"}, f"{db_name}_m")
        changes = _changes(client, config, seeded.position, TRANSACTION_SIZE + 2)

    inside = changes[1 : 1 + TRANSACTION_SIZE]
    assert [c["documentKey"]["_id"] for c in inside] == [f"t{n}" for n in range(TRANSACTION_SIZE)]
    assert all("txnNumber" in c and "lsid" in c for c in inside), inside
    # Resuming after any of these would start in the middle of the transaction.
    cut_points = [dict(c["_id"]) for c in inside[:-1]]

    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    summary = run_window(target, config, kafka, WindowParams(datetime.fromtimestamp(end.time, timezone.utc)))
    assert summary["reached_end"] is True and summary["events"] == TRANSACTION_SIZE + 2, summary

    committed = _committed_states(store, partition)[1:]  # after the seeded offset
    assert len(committed) >= 2, "the window committed no intermediate batch"
    for state in committed:
        inside_transaction = state.resume_token is not None and dict(state.resume_token) in cut_points
        assert not inside_transaction, (
            f"an offset was committed inside the MongoDB transaction: {state.position.describe()}"
        )
        # Events and offset share a Kafka transaction: the count committed with each offset is
        # where a Kafka transaction ends; "before" is event 1, the transaction events 2 to 6.
        assert not 2 <= state.events < 1 + TRANSACTION_SIZE, (
            f"a Kafka transaction ended after {state.events} events, inside the MongoDB transaction "
            f"(committed counts {[s.events for s in committed]})"
        )
    assert committed[-1].cluster_time == end and committed[-1].events == TRANSACTION_SIZE + 2
    assert _keys(kafka_bootstrap, f"{unique_name}.{db_name}.items") == [
        "before",
        *[f"t{n}" for n in range(TRANSACTION_SIZE)],
        "after",
    ]


@pytest.mark.simulator_only
def test_a_past_end_the_cluster_time_never_reaches_fails_retryably_and_keeps_what_was_read(
    mongosim, kafka_bootstrap, unique_name, operator_connections
):
    # No periodic no-op: the server's cluster time stays at its last write.
    sim = mongosim("replset", noop_interval=3600)
    db_name = f"stall_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(sim.uri, kafka, props)
    config = ConnectorConfig.from_properties(props)
    with sim.client() as client:
        for n in range(3):
            last = insert_at(client[db_name].items, {"_id": n})
        (last_change,) = _changes(client, config, store.read(partition).position, 3)[-1:]
    end = next_second(last)
    window_end = datetime.fromtimestamp(end.time, timezone.utc)
    deadline = time.monotonic() + 120
    while time.time() < end.time + 1:  # the end lies in the past by this machine's clock
        assert time.monotonic() < deadline, "the wall clock did not pass the window end"
        time.sleep(0.1)
    (target,) = plan_streams(connection_details({"connection_string": sim.uri}), config)

    with pytest.raises(MongoCdcError) as info:
        run_window(target, config, kafka, WindowParams(window_end, idle_timeout_s=20))
    message = str(info.value)
    assert "did not reach the window end" in message and window_end.isoformat()[:19] in message
    assert "periodic no-op" in message and "continues from" in message
    # What was read is committed: the offset stands at the last change read, not at the end.
    state = store.read(partition)
    assert dict(state.resume_token) == dict(last_change["_id"]) and state.events == 3
    assert state.windows == 0 and state.last_window_end is None
    assert _keys(kafka_bootstrap, f"{unique_name}.{db_name}.items") == [0, 1, 2]

    # Through the operator (spark-submit): the Airflow task fails, retryably, with the message.
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        **operator_connections("stall", sim.uri, kafka),
        idle_timeout=20,
    )
    with pytest.raises(AirflowException) as failed:
        operator.execute({"data_interval_end": window_end})
    assert type(failed.value).__name__ != "AirflowFailException"
    assert "did not reach the window end" in str(failed.value) and "Fix:" in str(failed.value)
    assert store.read(partition).position == state.position

    # Once the cluster time moves past the end, the re-run completes the interval.
    with sim.client() as client:
        pass_second(client, end, f"{db_name}_m")
    summary = run_window(target, config, kafka, WindowParams(window_end))
    assert summary["reached_end"] is True and summary["events"] == 0, summary
    state = store.read(partition)
    assert state.cluster_time == end and state.windows == 1 and state.events == 3
