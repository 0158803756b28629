"""Delta Lake tables kept equal to MongoDB, with the real Kafka broker and MongoDB (the simulator, or
MONGOCDC_TEST_MONGODB_URI): a snapshot and windows write the topics, the apply (its driver path, in
this process) applies them, and deltalake's own reader (pyarrow) reads the tables back.

The snapshot, c/u/d/replace and a multi-document transaction; nothing applied twice (each commit
continues exactly where the previous one ended; a run with nothing new commits nothing); a gap
re-snapshot removes the rows deleted while the history was lost; declared columns and the values
that do not fit them; bad input as one error in words before any table changes."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from bson import Decimal128, ObjectId
from confluent_kafka import Producer
from deltalake import DeltaTable
from pymongo import MongoClient

from airflow_provider_mongocdc.core.apply.settings import DeltaSettings
from airflow_provider_mongocdc.core.base.errors import EventFormatError, TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.record import Reading
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.plugins.health_tables import read_tables
from tests.integration.delta_helpers import (
    apply,
    apply_commits,
    connector,
    mongo_documents,
    snapshot,
    table_documents,
    table_rows,
    window,
)
from tests.integration.window_helpers import seed_offset

pytestmark = pytest.mark.integration


def assert_chained(path) -> list[dict]:
    """Every apply commit starts where the one before ended: no record applied twice or skipped."""
    commits = apply_commits(path)
    previous = {partition: 0 for partition in commits[0]["mongocdc.from"]}  # a topic's first offset
    for commit in commits:
        assert commit["mongocdc.from"] == {
            k: v for k, v in previous.items() if k in commit["mongocdc.from"]
        }, commits
        previous = commit["mongocdc.positions"]
    return commits


def test_tables_equal_mongodb_after_a_snapshot_changes_and_a_transaction(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    orders = client[database].orders
    customers = client[database].customers
    orders.insert_many(
        [{"_id": n, "total": n * 1.5, "status": "open", "customer": {"name": f"c{n}"}} for n in range(120)]
    )
    ids = [ObjectId() for _ in range(30)]
    customers.insert_many(
        [{"_id": oid, "name": f"n{i}", "price": Decimal128(f"{i}.25")} for i, oid in enumerate(ids)]
    )
    props = connector(unique_name, database)
    delta = {
        "location": str(tmp_path / "lake"),
        "columns": {f"{database}.orders": {"total": "double", "customer.name": "string", "status": "long"}},
    }
    snapshot(mongodb_uri, kafka, props)

    first = apply(kafka, props, delta)

    orders_table, customers_table = (
        tmp_path / "lake" / database / "orders",
        tmp_path / "lake" / database / "customers",
    )
    assert table_documents(orders_table) == mongo_documents(mongodb_uri, database, "orders")
    assert table_documents(customers_table) == mongo_documents(mongodb_uri, database, "customers")
    assert first["events"] == 150 and first["events_by_op"] == {"r": 150}, first
    by_topic = {table["collection"]: table for table in first["tables"]}
    # "status" is a string in MongoDB: each value counted and left in _doc only.
    assert by_topic[f"{database}.orders"]["misfits"]["status"]["count"] == 120

    orders.update_one({"_id": 1}, {"$set": {"total": 99.0}, "$unset": {"status": ""}})
    orders.replace_one({"_id": 2}, {"total": 7, "note": "replaced"})
    orders.delete_one({"_id": 3})
    orders.insert_one({"_id": 500, "total": 1})
    customers.delete_one({"_id": ids[0]})
    with client.start_session() as session, session.start_transaction():
        orders.insert_one({"_id": 501, "total": 2}, session=session)
        orders.update_one({"_id": 4}, {"$set": {"status": "paid"}}, session=session)
        orders.delete_one({"_id": 5}, session=session)
        customers.update_one({"_id": ids[1]}, {"$set": {"name": "renamed"}}, session=session)
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")

    second = apply(kafka, props, delta)

    assert table_documents(orders_table) == mongo_documents(mongodb_uri, database, "orders")
    assert table_documents(customers_table) == mongo_documents(mongodb_uri, database, "customers")
    assert second["rows_deleted"] == 3 and second["commits"] == 2, second
    rows = {row["_id"]: row for row in table_rows(orders_table)}
    assert rows["1"]["total"] == 99.0 and rows["1"]["customer_name"] == "c1" and rows["1"]["_op"] == "u"
    assert rows["501"]["_txn"] and rows["501"]["_txn"] == rows["4"]["_txn"]  # one MongoDB transaction
    assert rows["2"]["customer_name"] is None and json.loads(rows["2"]["_doc"])["note"] == "replaced"
    versions = DeltaTable(str(orders_table)).version()

    third = apply(kafka, props, delta)  # nothing new: nothing committed
    assert third["commits"] == 0 and DeltaTable(str(orders_table)).version() == versions
    commits = assert_chained(orders_table)
    assert sum(commit["mongocdc.events"] for commit in commits) == 120 + 9  # two tombstones among the 9


def test_a_gap_resnapshot_removes_the_rows_deleted_while_the_history_was_lost(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(60)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake")}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"
    assert len(table_documents(table)) == 60

    # While the connector's history is lost, documents are deleted and changed: no window ever
    # streams these changes; the gap re-snapshot copies everything and moves the offset past them.
    items.delete_many({"_id": {"$in": [3, 10, 11, 40]}})
    items.update_one({"_id": 5}, {"$set": {"v": 1}})
    items.insert_one({"_id": 100, "v": 2})
    snapshot(mongodb_uri, kafka, props, force=True, reset_offset=True)

    summary = apply(kafka, props, delta)

    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    (items_summary,) = summary["tables"]
    assert items_summary["rows_swept"] == 4 and items_summary["snapshot"]["completed"] == 1, items_summary
    items.delete_one({"_id": 6})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    apply(kafka, props, delta)
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    assert_chained(table)


def test_soft_deletes_mark_rows_and_keep_their_last_document(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": n} for n in range(10)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "soft_delete": True}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    items.delete_one({"_id": 4})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"
    rows = {row["_id"]: row for row in table_rows(table)}
    assert (
        rows["4"]["_deleted"] is True and rows["4"]["_op"] == "d" and json.loads(rows["4"]["_doc"])["v"] == 4
    )
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")

    # The MongoDB CDC page's reading of the tables: each table's version, nothing behind.
    shown = {"status": "ok", "problems": []}
    reading = Reading(
        read_tables(DeltaSettings.from_mapping(delta), ConnectorConfig.from_properties(props), kafka),
        datetime.now(timezone.utc),
    )
    add_tables(shown, delta["location"], reading, datetime.now(timezone.utc))
    (row,) = shown["tables"]["tables"]
    assert (row["collection"], row["version"], row["behind"]) == (f"{database}.items", 1, 0), row
    assert shown["status"] == "ok"


def test_bad_input_is_one_error_in_words_before_any_table_changes(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many([{"_id": n} for n in range(5)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)

    # A location that cannot be written (below a file: no user may create it).
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("x")
    with pytest.raises(TableError, match="cannot be written.*is not a directory.*Fix: create the directory"):
        apply(kafka, props, {"location": str(blocker / "lake")})

    # A table written by something else at the location.
    lake = tmp_path / "lake"
    foreign = lake / database / "items"
    import pyarrow as pa
    from deltalake import write_deltalake

    write_deltalake(str(foreign), pa.table({"id": [1]}), description="the sales team's table")
    with pytest.raises(TableError) as raised:
        apply(kafka, props, {"location": str(lake)})
    assert "was not written by the apply" in str(raised.value) and "the sales team's table" in str(
        raised.value
    )
    assert DeltaTable(str(foreign)).version() == 0

    # A topic of the connector that holds something else: no table of the run changes.
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(f"{unique_name}.{database}.avro", key=b"\x00\x01", value=b"\x00\x00\x00\x00\x01avro")
    producer.flush(30)
    other = tmp_path / "other"
    with pytest.raises(EventFormatError) as raised:
        apply(kafka, props, {"location": str(other)})
    assert f"topic '{unique_name}.{database}.avro'" in str(raised.value)
    assert not (other / database / "items").exists()


def test_a_newly_declared_column_is_added_and_filled_from_the_documents(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many(
        [{"_id": n, "price": n * 2, "tag": f"t{n}"} for n in range(8)]
    )
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    lake = {"location": str(tmp_path / "lake")}
    apply(kafka, props, lake)
    table = tmp_path / "lake" / database / "items"
    assert "price" not in DeltaTable(str(table)).schema().to_arrow().names

    declared = {**lake, "columns": {f"{database}.items": {"price": "long", "tag": "string"}}}
    summary = apply(kafka, props, declared)  # nothing new on the topic: the columns still come

    assert summary["events"] == 0
    rows = {row["_id"]: row for row in table_rows(table)}
    assert rows["3"]["price"] == 6 and rows["7"]["tag"] == "t7"
    with pytest.raises(TableError, match="is long, but it is declared string"):
        apply(kafka, props, {**lake, "columns": {f"{database}.items": {"price": "string"}}})


def test_a_completed_incremental_snapshot_sweeps_the_rows_it_did_not_find(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(30)])
    props = connector(unique_name, database, **{"incremental.snapshot.chunk.size": 10})
    delta = {"location": str(tmp_path / "lake")}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"

    # History lost: two documents deleted, and the stored position moved past their deletes.
    items.delete_many({"_id": {"$in": [3, 17]}})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    request = IncrementalRequest.new([f"{database}.items"])
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())
    items.insert_one({"_id": 100, "v": 1})  # a change while the incremental snapshot runs
    summary = window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    assert summary["incremental_snapshot"]["status"] == "completed", summary["incremental_snapshot"]

    applied = apply(kafka, props, delta)

    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    (items_summary,) = applied["tables"]
    assert items_summary["rows_swept"] == 2 and items_summary["snapshot"]["completed"] == 1, items_summary
