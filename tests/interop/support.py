"""What Debezium's consumer code should make of a MongoDB document, and records built around
Debezium's own texts of it.

:func:`connect_payload` is the payload ``ExtractNewDocumentState`` (array.encoding=array) gives a
document after Kafka Connect's JsonConverter wrote it, following Debezium's ``MongoDataConverter``:
ObjectId, Decimal128 and JavaScript as strings, dates and BSON timestamps as Connect Timestamps
(epoch milliseconds; a BSON timestamp's seconds, as a signed 32-bit int, times 1000), binary as base64 bytes, regular
expressions as {regex, options}, arrays of one type as lists. :data:`REFUSED` for documents the
3.6.1 SMT refuses whatever wrote them (a MinKey or MaxKey anywhere: "is not a valid field name";
code with scope: a ClassCastException). ``None`` where the model does not say (mixed arrays).
"""

from __future__ import annotations

import json
from typing import Any

import bson
from bson import json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.json_util import JSONMode, JSONOptions

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
