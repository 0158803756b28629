"""An oplog purge between two windows, with inserts, updates and a delete made during the gap:
the gap check (GapChecker, the core of OplogGapSensor) finds it, the snapshot application with
force and reset_offset re-snapshots, the next window streams on from the new snapshot's start, and
the state a consumer rebuilds from the topics equals MongoDB.

The Airflow path (watchdog DAG -> MongoResnapshotOperator) is covered by tests/e2e; this is the
lean core-level variant. A delete made during the gap has no event (its oplog entry is gone): as
documented for mongocdc_resnapshot, a consumer drops the keys of a collection that the gap
re-snapshot did not emit; the test applies that rule and also checks that it is needed.
"""

from __future__ import annotations

import json

import pytest
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from confluent_kafka import Consumer, TopicPartition

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.checker import GapChecker
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic, wait_stable
from tests.integration.window_helpers import end_after_insert
from tests.settled_offsets import SettledOffsetStore

pytestmark = [pytest.mark.faults, pytest.mark.simulator_only]

COLLECTIONS = ("orders", "customers")


def _canonical(value) -> str:
    return json_util.dumps(value, json_options=CANONICAL_JSON_OPTIONS)


def _end_offset(bootstrap: str, topic: str) -> int:
    """The topic's end for read_committed consumers, once the commit markers of the transactions
    just committed are written (until then it lags behind them)."""
    wait_stable(bootstrap, topic)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "faults-end-offset",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    try:
        return consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10, cached=False)[1]
    finally:
        consumer.close()


def rebuild(bootstrap: str, topic: str, resnapshot: tuple[int, int] | None) -> dict[str, str]:
    """A consumer's state: the last event per key (deletes and tombstones remove it). With
    ``resnapshot`` (the topic offsets the gap re-snapshot wrote, transaction markers included),
    keys that the re-snapshot did not emit are dropped once its read events have been applied."""
    state: dict[str, str] = {}
    emitted: set[str] = set()
    pending = resnapshot is not None

    def drop_unemitted() -> None:
        nonlocal state, pending
        state = {k: v for k, v in state.items() if k in emitted}
        pending = False

    for record in read_topic(bootstrap, topic):
        if pending and record.offset >= resnapshot[1]:
            drop_unemitted()
        key = _canonical(json_util.loads(json.loads(record.key)["payload"]["id"]))
        value = json.loads(record.value)["payload"] if record.value is not None else None
        if value is None or value["op"] == "d" or value["after"] is None:
            state.pop(key, None)  # (an update's lookup finds nothing once the document is deleted)
        else:
            state[key] = _canonical(json_util.loads(value["after"]))
        if pending and record.offset >= resnapshot[0]:
            assert value is not None and value["op"] == "r", "the re-snapshot range holds other events"
            emitted.add(key)
    if pending:
        drop_unemitted()
    return state


def read_events_between(bootstrap: str, topic: str, start: int, end: int) -> int:
    return sum(1 for record in read_topic(bootstrap, topic) if start <= record.offset < end)


def in_mongo(client, collection: str) -> dict[str, str]:
    return {_canonical(doc["_id"]): _canonical(doc) for doc in client.shop[collection].find()}


def test_purge_between_windows_is_found_and_resnapshot_converges(
    mongosim, kafka_bootstrap, unique_name, run_in_jvm
):
    sim = mongosim("replset")
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = {
        "topic.prefix": unique_name,
        "collection.include.list": r"shop\..*",
        "snapshot.chunk.size": 20,
        "connect.max.attempts": 1,
    }
    config = ConnectorConfig.from_properties(props)
    details = MongoConnectionDetails(connection_string=sim.uri)
    mongo = {"connection_string": sim.uri}
    store = SettledOffsetStore(kafka, config.offsets_topic)
    partition = OffsetPartition(unique_name, "rs0")
    topics = {name: f"{unique_name}.shop.{name}" for name in COLLECTIONS}
    client = sim.client()
    client.shop.orders.insert_many([{"_id": n, "status": "new", "total": n * 10} for n in range(60)])
    client.shop.customers.insert_many([{"_id": f"c{n}", "name": f"customer {n}"} for n in range(25)])

    def window() -> dict:
        end = end_after_insert(client.marks.m, {"at": 1}, "marks")  # after everything written so far
        (target,) = plan_streams(details, config)
        summary = run_window(target, config, kafka, WindowParams(end))
        assert summary["reached_end"] is True, summary
        return summary

    first = run_in_jvm("snapshot", props, mongo, kafka)
    assert first["status"] == "ok" and first["summary"]["documents"] == 85, first

    # Window 1: changes streamed normally.
    client.shop.orders.insert_one({"_id": 100, "status": "new", "total": 1000})
    client.shop.orders.update_one({"_id": 1}, {"$set": {"status": "paid"}})
    client.shop.orders.delete_one({"_id": 2})
    client.shop.customers.update_one({"_id": "c1"}, {"$set": {"name": "renamed"}})
    assert window()["events"] == 4
    report = GapChecker(config, details).check(store.read_all())
    assert not report.gap and [check.status for check in report.checks] == ["ok"]

    # The gap: changes that no window reads before the oplog drops them.
    client.shop.orders.insert_many([{"_id": 200 + n, "status": "late"} for n in range(5)])
    client.shop.orders.update_one({"_id": 3}, {"$set": {"status": "shipped"}})
    client.shop.orders.update_many({"_id": {"$lt": 10}}, {"$inc": {"total": 1}})
    client.shop.orders.delete_one({"_id": 4})
    client.shop.customers.insert_one({"_id": "c99", "name": "late customer"})
    client.shop.customers.replace_one({"_id": "c2"}, {"_id": "c2", "name": "replaced"})
    sim.set_oplog_retention(max_entries=3)
    before = store.read(partition)

    report = GapChecker(config, details).check(store.read_all())
    assert report.gap and report.to_dict()["gap_partitions"] == ["rs0"]
    (gap,) = report.gaps
    assert gap.position == before.position  # the stored position is the one reported lost
    assert store.read(partition) == before  # checking changes nothing
    sim.set_oplog_retention(max_entries=None)  # the oplog keeps what is written from now on

    # The re-snapshot: every captured collection again, the offset moved to its start.
    ranges_start = {name: _end_offset(kafka_bootstrap, topic) for name, topic in topics.items()}
    again = run_in_jvm("snapshot", props, mongo, kafka, force=True, reset_offset=True)
    assert again["status"] == "ok", again
    summary = again["summary"]
    assert summary["action"] == "snapshot" and summary["snapshot_id"] != first["summary"]["snapshot_id"]
    assert summary["collections"] == {"shop.orders": 64, "shop.customers": 26}
    ranges = {
        name: (ranges_start[name], _end_offset(kafka_bootstrap, topic)) for name, topic in topics.items()
    }
    assert {
        name: read_events_between(kafka_bootstrap, topics[name], *span) for name, span in ranges.items()
    } == {"orders": 64, "customers": 26}
    repaired = store.read(partition)
    assert (
        repaired.position == repaired.snapshot.start == Position.from_json(summary["start_position"]["rs0"])
    )
    assert repaired.snapshot.snapshot_id == summary["snapshot_id"]
    report = GapChecker(config, details).check(store.read_all())
    assert not report.gap

    # Window 2 streams on from the re-snapshot's start.
    client.shop.orders.insert_one({"_id": 300, "status": "new"})
    client.shop.orders.update_one({"_id": 5}, {"$set": {"status": "after"}})
    client.shop.orders.delete_one({"_id": 6})
    client.shop.customers.delete_one({"_id": "c3"})
    assert window()["events"] == 4
    assert store.read(partition).windows == 2

    for name, topic in topics.items():
        expected = in_mongo(client, name)
        assert rebuild(kafka_bootstrap, topic, ranges[name]) == expected, name
        # Without the documented rule, exactly the keys deleted during the gap would linger.
        naive = rebuild(kafka_bootstrap, topic, None)
        lingering = set(naive) - set(expected)
        assert lingering == ({_canonical(4)} if name == "orders" else set()), lingering
        assert {key: naive[key] for key in expected} == expected
    client.close()
