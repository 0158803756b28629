"""What Debezium's consumer code should make of a MongoDB document, records built around
Debezium's own texts of it, documents of many BSON types (:data:`IDS`, :func:`fields`), and the
side-by-side comparison of a record on our topics with the one Debezium's MongoDB connector sends
for the same document or change (:func:`assert_debeziums`).

:func:`connect_payload` is the payload ``ExtractNewDocumentState`` (array.encoding=array) gives a
document after Kafka Connect's JsonConverter wrote it, following Debezium's ``MongoDataConverter``:
ObjectId, Decimal128 and JavaScript as strings, dates and BSON timestamps as Connect Timestamps
(epoch milliseconds; a BSON timestamp's seconds, as a signed 32-bit int, times 1000), binary as base64 bytes, regular
expressions as {regex, options}, arrays of one type as lists. :data:`REFUSED` for documents the
3.6.1 SMT refuses whatever wrote them (a MinKey or MaxKey anywhere: "is not a valid field name";
code with scope: a ClassCastException). ``None`` where the model does not say (mixed arrays).
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import uuid
from typing import Any

import bson
from bson import Binary, Code, Decimal128, Int64, ObjectId, Regex, Timestamp, json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.json_util import JSONMode, JSONOptions

from airflow_provider_mongocdc import __version__
from devtools.kafka.reading import ReadRecord

UNKNOWN = object()
REFUSED = "refused by ExtractNewDocumentState"

ENCODE = CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
# What the connector's clients decode: default UUID representation, dates out of Python's range
# as DatetimeMS.
DECODE = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL, uuid_representation=UuidRepresentation.STANDARD)


def as_read(document: dict) -> tuple[bytes, dict]:
    """The BSON of ``document`` and the document as the connector's pymongo client reads it."""
    raw = bson.encode(document, codec_options=ENCODE)
    return raw, bson.decode(raw, codec_options=DECODE)


def canonical(document: Any) -> Any:
    return json.loads(json_util.dumps(document, json_options=CANONICAL))


_ARRAY_KINDS = {
    "string",
    "int32",
    "int64",
    "double",
    "boolean",
    "objectId",
    "decimal",
    "binary",
    "code",
    "date",
    "timestamp",
    "document",
    "array",
}


def _kind(value: Any) -> str:
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, list):
        return "array"
    if value is None:
        return "null"
    keys = set(value)
    for marker, kind in (
        ("$numberInt", "int32"),
        ("$numberLong", "int64"),
        ("$numberDouble", "double"),
        ("$oid", "objectId"),
        ("$numberDecimal", "decimal"),
        ("$binary", "binary"),
        ("$date", "date"),
        ("$timestamp", "timestamp"),
        ("$regularExpression", "regex"),
        ("$minKey", "minKey"),
        ("$maxKey", "maxKey"),
        ("$symbol", "symbol"),
        ("$undefined", "undefined"),
        ("$dbPointer", "dbPointer"),
    ):
        if marker in keys:
            return kind
    if "$code" in keys:
        return "codeWithScope" if "$scope" in keys else "code"
    return "document"


def _double(text: str) -> Any:
    # JsonConverter (Jackson) writes non-finite doubles as the strings "NaN", "Infinity", "-Infinity".
    number = float(text)
    return number if number == number and abs(number) != float("inf") else text


def _convert(value: Any) -> Any:
    kind = _kind(value)
    if kind in ("string", "boolean"):
        return value
    if kind == "null":
        return None
    if kind in ("int32", "int64"):
        return int(next(iter(value.values())))
    if kind == "double":
        return _double(value["$numberDouble"])
    if kind == "objectId":
        return value["$oid"]
    if kind == "decimal":
        return value["$numberDecimal"]
    if kind == "binary":
        return value["$binary"]["base64"]
    if kind == "date":
        return int(value["$date"]["$numberLong"])
    if kind == "timestamp":
        # BsonTimestamp.getTime() is a signed int: seconds past 2**31 - 1 come out negative.
        seconds = value["$timestamp"]["t"]
        return (seconds - 2**32 if seconds >= 2**31 else seconds) * 1000
    if kind == "regex":
        return {
            "regex": value["$regularExpression"]["pattern"],
            "options": value["$regularExpression"]["options"],
        }
    if kind == "code":
        return value["$code"]
    if kind in ("codeWithScope", "minKey", "maxKey"):
        return REFUSED
    if kind == "document":
        return _document(value)
    if kind == "array":
        kinds = {_kind(element) for element in value}
        if not value:
            return []
        if len(kinds) == 1 and kinds <= _ARRAY_KINDS:
            converted = [_convert(element) for element in value]
            for item in converted:
                if item is UNKNOWN or item is REFUSED:
                    return item
            return converted
        return UNKNOWN
    return UNKNOWN


def _document(document: dict) -> Any:
    out = {}
    for name, value in document.items():
        converted = _convert(value)
        if converted is UNKNOWN or converted is REFUSED:
            return converted
        out[name] = converted
    return out


def connect_payload(document: dict) -> dict | str | None:
    """The flattened record's payload for ``document``, :data:`REFUSED` or None (see the module
    docstring)."""
    converted = _document(canonical(document))
    return None if converted is UNKNOWN else converted


def with_debezium_texts(value: bytes, key: bytes, texts: dict[str, str]) -> tuple[bytes, bytes]:
    """The record with ``after`` and the key's ``id`` replaced by Debezium's own texts of the
    document (``JsonSerialization.getDocumentValue``/``getDocumentId``)."""
    envelope = json.loads(value)
    envelope["payload"]["after"] = texts["value"]
    key_envelope = json.loads(key)
    key_envelope["payload"]["id"] = texts["key"]
    return json.dumps(envelope).encode(), json.dumps(key_envelope).encode()


# -- documents of many BSON types -----------------------------------------------------------------
IDS = [
    7,
    Int64(2**40),
    'a "quoted" id',
    ObjectId("596e275826f08b2730779e1f"),
    Binary(uuid.UUID("6f2a1c3e-8d4b-4f6a-9c2e-1b7d5e3a9f10").bytes, 4),
    datetime.datetime(2024, 2, 29, 12, 0, 0, 1000),
    DatetimeMS(253_402_300_801_000),
    Decimal128("12.340"),
    {"region": "eu", "n": 1},
]


def fields(n: int) -> dict:
    return {
        "s": f'text {n} \u00e9\U0001f600 "q" \\ \n',
        "i": n,
        "l": Int64(2**40 + n),
        "d": 12.5 + n,
        "small": 1e-07,
        "dec": Decimal128("1.10"),
        "at": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=n),
        "far": DatetimeMS(253_402_300_801_000 + n),
        "before_year_1": DatetimeMS(-62_135_596_800_001),
        "bin": Binary(b"\x00\x01\xfe\xff", 0),
        "uuid": Binary(uuid.UUID(int=n).bytes, 4),
        "oid": ObjectId("000000000000000000000000"),
        "re": Regex("^a.*b$", "i"),
        "js": Code("function () { return 1; }"),
        "ts": Timestamp(1_700_000_000, n),
        "yes": True,
        "nothing": None,
        "nested": {"a": {"b": [1, 2, 3]}, "docs": [{"x": 1}, {"x": 2}], "empty": {}},
        "tags": ["a", "b"],
        "none": [],
    }


# -- side by side with Debezium's MongoDB connector ------------------------------------------------
DEBEZIUM_VERSION = "3.6.1.Final"
# DebeziumHeaderProducer's headers, in its order (the runId: a UUID version 7).
CONTEXT_HEADERS = [
    "__debezium.context.connectorLogicalName",
    "__debezium.context.taskId",
    "__debezium.context.connectorName",
    "__debezium.context.runId",
]
UUID7 = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")


def _instants(payload: dict[str, Any], read_instant: bool) -> list[int]:
    """Take the times that are when each connector built the record out of ``payload`` (the
    envelope's ``ts_ms``; a snapshot read's ``source`` times too), as nanoseconds."""
    built = [payload.pop("ts_ms") * 1_000_000]
    source = payload["source"]
    if read_instant:
        ts_ns = source.pop("ts_ns")
        assert (source.pop("ts_us"), source.pop("ts_ms")) == (ts_ns // 1000, ts_ns // 1_000_000), source
        built.append(ts_ns)
    return built


def assert_debeziums(ours: ReadRecord, theirs: dict[str, Any], built: tuple[int, int]) -> str | None:
    """Assert that ``ours`` is the record Debezium sends (``theirs``, from the harness's
    ``emit_read``/``emit_change``): the same topic, key, value and headers, but for

    - ``source.version``: this connector's version where Debezium's is its release;
    - the instants each connector built its record at (the envelope's ``ts_ms``, and a snapshot
      read's ``source.ts_ms``/``ts_us``/``ts_ns``): ours within ``built`` (epoch nanoseconds);
    - the ``__debezium.context.runId`` header: each run has its own (a UUID version 7).

    Returns our record's run id (None without headers)."""
    assert ours.topic == theirs["topic"]
    assert json.loads(ours.key) == theirs["key"]
    value = json.loads(ours.value) if ours.value is not None else None
    expected = theirs["value"]
    if value is None or expected is None:
        assert value == expected, (value, expected)
    else:
        payload, debezium = value["payload"], expected["payload"]
        read_instant = payload["op"] == "r" and payload["source"]["snapshot"] in ("true", "last")
        assert payload["source"].pop("version") == __version__
        assert debezium["source"].pop("version") == DEBEZIUM_VERSION
        low, high = built
        for instant in _instants(payload, read_instant):
            assert low // 1_000_000 * 1_000_000 <= instant <= high, (instant, built, value)
        _instants(debezium, read_instant)
        assert value == expected
    names = [name for name, _ in ours.headers]
    assert names == [name for name, _ in theirs["headers"]], (ours.headers, theirs["headers"])
    ours_by_name = {name: data for name, data in ours.headers}
    for name, data in theirs["headers"]:
        if name == "__debezium.context.runId":
            assert UUID7.match(ours_by_name[name].decode()), ours_by_name[name]
            continue
        assert ours_by_name[name] == (None if data is None else base64.b64decode(data)), name
    run_id = ours_by_name.get("__debezium.context.runId")
    return run_id.decode() if run_id is not None else None
