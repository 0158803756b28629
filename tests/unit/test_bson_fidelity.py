"""BSON fidelity: ``before``/``after``/key strings parse back (``bson.json_util.loads``) to the
original values, for every BSON type a MongoDB document can hold."""

from __future__ import annotations

import datetime
import json
import math
import uuid

import pytest
from bson import (
    BSON,
    Binary,
    Code,
    DBRef,
    Decimal128,
    Int64,
    MaxKey,
    MinKey,
    ObjectId,
    Regex,
    Timestamp,
    json_util,
)
from bson.codec_options import CodecOptions

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.extended_json import Encoder, json_options

pytestmark = pytest.mark.unit

MODES = ("strict", "relaxed", "canonical", "legacy")


def _nested(depth: int):
    value: object = {"leaf": Int64(depth)}
    for level in range(depth):
        value = {"level": level, "child": value, "list": [[level, [value]]] if level < 3 else []}
    return value


def _as_pymongo_returns(document: dict) -> dict:
    """The document as a default pymongo client decodes it from BSON."""
    return BSON.encode(document).decode(CodecOptions())


ALL_TYPES = _as_pymongo_returns(
    {
        "_id": ObjectId("596e275826f08b2730779e1f"),
        "int32": 2_147_483_647,
        "int64": Int64(9_223_372_036_854_775_807),
        "negative_int64": Int64(-5),
        "double": 12.34,
        "whole_double": 10.0,
        "decimal": Decimal128("1234567890.123456789012345678901234"),
        "decimal_special": Decimal128("-Infinity"),
        "date": datetime.datetime(2024, 2, 29, 23, 59, 59, 999000),
        "date_before_epoch": datetime.datetime(1901, 12, 13, 20, 45, 52, 1000),
        "timestamp": Timestamp(1_700_000_000, 42),
        "binary_generic": Binary(b"\x00\x01\xff", 0),
        "binary_function": Binary(b"fn", 1),
        "binary_old": Binary(b"old", 2),
        "uuid_legacy": Binary(uuid.UUID("12345678-1234-5678-1234-567812345678").bytes, 3),
        "uuid": Binary(uuid.UUID("87654321-4321-8765-4321-876543218765").bytes, 4),
        "md5": Binary(b"0123456789abcdef", 5),
        "encrypted": Binary(b"\x01secret", 6),
        "column": Binary(b"\x00col", 7),
        "sensitive": Binary(b"sens", 8),
        "user_defined": Binary(b"user", 0x80),
        "regex": Regex("^ab.*c$", "imsx"),
        "min": MinKey(),
        "max": MaxKey(),
        "code": Code("function () { return 1; }"),
        "code_with_scope": Code("function () { return x; }", {"x": Int64(1), "y": [1, "two"]}),
        "dbref": DBRef("customers", ObjectId("596e275826f08b2730779e1f"), "inventory"),
        "null": None,
        "true": True,
        "false": False,
        "string": "plain ascii",
        "unicode": "Grüße, 東京, \U0001f600, \u2028 line separator",
        "escapes": 'quote " backslash \\ newline \n tab \t nul \x00',
        "empty_doc": {},
        "empty_list": [],
        "a.dotted.name": "MongoDB 5.0+ allows dots in field names",
        "$dollar": {"$leading": "and nested $ names"},
        "deep": _nested(40),
        "array_of_arrays": [[1, [2, [3, [4, [Int64(5)]]]]], [{"a": [{"b": Decimal128("1.5")}]}]],
    }
)


def _value_types(value):
    """Types of every leaf, to check that nothing was silently converted."""
    if isinstance(value, dict):
        return {key: _value_types(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_value_types(item) for item in value]
    return type(value).__name__


@pytest.mark.parametrize("mode", MODES)
def test_after_string_parses_back_to_the_original_document(mode):
    config = ConnectorConfig.from_properties({"topic.prefix": "fidelity", "extended.json.mode": mode})
    builder = EventBuilder(config, replica_set="rs0")
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(1, 1),
        "ns": {"db": "db", "coll": "c"},
        "documentKey": {"_id": ALL_TYPES["_id"]},
        "fullDocument": ALL_TYPES,
    }
    [record] = builder.build_change(change)
    after = json.loads(record.value)["payload"]["after"]
    parsed = Encoder(mode).loads(after)
    assert parsed == ALL_TYPES
    if mode in ("strict", "canonical"):
        assert _value_types(parsed) == _value_types(ALL_TYPES)
    else:
        # Relaxed and legacy JSON write 64-bit integers as plain numbers: same values, int type.
        assert isinstance(parsed["int64"], int) and parsed["int64"] == ALL_TYPES["int64"]


def test_strict_mode_is_plain_json_util_reading():
    """Consumers can read strict-mode events with json_util.loads and default options."""
    text = Encoder("strict").dumps(ALL_TYPES)
    parsed = json_util.loads(text, json_options=json_util.JSONOptions(tz_aware=False))
    assert parsed["int64"] == ALL_TYPES["int64"] and isinstance(parsed["int64"], Int64)
    assert parsed["decimal"] == ALL_TYPES["decimal"]
    assert parsed["date"] == ALL_TYPES["date"]
    assert parsed["regex"] == ALL_TYPES["regex"]
    assert parsed["code_with_scope"] == ALL_TYPES["code_with_scope"]


def test_strict_mode_writes_debezium_strict_forms():
    text = Encoder("strict").dumps(
        {
            "l": Int64(1004),
            "i": 7,
            "d": 10.0,
            "t": datetime.datetime(2019, 5, 27, 13, 58, 28),
            "b": Binary(b"kafka", 0),
            "o": ObjectId("596e275826f08b2730779e1f"),
        }
    )
    assert json.loads(text) == {
        "l": {"$numberLong": "1004"},
        "i": 7,
        "d": 10.0,
        "t": {"$date": 1558965508000},
        "b": {"$binary": "a2Fma2E=", "$type": "00"},
        "o": {"$oid": "596e275826f08b2730779e1f"},
    }


@pytest.mark.parametrize("mode", MODES)
def test_non_finite_doubles_stay_valid_json(mode):
    document = {"nan": float("nan"), "inf": float("inf"), "ninf": float("-inf"), "x": 1.5}
    text = Encoder(mode).dumps(document)
    json.loads(text)  # strict JSON: no bare NaN/Infinity
    parsed = Encoder(mode).loads(text)
    assert math.isnan(parsed["nan"])
    assert parsed["inf"] == math.inf and parsed["ninf"] == -math.inf and parsed["x"] == 1.5


@pytest.mark.parametrize("mode", MODES)
def test_keys_parse_back_to_the_id(mode):
    config = ConnectorConfig.from_properties({"topic.prefix": "fidelity", "extended.json.mode": mode})
    builder = EventBuilder(config)
    for document_id in (
        ALL_TYPES["_id"],
        Int64(5),
        7,
        "text",
        ALL_TYPES["uuid"],
        {"compound": Int64(1), "at": ALL_TYPES["date"]},
        Decimal128("1.10"),
    ):
        [record] = builder.build_snapshot({"_id": document_id}, "db", "c")
        key = json.loads(record.key)["payload"]["id"]
        assert Encoder(mode).loads(key) == document_id


def test_native_uuid_values_round_trip():
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    for mode in MODES:
        text = Encoder(mode).dumps({"u": value})
        parsed = json_util.loads(
            text,
            json_options=json_util.JSONOptions(uuid_representation=json_options(mode).uuid_representation),
        )
        assert parsed["u"] == value


def test_large_document_round_trips():
    document = {"_id": 1, "items": [{"n": i, "s": "x" * 100, "d": Decimal128(str(i))} for i in range(5000)]}
    text = Encoder("strict").dumps(document)
    assert Encoder("strict").loads(text) == document
