"""field.exclude.list, field.renames and field name adjustment in event values."""

from __future__ import annotations

import json

import pytest
from bson import Timestamp, json_util

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder

pytestmark = pytest.mark.unit

DOCUMENT = {
    "_id": 1,
    "name": "Anne",
    "ssn": "123-45-6789",
    "address": {"street": "Main", "geo": {"lat": 1.0, "lon": 2.0}},
    "orders": [{"sku": "a", "secret": 1}, {"sku": "b", "secret": 2}, "not a document"],
    "nested_arrays": [[{"secret": 3}]],
}


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "p", **props})
    return EventBuilder(config, clock=lambda: 0)


def event(**extra) -> dict:
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(1, 1),
        "ns": {"db": "inventory", "coll": "customers"},
        "documentKey": {"_id": 1},
        "fullDocument": DOCUMENT,
    }
    change.update(extra)
    return change


def payload_of(records) -> dict:
    return json.loads(records[0].value)["payload"]


def after(records):
    return json_util.loads(payload_of(records)["after"])


def inserted_after(**props) -> dict:
    """The ``after`` document of the insert ``event()`` built with connector properties ``props``."""
    return after(builder(**props).build_change(event()))


def test_excluded_fields_vanish_from_after_at_any_depth_and_inside_arrays():
    result = inserted_after(
        **{
            "field.exclude.list": "inventory.customers.ssn,"
            "inventory.customers.address.geo.lat,"
            "inventory.customers.orders.secret"
        }
    )
    assert "ssn" not in result
    assert result["address"] == {"street": "Main", "geo": {"lon": 2.0}}
    assert result["orders"] == [{"sku": "a"}, {"sku": "b"}, "not a document"]
    assert result["nested_arrays"] == [[{"secret": 3}]]  # arrays of arrays are not entered
    assert DOCUMENT["ssn"] == "123-45-6789"  # the input document is not modified


def test_wildcards_and_case_insensitive_namespaces():
    b = builder(**{"field.exclude.list": "*.CUST*.ssn"})
    assert "ssn" not in after(b.build_change(event()))
    other = event(ns={"db": "inventory", "coll": "orders"})
    assert "ssn" in after(b.build_change(other))


def test_renames_apply_in_order_and_keep_field_position():
    result = inserted_after(
        **{
            "field.renames": "inventory.customers.name:full_name,"
            "inventory.customers.full_name:display_name,"
            "inventory.customers.address.street:line1"
        }
    )
    assert list(result)[:2] == ["_id", "display_name"]
    assert result["display_name"] == "Anne"
    assert result["address"]["line1"] == "Main"


def test_rename_onto_an_existing_field_is_an_error_naming_the_rule():
    b = builder(**{"field.renames": "inventory.customers.name:ssn"})
    with pytest.raises(ConfigError, match="inventory.customers.name:ssn"):
        b.build_change(event())


def test_rules_apply_to_update_descriptions():
    update = event(
        operationType="update",
        fullDocument=DOCUMENT,
        fullDocumentBeforeChange=DOCUMENT,
        updateDescription={
            "updatedFields": {
                "ssn": "x",
                "address.geo.lat": 5.0,
                "address": {"street": "Side", "geo": {"lat": 6.0, "lon": 7.0}},
                "orders.1.secret": 9,
                "orders.1.sku": "c",
                "name": "Bea",
            },
            "removedFields": ["ssn", "address.geo.lat", "phone", "orders.0.secret"],
            "truncatedArrays": [{"field": "orders", "newSize": 1}],
        },
    )
    b = builder(
        **{
            "capture.mode": "change_streams_update_full_with_pre_image",
            "field.exclude.list": "inventory.customers.ssn,"
            "inventory.customers.address.geo.lat,"
            "inventory.customers.orders.secret",
            "field.renames": "inventory.customers.orders:purchases,inventory.customers.name:full_name",
        }
    )
    p = payload_of(b.build_change(update))
    updated = json_util.loads(p["updateDescription"]["updatedFields"])
    assert updated == {
        "address": {"street": "Side", "geo": {"lon": 7.0}},
        "purchases.1.sku": "c",
        "full_name": "Bea",
    }
    assert p["updateDescription"]["removedFields"] == ["phone"]
    assert p["updateDescription"]["truncatedArrays"] == [{"field": "purchases", "size": 1}]
    for side in ("before", "after"):
        document = json_util.loads(p[side])
        assert "ssn" not in document and "purchases" in document and "orders" not in document
        assert document["full_name"] == "Anne"


def test_rules_apply_to_patch_and_filter_of_the_oplog_format():
    update = event(
        operationType="update",
        documentKey={"_id": 1, "ssn": "shard-key"},
        updateDescription={"updatedFields": {"ssn": "x", "name": "Bea"}, "removedFields": ["address"]},
    )
    b = builder(
        **{
            "event.format": "oplog",
            "field.exclude.list": "inventory.customers.ssn",
            "field.renames": "inventory.customers.address:home",
        }
    )
    p = payload_of(b.build_change(update))
    assert json_util.loads(p["patch"]) == {"$set": {"name": "Bea"}, "$unset": {"home": True}}
    assert json_util.loads(p["filter"]) == {"_id": 1}


def test_rules_apply_to_snapshot_reads():
    b = builder(**{"field.exclude.list": "inventory.customers.ssn"})
    [record] = b.build_snapshot(DOCUMENT, "inventory", "customers")
    assert "ssn" not in json_util.loads(json.loads(record.value)["payload"]["after"])


def test_keys_are_not_affected_by_field_rules():
    b = builder(**{"field.renames": "inventory.customers._id:id"})
    [record] = b.build_change(event())
    assert json.loads(record.key)["payload"]["id"] == "1"


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        # An invalid first character is replaced, not prefixed, as Debezium's adjuster does.
        ("avro", {"_id": 1, "a_b": 1, "_dollar": {"_": 2, "x_y": [{"_st": True}]}}),
        (
            "avro_unicode",
            {"_u005fid": 1, "a_u002eb": 1, "_u0024dollar": {"_u0030": 2, "x_u002dy": [{"_u0031st": True}]}},
        ),
    ],
)
def test_field_name_adjustment(mode, expected):
    document = {"_id": 1, "a.b": 1, "$dollar": {"0": 2, "x-y": [{"1st": True}]}}
    b = builder(**{"field.name.adjustment.mode": mode})
    assert after(b.build_change(event(fullDocument=document))) == expected


def test_sanitize_field_names_adjusts_update_paths_but_not_array_indexes():
    update = event(
        operationType="update",
        fullDocument=None,
        updateDescription={"updatedFields": {"a-b.0.c d": 1}, "removedFields": ["x-y"]},
    )
    b = builder(**{"sanitize.field.names": "true", "capture.mode": "change_streams"})
    description = payload_of(b.build_change(update))["updateDescription"]
    assert json_util.loads(description["updatedFields"]) == {"a_b.0.c_d": 1}
    assert description["removedFields"] == ["x_y"]
