"""Apache Iceberg tables through a real REST catalog server (devtools/iceberg: iceberg-core's
handlers over a JDBC catalog, OAuth2 client credentials) and the MongoDB CDC page's reading of
Iceberg tables; the real Kafka broker and MongoDB (the simulator, or MONGOCDC_TEST_MONGODB_URI).
The tables are read back by pyiceberg's own REST client and polars, compared with MongoDB."""

from __future__ import annotations

import os
from datetime import datetime, timezone

import pytest
from bson import Decimal128
from pymongo import MongoClient

from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.base.errors import TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.record import Reading
from airflow_provider_mongocdc.core.health.tables import add_tables
from tests.integration.delta_helpers import apply, connector, mongo_documents, snapshot, window

pytestmark = pytest.mark.integration
pytest.importorskip("pyiceberg")


@pytest.fixture(scope="module")
def rest_catalog(tmp_path_factory):
    from devtools.iceberg import IcebergRestCatalog

    with IcebergRestCatalog(
        tmp_path_factory.mktemp("warehouse"), credential="mongocdc:catalog-s3cret"
    ) as server:
        yield server


def _documents(table) -> dict:
    import polars
    from bson import json_util

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    rows = table.scan().to_arrow().to_pylist()
    by_polars = polars.scan_iceberg(table).collect()
    assert sorted(by_polars["_id"].to_list()) == sorted(row["_id"] for row in rows)
    return {json_util.loads(row["_id"]): json_util.loads(row["_doc"]) for row in rows}


def test_tables_in_a_rest_catalog_equal_mongodb_and_its_credential_never_shows(
    rest_catalog, mongodb_uri, kafka_bootstrap, unique_name
):
    from pyiceberg.catalog import load_catalog

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    orders = client[database].orders
    orders.insert_many([{"_id": n, "total": Decimal128(f"{n}.5"), "status": "open"} for n in range(50)])
    props = connector(unique_name, database)
    tables = {
        "format": "iceberg",
        "conn_id": "lake_catalog",
        "namespace_prefix": "cdc_",
        "columns": {f"{database}.orders": {"total": "double", "status": "string"}},
    }
    catalog = rest_catalog.catalog_properties()
    snapshot(mongodb_uri, kafka, props)
    first = apply(kafka, props, tables, storage_options=catalog)
    orders.delete_one({"_id": 3})
    orders.update_one({"_id": 4}, {"$set": {"status": "paid"}})
    with client.start_session() as session, session.start_transaction():
        orders.insert_one({"_id": 100, "total": Decimal128("1")}, session=session)
        orders.delete_one({"_id": 5}, session=session)
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    second = apply(kafka, props, tables, storage_options=catalog)

    reader = load_catalog("reader", **catalog)  # pyiceberg's own REST client, another session
    table = reader.load_table((f"cdc_{database}", "orders"))
    assert _documents(table) == mongo_documents(mongodb_uri, database, "orders")
    rows = {row["_id"]: row for row in table.scan().to_arrow().to_pylist()}
    assert rows["4"]["status"] == "paid" and rows["7"]["total"] == 7.5
    assert rows["100"]["_txn"] is not None
    (summary,) = second["tables"]
    assert summary["table"] == f"iceberg://lake_catalog/cdc_{database}/orders" and summary["behind"] == 0
    assert first["events"] == 50 and second["events"] >= 4
    assert "catalog-s3cret" not in str(first) + str(second)

    # A wrong credential: one error in words, without the secret, before any table changes.
    version = table.current_snapshot().sequence_number
    wrong = {**catalog, "credential": "mongocdc:wrong-s3cret"}
    with pytest.raises(TableError) as raised:
        apply(kafka, props, tables, storage_options=wrong)
    assert "Iceberg" in str(raised.value) and "wrong-s3cret" not in str(raised.value)
    table.refresh()
    assert table.current_snapshot().sequence_number == version


def test_the_page_reads_an_iceberg_tables_version_position_and_misfits(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    from airflow_provider_mongocdc.plugins.health_tables import read_tables

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many(
        [{"_id": n, "points": 2**40 if n < 3 else n} for n in range(10)]
    )
    props = connector(unique_name, database)
    tables = {
        "format": "iceberg",
        "location": str(tmp_path / "lake"),
        "columns": {f"{database}.items": {"points": "integer"}},
    }
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, tables)

    shown = {"status": "ok", "problems": []}
    reading = Reading(
        read_tables(TableSettings.from_mapping(tables), ConnectorConfig.from_properties(props), kafka),
        datetime.now(timezone.utc),
    )
    add_tables(shown, tables["location"], reading, datetime.now(timezone.utc))
    (row,) = shown["tables"]["tables"]
    assert (row["collection"], row["behind"]) == (f"{database}.items", 0) and row["version"] >= 1, row
    assert row["misfits_total"] == 3, row
    assert shown["status"] == "warning" and any("points" in problem for problem in shown["problems"]), shown


def test_an_iceberg_tables_maintenance_compacts_expires_and_removes_orphans(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    from tests.integration.delta_helpers import iceberg_table, table_documents

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(30)])
    props = connector(unique_name, database)
    lake = tmp_path / "lake"
    tables = {"format": "iceberg", "location": str(lake), "compact_every": None, "vacuum_every": None}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, tables)
    for round_ in range(3):  # small commits of keys outside the files' bounds: a file each
        items.insert_one({"_id": f"new{round_}", "v": round_})
        window(mongodb_uri, kafka, props, f"{unique_name}_markers")
        apply(kafka, props, tables)
    path = lake / database / "items"
    table = iceberg_table(path)
    assert len(list(table.scan().plan_files())) > 1
    # A file no snapshot uses, older than the retention: an orphan (a killed writer's, say).
    data_dir = table.location().removeprefix("file://") + "/data"
    orphan = os.path.join(data_dir, "orphan-00000.parquet")
    with open(orphan, "wb") as handle:
        handle.write(b"PAR1")
    old = datetime.now(timezone.utc).timestamp() - 3 * 3600
    os.utime(orphan, (old, old))

    summary = apply(
        kafka, props, {**tables, "compact_every": "0s", "vacuum_every": "0s", "vacuum_retention": "1h"}
    )

    (done,) = summary["tables"]
    maintenance = done["maintenance"]
    assert maintenance["compacted"]["files_removed"] > 1, maintenance
    assert maintenance["vacuumed"]["files_removed"] >= 1 and not os.path.exists(orphan), maintenance
    table = iceberg_table(path)
    assert len(list(table.scan().plan_files())) == 1
    assert table_documents(path) == mongo_documents(mongodb_uri, database, "items")
