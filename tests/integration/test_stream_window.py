"""Bounded stream windows through spark-submit: the events on the topics, consecutive windows
without overlap or hole, and quiet windows that still move the offset.

Runs against the simulator (or MONGOCDC_TEST_MONGODB_URI), the real Kafka broker and
spark-submit. Window ends are whole seconds derived from the server's own cluster times.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.transactions import java_hash_map_order
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    insert_at,
    next_second,
    pass_second,
    run_window_app,
    seed_offset,
    topic_events,
    write_time,
)

pytestmark = pytest.mark.integration


def _ts_datetime(ts: Timestamp) -> datetime:
    return datetime.fromtimestamp(ts.time, timezone.utc)


def _updated(event) -> dict:
    return json.loads(event.payload["updateDescription"]["updatedFields"])


# The one stream of these windows runs in the application's driver (no SparkContext; the
# operators' default on a local master) or in a Spark task: the same events, summary and offsets.
@pytest.mark.parametrize("stream_in_driver", [True, False], ids=["in-driver", "in-spark-task"])
def test_consecutive_windows_emit_every_change_once_and_quiet_windows_advance(
    mongodb_uri, kafka_bootstrap, spark_submit, unique_name, tmp_path, stream_in_driver
):
    db_name = unique_name[:32] + unique_name[-8:]  # unique_name ends with a random suffix
    marker_db = f"{db_name}_m"
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, db_name, {"heartbeat.interval.ms": 1000})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    seeded = store.read(partition)
    topic = f"{prefix}.{db_name}"

    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    db = client[db_name]
    # -- window A: inserts, updates (set, unset, array element, push), replace, delete, a
    # transaction over two collections, a drop and a rename; the last write X just before the end.
    db.orders.insert_one({"_id": 1, "items": [1, 2, 3], "status": "new", "note": "x"})
    db.orders.update_one({"_id": 1}, {"$set": {"status": "paid", "items.1": 20}, "$unset": {"note": ""}})
    db.orders.update_one({"_id": 1}, {"$push": {"items": 4}})
    db.orders.replace_one({"_id": 1}, {"_id": 1, "status": "replaced"})
    db.orders.insert_one({"_id": 2})
    db.orders.delete_one({"_id": 2})

    def transaction(session):
        with session.start_transaction():
            db.orders.insert_one({"_id": 3}, session=session)
            db.payments.insert_one({"_id": "p3", "order": 3}, session=session)

    write_time(client, transaction)
    db.gone.insert_one({"_id": 10})
    db.gone.drop()
    db.old.insert_one({"_id": 20})
    db.old.rename("renamed")
    db.renamed.update_one({"_id": 20}, {"$set": {"v": 1}})
    x_time = insert_at(db.orders, {"_id": 100})
    end_a = next_second(x_time)
    pass_second(client, end_a, marker_db)
    y_time = insert_at(db.orders, {"_id": 101})  # at or after the end of window A
    assert y_time >= end_a

    run_a = run_window_app(
        spark_submit, tmp_path, "a", props, mongodb_uri, kafka, end_a, stream_in_driver=stream_in_driver
    )
    summary = run_a.summary
    # Where the stream ran: the driver's phases say whether a SparkContext was started.
    expected_phases = (
        {"driver_checks", "in_driver"} if stream_in_driver else {"driver_checks", "spark_start", "tasks"}
    )
    assert set(summary["phases_s"]) == expected_phases
    assert summary["status"] == "completed" and summary["reached_end"] is True
    assert summary["events"] == 12
    assert summary["events_by_op"] == {"c": 7, "d": 1, "u": 4}
    assert summary["events_by_collection"] == {
        f"{db_name}.gone": 1,
        f"{db_name}.old": 1,
        f"{db_name}.orders": 8,
        f"{db_name}.payments": 1,
        f"{db_name}.renamed": 1,
    }
    assert summary["transactions"] == 1 and summary["tombstones"] == 1
    assert summary["batches_committed"] >= 1 and summary["bytes"] > 0
    assert summary["start_position"][partition.rs]["sec"] == seeded.cluster_time.time
    assert summary["end_position"][partition.rs] == {
        "sec": end_a.time,
        "ord": 0,
        "time": _ts_datetime(end_a).isoformat().replace("+00:00", "Z"),
    }
    assert set(summary["lag_ms"]) == {"p50", "p95", "max"} and summary["lag_ms"]["max"] >= 0

    orders = topic_events(kafka_bootstrap, f"{topic}.orders")
    window_a_orders = [
        ("1", "c"),
        ("1", "u"),
        ("1", "u"),
        ("1", "u"),
        ("2", "c"),
        ("2", "d"),
        ("2", None),
        ("3", "c"),
        ("100", "c"),
    ]
    assert [(e.key["id"], e.op) for e in orders] == window_a_orders
    created, set_unset, pushed, replaced = orders[:4]
    assert created.after == {"_id": 1, "items": [1, 2, 3], "status": "new", "note": "x"}
    assert _updated(set_unset) == {"status": "paid", "items.1": 20}
    assert set_unset.payload["updateDescription"]["removedFields"] == ["note"]
    assert _updated(pushed) == {"items.3": 4}
    assert pushed.payload["updateDescription"]["removedFields"] is None
    # Updates carry the document as looked up when read (capture.mode change_streams_update_full).
    assert set_unset.after == pushed.after == {"_id": 1, "status": "replaced"}
    assert replaced.after == {"_id": 1, "status": "replaced"}
    assert replaced.payload["updateDescription"] is None
    assert orders[5].payload["before"] is None and orders[5].after is None  # delete, then tombstone
    assert all("rs" not in e.payload["source"] for e in orders if e.payload)  # Debezium 3.x: no rs
    assert all(e.payload["source"]["snapshot"] == "false" for e in orders if e.payload)

    payments = topic_events(kafka_bootstrap, f"{topic}.payments")
    assert [(e.key["id"], e.op, e.after) for e in payments] == [('"p3"', "c", {"_id": "p3", "order": 3})]
    in_transaction = orders[7].payload["transaction"]
    assert in_transaction["total_order"] == 1 and in_transaction["data_collection_order"] == 1
    assert payments[0].payload["transaction"] == {
        "id": in_transaction["id"],
        "total_order": 2,
        "data_collection_order": 1,
    }
    assert all(e.payload["transaction"] is None for i, e in enumerate(orders) if e.payload and i != 7)
    transactions = topic_events(kafka_bootstrap, f"{prefix}.transaction")
    assert [(e.key["id"], e.payload["status"], e.payload["event_count"]) for e in transactions] == [
        (in_transaction["id"], "BEGIN", None),
        (in_transaction["id"], "END", 2),
    ]
    # Listed in the java.util.HashMap order of Debezium's TransactionContext.
    assert transactions[1].payload["data_collections"] == [
        {"data_collection": name, "event_count": 1}
        for name in java_hash_map_order([f"{db_name}.orders", f"{db_name}.payments"])
    ]

    # The drop and the rename produce no event; the renamed collection's changes go to its topic.
    assert [(e.key["id"], e.op) for e in topic_events(kafka_bootstrap, f"{topic}.gone")] == [("10", "c")]
    assert [(e.key["id"], e.op) for e in topic_events(kafka_bootstrap, f"{topic}.old")] == [("20", "c")]
    renamed = topic_events(kafka_bootstrap, f"{topic}.renamed")
    assert [(e.key["id"], e.op, e.after) for e in renamed] == [("20", "u", {"_id": 20, "v": 1})]

    state = store.read(partition)
    assert state.position.resume_token is None and state.cluster_time == end_a
    assert state.last_window_end == _ts_datetime(end_a) and state.windows == 1 and state.events == 12

    # -- window B: Y (written right at window A's end) and Z, nothing of window A again.
    z_time = write_time(client, lambda s: db.orders.update_one({"_id": 101}, {"$set": {"z": 1}}, session=s))
    end_b = next_second(z_time)
    pass_second(client, end_b, marker_db)
    summary = run_window_app(
        spark_submit, tmp_path, "b", props, mongodb_uri, kafka, end_b, stream_in_driver=stream_in_driver
    ).summary
    assert summary["events"] == 2 and summary["events_by_op"] == {"c": 1, "u": 1}
    orders = topic_events(kafka_bootstrap, f"{topic}.orders")
    assert [(e.key["id"], e.op) for e in orders] == window_a_orders + [("101", "c"), ("101", "u")]
    assert store.read(partition).cluster_time == end_b

    # -- window C (run in-process): no captured change, only uncaptured writes: the offset still
    # moves on with the cluster time, and a heartbeat marks the quiet window.
    quiet = insert_at(client[marker_db]["markers"], {"quiet": True})
    end_c = next_second(quiet)
    pass_second(client, end_c, marker_db)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    summary = run_window(target, config, kafka, WindowParams(end_c, idle_timeout_s=60))
    assert summary["events"] == 0 and summary["reached_end"] is True
    state = store.read(partition)
    assert state.cluster_time == end_c > end_b
    assert state.windows == 3 and state.events == 14
    heartbeats = topic_events(kafka_bootstrap, f"__debezium-heartbeat.{prefix}")
    assert heartbeats[-1].payload == {"ts_ms": end_c.time * 1000}
    assert heartbeats[-1].key == {"serverName": prefix}
    assert len(topic_events(kafka_bootstrap, f"{topic}.orders")) == 11
    client.close()


def test_collection_scoped_window_ends_at_an_invalidate_and_the_next_starts_after_it(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = {"topic.prefix": unique_name, "capture.scope": "collection", "capture.target": f"{db_name}.carts"}
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        carts = client[db_name].carts
        carts.insert_one({"_id": 1})
        dropped = write_time(client, lambda s: carts.drop(session=s))
        carts.insert_one({"_id": 2})  # the collection again, after the drop
        end = end_after_insert(carts, {"_id": 3}, f"{db_name}_m")
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    params = WindowParams(end, idle_timeout_s=60)
    topic = f"{unique_name}.{db_name}.carts"

    first = run_window(target, config, kafka, params)
    assert first["stop_reason"] == "invalidated" and first["events"] == 1
    state = store.read(partition)
    assert state.cluster_time == dropped and state.resume_token is not None  # the invalidate's token
    assert [e.key["id"] for e in topic_events(kafka_bootstrap, topic)] == ["1"]

    second = run_window(target, config, kafka, params)  # startAfter the invalidate
    assert second["stop_reason"] == "end_reached" and second["events"] == 2
    assert [e.key["id"] for e in topic_events(kafka_bootstrap, topic)] == ["1", "2", "3"]
    assert store.read(partition).cluster_time == end


def test_live_window_commits_on_time_and_stops_at_its_end(mongodb_uri, kafka_bootstrap, unique_name):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)  # max.batch.size 2048
    store, partition = seed_offset(mongodb_uri, kafka, props)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    # The end lies far enough ahead that the window (started at once) is streaming well before
    # it: a window starting after its end would read the inserts as one backlog, in less than a
    # commit interval, and show no intermediate commit.
    params = WindowParams(
        datetime.now(timezone.utc) + timedelta(seconds=30), idle_timeout_s=60, commit_interval_s=1
    )
    written: list[tuple[int, Timestamp]] = []
    outcome: dict = {}

    def write() -> None:  # one insert every 0.2 s until past the window end
        with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
            n = 0
            while not written or written[-1][1] < next_second(params.end):
                written.append((n, insert_at(client[db_name].items, {"_id": n})))
                n += 1
                time.sleep(0.2)

    def window() -> None:
        try:
            outcome["summary"] = run_window(target, config, kafka, params)
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    threads = [threading.Thread(target=write, daemon=True), threading.Thread(target=window, daemon=True)]
    for thread in threads:
        thread.start()
    # While the window runs, batches far smaller than max.batch.size become visible with their offset.
    deadline = time.monotonic() + 180
    while True:
        state = store.read(partition)
        if state.windows == 0 and state.events > 0:
            break
        assert state.windows == 0, (
            f"the window ended without an intermediate commit (it started more than 30 s late?): {outcome}"
        )
        assert time.monotonic() < deadline, f"no intermediate commit within 180 s: {outcome}"
        time.sleep(0.2)
    for thread in threads:
        thread.join(timeout=300)
        assert not thread.is_alive(), "the writer or the window did not end within 300 s"

    assert "error" not in outcome, outcome.get("error")
    summary = outcome["summary"]
    inside = [n for n, ts in written if ts < params.end]
    assert inside and len(inside) < len(written)
    assert summary["stop_reason"] == "end_reached" and summary["events"] == len(inside)
    assert summary["batches_committed"] >= 2
    ids = [int(e.key["id"]) for e in topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items")]
    assert ids == inside
    assert store.read(partition).cluster_time == params.end


def test_window_whose_end_has_passed_stops_at_the_streams_first_reply_without_awaiting_changes(
    mongodb_uri, kafka_bootstrap, unique_name
):
    # The change stream's first reply (the aggregate) already says, with its postBatchResumeToken,
    # that the server scanned past the end: the window stops there instead of holding a getMore
    # for poll_ms (here 10 minutes, far beyond the bound below) to hear the same again.
    db_name = unique_name[:32] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = next_second(insert_at(client[f"{db_name}_m"].markers, {"uncaptured": True}))
        pass_second(client, end, f"{db_name}_m")
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    params = WindowParams(end, idle_timeout_s=60, poll_ms=600_000)
    outcome: dict = {}

    def window() -> None:
        try:
            outcome["summary"] = run_window(target, config, kafka, params)
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    thread = threading.Thread(target=window, daemon=True)
    thread.start()
    thread.join(timeout=120)
    assert outcome, (
        "the window whose end had passed was still waiting 120 s later (a getMore held for poll_ms)"
    )
    assert "error" not in outcome, outcome
    summary = outcome["summary"]
    assert summary["stop_reason"] == "end_reached" and summary["events"] == 0
    assert store.read(partition).cluster_time == end
