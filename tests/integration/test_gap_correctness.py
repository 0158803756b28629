"""What the gap check must not call a gap, against the MongoDB simulator and the real Kafka broker.

* A shard added to the cluster after the stored position: its oplog starts after that position,
  but with the replica set's initiation, from which MongoDB resumes any earlier time. Reporting a
  gap there would re-snapshot and reset the offset, skipping every change and delete since.
* A stored resume token MongoDB refuses as invalid (280: a token of another deployment; 260: a
  malformed one): the oplog lost nothing; the window and the gap check fail with an error that
  names the offset and how to repair it with ``mongocdc offsets``.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import OffsetError, ResumePointPurgedError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.triggers.oplog_gap import OplogGapTrigger, event_error
from tests.integration.oplog_gap_helpers import first_event, sensor
from tests.integration.window_helpers import (
    connector,
    next_second,
    pass_second,
    seed_offset,
    topic_events,
    write_time,
)

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

FIRST_ENTRY = {"ts": 1, "op": 1, "o.msg": 1, "_id": 0}


def trigger_check(props, ids):
    return asyncio.run(OplogGapTrigger(props, ids["mongo"], ids["kafka"]).check_once())


def first_oplog_entry(uri: str) -> dict:
    with MongoClient(uri) as shard:
        return shard.local["oplog.rs"].find_one({}, FIRST_ENTRY, sort=[("$natural", 1)])


def window_to(uri: str, props, kafka, end, marker_db: str) -> dict:
    """Run the window of the deployment's one stream up to ``end`` (the cluster time passed first)."""
    with MongoClient(uri) as client:
        pass_second(client, end, marker_db)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60)
    return run_window(target, config, kafka, params)


def test_a_shard_added_after_the_stored_position_is_no_gap_and_the_window_streams_everything(
    mongosim, kafka_bootstrap, gap_connections, unique_name
):
    sim = mongosim("sharded", shards=2)
    ids = gap_connections(sim.uri)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(sim.uri)
    client.admin.command("shardCollection", "shop.items", key={"_id": "hashed"})
    client.shop.items.insert_many([{"_id": n, "v": 0} for n in range(40)])
    # Both shards have run long enough to drop old entries: their oplogs no longer start with the
    # replica set's initiation, so the oplog comparison is a real one for them.
    sim.set_oplog_retention(max_entries=8)
    sim.set_oplog_retention(max_entries=None)
    assert [first_oplog_entry(uri)["op"] for uri in sim.shard_uris] == ["i", "i"]

    props = connector(unique_name, "shop")
    store, partition = seed_offset(sim.uri, kafka, props)  # where the last window ended
    stored = store.read(partition).position

    # Changes after the stored position, on the old shards: deletes and an update.
    client.shop.items.delete_many({"_id": {"$lt": 5}})
    client.shop.items.update_one({"_id": 10}, {"$set": {"v": 1}})
    # Then a shard is added, and a collection sharded over all three shards gets documents.
    new_uri = sim.add_shard()
    first = first_oplog_entry(new_uri)
    assert (
        first["op"] == "n" and first["o"] == {"msg": "initiating set"} and first["ts"] > stored.cluster_time
    )
    client.admin.command("shardCollection", "shop.more", key={"_id": "hashed"})
    last = write_time(
        client, lambda s: client.shop.more.insert_many([{"_id": n} for n in range(30)], session=s)
    )
    with MongoClient(new_uri) as shard:
        assert shard.shop.more.count_documents({}) > 0, "no document landed on the new shard"

    # The gap check (poke and trigger) sees no gap: MongoDB resumes the stream from the position.
    report = sensor(props, ids).check()
    (check,) = report.checks
    assert report.gap is False, f"a shard added after the stored position was reported as a gap: {check.note}"
    assert (check.status, check.stream) == ("ok", "resumable")
    assert sorted(span.replica_set for span in check.spans) == ["shard0", "shard1", "shard2"]
    assert check.headroom_seconds is not None and check.headroom_seconds >= 0
    assert sensor(props, ids).poke({}).is_done is False
    async_report = trigger_check(props, ids)
    assert async_report.gap is False, async_report.checks[0].note
    assert async_report.checks[0].status == "ok"

    # The window streams every change since the stored position, from all three shards.
    end = next_second(last)
    summary = window_to(sim.uri, props, kafka, end, f"{unique_name}_markers")
    assert summary["reached_end"], summary
    items = topic_events(kafka_bootstrap, f"{unique_name}.shop.items")
    deleted = sorted(e.key["id"] for e in items if e.op == "d")
    assert deleted == ["0", "1", "2", "3", "4"]
    assert [e.key["id"] for e in items if e.op == "u"] == ["10"]
    more = topic_events(kafka_bootstrap, f"{unique_name}.shop.more")
    assert sorted(int(e.key["id"]) for e in more if e.op == "c") == list(range(30))
    assert store.read(partition).position.cluster_time == end

    # A real gap on the new shard is still one: once its oplog rolls past the initiation and past
    # the stored position, poke and trigger report it.
    client.shop.more.insert_many([{"_id": 100 + n} for n in range(30)])
    with MongoClient(new_uri) as shard:
        shard.admin.command({"mongosimSetOplogRetention": 1, "maxEntries": 3})
        assert shard.local["oplog.rs"].find_one({}, sort=[("$natural", 1)])["ts"] > end
    gap = sensor(props, ids).check()
    assert gap.gap and gap.checks[0].stream == "history_lost", gap.checks[0].note
    assert "shard2" in gap.checks[0].note
    assert trigger_check(props, ids).gap is True


def test_a_stored_token_mongodb_refuses_as_invalid_is_not_a_gap(
    mongosim, kafka_bootstrap, gap_connections, unique_name
):
    sim = mongosim("replset")
    other = mongosim("replset")  # another deployment, started after this one
    ids = gap_connections(sim.uri)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(sim.uri)
    client.shop.orders.insert_one({"_id": 0})
    with MongoClient(other.uri) as foreign:
        with foreign.shop.orders.watch(max_await_time_ms=200) as stream:
            foreign.shop.orders.insert_one({"_id": "elsewhere"})
            change = stream.try_next()
            while change is None:
                change = stream.try_next()
    # This deployment's oplog spans the foreign token's time: it is not purged, only unknown here.
    # (Two deployments' clocks are independent: write until this one's cluster time is past it.)
    deadline = time.monotonic() + 120
    n = 0
    while True:
        n += 1
        last = write_time(client, lambda s, n=n: client.shop.orders.insert_one({"_id": n}, session=s))
        if last > change["clusterTime"]:
            break
        assert time.monotonic() < deadline, (
            f"the cluster time stayed at {last}, not past {change['clusterTime']}"
        )
        time.sleep(0.05)

    props = connector(unique_name, "shop")
    config = ConnectorConfig.from_properties(props)
    store = OffsetStore(kafka, config.offsets_topic)
    partition = OffsetPartition(unique_name, "rs0")
    cases = {
        "ChangeStreamFatalError (280)": Position(dict(change["_id"]), change["clusterTime"]),
        "InvalidResumeToken (260)": Position({"_data": "82NOTATOKEN"}),
    }
    end = next_second(last)
    for answer, position in cases.items():
        stored = store.write(partition, OffsetState(position=position))

        # The window fails with the offset's error, not a purge: nothing is re-snapshotted or reset.
        with pytest.raises(OffsetError) as failed:
            window_to(sim.uri, props, kafka, end, f"{unique_name}_markers")
        message = str(failed.value)
        assert not isinstance(failed.value, ResumePointPurgedError), message
        assert answer in message and "not a gap" in message, message
        assert position.describe() in message, message
        assert f"mongocdc offsets show --topic-prefix {unique_name} --partition rs0" in message, message
        assert "mongocdc offsets set" in message and "mongocdc offsets reset" in message, message
        assert store.read(partition) == stored

        # The gap check neither reports a gap nor passes: poke and trigger fail with that error.
        with pytest.raises(OffsetError, match="mongocdc offsets show"):
            sensor(props, ids).poke({})
        event = first_event(OplogGapTrigger(props, ids["mongo"], ids["kafka"], poll_interval=1))
        assert event["status"] == "error" and event["error"] == "OffsetError", event
        assert answer in event["cause"] and "mongocdc offsets" in event["fix"], event
        assert isinstance(event_error(event), OffsetError)
        assert store.read(partition) == stored
