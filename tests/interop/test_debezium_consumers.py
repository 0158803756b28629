"""Events built by core/events/builder.py read by the consumer code of a Debezium pipeline: Kafka
Connect's JsonConverter (schemas.enable=true) and Debezium's ExtractNewDocumentState SMT, from
their own jars (devtools/interop), plus the MongoDB connector's own JsonSerialization for the
texts it would write for the same BSON document.

For every BSON type as a field value and as ``_id``: each record converts with JsonConverter and
back to the same JSON; ``after`` and the key's ``id`` are byte for byte the texts Debezium writes
(getDocumentValue, getDocumentId), ``updatedFields`` is ``BsonDocument.toJson()``; the SMT's
flattened record equals the one it makes of a record carrying Debezium's own texts and, where
:func:`support.connect_payload` says, the document itself. Deletes and tombstones under each
``delete.tombstone.handling.mode``, transaction BEGIN/END records and heartbeats too.
"""

from __future__ import annotations

import datetime
import json
import re
import uuid

import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from tests.interop.support import REFUSED, as_read, connect_payload, with_debezium_texts

pytestmark = pytest.mark.interop

NOW_MS = 1_700_000_123_456
DB, COLL = "inventory", "things"
OID = ObjectId("596e275826f08b2730779e1f")
UUID4 = uuid.UUID("6f2a1c3e-8d4b-4f6a-9c2e-1b7d5e3a9f10")
UUID3 = uuid.uuid3(uuid.NAMESPACE_DNS, "example.org")

FIELD_VALUES = {
    "double": 12.34,
    "double_whole": 10.0,
    "double_small": 1e-07,
    "double_large": 1e22,
    "double_max": 1.7976931348623157e308,
    "double_min_subnormal": 5e-324,
    "double_negative_zero": -0.0,
    "double_nan": float("nan"),
    "double_inf": float("inf"),
    "double_negative_inf": float("-inf"),
    "int32": 2_147_483_647,
    "int32_min": -2_147_483_648,
    "int64": Int64(9_223_372_036_854_775_807),
    "int64_min": Int64(-9_223_372_036_854_775_808),
    "int64_small": Int64(5),
    "decimal": Decimal128("1234567890.123456789012345678901234"),
    "decimal_trailing_zero": Decimal128("1.10"),
    "decimal_negative_zero": Decimal128("-0.000"),
    "decimal_exponent": Decimal128("1E+6144"),
    "decimal_tiny": Decimal128("1E-6176"),
    "decimal_nan": Decimal128("NaN"),
    "decimal_inf": Decimal128("-Infinity"),
    "string": "plain",
    "string_empty": "",
    "string_astral": "emoji \U0001f600 clef \U0001d11e",
    "string_control": "nul \x00 soh \x01 us \x1f del \x7f tab \t newline \n cr \r",
    "string_escapes": 'quote " backslash \\ slash / </script>',
    "string_unicode": "Ünïcødé \u2028 \u2029 \ufeff \u00a0 日本語",
    "objectid": OID,
    "true": True,
    "false": False,
    "null": None,
    "datetime": datetime.datetime(2024, 2, 29, 23, 59, 59, 999000),
    "datetime_epoch": datetime.datetime(1970, 1, 1),
    "datetime_pre_1970": datetime.datetime(1960, 6, 15, 8, 30),
    "datetime_year_1": datetime.datetime(1, 1, 1),
    "datetime_year_9999": datetime.datetime(9999, 12, 31, 23, 59, 59, 999000),
    "datetime_beyond_9999": DatetimeMS(253_402_300_801_000),
    "datetime_before_year_1": DatetimeMS(-62_135_596_800_001),
    "datetime_far": DatetimeMS(2**62),
    "regex": Regex("^a.*b$", "imsx"),
    "regex_flags_lu": Regex("caf\u00e9", "lu"),
    "regex_compiled": re.compile("b.c", re.I | re.M),
    "code": Code("function () { return 1; }"),
    "code_with_scope": Code("function () { return x; }", {"x": Int64(1), "y": "z"}),
    "timestamp": Timestamp(1_700_000_000, 7),
    "timestamp_max": Timestamp(2**32 - 1, 2**32 - 1),
    "binary_generic": Binary(b"\x00\x01\xfe\xff", 0),
    "binary_empty": Binary(b"", 0),
    "binary_function": Binary(b"fn", 1),
    "binary_old": Binary(b"old binary", 2),
    "binary_uuid_legacy": Binary(UUID3.bytes, 3),
    "binary_uuid": Binary(UUID4.bytes, 4),
    "uuid_object": UUID4,
    "binary_md5": Binary(bytes(range(16)), 5),
    "binary_encrypted": Binary(b"\x01encrypted", 6),
    "binary_column": Binary(b"\x01column", 7),
    "binary_sensitive": Binary(b"sensitive", 8),
    "binary_vector": Binary(b"\x03\x00\x01\x02", 9),
    "binary_user_defined": Binary(b"user", 0x80),
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "dbref": DBRef("orders", OID),
    "dbref_database": DBRef("orders", 5, "shop"),
    "document_empty": {},
    "document_nested": {"a": {"b": {"c": "deep", "d": Int64(2), "e": {"f": Decimal128("1.5")}}}, "g": {}},
    "array_empty": [],
    "array_strings": ["a", "b", ""],
    "array_int32": [1, 2, 3],
    "array_int64": [Int64(1), Int64(-2)],
    "array_doubles": [1.5, -0.0, 1e300],
    "array_objectids": [OID, ObjectId("000000000000000000000000")],
    "array_documents": [{"x": 1, "y": "a"}, {"x": 2, "y": "b"}],
    "array_nested_documents": [{"x": {"y": [1, 2]}}],
    "array_dates": [datetime.datetime(2024, 1, 1), DatetimeMS(253_402_300_801_000)],
    "array_timestamps": [Timestamp(1, 2)],
    "array_arrays": [[1, 2], [3]],
    "array_mixed": [1, "two", 3.0, Int64(4), None, OID, {"x": 1}, [1], MinKey(), MaxKey()],
}

ID_VALUES = {
    "int32": 1234,
    "int64": Int64(1234),
    "int64_large": Int64(2**53 + 1),
    "double": 12.34,
    "double_whole": 3.0,
    "decimal": Decimal128("12.340"),
    "string": "1234",
    "string_quotes": 'a "quoted" \\ id',
    "string_unicode": "日本 \U0001f600",
    "objectid": OID,
    "true": True,
    "null": None,
    "datetime": datetime.datetime(2024, 2, 29, 12, 0, 0, 1000),
    "datetime_beyond_9999": DatetimeMS(253_402_300_801_000),
    "datetime_before_year_1": DatetimeMS(-62_135_596_800_001),
    "timestamp": Timestamp(1_700_000_000, 7),
    "binary_generic": Binary(b"kafka", 0),
    "binary_uuid": Binary(UUID4.bytes, 4),
    "binary_uuid_legacy": Binary(UUID3.bytes, 3),
    "uuid_object": UUID4,
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "code": Code("x"),
    "document": {"a": 1, "b": "two"},
    "document_nested": {"a": {"b": [1, 2]}, "c": Int64(3)},
    "document_empty": {},
}


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "shop", **props})
    return EventBuilder(config, replica_set="rs0", clock=lambda: NOW_MS)


def change(operation: str, document_id, **extra) -> dict:
    base = {
        "_id": {"_data": "82650000000000000001"},
        "operationType": operation,
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": datetime.datetime(2023, 11, 14, 22, 13, 20, 42000),
        "ns": {"db": DB, "coll": COLL},
        "documentKey": {"_id": document_id},
    }
    base.update(extra)
    return base


def data_records(document: dict, updated: dict | None = None) -> dict:
    """The events of every operation that carries the document as ``after``."""
    events = builder()
    document_id = document["_id"]
    records = {
        "read": events.build_snapshot(document, DB, COLL, last=True, position=Timestamp(1_700_000_000, 1))
    }
    records["insert"] = events.build_change(change("insert", document_id, fullDocument=document))
    records["update"] = events.build_change(
        change(
            "update",
            document_id,
            fullDocument=document,
            updateDescription={
                "updatedFields": updated or {},
                "removedFields": ["gone"],
                "truncatedArrays": [],
            },
        )
    )
    records["replace"] = events.build_change(change("replace", document_id, fullDocument=document))
    for name, built in records.items():
        assert len(built) == 1, (name, built)
    return {name: built[0] for name, built in records.items()}


def check_round_trip(answer: dict, record) -> None:
    """JsonConverter read the record and wrote it back as the same JSON."""
    assert answer["ok"], answer
    assert answer["key"] == json.loads(record.key)
    assert answer["value"] == (json.loads(record.value) if record.value is not None else None)


def check_document(harness, document: dict, raw: bytes, smt: dict) -> dict:
    """Every event carrying ``document``: ``after`` and the key's ``id`` are Debezium's bytes, the
    records convert with JsonConverter, and the SMT makes of them what it makes of the same
    records carrying Debezium's own texts (the same record, or the same error where Debezium's
    converter refuses the document whatever wrote it). Returns the SMT answers by operation
    (None where the SMT refuses the document)."""
    texts = harness.document(raw)
    assert texts["ok"], texts
    results = {}
    for operation, record in data_records(document).items():
        payload = json.loads(record.value)["payload"]
        assert payload["after"] == texts["value"], f"{operation}: after differs from getDocumentValue"
        assert json.loads(record.key)["payload"]["id"] == texts["key"], f"{operation}: key differs"
        value, key = with_debezium_texts(record.value, record.key, texts)
        reference = harness.record(record.topic, key, value, smt)
        ours = harness.record(record.topic, record.key, record.value, smt)
        if reference["ok"]:
            check_round_trip(ours, record)
            assert ours["smt"] == reference["smt"], operation
            results[operation] = ours["smt"]
        else:
            assert reference["stage"] == "ExtractNewDocumentState.apply", reference
            assert not ours["ok"] and ours["error"] == reference["error"], (operation, ours, reference)
            assert ours["stage"] == reference["stage"], ours
            check_round_trip(harness.record(record.topic, record.key, record.value), record)
            results[operation] = None
    return results


def field_names() -> list:
    return sorted(FIELD_VALUES)


@pytest.mark.parametrize("name", field_names())
def test_every_bson_type_as_a_field_value(harness, name):
    raw, document = as_read({"_id": 1, "v": FIELD_VALUES[name], "nested": {"w": FIELD_VALUES[name]}})
    expected = connect_payload(document)
    for encoding in ("array", "document"):
        results = check_document(harness, document, raw, {"array.encoding": encoding})
        if expected == REFUSED:
            assert set(results.values()) == {None}, results
        elif encoding == "array" and expected is not None:
            for operation, result in results.items():
                assert result is not None, f"{operation}: the SMT refused a document it converts"
                assert result["value"]["payload"] == expected, operation


def test_arrays_debezium_refuses_with_array_encoding_array_convert_with_document_encoding(harness):
    raw, document = as_read({"_id": 1, "mixed": [1, "two", OID], "docs": [{"a": 1}, {"a": "x"}]})
    refused = check_document(harness, document, raw, {"array.encoding": "array"})
    assert set(refused.values()) == {None}
    results = check_document(harness, document, raw, {"array.encoding": "document"})
    payload = results["insert"]["value"]["payload"]
    assert payload["mixed"] == {"_0": 1, "_1": "two", "_2": str(OID)}
    assert payload["docs"] == {"_0": {"a": 1}, "_1": {"a": "x"}}


@pytest.mark.parametrize("name", field_names())
def test_updated_fields_are_the_java_drivers_to_json(harness, name):
    raw, updated = as_read({"v": FIELD_VALUES[name], "n": {"w": FIELD_VALUES[name]}})
    texts = harness.document(raw)
    assert texts["ok"], texts
    [record] = builder().build_change(
        change(
            "update",
            1,
            fullDocument={"_id": 1, **updated},
            updateDescription={"updatedFields": updated, "removedFields": [], "truncatedArrays": []},
        )
    )
    assert json.loads(record.value)["payload"]["updateDescription"]["updatedFields"] == texts["toJson"]
    check_round_trip(harness.record(record.topic, record.key, record.value), record)


@pytest.mark.parametrize("name", field_names())
@pytest.mark.parametrize("mode", ["relaxed", "canonical"])
def test_other_extended_json_modes_write_the_java_drivers_text(harness, mode, name):
    raw, document = as_read({"_id": 1, "v": FIELD_VALUES[name]})
    texts = harness.document(raw)
    [record] = builder(**{"extended.json.mode": mode}).build_snapshot(document, DB, COLL)
    assert json.loads(record.value)["payload"]["after"] == texts[mode]
    check_round_trip(harness.record(record.topic, record.key, record.value), record)


@pytest.mark.parametrize("name", sorted(ID_VALUES))
def test_every_bson_type_as_id(harness, name):
    raw, document = as_read({"_id": ID_VALUES[name], "v": 1})
    results = check_document(harness, document, raw, {})
    expected = connect_payload(document)
    for operation, result in results.items():
        if expected == REFUSED:
            assert result is None, operation
            continue
        assert result["value"]["payload"] == expected, operation
        assert result["key"]["payload"] == ({"id": expected["_id"]} if "_id" in expected else {}), operation


DELETE_MODES = {
    # mode: (delete event's value payload or "tombstone"/"dropped", tombstone's fate)
    "tombstone": ("tombstone", "dropped"),
    "drop": ("dropped", "dropped"),
    "rewrite": ({"__deleted": True}, "dropped"),
    "rewrite-with-tombstone": ({"__deleted": True}, "tombstone"),
}


@pytest.mark.parametrize("mode", sorted(DELETE_MODES))
@pytest.mark.parametrize(
    "id_name", ["objectid", "int64", "string_quotes", "document", "datetime_beyond_9999"]
)
def test_deletes_and_tombstones_under_each_delete_handling_mode(harness, mode, id_name):
    raw, document = as_read({"_id": ID_VALUES[id_name]})
    texts = harness.document(raw)
    records = builder().build_change(change("delete", document["_id"]))
    assert [record.value is None for record in records] == [False, True]
    expected_key = {"id": connect_payload(document)["_id"]}
    outcomes = []
    for record in records:
        assert json.loads(record.key)["payload"]["id"] == texts["key"]
        answer = harness.record(
            record.topic, record.key, record.value, {"delete.tombstone.handling.mode": mode}
        )
        check_round_trip(answer, record)
        result = answer["smt"]
        if result["dropped"]:
            outcomes.append("dropped")
            continue
        assert result["key"]["payload"] == expected_key
        outcomes.append("tombstone" if result["value"] is None else result["value"]["payload"])
    assert tuple(outcomes) == DELETE_MODES[mode]


def test_transaction_records_and_heartbeats_convert_and_pass_the_smt_unchanged(harness):
    events = builder(**{"provide.transaction.metadata": "true"})
    session = {"lsid": {"id": Binary(UUID4.bytes, 4), "uid": Binary(b"\x01" * 32, 0)}, "txnNumber": Int64(7)}
    records = []
    for n in range(3):
        records += events.build_change(change("insert", n, fullDocument={"_id": n}, **session))
    records += events.finish()
    records.append(events.build_heartbeat())
    topics = [record.topic for record in records]
    assert topics.count("shop.transaction") == 2 and topics[-1] == "__debezium-heartbeat.shop", topics
    for record in records:
        answer = harness.record(record.topic, record.key, record.value, {})
        check_round_trip(answer, record)
        if record.topic == f"shop.{DB}.{COLL}":
            assert answer["smt"]["value"]["payload"] == {"_id": int(json.loads(record.key)["payload"]["id"])}
            continue
        assert answer["smt"] == {
            "dropped": False,
            "topic": record.topic,
            "key": json.loads(record.key),
            "value": json.loads(record.value),
        }


def test_update_without_full_document_and_oplog_format_events_convert(harness):
    records = builder(**{"capture.mode": "change_streams"}).build_change(
        change(
            "update",
            OID,
            updateDescription={"updatedFields": {"a": 1}, "removedFields": [], "truncatedArrays": []},
        )
    )
    records += builder(**{"event.format": "oplog"}).build_change(
        change(
            "update",
            OID,
            updateDescription={"updatedFields": {"a": 1}, "removedFields": ["b"], "truncatedArrays": []},
        )
    )
    records += builder(**{"event.format": "oplog"}).build_change(change("delete", OID))
    for record in records:
        check_round_trip(harness.record(record.topic, record.key, record.value), record)
