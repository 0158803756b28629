"""MongoStreamWindowOperator through Airflow connections (AIRFLOW_CONN_*), spark-submit, the real
Kafka broker and the simulator: the window end from the data interval and the summary."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator, window_end_for
from tests.integration.window_helpers import (
    connector,
    insert_at,
    next_second,
    pass_second,
    seed_offset,
    topic_events,
    write_time,
)

pytestmark = pytest.mark.integration


def test_window_end_is_the_data_interval_end_or_now():
    now = datetime(2024, 5, 1, 10, 30, tzinfo=timezone.utc)
    assert window_end_for({"data_interval_end": now - timedelta(minutes=30)}, now) == now - timedelta(minutes=30)
    assert window_end_for({"data_interval_end": now + timedelta(minutes=30)}, now) == now
    assert window_end_for({}, now) == now


def test_operator_runs_a_window_and_returns_its_summary(mongodb_uri, kafka_bootstrap, unique_name,
                                                        monkeypatch):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    for conn_id, fields in (("window_mongo", {"conn_type": "mongocdc", "host": mongodb_uri}),
                            ("window_kafka", {"conn_type": "mongocdc_kafka", "extra": kafka}),
                            ("window_spark", {"conn_type": "spark", "host": "local[2]"})):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))

    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        db = client[db_name]
        db.carts.insert_one({"_id": 1, "n": 1})
        db.carts.update_one({"_id": 1}, {"$inc": {"n": 1}})

        def transaction(session):
            with session.start_transaction():
                db.carts.delete_one({"_id": 1}, session=session)
                db.audit.insert_one({"_id": "a1"}, session=session)

        write_time(client, transaction)
        end = next_second(insert_at(db.carts, {"_id": 2}))
        pass_second(client, end, f"{db_name}_m")

    operator = MongoStreamWindowOperator(
        task_id="window", connector_config=props, mongo_conn_id="window_mongo",
        kafka_conn_id="window_kafka", spark_conn_id="window_spark",
        conf={"spark.ui.enabled": "false"}, idle_timeout=20)
    data_interval_end = datetime.fromtimestamp(end.time, timezone.utc)
    summary = operator.execute({"data_interval_end": data_interval_end})

    assert summary["status"] == "completed" and summary["reached_end"] is True
    assert summary["window_end"] == data_interval_end.isoformat().replace("+00:00", "Z")
    assert summary["events"] == 5
    assert summary["events_by_op"] == {"c": 3, "d": 1, "u": 1}
    assert summary["events_by_collection"] == {f"{db_name}.audit": 1, f"{db_name}.carts": 4}
    assert summary["transactions"] == 1 and summary["tombstones"] == 1
    assert summary["bytes"] > 0 and summary["batches_committed"] == 1
    assert summary["start_position"][partition.rs]["sec"] < end.time
    assert summary["end_position"][partition.rs]["sec"] == end.time
    assert set(summary["lag_ms"]) == {"p50", "p95", "max"}
    assert 0 <= summary["lag_ms"]["p50"] <= summary["lag_ms"]["p95"] <= summary["lag_ms"]["max"]
    assert summary["duration_s"] > 0
    json.dumps(summary)  # fit for XCom

    carts = topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.carts")
    assert [(e.key["id"], e.op) for e in carts] == [("1", "c"), ("1", "u"), ("1", "d"), ("1", None), ("2", "c")]
    assert store.read(partition).cluster_time == end
