"""``snapshot.mode=always`` with the hourly DAG's tasks (snapshot, then window) over two runs: the
re-snapshot of the second run leaves streaming continuous, so the changes made between the runs
(a delete included) still reach the topic as change events. Operators through Airflow connections,
spark-submit ``local[2]``, the real Kafka broker and MongoDB (simulator or real)."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.integration.window_helpers import end_after_insert, topic_events

pytestmark = pytest.mark.integration


def _context(task_id: str, run_id: str, **extra) -> dict:
    ti = SimpleNamespace(dag_id="mongocdc_hourly", task_id=task_id, run_id=run_id, map_index=-1)
    return {"ti": ti, **extra}


def test_always_resnapshots_every_run_and_loses_no_change_between_runs(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections
):
    database, marker_db = unique_name[:40], f"{unique_name[:40]}_m"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = {
        "topic.prefix": unique_name,
        "collection.include.list": f"{database}\\..*",
        "snapshot.mode": "always",
        "snapshot.max.threads": 1,
        "connect.max.attempts": 1,
    }
    common = dict(
        connector_config=props,
        **operator_connections("always", mongodb_uri, kafka),
    )
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    items = client[database]["items"]
    items.insert_many([{"_id": n, "v": 0} for n in range(1, 6)])
    rs = client.admin.command("hello")["setName"]
    store = OffsetStore(kafka, ConnectorConfig.from_properties(props).offsets_topic)
    partition = OffsetPartition(unique_name, rs)

    def hourly_run(run_id: str) -> tuple[dict, dict]:
        """The hourly DAG's two tasks: snapshot, then the window up to the data interval's end."""
        snapshot = MongoSnapshotOperator(task_id="snapshot", **common).execute(_context("snapshot", run_id))
        end = end_after_insert(client[marker_db]["markers"], {"at": time.time()}, marker_db)
        window = MongoStreamWindowOperator(task_id="window", idle_timeout=60, **common).execute(
            _context("window", run_id, data_interval_end=datetime.fromtimestamp(end.time, timezone.utc))
        )
        assert window["reached_end"] is True, window
        return snapshot, window

    first_snapshot, first_window = hourly_run("scheduled__1")
    assert first_snapshot["action"] == "snapshot" and first_snapshot["documents"] == 5
    assert first_window["events"] == 0
    first_end = store.read(partition).position

    # Between the runs: a delete, an update and an insert.
    items.delete_one({"_id": 2})
    items.update_one({"_id": 3}, {"$set": {"v": 1}})
    items.insert_one({"_id": 6, "v": 0})

    second_snapshot, second_window = hourly_run("scheduled__2")
    assert second_snapshot["action"] == "snapshot", second_snapshot  # always: a snapshot every run
    assert second_snapshot["documents"] == 5
    assert second_window["events_by_op"] == {"c": 1, "d": 1, "u": 1}, second_window
    assert second_snapshot["offsets"][rs]["sec"] == first_end.cluster_time.time  # the offset stayed

    events = topic_events(kafka_bootstrap, f"{unique_name}.{database}.items")
    reads = [event for event in events if event.op == "r"]
    assert sorted(int(e.key["id"]) for e in reads) == [1, 1, 2, 3, 3, 4, 4, 5, 5, 6]
    changes = [(event.op, int(event.key["id"])) for event in events if event.op != "r"]
    assert changes == [("d", 2), (None, 2), ("u", 3), ("c", 6)], changes  # None: the tombstone

    # A consumer applying the topic in order ends with the collection as it is.
    state: dict[int, dict] = {}
    for event in events:
        key = int(event.key["id"])
        if event.payload is None or event.op == "d":
            state.pop(key, None)
        else:
            state[key] = event.after
    assert state == {doc["_id"]: doc for doc in items.find()}
    client.close()
