"""Event building: capture modes, operations, tombstones, filters, output options, limits."""

from __future__ import annotations

import datetime
import json
import logging

import pytest
from bson import Int64, ObjectId, Timestamp, json_util

from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OversizeEventError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder, is_invalidate
from airflow_provider_mongocdc.core.events.schema import Record

pytestmark = pytest.mark.unit

NOW_MS = 1_700_000_123_456
OID = ObjectId("596e275826f08b2730779e1f")
NS = {"db": "inventory", "coll": "customers"}
BEFORE = {"_id": OID, "name": "Anne", "email": "anne@example.org", "phone": "555"}
AFTER = {"_id": OID, "name": "Anne Marie", "email": "anne@example.org"}


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})
    return EventBuilder(config, replica_set="rs0", clock=lambda: NOW_MS)


def change(operation: str, **extra) -> dict:
    base = {
        "_id": {"_data": "82650000000000000001"},
        "operationType": operation,
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": datetime.datetime(2023, 11, 14, 22, 13, 20, 42000),
        "ns": NS,
        "documentKey": {"_id": OID},
    }
    base.update(extra)
    return base


def update(**extra) -> dict:
    return change(
        "update",
        updateDescription={
            "updatedFields": {"name": "Anne Marie"},
            "removedFields": ["phone"],
            "truncatedArrays": [],
        },
        fullDocument=AFTER,
        fullDocumentBeforeChange=BEFORE,
        **extra,
    )


def payload(record: Record) -> dict:
    return json.loads(record.value)["payload"]


def doc(text: str | None):
    return None if text is None else json_util.loads(text)


@pytest.mark.parametrize(
    ("mode", "has_before", "has_after"),
    [
        ("change_streams", False, False),
        ("change_streams_update_full", False, True),
        ("change_streams_with_pre_image", True, False),
        ("change_streams_update_full_with_pre_image", True, True),
    ],
)
def test_capture_modes_decide_before_and_after_of_updates(mode, has_before, has_after):
    [event] = builder(**{"capture.mode": mode}).build_change(update())
    p = payload(event)
    assert p["op"] == "u"
    assert doc(p["before"]) == (BEFORE if has_before else None)
    assert doc(p["after"]) == (AFTER if has_after else None)
    assert doc(p["updateDescription"]["updatedFields"]) == {"name": "Anne Marie"}
    assert p["updateDescription"]["removedFields"] == ["phone"]
    assert p["updateDescription"]["truncatedArrays"] is None


def test_update_whose_lookup_found_nothing_has_null_after():
    event = update()
    event["fullDocument"] = None  # updateLookup after the document was deleted
    [record] = builder().build_change(event)
    assert payload(record)["after"] is None


def test_truncated_arrays_use_debezium_field_names():
    event = change(
        "update",
        updateDescription={
            "updatedFields": {},
            "removedFields": [],
            "truncatedArrays": [{"field": "vacation_time", "newSize": 36}],
        },
    )
    [record] = builder(**{"capture.mode": "change_streams"}).build_change(event)
    assert payload(record)["updateDescription"] == {
        "removedFields": None,
        "updatedFields": "{}",
        "truncatedArrays": [{"field": "vacation_time", "size": 36}],
    }


def test_replace_is_an_update_with_the_replacement_as_after():
    for mode in ("change_streams", "change_streams_update_full"):
        [record] = builder(**{"capture.mode": mode}).build_change(change("replace", fullDocument=AFTER))
        p = payload(record)
        assert p["op"] == "u"
        assert doc(p["after"]) == AFTER
        assert p["updateDescription"] is None
        assert p["before"] is None


def test_insert_has_after_only():
    [record] = builder(**{"capture.mode": "change_streams_update_full_with_pre_image"}).build_change(
        change("insert", fullDocument=AFTER)
    )
    p = payload(record)
    assert p["op"] == "c" and doc(p["after"]) == AFTER
    assert p["before"] is None and p["updateDescription"] is None


def test_delete_with_pre_image_and_tombstone():
    event, tombstone = builder(**{"capture.mode": "change_streams_with_pre_image"}).build_change(
        change("delete", fullDocumentBeforeChange=BEFORE)
    )
    p = payload(event)
    assert p["op"] == "d" and doc(p["before"]) == BEFORE and p["after"] is None
    assert tombstone == Record(event.topic, event.key, None, event.headers)


def test_delete_without_tombstone():
    records = builder(**{"tombstones.on.delete": "false"}).build_change(change("delete"))
    assert len(records) == 1 and records[0].value is not None


def test_source_block_of_a_streamed_event():
    lsid = {
        "id": json_util.loads('{"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"}'),
        "uid": json_util.loads('{"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", "$type": "00"}'),
    }
    [record] = builder().build_change(update(lsid=lsid, txnNumber=Int64(1)))
    source = payload(record)["source"]
    assert source["name"] == "fulfillment" and source["connector"] == "mongodb"
    # Debezium 3.x: the change's wallTime (SourceInfo.timestamp()), no rs
    assert source["ts_ms"] == 1_700_000_000_042
    assert source["ts_us"] == 1_700_000_000_042_000
    assert source["ts_ns"] == 1_700_000_000_042_000_000
    assert source["ord"] == 7
    assert source["snapshot"] == "false"
    assert (source["db"], source["collection"]) == ("inventory", "customers") and "rs" not in source
    assert source["wallTime"] == 1_700_000_000_042
    assert source["txnNumber"] == 1
    assert json.loads(source["lsid"]) == {
        "id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==", "$type": "04"},
        "uid": {"$binary": "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=", "$type": "00"},
    }
    assert payload(record)["ts_ms"] == NOW_MS


def test_replica_set_can_be_given_per_call():
    oplog = builder(**{"event.format": "oplog"})  # only Debezium 1.x's source has rs
    [record] = oplog.build_change(change("insert", fullDocument=AFTER), replica_set="shard02")
    assert payload(record)["source"]["rs"] == "shard02"


@pytest.mark.parametrize(
    "operation", ["drop", "rename", "dropDatabase", "invalidate", "create", "createIndexes"]
)
def test_collection_and_database_operations_produce_no_records(operation):
    event = {"_id": {"_data": "82"}, "operationType": operation, "clusterTime": Timestamp(1_700_000_000, 1)}
    if operation != "invalidate":
        event["ns"] = {"db": "inventory"} if operation == "dropDatabase" else NS
    if operation == "rename":
        event["to"] = {"db": "inventory", "coll": "people"}
    assert builder().build_change(event) == []
    assert is_invalidate(event) is (operation == "invalidate")


@pytest.mark.parametrize(
    ("skipped", "operation", "emitted"),
    [
        ("c", "insert", False),
        ("c", "update", True),
        ("u", "update", False),
        ("u", "replace", False),
        ("d", "delete", False),
        ("d", "insert", True),
        ("t", "delete", True),
        ("none", "delete", True),
    ],
)
def test_skipped_operations(skipped, operation, emitted):
    event = change(
        operation, fullDocument=AFTER, updateDescription={"updatedFields": {"a": 1}, "removedFields": []}
    )
    records = builder(**{"skipped.operations": skipped}).build_change(event)
    assert bool(records) is emitted


def test_changes_of_collections_not_captured_produce_no_records():
    b = builder(**{"collection.include.list": "inventory[.]orders"})
    assert b.build_change(change("insert", fullDocument=AFTER)) == []
    other = change("insert", fullDocument=AFTER, ns={"db": "inventory", "coll": "orders"})
    [record] = b.build_change(other)
    assert record.topic == "fulfillment.inventory.orders"
    system = change("insert", fullDocument=AFTER, ns={"db": "admin", "coll": "users"})
    assert builder().build_change(system) == []


def test_payload_only_output_when_schemas_are_disabled():
    b = builder(**{"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"})
    [record] = b.build_change(change("insert", fullDocument=AFTER))
    key, value = json.loads(record.key), json.loads(record.value)
    assert key == {"id": '{"$oid": "596e275826f08b2730779e1f"}'}
    assert "schema" not in value and value["op"] == "c"
    assert list(value) == ["before", "after", "updateDescription", "source", "op", "ts_ms", "transaction"]


def test_schema_names_are_adjusted_to_avro_and_topics_to_kafka_rules():
    event = change("insert", fullDocument=AFTER, ns={"db": "my-db", "coll": "orders 2024"})
    [record] = builder(**{"schema.name.adjustment.mode": "avro"}).build_change(event)
    assert record.topic == "fulfillment.my-db.orders_2024"
    assert json.loads(record.value)["schema"]["name"] == "fulfillment.my_db.orders_2024.Envelope"
    assert json.loads(record.key)["schema"]["name"] == "fulfillment.my_db.orders_2024.Key"
    assert payload(record)["source"]["collection"] == "orders 2024"  # real name kept in source
    # Schema names derive from the (Kafka-legal) topic name, as in Debezium; none is the default.
    [plain] = builder().build_change(event)
    assert json.loads(plain.value)["schema"]["name"] == "fulfillment.my-db.orders_2024.Envelope"


def test_unicode_text_is_utf8_not_escaped_twice():
    document = {"_id": OID, "city": "Zürich", "emoji": "\U0001f600", "quote": 'say "hi" \\o/'}
    [record] = builder().build_change(change("insert", fullDocument=document))
    assert "Zürich".encode() in record.value
    assert doc(payload(record)["after"]) == document


def test_snapshot_read_events():
    b = builder()
    position = Timestamp(1_699_999_000, 3)
    [first] = b.build_snapshot(AFTER, "inventory", "customers", position=position)
    [last] = b.build_snapshot(BEFORE, "inventory", "customers", last=True, position=position)
    p = payload(first)
    assert p["op"] == "r" and doc(p["after"]) == AFTER and p["before"] is None
    assert p["source"]["snapshot"] == "true"
    # source.ts_ms: the instant of the read (the builder's clock); ord -1, Debezium's
    # SourceInfo.Position.getInc() of its snapshot offset, which has no cluster time
    assert p["source"]["ts_ms"] == NOW_MS and p["source"]["ord"] == -1
    assert payload(last)["source"]["snapshot"] == "last"
    assert first.topic == "fulfillment.inventory.customers"
    assert json.loads(first.key)["payload"]["id"] == '{"$oid": "596e275826f08b2730779e1f"}'


def test_snapshot_read_in_oplog_format():
    [record] = builder(**{"event.format": "oplog"}).build_snapshot(
        AFTER, "inventory", "customers", last=True, position=Timestamp(5, 1)
    )
    p = payload(record)
    assert p["op"] == "r" and p["source"]["snapshot"] is True
    assert doc(p["after"]) == AFTER and p["patch"] is None and p["filter"] is None


def test_oplog_format_update_patch_and_replace():
    b = builder(**{"event.format": "oplog"})
    [record] = b.build_change(update())
    p = payload(record)
    assert doc(p["patch"]) == {"$set": {"name": "Anne Marie"}, "$unset": {"phone": True}}
    assert doc(p["filter"]) == {"_id": OID}
    assert p["after"] is None
    [record] = b.build_change(change("replace", fullDocument=AFTER))
    assert doc(payload(record)["patch"]) == AFTER


def test_missing_document_key_is_a_clear_error():
    event = change("insert", fullDocument=AFTER)
    del event["documentKey"]
    with pytest.raises(MongoCdcError, match="documentKey._id"):
        builder().build_change(event)


def test_oversize_event_fails_by_default_naming_topic_and_key():
    big = {"_id": 42, "blob": "x" * 5000}
    with pytest.raises(OversizeEventError) as info:
        builder(**{"event.max.bytes": 4096}).build_change(
            change("insert", documentKey={"_id": 42}, fullDocument=big)
        )
    text = str(info.value)
    assert "fulfillment.inventory.customers" in text and "42" in text
    assert "event.max.bytes=4096" in text and "Fix:" in text


def test_oversize_event_can_be_skipped_and_logged(caplog):
    big = {"_id": 42, "blob": "x" * 5000}
    b = builder(**{"event.max.bytes": 4096, "event.oversize.handling.mode": "skip"})
    with caplog.at_level(logging.WARNING):
        records = b.build_change(change("delete", documentKey={"_id": 42}, fullDocumentBeforeChange=big))
        assert len(records) == 2  # a delete without pre-image is small
        assert b.build_change(change("insert", documentKey={"_id": 42}, fullDocument=big)) == []
    assert "Skipped a" in caplog.text and "fulfillment.inventory.customers" in caplog.text


def test_heartbeat_through_the_builder():
    record = builder(**{"heartbeat.interval.ms": 1000}).build_heartbeat()
    assert record.topic == "__debezium-heartbeat.fulfillment"
    assert json.loads(record.value)["payload"] == {"ts_ms": NOW_MS}


def test_records_are_immutable_tuples_with_sizes():
    [record] = builder().build_change(change("insert", fullDocument=AFTER))
    assert isinstance(record.key, bytes) and isinstance(record.value, bytes)
    assert record.size == len(record.key) + len(record.value)
    assert [name for name, _ in record.headers] == [
        "__debezium.context.connectorLogicalName",
        "__debezium.context.taskId",
        "__debezium.context.connectorName",
        "__debezium.context.runId",
    ]
    with pytest.raises(AttributeError):
        record.topic = "other"  # type: ignore[misc]


def test_builder_and_config_travel_to_spark_workers_by_pickle():
    import pickle

    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": "fulfillment",
            "provide.transaction.metadata": "true",
            "collection.include.list": "inventory[.].*",
            "field.exclude.list": "*.*.phone",
        }
    )
    copy = pickle.loads(pickle.dumps(EventBuilder(config, replica_set="rs0")))
    [record] = copy.build_change(change("insert", fullDocument=BEFORE))
    assert "phone" not in doc(payload(record)["after"])
    assert pickle.loads(pickle.dumps(config)) == config
