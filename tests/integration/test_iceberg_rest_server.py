"""The Iceberg REST catalog server of devtools/iceberg, used by pyiceberg's own REST client.

A real server (iceberg-core's CatalogHandlers over a JdbcCatalog on SQLite, the warehouse on the
local file system) with OAuth2 client credentials: namespaces and tables made, rows appended with
snapshot properties and read back, renamed, registered, dropped; two clients committing on one
base (the second refused until it refreshes); a multi-table transaction applied to both tables or
to none; a wrong credential and a request without a token refused.
"""

from __future__ import annotations

import json
import secrets

import pytest

pytest.importorskip("pyiceberg")
pa = pytest.importorskip("pyarrow")

from pyiceberg.catalog import load_catalog  # noqa: E402
from pyiceberg.exceptions import (  # noqa: E402
    CommitFailedException,
    NoSuchTableError,
    OAuthError,
)

from devtools.iceberg import IcebergRestCatalog  # noqa: E402

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([pa.field("_id", pa.string(), nullable=False), pa.field("n", pa.int64())])


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    credential = f"mongocdc-tests:{secrets.token_urlsafe(16)}"
    with IcebergRestCatalog(tmp_path_factory.mktemp("warehouse"), credential) as catalog:
        yield catalog


def client(server, name="rest", **overrides):
    return load_catalog(name, **{**server.catalog_properties(), **overrides})


def rows(*pairs):
    return pa.Table.from_pylist([{"_id": key, "n": n} for key, n in pairs], schema=SCHEMA)


def test_namespace_and_table_round_trip(server):
    catalog = client(server)
    catalog.create_namespace("sales", {"owner": "mongocdc"})
    assert ("sales",) in catalog.list_namespaces()
    assert catalog.load_namespace_properties("sales")["owner"] == "mongocdc"
    catalog.update_namespace_properties("sales", removals={"owner"}, updates={"source": "orders"})
    properties = catalog.load_namespace_properties("sales")
    assert properties["source"] == "orders" and "owner" not in properties

    table = catalog.create_table("sales.orders", schema=SCHEMA)
    assert catalog.list_tables("sales") == [("sales", "orders")]
    table.append(rows(("a", 1), ("b", 2)), snapshot_properties={"mongocdc.position": "1700000000:1"})
    table.append(rows(("c", 3)), snapshot_properties={"mongocdc.position": "1700000000:2"})

    # Another client sees the two commits: the rows, and the properties of each snapshot.
    reader = client(server, name="reader").load_table("sales.orders")
    assert sorted(reader.scan().to_arrow().to_pylist(), key=lambda row: row["_id"]) == [
        {"_id": "a", "n": 1},
        {"_id": "b", "n": 2},
        {"_id": "c", "n": 3},
    ]
    positions = [snapshot.summary["mongocdc.position"] for snapshot in reader.snapshots()]
    assert positions == ["1700000000:1", "1700000000:2"]
    assert reader.current_snapshot().summary["mongocdc.position"] == "1700000000:2"
    # The server wrote the table's metadata in the warehouse directory, pyiceberg its data files.
    table_dir = server.warehouse_dir / "sales" / "orders"
    assert list((table_dir / "metadata").glob("*.metadata.json"))
    assert list((table_dir / "data").glob("*.parquet"))


def test_polars_reads_the_table(server, monkeypatch):
    pl = pytest.importorskip("polars")
    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # pyiceberg plans the scan
    catalog = client(server)
    catalog.create_namespace("polars_read")
    table = catalog.create_table("polars_read.items", schema=SCHEMA)
    table.append(rows(("x", 10), ("y", 20)), snapshot_properties={"mongocdc.position": "7:1"})
    frame = pl.scan_iceberg(catalog.load_table("polars_read.items")).sort("_id").collect()
    assert frame.to_dicts() == [{"_id": "x", "n": 10}, {"_id": "y", "n": 20}]


def test_second_commit_on_one_base_is_refused_until_refreshed(server):
    catalog = client(server)
    catalog.create_namespace("conflict")
    # pyiceberg retries a refused commit on its own by default: off here, to see the refusal.
    catalog.create_table("conflict.events", schema=SCHEMA, properties={"commit.retry.num-retries": "0"})
    first = client(server, name="first").load_table("conflict.events")
    second = client(server, name="second").load_table("conflict.events")

    first.append(rows(("one", 1)), snapshot_properties={"mongocdc.position": "1"})
    with pytest.raises(CommitFailedException):
        second.append(rows(("two", 2)), snapshot_properties={"mongocdc.position": "2"})
    # The refused commit left nothing behind: one snapshot, the first client's row.
    snapshots = catalog.load_table("conflict.events").snapshots()
    assert [snapshot.summary["mongocdc.position"] for snapshot in snapshots] == ["1"]

    second.refresh()
    second.append(rows(("two", 2)), snapshot_properties={"mongocdc.position": "2"})
    table = catalog.load_table("conflict.events")
    assert sorted(row["_id"] for row in table.scan().to_arrow().to_pylist()) == ["one", "two"]
    assert [snapshot.summary["mongocdc.position"] for snapshot in table.snapshots()] == ["1", "2"]


def test_rename_register_and_drop(server):
    catalog = client(server)
    catalog.create_namespace("moves")
    table = catalog.create_table("moves.before", schema=SCHEMA)
    table.append(rows(("k", 1)))
    catalog.rename_table("moves.before", "moves.after")
    assert not catalog.table_exists("moves.before")
    assert catalog.table_exists("moves.after")
    metadata_location = catalog.load_table("moves.after").metadata_location

    catalog.drop_table("moves.after")
    with pytest.raises(NoSuchTableError):
        catalog.load_table("moves.after")
    registered = catalog.register_table("moves.registered", metadata_location)
    assert registered.scan().to_arrow().to_pylist() == [{"_id": "k", "n": 1}]

    catalog.drop_table("moves.registered")
    catalog.drop_namespace("moves")
    assert ("moves",) not in catalog.list_namespaces()


def transaction(*changes):
    """A CommitTransactionRequest of (table name, table uuid, properties to set)."""
    return json.dumps(
        {
            "table-changes": [
                {
                    "identifier": {"namespace": ["txn"], "name": name},
                    "requirements": [{"type": "assert-table-uuid", "uuid": uuid}],
                    "updates": [{"action": "set-properties", "updates": updates}],
                }
                for name, uuid, updates in changes
            ]
        }
    ).encode()


def test_multi_table_transaction_commits_all_tables_or_none(server):
    catalog = client(server)
    catalog.create_namespace("txn")
    left = catalog.create_table("txn.left", schema=SCHEMA)
    right = catalog.create_table("txn.right", schema=SCHEMA)
    headers = {"Authorization": f"Bearer {server.token()}", "Content-Type": "application/json"}

    status, _ = server.request(
        "POST",
        "/v1/transactions/commit",
        data=transaction(
            ("left", str(left.metadata.table_uuid), {"mongocdc.batch": "1"}),
            ("right", str(right.metadata.table_uuid), {"mongocdc.batch": "1"}),
        ),
        headers=headers,
    )
    assert status == 204
    assert catalog.load_table("txn.left").properties["mongocdc.batch"] == "1"
    assert catalog.load_table("txn.right").properties["mongocdc.batch"] == "1"

    # A requirement that fails on the second table: the first table is not changed either.
    status, body = server.request(
        "POST",
        "/v1/transactions/commit",
        data=transaction(
            ("left", str(left.metadata.table_uuid), {"mongocdc.batch": "2"}),
            ("right", "00000000-0000-0000-0000-000000000000", {"mongocdc.batch": "2"}),
        ),
        headers=headers,
    )
    assert status == 409
    assert body["error"]["type"] == "CommitFailedException"
    assert catalog.load_table("txn.left").properties["mongocdc.batch"] == "1"
    assert catalog.load_table("txn.right").properties["mongocdc.batch"] == "1"


def test_wrong_credential_and_missing_token_are_refused(server):
    client_id = server.credential.partition(":")[0]
    with pytest.raises(OAuthError, match="invalid_client"):
        client(server, name="intruder", credential=f"{client_id}:not-the-secret")

    status, body = server.request("GET", "/v1/namespaces")
    assert status == 401
    assert body["error"]["type"] == "NotAuthorizedException"
    status, body = server.request("GET", "/v1/namespaces", headers={"Authorization": "Bearer made-up"})
    assert status == 401
    assert "not valid" in body["error"]["message"]
