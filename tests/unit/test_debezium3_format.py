"""Events as Debezium 3.x's MongoDB connector writes them, byte for byte, and the settings that
restore the earlier output.

The expected texts follow Debezium 3.x's code (debezium-connector-mongodb): ``JsonSerialization``
(keys with ``SIMPLE_JSON_SETTINGS``: relaxed, compact; documents with ``COMPACT_JSON_SETTINGS``:
strict, compact), ``MongoDbCollectionSchema`` (``updatedFields`` with ``BsonDocument.toJson()``:
relaxed, the driver's default layout), ``SourceInfo``/``MongoDbSourceInfoStructMaker`` (``ts_ms``
from ``wallTime``, no ``rs``, ``wallTime`` null for snapshot reads, whose times are the instant of
the read), ``MongoDbSchema`` and
``SchemaFactory`` (schemas), ``TransactionMonitor``/``TransactionContext`` (END records) and the
MongoDB Java driver's ``JsonWriter`` (``Double.toString``, string escaping, relaxed dates).
"""

from __future__ import annotations

import datetime
import json
import time
import uuid

import pytest
from bson import Binary, Int64, ObjectId, Timestamp

from airflow_provider_mongocdc import __version__
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from tests.topic_records import ENVELOPE_FIELDS

pytestmark = pytest.mark.unit

NOW_MS = 1_700_000_123_456
OID = ObjectId("596e275826f08b2730779e1f")
WALL = datetime.datetime(2023, 11, 14, 22, 13, 20, 42000)  # 1_700_000_000_042 ms
UUID4 = uuid.UUID("6f2a1c3e-8d4b-4f6a-9c2e-1b7d5e3a9f10")


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})
    return EventBuilder(config, replica_set="rs0", clock=lambda: NOW_MS)


def insert(document: dict, **extra) -> dict:
    change = {
        "_id": {"_data": "82650000000000000001"},
        "operationType": "insert",
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": WALL,
        "ns": {"db": "inventory", "coll": "customers"},
        "documentKey": {"_id": document["_id"]},
        "fullDocument": document,
    }
    change.update(extra)
    return change


def payload(record) -> dict:
    return json.loads(record.value)["payload"]


def key_id(record) -> str:
    return json.loads(record.key)["payload"]["id"]


# -- keys ----------------------------------------------------------------------------------------
KEYS = [
    (Int64(1234), "1234", '{"$numberLong": "1234"}'),
    (1234, "1234", "1234"),
    (12.5, "12.5", "12.5"),
    (1e-7, "1.0E-7", "1.0E-7"),
    ("1234", '"1234"', '"1234"'),
    (OID, '{"$oid": "596e275826f08b2730779e1f"}', '{"$oid": "596e275826f08b2730779e1f"}'),
    (
        b"kafka",
        '{"$binary": {"base64": "a2Fma2E=","subType": "00"}}',
        '{"$binary": "a2Fma2E=","$type": "00"}',
    ),
    (
        Binary(UUID4.bytes, 4),
        '{"$binary": {"base64": "byocPo1LT2qcLht9XjqfEA==","subType": "04"}}',
        '{"$binary": "byocPo1LT2qcLht9XjqfEA==","$type": "04"}',
    ),
    (
        datetime.datetime(2023, 11, 14, 22, 13, 20),
        '{"$date": "2023-11-14T22:13:20Z"}',
        '{"$date": 1700000000000}',
    ),
    (
        datetime.datetime(2023, 11, 14, 22, 13, 20, 100000),
        '{"$date": "2023-11-14T22:13:20.1Z"}',
        '{"$date": 1700000000100}',
    ),
    ({"a": Int64(1), "b": "x"}, '{"a": 1,"b": "x"}', '{"a": {"$numberLong": "1"},"b": "x"}'),
]


@pytest.mark.parametrize(("document_id", "relaxed", "strict"), KEYS)
def test_keys_are_relaxed_extended_json_by_default(document_id, relaxed, strict):
    document = {"_id": document_id, "name": "x"}
    [event] = builder().build_change(insert(document))
    assert key_id(event) == relaxed
    [snapshot] = builder().build_snapshot(document, "inventory", "customers", position=Timestamp(1, 1))
    assert key_id(snapshot) == relaxed


@pytest.mark.parametrize(("document_id", "relaxed", "strict"), KEYS)
def test_key_json_mode_strict_restores_strict_keys(document_id, relaxed, strict):
    [event] = builder(**{"key.json.mode": "strict"}).build_change(insert({"_id": document_id}))
    assert key_id(event) == strict


def test_oplog_format_keeps_debezium_1x_strict_keys():
    [event] = builder(**{"event.format": "oplog"}).build_change(insert({"_id": Int64(7)}))
    assert key_id(event) == '{"$numberLong": "7"}'


# -- documents -------------------------------------------------------------------------------------
def test_after_is_written_as_the_java_driver_writes_strict_json():
    document = {
        "_id": OID,
        "small": 1e-7,
        "large": 1e22,
        "whole": 10.0,
        "thousandth": 0.001,
        "nan": float("nan"),
        "inf": float("-inf"),
        "count": Int64(5),
        "big": 2**40,
        "text": "e\u0301 \U0001f600 \u2028 caf\u00e9 \x7f",
        "list": [1, 2.5, {"a": None}],
    }
    [event] = builder().build_change(insert(document))
    assert payload(event)["after"] == (
        '{"_id": {"$oid": "596e275826f08b2730779e1f"},"small": 1.0E-7,"large": 1.0E22,'
        '"whole": 10.0,"thousandth": 0.001,"nan": NaN,"inf": -Infinity,'
        '"count": {"$numberLong": "5"},"big": {"$numberLong": "1099511627776"},'
        '"text": "e\\u0301 \\ud83d\\ude00 \\u2028 caf\u00e9 \\u007f","list": [1,2.5,{"a": null}]}'
    )


def test_updated_fields_are_bson_document_to_json_relaxed():
    change = insert({"_id": OID})
    change.update(
        operationType="update",
        updateDescription={
            "updatedFields": {
                "name": "Anne",
                "visits": Int64(7),
                "seen": datetime.datetime(2023, 11, 14, 22, 13, 20),
                "tags": ["a", "b"],
                "score": 1e-7,
            },
            "removedFields": [],
        },
    )
    [event] = builder(**{"capture.mode": "change_streams"}).build_change(change)
    assert payload(event)["updateDescription"]["updatedFields"] == (
        '{"name": "Anne", "visits": 7, "seen": {"$date": "2023-11-14T22:13:20Z"}, '
        '"tags": ["a", "b"], "score": 1.0E-7}'
    )


# -- source ----------------------------------------------------------------------------------------
def test_whole_insert_event_payload_is_debezium_3x_bytes():
    document = {"_id": OID, "n": Int64(5), "x": 1e-7}
    [event] = builder(**{"value.converter.schemas.enable": "false"}).build_change(insert(document))
    expected = (
        '{"before":null,"after":"{\\"_id\\": {\\"$oid\\": \\"596e275826f08b2730779e1f\\"},'
        '\\"n\\": {\\"$numberLong\\": \\"5\\"},\\"x\\": 1.0E-7}","updateDescription":null,'
        '"source":{"version":"' + __version__ + '","connector":"mongodb","name":"fulfillment",'
        '"ts_ms":1700000000042,"snapshot":"false","db":"inventory","sequence":null,'
        '"ts_us":1700000000042000,"ts_ns":1700000000042000000,"collection":"customers","ord":7,'
        '"lsid":null,"txnNumber":null,"wallTime":1700000000042},"op":"c","ts_ms":' + str(NOW_MS) + ","
        '"transaction":null}'
    )
    assert event.value.decode() == expected


def test_source_time_falls_back_to_the_cluster_time_without_wall_time():
    change = insert({"_id": OID})
    del change["wallTime"]
    source = payload(builder().build_change(change)[0])["source"]
    assert (source["ts_ms"], source["ts_us"], source["ts_ns"]) == (
        1_700_000_000_000,
        1_700_000_000_000_000,
        1_700_000_000_000_000_000,
    )
    assert source["wallTime"] is None


def test_source_has_no_rs_and_its_schema_is_version_1_with_every_snapshot_value():
    [event] = builder().build_change(insert({"_id": OID}))
    value = json.loads(event.value)
    assert "rs" not in value["payload"]["source"]
    [source_schema] = [f for f in value["schema"]["fields"] if f["field"] == "source"]
    assert source_schema["name"] == "io.debezium.connector.mongo.Source"
    assert source_schema["version"] == 1
    assert [f["field"] for f in source_schema["fields"]] == [
        "version",
        "connector",
        "name",
        "ts_ms",
        "snapshot",
        "db",
        "sequence",
        "ts_us",
        "ts_ns",
        "collection",
        "ord",
        "lsid",
        "txnNumber",
        "wallTime",
    ]
    [snapshot] = [f for f in source_schema["fields"] if f["field"] == "snapshot"]
    assert snapshot["parameters"]["allowed"] == (
        "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
    )
    assert [f["field"] for f in value["schema"]["fields"]] == ENVELOPE_FIELDS


def test_oplog_format_keeps_rs_and_cluster_time():
    [event] = builder(**{"event.format": "oplog"}).build_change(insert({"_id": OID}))
    source = payload(event)["source"]
    assert source["rs"] == "rs0" and source["ts_ms"] == 1_700_000_000_000


def test_snapshot_read_source_times_are_the_instant_of_the_read():
    # Debezium 3.x: the snapshot's offset holds the stream's resume token without a cluster time
    # (MongoDbSnapshotChangeEventSource.initSnapshotStartOffsets, SourceInfo.noEvent), so
    # SourceInfo.timestamp() is null and AbstractSourceInfoStructMaker stamps ts_ms/ts_us/ts_ns
    # with Instant.now(), to the nanosecond on Java 17.
    config = ConnectorConfig.from_properties({"topic.prefix": "fulfillment"})
    before = time.time_ns()
    [event] = EventBuilder(config).build_snapshot(
        {"_id": OID}, "inventory", "customers", position=Timestamp(1_699_999_000, 3)
    )
    after = time.time_ns()
    source = payload(event)["source"]
    assert before <= source["ts_ns"] <= after, (before, source["ts_ns"], after)
    assert source["ts_us"] == source["ts_ns"] // 1000
    assert source["ts_ms"] == source["ts_ns"] // 1_000_000
    # ord: SourceInfo.Position.getInc() of that offset's position without a cluster time.
    assert (source["ord"], source["wallTime"]) == (-1, None)


def test_snapshot_read_source_times_keep_their_nanoseconds():
    config = ConnectorConfig.from_properties(
        {"topic.prefix": "fulfillment", "value.converter.schemas.enable": "false"}
    )
    events = EventBuilder(config, clock=lambda: NOW_MS, clock_ns=lambda: 1_700_000_123_456_789_012)
    [event] = events.build_snapshot(
        {"_id": OID}, "inventory", "customers", last=True, position=Timestamp(9, 3)
    )
    assert (
        '"source":{"version":"' + __version__ + '","connector":"mongodb","name":"fulfillment",'
        '"ts_ms":1700000123456,"snapshot":"last","db":"inventory","sequence":null,'
        '"ts_us":1700000123456789,"ts_ns":1700000123456789012,"collection":"customers","ord":-1,'
        '"lsid":null,"txnNumber":null,"wallTime":null},"op":"r","ts_ms":' + str(NOW_MS) + ","
    ) in event.value.decode()


def test_incremental_snapshot_reads_carry_the_stream_position_time():
    # MongoDbIncrementalSnapshotChangeEventSource.sendEvent: readEvent keeps the streaming
    # offset's position, whose cluster time SourceInfo.timestamp() gives in whole seconds.
    [event] = builder().build_snapshot(
        {"_id": OID}, "inventory", "customers", position=Timestamp(1_699_999_000, 3), incremental=True
    )
    source = payload(event)["source"]
    assert (source["ts_ms"], source["ts_us"], source["ts_ns"], source["ord"]) == (
        1_699_999_000_000,
        1_699_999_000_000_000,
        1_699_999_000_000_000_000,
        3,
    )
    assert source["snapshot"] == "incremental" and payload(event)["ts_ms"] == NOW_MS


def test_oplog_format_snapshot_reads_carry_the_start_position_time():
    [event] = builder(**{"event.format": "oplog"}).build_snapshot(
        {"_id": OID}, "inventory", "customers", position=Timestamp(1_699_999_000, 3)
    )
    assert payload(event)["source"]["ts_ms"] == 1_699_999_000_000
    assert payload(event)["source"]["ord"] == 3  # Debezium 1.x: the recorded position's


def test_lsid_and_txn_number_only_together():
    [event] = builder().build_change(insert({"_id": OID}, txnNumber=Int64(3)))
    source = payload(event)["source"]
    assert (source["lsid"], source["txnNumber"]) == (None, None)


# -- schema names ----------------------------------------------------------------------------------
def test_schema_names_are_not_adjusted_by_default_and_avro_on_request():
    config = {"topic.prefix": "my-shop"}
    [event] = builder(**config).build_change(insert({"_id": OID}))
    assert json.loads(event.value)["schema"]["name"] == "my-shop.inventory.customers.Envelope"
    assert json.loads(event.key)["schema"]["name"] == "my-shop.inventory.customers.Key"
    [event] = builder(**config, **{"schema.name.adjustment.mode": "avro"}).build_change(insert({"_id": OID}))
    assert json.loads(event.value)["schema"]["name"] == "my_shop.inventory.customers.Envelope"


# -- transactions ----------------------------------------------------------------------------------
SESSION = {"id": Binary(UUID4.bytes, 4), "uid": Binary(b"\xe3" * 32, 0)}


def test_end_carries_the_closing_event_time_and_hash_map_collection_order():
    b = builder(**{"provide.transaction.metadata": "true"})
    records = []
    for collection, wall in (("orders", WALL), ("customers", WALL), ("orders", WALL)):
        change = insert({"_id": ObjectId()}, lsid=SESSION, txnNumber=Int64(1), wallTime=wall)
        change["ns"] = {"db": "inventory", "coll": collection}
        records += b.build_change(change)
    closing = insert({"_id": ObjectId()}, wallTime=WALL + datetime.timedelta(seconds=5))
    records += b.build_change(closing)
    values = [json.loads(r.value)["payload"] for r in records if r.topic == "fulfillment.transaction"]
    begin, end = values
    assert begin["status"] == "BEGIN" and begin["ts_ms"] == 1_700_000_000_042
    assert end["status"] == "END" and end["ts_ms"] == 1_700_000_005_042
    # java.util.HashMap iteration order of the two names (String.hashCode buckets), not insertion
    assert end["data_collections"] == [
        {"data_collection": "inventory.customers", "event_count": 1},
        {"data_collection": "inventory.orders", "event_count": 2},
    ]


# -- the Java writer in each mode ------------------------------------------------------------------
JAVA_DOCUMENT = {
    "i": 5,
    "l": Int64(-7),
    "d": 2.5,
    "e": 1e-7,
    "nan": float("nan"),
    "date": datetime.datetime(2023, 11, 14, 22, 13, 20, 120000),
    "old": datetime.datetime(1969, 12, 31, 23, 59, 59),
    "bin": Binary(b"kafka", 0x80),
    "ts": Timestamp(1, 2),
}
JAVA_EXPECTED = {
    "strict": '{"i": 5,"l": {"$numberLong": "-7"},"d": 2.5,"e": 1.0E-7,"nan": NaN,'
    '"date": {"$date": 1700000000120},"old": {"$date": -1000},'
    '"bin": {"$binary": "a2Fma2E=","$type": "80"},"ts": {"$timestamp": {"t": 1,"i": 2}}}',
    "relaxed": '{"i": 5,"l": -7,"d": 2.5,"e": 1.0E-7,"nan": {"$numberDouble": "NaN"},'
    '"date": {"$date": "2023-11-14T22:13:20.12Z"},"old": {"$date": {"$numberLong": "-1000"}},'
    '"bin": {"$binary": {"base64": "a2Fma2E=","subType": "80"}},"ts": {"$timestamp": {"t": 1,"i": 2}}}',
    "canonical": '{"i": {"$numberInt": "5"},"l": {"$numberLong": "-7"},"d": {"$numberDouble": "2.5"},'
    '"e": {"$numberDouble": "1.0E-7"},"nan": {"$numberDouble": "NaN"},'
    '"date": {"$date": {"$numberLong": "1700000000120"}},"old": {"$date": {"$numberLong": "-1000"}},'
    '"bin": {"$binary": {"base64": "a2Fma2E=","subType": "80"}},"ts": {"$timestamp": {"t": 1,"i": 2}}}',
}


@pytest.mark.parametrize("mode", sorted(JAVA_EXPECTED))
def test_after_in_each_extended_json_mode_is_the_java_drivers_text(mode):
    document = {"_id": "k", **JAVA_DOCUMENT}
    [event] = builder(**{"extended.json.mode": mode}).build_change(insert(document))
    assert payload(event)["after"] == '{"_id": "k",' + JAVA_EXPECTED[mode][1:]
