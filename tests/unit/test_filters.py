"""Include/exclude filters, the equivalent change stream $match stage, snapshot selection."""

from __future__ import annotations

import itertools

import mongomock
import pytest

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.filters import Filters

pytestmark = pytest.mark.unit

NAMESPACES = [
    ("inventory", "customers"),
    ("inventory", "orders"),
    ("Inventory", "Orders"),
    ("inventory", "orders_2024"),
    ("inventoryX", "orders"),
    ("shop", "orders"),
    ("shop", "customers.archive"),
    ("test", "x"),
    ("tes", "x"),
    ("my-db", "a b"),
    ("admin", "users"),
    ("local", "oplog.rs"),
    ("config", "chunks"),
    ("inventory", "system.views"),
]
OPERATIONS = ["insert", "update", "replace", "delete", "drop", "rename", "dropDatabase"]


def filters(**props) -> Filters:
    return Filters(ConnectorConfig.from_properties({"topic.prefix": "p", **props}))


def test_regex_lists_match_whole_names_case_insensitively():
    f = filters(**{"collection.include.list": "inventory[.]orders"})
    assert f.collection_included("inventory", "orders")
    assert f.collection_included("Inventory", "Orders")
    assert not f.collection_included("inventory", "orders_2024")  # anchored: no prefix match
    assert not f.collection_included("xinventory", "orders")
    f = filters(**{"database.include.list": "inv.*"})
    assert f.collection_included("inventory", "orders") and not f.collection_included("shop", "x")


def test_exclude_lists():
    f = filters(**{"database.exclude.list": "test", "collection.exclude.list": "shop[.].*"})
    assert not f.collection_included("test", "x")
    assert f.collection_included("tes", "x")
    assert not f.collection_included("shop", "orders")
    assert f.collection_included("inventory", "orders")


def test_built_in_databases_and_system_collections_are_never_captured():
    f = filters(**{"collection.include.list": ".*"})
    for database, collection in (
        ("admin", "users"),
        ("local", "oplog.rs"),
        ("config", "chunks"),
        ("inventory", "system.views"),
    ):
        assert not f.collection_included(database, collection)


def test_literal_match_mode():
    f = filters(
        **{"filters.match.mode": "literal", "collection.include.list": "inventory.orders, shop.items"}
    )
    assert f.collection_included("inventory", "orders")
    assert not f.collection_included("Inventory", "Orders")  # literal: exact names
    assert not f.collection_included("inventoryXorders", "")
    assert f.collection_included("shop", "items")


def test_capture_scope_limits_the_collections():
    f = filters(**{"capture.scope": "database", "capture.target": "inventory"})
    assert f.collection_included("inventory", "a") and not f.collection_included("shop", "a")
    f = filters(**{"capture.scope": "collection", "capture.target": "inventory.orders"})
    assert f.collection_included("inventory", "orders")
    assert not f.collection_included("inventory", "customers")


@pytest.mark.parametrize(
    "props",
    [
        {},
        {"collection.include.list": "inventory[.]orders.*,shop\\.customers\\..*"},
        {"collection.exclude.list": "inventory[.]orders"},
        {"database.include.list": "inv.*,my-db"},
        {"database.exclude.list": "te.t"},
        {"database.include.list": "inventory", "collection.exclude.list": ".*[.]orders_[0-9]{4}"},
        {"skipped.operations": "c,d"},
        {"filters.match.mode": "literal", "database.include.list": "inventory,shop"},
        {"filters.match.mode": "literal", "database.exclude.list": "inventory"},
        {"filters.match.mode": "literal", "collection.include.list": "inventory.orders,my-db.a b"},
        {"filters.match.mode": "literal", "collection.exclude.list": "inventory.orders"},
    ],
    ids=lambda props: ",".join(f"{k}={v}" for k, v in props.items()) or "defaults",
)
def test_server_side_match_selects_the_same_events_as_the_client_side_filter(props):
    """The $match stage, run by an independent MongoDB query engine (mongomock), keeps exactly
    the data events the connector captures (system namespaces aside: change streams never
    report them)."""
    f = filters(**props)
    events = [
        {"operationType": op, "ns": {"db": db, "coll": coll}, "n": n}
        for n, ((db, coll), op) in enumerate(itertools.product(NAMESPACES, OPERATIONS))
    ]
    collection = mongomock.MongoClient().db.events
    collection.insert_many([dict(event) for event in events])
    selected = {doc["n"] for doc in collection.aggregate(f.change_stream_pipeline())}
    operation_codes = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}
    for event in events:
        db, coll, op = event["ns"]["db"], event["ns"]["coll"], event["operationType"]
        if db in ("admin", "local", "config") or coll.startswith("system."):
            continue
        expected = (
            op in operation_codes
            and operation_codes[op] not in f.config.skipped_operations
            and f.collection_included(db, coll)
        )
        assert (event["n"] in selected) is expected, (db, coll, op)


def test_match_stage_shape():
    stage = filters(**{"collection.include.list": "inventory[.]orders"}).change_stream_match()
    conditions = stage["$match"]["$and"]
    assert conditions[0] == {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}
    regex_match = conditions[1]["$expr"]["$regexMatch"]
    assert regex_match["input"] == {"$concat": ["$ns.db", ".", "$ns.coll"]}
    assert regex_match["regex"] == "^(?:(?:inventory[.]orders))$"
    assert regex_match["options"] == "i"
    assert filters().change_stream_match() == {
        "$match": {"operationType": {"$in": ["insert", "update", "replace", "delete"]}}
    }


def test_change_stream_options_follow_capture_mode():
    assert filters().change_stream_options() == {"batch_size": 2048, "full_document": "updateLookup"}
    assert filters(**{"capture.mode": "change_streams"}).change_stream_options() == {"batch_size": 2048}
    assert filters(
        **{
            "capture.mode": "change_streams_update_full_with_pre_image",
            "capture.mode.full.update.type": "post_image",
            "cursor.max.await.time.ms": 500,
            "max.batch.size": 10,
        }
    ).change_stream_options() == {
        "batch_size": 10,
        "full_document": "whenAvailable",
        "full_document_before_change": "whenAvailable",
        "max_await_time_ms": 500,
    }


def test_snapshot_selection_and_filter_overrides():
    f = filters(
        **{
            "collection.include.list": "inventory[.].*",
            "snapshot.include.collection.list": "inventory[.]orders.*",
            "snapshot.collection.filter.overrides": "inventory.orders",
            "snapshot.collection.filter.overrides.inventory.orders": '{"status": "open", "created": {"$gte": {"$date": 1700000000000}}}',
        }
    )
    assert f.snapshot_included("inventory", "orders")
    assert not f.snapshot_included("inventory", "customers")  # captured, not snapshotted
    assert not f.snapshot_included("shop", "orders")  # not captured
    query = f.snapshot_filter("inventory", "orders")
    assert query["status"] == "open" and query["created"]["$gte"].year == 2023
    assert f.snapshot_filter("inventory", "orders_2") == {}
    assert not filters(**{"snapshot.mode": "no_data"}).snapshot_included("inventory", "orders")
