"""MongoStreamWindowOperator through Airflow connections (AIRFLOW_CONN_*), spark-submit, the real
Kafka broker and a sharded simulator: the window end from the data interval, one Spark task per
shard replica set (mongodb.connection.mode=replica_set), and the summary; then the same window
through mongos."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator, window_end_for
from tests.integration.window_helpers import connector, end_after_insert, topic_events, write_time
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration


def test_window_end_is_the_data_interval_end_or_now():
    now = datetime(2024, 5, 1, 10, 30, tzinfo=timezone.utc)
    assert window_end_for({"data_interval_end": now - timedelta(minutes=30)}, now) == now - timedelta(
        minutes=30
    )
    assert window_end_for({"data_interval_end": now + timedelta(minutes=30)}, now) == now
    assert window_end_for({}, now) == now


def _seed(store, prefix: str, rs: str, uri: str, config: ConnectorConfig) -> OffsetPartition:
    partition = OffsetPartition(prefix, rs)
    with MongoClient(uri, serverSelectionTimeoutMS=20000) as client:
        store.write(partition, OffsetState(position=current_position(client, config)))
    return partition


@pytest.mark.simulator_only
def test_operator_runs_one_spark_task_per_shard_and_returns_the_summary(
    mongosim, kafka_bootstrap, unique_name, operator_connections
):
    sim = mongosim("sharded", shards=2)
    db_name = unique_name[:40]
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, db_name, {"mongodb.connection.mode": "replica_set"})
    config = ConnectorConfig.from_properties(props)
    store = SettledOffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    shards = {"shard0": sim.shard_uris[0], "shard1": sim.shard_uris[1]}
    partitions = {rs: _seed(store, prefix, rs, uri, config) for rs, uri in shards.items()}
    through_mongos = ConnectorConfig.from_properties({**props, "mongodb.connection.mode": "sharded"})
    cluster = _seed(store, prefix, "cluster", sim.uri, through_mongos)

    with MongoClient(sim.uri, serverSelectionTimeoutMS=20000) as client:
        client.admin.command("enableSharding", db_name)
        client.admin.command("shardCollection", f"{db_name}.items", key={"_id": "hashed"})
        db = client[db_name]
        db.items.insert_many([{"_id": n} for n in range(20)])
        db.items.update_one({"_id": 3}, {"$set": {"seen": True}})
        db.items.delete_one({"_id": 4})

        def transaction(session):  # spans both shards
            with session.start_transaction():
                db.items.insert_many([{"_id": n} for n in range(100, 110)], session=session)

        write_time(client, transaction)
        end = end_after_insert(db.items, {"_id": 999}, f"{db_name}_m")
    on_shard = {}
    for rs, uri in shards.items():
        with MongoClient(uri, serverSelectionTimeoutMS=20000) as shard:
            on_shard[rs] = {doc["_id"] for doc in shard[db_name].items.find({}, {"_id": 1})}
    assert on_shard["shard0"] and on_shard["shard1"]  # the documents are spread over both shards

    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        **operator_connections("window", sim.uri, kafka),
        idle_timeout=60,
    )
    data_interval_end = datetime.fromtimestamp(end.time, timezone.utc)
    summary = operator.execute({"data_interval_end": data_interval_end})

    expected_events = 20 + 1 + 1 + 10 + 1
    assert summary["status"] == "completed" and summary["reached_end"] is True
    assert summary["window_end"] == data_interval_end.isoformat().replace("+00:00", "Z")
    assert summary["events"] == expected_events
    assert summary["events_by_op"] == {"c": 31, "d": 1, "u": 1}
    assert summary["events_by_collection"] == {f"{db_name}.items": expected_events}
    assert summary["transactions"] == 2  # the transaction's share on each shard
    assert summary["tombstones"] == 1 and summary["bytes"] > 0
    # Each shard stream commits (more than once only when a commit interval passes meanwhile).
    committed = {p["partition"]: p["batches_committed"] >= 1 for p in summary["partitions"]}
    assert committed == {"shard0": True, "shard1": True}
    assert set(summary["start_position"]) == set(summary["end_position"]) == {"shard0", "shard1"}
    assert all(position["sec"] == end.time for position in summary["end_position"].values())
    assert [p["partition"] for p in summary["partitions"]] == ["shard0", "shard1"]
    assert set(summary["lag_ms"]) == {"p50", "p95", "max"}
    assert 0 <= summary["lag_ms"]["p50"] <= summary["lag_ms"]["p95"] <= summary["lag_ms"]["max"]
    assert summary["duration_s"] > 0
    # Two streams: one Spark task each, even where a single stream would run in the driver
    # (stream_in_driver "auto" on a local master).
    assert set(summary["phases_s"]) == {"driver_checks", "spark_start", "tasks"}
    json.dumps(summary)  # fit for XCom

    events = topic_events(kafka_bootstrap, f"{prefix}.{db_name}.items")
    created = [e for e in events if e.op == "c"]
    assert sorted(int(e.key["id"]) for e in created) == list(range(20)) + list(range(100, 110)) + [999]
    # Each document's events come once, from the one shard stream that holds it (Debezium 3.x's
    # source block has no rs to name the shard: the exactly-once creates above show it).
    assert {int(e.key["id"]) for e in events} <= on_shard["shard0"] | on_shard["shard1"] | {4}
    ends = [e for e in topic_events(kafka_bootstrap, f"{prefix}.transaction") if e.payload["status"] == "END"]
    assert len({e.key["id"] for e in ends}) == 1 and sum(e.payload["event_count"] for e in ends) == 10
    for partition in partitions.values():
        state = store.read(partition)
        assert state.cluster_time == end and state.windows == 1 and state.events > 0

    # Through mongos (the default connection mode): one merged stream with its own offset
    # (partition "cluster"), the whole transaction in one BEGIN/END.
    (target,) = plan_streams(connection_details({"connection_string": sim.uri}), through_mongos)
    assert target.partition == "cluster"
    mongos_summary = run_window(target, through_mongos, kafka, WindowParams(end, idle_timeout_s=60))
    assert mongos_summary["events"] == expected_events and mongos_summary["transactions"] == 1
    assert store.read(cluster).cluster_time == end


def test_operator_open_window_holds_the_lease_while_open_and_logs_and_reports_it(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections, capsys
):
    import threading
    from collections import defaultdict
    from types import SimpleNamespace

    from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore
    from tests.integration.test_open_window import Writer, open_marker, wait_for
    from tests.integration.window_helpers import seed_offset

    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    _, partition = seed_offset(mongodb_uri, kafka, props)
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        **operator_connections("openwin", mongodb_uri, kafka),
        open_window={"idle": "3s", "commit_interval": "0.5s"},
    )
    outlet_events: dict = defaultdict(lambda: SimpleNamespace(extra=None))
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = operator.execute({"outlet_events": outlet_events})
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    reader = OffsetStore(kafka, f"{unique_name}.offsets")
    wait_for(lambda: open_marker(reader, partition) or "error" in outcome, "the window did not open", 240)
    assert "error" not in outcome, outcome.get("error")
    with Writer(mongodb_uri, db_name) as writer:
        wait_for(lambda: (m := open_marker(reader, partition)) and m["events"] >= 5, "no commit while open")
        # The task holds the connector's lease while its window is open.
        lease = ConnectorLease(kafka, unique_name).current()
        assert lease is not None and lease.kind == WINDOW and lease.live()
    thread.join(timeout=240)
    assert not thread.is_alive() and "error" not in outcome, outcome.get("error")
    summary = outcome["summary"]
    assert summary["events"] == len(writer.written) and summary["open_window"]["stop_reasons"] == ["idle"]
    assert set(summary["phases_s"]) == {"driver_checks", "in_driver"}  # one stream, local master
    # The task log: the window opening, its close, the summary's line.
    log = capsys.readouterr().out
    assert "open from" in log and "closes after 3 s without a change" in log
    assert "closed (no change for 3 s)" in log
    assert f"{len(writer.written)} events in {summary['open_window']['commits']} commits" in log
    # The connector's Asset event carries the open window.
    (event,) = outlet_events.values()
    assert event.extra["open_window"]["events"] == len(writer.written)
    assert event.extra["open_window"]["opened_at"] and event.extra["open_window"]["committed_lag_ms"] >= 0
    assert ConnectorLease(kafka, unique_name).current() is None  # released at the end
