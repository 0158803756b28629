"""Delta Lake and Apache Iceberg tables kept equal to MongoDB, with the real Kafka broker and MongoDB
(the simulator, or MONGOCDC_TEST_MONGODB_URI): a snapshot and windows write the topics, the apply
(its driver path, in this process) applies them, and readers that are not the provider's read the
tables back (a Delta table: deltalake's own reader, pyarrow; an Iceberg table of the SQL catalog
under the location: pyiceberg, checked against polars).

In both formats: the snapshot, c/u/d/replace and a multi-document transaction; nothing applied twice
(each commit continues exactly where the previous one ended; a run with nothing new commits
nothing); a gap re-snapshot, and a completed incremental snapshot, remove the rows deleted while the
history was lost; soft deletes, and the MongoDB CDC page's reading of the table; declared columns
and the values that do not fit them; bad input as one error in words before any table changes.
Delta only: delta-rs's vacuum retention, and delta-rs's storage errors without the storage options'
secrets (Iceberg tables through a REST catalog, the page and maintenance:
tests/integration/test_iceberg_tables.py)."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from bson import Decimal128, ObjectId
from confluent_kafka import Producer
from deltalake import DeltaTable, write_deltalake
from deltalake.transaction import RemoveAction
from pymongo import MongoClient

from airflow_provider_mongocdc.core.apply.settings import DeltaSettings, TableSettings
from airflow_provider_mongocdc.core.apply.state import TableState, vacuumed_app_id
from airflow_provider_mongocdc.core.base.errors import EventFormatError, TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.record import Reading
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.plugins.health_tables import read_tables
from airflow_provider_mongocdc.tables.delta import DeltaTableStore
from tests.integration.delta_helpers import (
    FORMATS,
    apply,
    apply_commits,
    arrow_rows,
    connector,
    iceberg_table,
    mongo_documents,
    snapshot,
    table_documents,
    table_rows,
    table_version,
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


@pytest.mark.parametrize("table_format", FORMATS)
def test_tables_equal_mongodb_after_a_snapshot_changes_and_a_transaction(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
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
        "format": table_format,
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
    version = table_version(orders_table)

    third = apply(kafka, props, delta)  # nothing new: nothing committed
    assert third["commits"] == 0 and table_version(orders_table) == version
    commits = assert_chained(orders_table)
    assert sum(commit["mongocdc.events"] for commit in commits) == 120 + 9  # two tombstones among the 9


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_gap_resnapshot_removes_the_rows_deleted_while_the_history_was_lost(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(60)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "format": table_format}
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


@pytest.mark.parametrize("table_format", FORMATS)
def test_soft_deletes_mark_rows_and_keep_their_last_document(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": n} for n in range(10)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "format": table_format, "soft_delete": True}
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

    # The MongoDB CDC page's reading of the tables: each table's version (Delta's, counted from 0;
    # the sequence number of the Iceberg table's current snapshot, from 1), nothing behind.
    shown = {"status": "ok", "problems": []}
    reading = Reading(
        read_tables(TableSettings.from_mapping(delta), ConnectorConfig.from_properties(props), kafka),
        datetime.now(timezone.utc),
    )
    add_tables(shown, delta["location"], reading, datetime.now(timezone.utc))
    (row,) = shown["tables"]["tables"]
    assert (row["collection"], row["behind"]) == (f"{database}.items", 0), row
    assert row["version"] == table_version(table), row
    if table_format == "delta":
        assert row["version"] == 1, row  # the two applies' commits: versions 0 and 1
    else:  # their snapshots (sequence numbers from 1), and the maintenance's (a vacuum's record...)
        assert row["version"] >= 2, row
    assert shown["status"] == "ok"


def foreign_table(lake, database: str, table_format: str):
    """A table of ``<database>.items`` at ``lake`` written by something else (not the apply), where
    the apply would write its own: a Delta table at ``<lake>/<database>/items``, or an Iceberg table
    of the SQL catalog the apply uses under the location. Returns a reading of its state that the
    apply must leave as it is."""
    rows = pa.table({"id": [1]})
    if table_format == "delta":
        path = str(lake / database / "items")
        write_deltalake(path, rows, description="the sales team's table")
        return lambda: DeltaTable(path).version()
    from pyiceberg.catalog import load_catalog

    lake.mkdir()
    settings = TableSettings.from_mapping({"format": "iceberg", "location": str(lake)})
    catalog = load_catalog("mongocdc", **settings.default_catalog())
    catalog.create_namespace(database)
    table = catalog.create_table(
        (database, "items"), rows.schema, properties={"comment": "the sales team's table"}
    )
    table.append(rows)

    def state():
        table = iceberg_table(lake / database / "items")
        return table.metadata_location, table.current_snapshot().snapshot_id

    return state


def table_exists(path, table_format: str) -> bool:
    """Whether the table of ``<location>/<database>/<collection>`` exists (Iceberg: in the SQL
    catalog under the location)."""
    if table_format == "delta":
        return path.exists()
    if not (path.parent.parent / "catalog.db").exists():
        return False
    from pyiceberg.catalog import load_catalog

    location = path.parent.parent
    settings = TableSettings.from_mapping({"format": "iceberg", "location": str(location)})
    return load_catalog("mongocdc", **settings.default_catalog()).table_exists((path.parent.name, path.name))


@pytest.mark.parametrize("table_format", FORMATS)
def test_bad_input_is_one_error_in_words_before_any_table_changes(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
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
        apply(kafka, props, {"location": str(blocker / "lake"), "format": table_format})

    # A table written by something else where the apply would write its own.
    lake = tmp_path / "lake"
    before = foreign_table(lake, database, table_format)
    state = before()
    with pytest.raises(TableError) as raised:
        apply(kafka, props, {"location": str(lake), "format": table_format})
    text = str(raised.value)
    uri = lake / database / "items" if table_format == "delta" else f"iceberg://mongocdc/{database}/items"
    assert f"The table at {uri} was not written by the apply" in text and "the sales team's table" in text, (
        text
    )
    assert before() == state

    # A topic of the connector that holds something else: no table of the run changes.
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(f"{unique_name}.{database}.avro", key=b"\x00\x01", value=b"\x00\x00\x00\x00\x01avro")
    producer.flush(30)
    other = tmp_path / "other"
    with pytest.raises(EventFormatError) as raised:
        apply(kafka, props, {"location": str(other), "format": table_format})
    assert f"topic '{unique_name}.{database}.avro'" in str(raised.value)
    assert not table_exists(other / database / "items", table_format)


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_newly_declared_column_is_added_and_filled_from_the_documents(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many(
        [{"_id": n, "price": n * 2, "tag": f"t{n}"} for n in range(8)]
    )
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    lake = {"location": str(tmp_path / "lake"), "format": table_format}
    apply(kafka, props, lake)
    table = tmp_path / "lake" / database / "items"
    assert "price" not in arrow_rows(table).schema.names

    declared = {**lake, "columns": {f"{database}.items": {"price": "long", "tag": "string"}}}
    summary = apply(kafka, props, declared)  # nothing new on the topic: the columns still come

    assert summary["events"] == 0
    assert {"price", "tag"} <= set(arrow_rows(table).schema.names)
    rows = {row["_id"]: row for row in table_rows(table)}
    assert rows["3"]["price"] == 6 and rows["7"]["tag"] == "t7"
    with pytest.raises(TableError, match="is long, but it is declared string"):
        apply(kafka, props, {**lake, "columns": {f"{database}.items": {"price": "string"}}})


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_completed_incremental_snapshot_sweeps_the_rows_it_did_not_find(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(30)])
    props = connector(unique_name, database, **{"incremental.snapshot.chunk.size": 10})
    delta = {"location": str(tmp_path / "lake"), "format": table_format}
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


@pytest.mark.parametrize("table_format", FORMATS)
def test_soft_delete_switched_off_on_a_table_created_with_it_is_refused_in_words(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": n} for n in range(6)])
    props = connector(unique_name, database)
    soft = {"location": str(tmp_path / "lake"), "format": table_format, "soft_delete": True}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, soft)
    table = tmp_path / "lake" / database / "items"
    version = table_version(table)
    items.delete_one({"_id": 2})
    items.update_one({"_id": 3}, {"$set": {"v": 30}})
    items.insert_one({"_id": 100, "v": 100})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")

    # The table keeps deleted documents: applying it with hard deletes is refused before anything
    # changes, saying why and how to go on (not delta-rs's "rows failed validation").
    hard = {**soft, "soft_delete": False}
    with pytest.raises(TableError) as raised:
        apply(kafka, props, hard)
    text = str(raised.value)
    if table_format == "delta":
        assert f"The Delta table at {table} keeps deleted documents" in text, text
        assert "Fix: set soft_delete back to true, or apply to a new location" in text, text
    else:
        head = f"The Iceberg table {database}.items keeps deleted documents (its column _deleted)"
        assert head in text, text
        assert "Fix: set soft_delete back to true, or apply to another namespace" in text, text
    assert "created with soft_delete on" in text and "failed validation" not in text, text
    assert table_version(table) == version

    apply(kafka, props, soft)  # the table as created takes the changes
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")


def test_vacuum_never_removes_a_file_younger_than_the_retention(tmp_path):
    """The retention in hours rounded up, never down: with 90 minutes, a file removed from the table
    80 minutes ago stays and one removed 150 minutes ago goes (delta-rs's vacuum, no Kafka needed;
    Delta only: an Iceberg table's maintenance is tests/integration/test_iceberg_tables.py's)."""
    uri = str(tmp_path / "items")
    paths = []
    for n in range(3):
        write_deltalake(uri, pa.table({"n": [n]}), mode="append")
        added = {file["path"] for file in pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()}
        paths.append(next(path for path in added if path not in paths))
    now_ms = int(time.time() * 1000)
    removed = {paths[0]: now_ms - 80 * 60_000, paths[1]: now_ms - 150 * 60_000}
    table = DeltaTable(uri)
    sizes = {
        file["path"]: file["size_bytes"] for file in pa.table(table.get_add_actions(flatten=True)).to_pylist()
    }
    table.create_write_transaction(
        [RemoveAction(path, True, at, sizes[path], {}) for path, at in removed.items()],
        "append",
        table.schema(),
    )
    store = DeltaTableStore(uri)
    state = TableState("t", store.version())

    done = store.maintain(state, False, 90 * 60.0, now_ms // 1000)

    assert done == {"vacuumed": {"files_removed": 1}}, done
    assert (tmp_path / "items" / paths[0]).exists() and not (tmp_path / "items" / paths[1]).exists()
    assert DeltaTable(uri).transaction_version(vacuumed_app_id("t")) == now_ms // 1000


def test_storage_errors_show_no_signature_and_no_secret_of_the_storage_options(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path, monkeypatch
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many([{"_id": n} for n in range(3)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    # delta-rs reads the "%3D" of this local location as "=" and fails, its error naming the path:
    # a SAS signature and the value of a secret storage option inside it (matched by value).
    account_key = "Acc0untKey-of-the-lake"
    location = tmp_path / f"lake-{account_key}?sv=2024-11-04&se=2030-01-01&sp=rwl&sig=S1gnature%2Bx%3D"
    options = {"AZURE_STORAGE_ACCOUNT_KEY": account_key, "AZURE_STORAGE_ACCOUNT_NAME": "lake"}
    monkeypatch.setenv("AIRFLOW_CONN_LAKE_STORAGE", json.dumps({"conn_type": "generic", "extra": options}))
    delta = {"location": str(location), "conn_id": "lake_storage"}

    for doing in ("write", "read"):  # the first commit fails; the next run fails reading what it left
        with pytest.raises(TableError) as raised:
            apply(kafka, props, delta, storage_options=options)
        text = str(raised.value)
        assert f"Could not {doing} the Delta table at " in text and "DeltaError" in text, text
        assert "S1gnature" not in text and account_key not in text, text
        assert "lake-***?sv=2024-11-04&se=2030-01-01&sp=rwl&sig=***" in text, text

    # The MongoDB CDC page's row of the table: delta-rs's error, without them either.
    shown = {"status": "ok", "problems": []}
    reading = Reading(
        read_tables(DeltaSettings.from_mapping(delta), ConnectorConfig.from_properties(props), kafka),
        datetime.now(timezone.utc),
    )
    add_tables(shown, delta["location"], reading, datetime.now(timezone.utc))
    (row,) = shown["tables"]["tables"]
    assert row["error"] and "File not found" in row["error"], row
    assert "S1gnature" not in row["error"] and account_key not in row["error"], row
    assert not any("S1gnature" in problem or account_key in problem for problem in shown["problems"])


def _kafka_threads() -> int:
    """The librdkafka threads of this process (each open client has its own)."""
    import os

    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except OSError:  # the thread ended meanwhile
            continue
    return sum(name.startswith("rdk:") for name in names)


def test_an_apply_whose_commit_fails_closes_its_kafka_consumer(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path, monkeypatch
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many([{"_id": n} for n in range(5)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)

    def refused(self, *args, **kwargs):
        raise TableError("Another writer committed first", cause="a test", fix="run again")

    monkeypatch.setattr(DeltaTableStore, "commit", refused)
    before = _kafka_threads()
    with pytest.raises(TableError) as raised:  # the error (and its traceback) is kept, as a caller may
        # The first commit comes while the topic is still being read (a batch of 2 of 5 events).
        apply(kafka, props, {"location": str(tmp_path / "lake"), "max_batch_events": 2})
    deadline = time.monotonic() + 60
    while _kafka_threads() > before and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _kafka_threads() <= before, f"a Kafka client of the failed apply is still open ({raised.value})"
