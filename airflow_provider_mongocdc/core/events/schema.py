"""Kafka Connect schemas of the events, in the JsonConverter layout, and schema name adjustment.

With ``key.converter.schemas.enable`` / ``value.converter.schemas.enable`` (the defaults) every
record is ``{"schema": <schema>, "payload": <payload>}`` exactly as Kafka Connect's JsonConverter
writes it; otherwise only the payload. The schemas are Debezium's: ``<topic>.Key``,
``<topic>.Envelope`` (Debezium 3.x's ``MongoDbSchema``, or the Debezium 1.x shape with
``event.format=oplog``) and those of the transaction and heartbeat topics. Field order and each
schema's attribute order follow JsonConverter's output. Serialised schemas are cached per topic:
an event costs only its payload. :func:`adjust_schema_name` and :func:`adjust_field_name` apply
``schema.name.adjustment.mode`` and ``field.name.adjustment.mode``. Each schema's fields:
docs/design.md, "Events", "Schemas".
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, NamedTuple

from airflow_provider_mongocdc.core.config.enums import EventFormat, NameAdjustmentMode

SOURCE_SCHEMA_NAME = "io.debezium.connector.mongo.Source"
JSON_SCHEMA_NAME = "io.debezium.data.Json"
ENUM_SCHEMA_NAME = "io.debezium.data.Enum"
UPDATE_DESCRIPTION_SCHEMA_NAME = "io.debezium.connector.mongodb.changestream.updatedescription"
TRUNCATED_ARRAY_SCHEMA_NAME = "io.debezium.connector.mongodb.changestream.truncatedarray"
TRANSACTION_BLOCK_SCHEMA_NAME = "event.block"
TRANSACTION_COLLECTION_SCHEMA_NAME = "event.collection"
TRANSACTION_KEY_SCHEMA_NAME = "io.debezium.connector.common.TransactionMetadataKey"
TRANSACTION_VALUE_SCHEMA_NAME = "io.debezium.connector.common.TransactionMetadataValue"
HEARTBEAT_KEY_SCHEMA_NAME = "io.debezium.connector.common.ServerNameKey"
HEARTBEAT_VALUE_SCHEMA_NAME = "io.debezium.connector.common.Heartbeat"
SNAPSHOT_VALUES = "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"


# -- name adjustment -------------------------------------------------------------------------------
def _is_first(char: str) -> bool:
    return char == "_" or ("a" <= char <= "z") or ("A" <= char <= "Z")


def _is_next(char: str) -> bool:
    return _is_first(char) or ("0" <= char <= "9")


@lru_cache(maxsize=4096)
def adjust_schema_name(name: str, mode: str = "avro") -> str:
    """Make a dotted schema name Avro-compatible, as Debezium's SchemaNameAdjuster does: the first
    character must be a Latin letter or ``_``, the others Latin letters, digits, ``_`` or ``.``.
    ``avro`` replaces an invalid character with ``_``; ``avro_unicode`` with ``_uXXXX`` (and
    ``_`` itself with ``_u005f``); ``none`` leaves the name alone."""
    return _adjusted(name, mode, dots=True)


@lru_cache(maxsize=65536)
def adjust_field_name(name: str, mode: str = "avro") -> str:
    """Make a document field name Avro-compatible (like :func:`adjust_schema_name` but ``.`` is
    not allowed inside a field name)."""
    return _adjusted(name, mode, dots=False)


def _adjusted(name: str, mode: str, *, dots: bool) -> str:
    if mode == NameAdjustmentMode.NONE or not name:
        return name
    out = []
    for index, char in enumerate(name):
        valid = _is_first(char) if index == 0 else ((dots and char == ".") or _is_next(char))
        if mode == NameAdjustmentMode.AVRO_UNICODE and (char == "_" or not valid):
            out.append(
                f"_u{ord(char):04x}"
                if ord(char) <= 0xFFFF
                else "".join(f"_u{unit:04x}" for unit in _utf16_units(char))
            )
        elif valid:
            out.append(char)
        else:
            out.append("_")
    return "".join(out)


def _utf16_units(char: str) -> tuple[int, int]:
    code = ord(char) - 0x10000
    return 0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF)


# -- schema building blocks ------------------------------------------------------------------------
def _f(field_name: str, type_: str, optional: bool, /, **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": type_}
    schema.update({k: v for k, v in extra.items() if k in ("items", "fields")})
    schema["optional"] = optional
    for key in ("name", "version", "parameters", "default"):
        if key in extra:
            schema[key] = extra[key]
    schema["field"] = field_name
    return schema


def _json_field(name: str) -> dict[str, Any]:
    return _f(name, "string", True, name=JSON_SCHEMA_NAME, version=1)


def transaction_block_schema() -> dict[str, Any]:
    return _f(
        "transaction",
        "struct",
        True,
        fields=[
            _f("id", "string", False),
            _f("total_order", "int64", False),
            _f("data_collection_order", "int64", False),
        ],
        name=TRANSACTION_BLOCK_SCHEMA_NAME,
        version=1,
    )


def _struct(name: str, fields: Any, *, optional: bool = False, version: int | None = 1) -> dict[str, Any]:
    """A Kafka Connect struct schema, its keys in JsonConverter's order."""
    schema = {"type": "struct", "fields": fields, "optional": optional, "name": name}
    if version is not None:
        schema["version"] = version
    return schema


def update_description_schema() -> dict[str, Any]:
    truncated = _struct(
        TRUNCATED_ARRAY_SCHEMA_NAME, [_f("field", "string", False), _f("size", "int32", False)]
    )
    return _f(
        "updateDescription",
        "struct",
        True,
        fields=[
            _f("removedFields", "array", True, items={"type": "string", "optional": False}),
            _json_field("updatedFields"),
            _f("truncatedArrays", "array", True, items=truncated),
        ],
        name=UPDATE_DESCRIPTION_SCHEMA_NAME,
        version=1,
    )


def source_schema(event_format: str = "change_streams") -> dict[str, Any]:
    """``io.debezium.connector.mongo.Source``: Debezium 3.x fields, or the 1.x fields."""
    if event_format == EventFormat.OPLOG:
        fields = [
            _f("version", "string", False),
            _f("connector", "string", False),
            _f("name", "string", False),
            _f("ts_ms", "int64", False),
            _f("snapshot", "boolean", True, default=False),
            _f("db", "string", False),
            _f("rs", "string", False),
            _f("collection", "string", False),
            _f("ord", "int32", False),
            _f("h", "int64", True),
        ]
    else:
        fields = [
            _f("version", "string", False),
            _f("connector", "string", False),
            _f("name", "string", False),
            _f("ts_ms", "int64", False),
            _f(
                "snapshot",
                "string",
                True,
                name=ENUM_SCHEMA_NAME,
                version=1,
                parameters={"allowed": SNAPSHOT_VALUES},
                default="false",
            ),
            _f("db", "string", False),
            _f("sequence", "string", True),
            _f("ts_us", "int64", True),
            _f("ts_ns", "int64", True),
            _f("collection", "string", False),
            _f("ord", "int32", False),
            _f("lsid", "string", True),
            _f("txnNumber", "int64", True),
            _f("wallTime", "int64", True),
        ]
        # MongoDbSourceInfoStructMaker on SchemaFactory.sourceInfoSchemaBuilder(): version 1, no rs.
        return _f("source", "struct", False, fields=fields, name=SOURCE_SCHEMA_NAME, version=1)
    return _f("source", "struct", False, fields=fields, name=SOURCE_SCHEMA_NAME)


def envelope_schema(
    topic: str,
    *,
    event_format: str = "change_streams",
    transaction_metadata: bool = False,
    adjustment: str = "none",
) -> dict[str, Any]:
    """The value schema ``<topic>.Envelope`` of a collection's events."""
    if event_format == EventFormat.OPLOG:
        fields = [
            _json_field("after"),
            _json_field("patch"),
            _json_field("filter"),
            source_schema("oplog"),
            _f("op", "string", True),
            _f("ts_ms", "int64", True),
        ]
        if transaction_metadata:
            fields.append(transaction_block_schema())
    else:
        fields = [
            _json_field("before"),
            _json_field("after"),
            update_description_schema(),
            source_schema(),
            _f("op", "string", True),
            _f("ts_ms", "int64", True),
            transaction_block_schema(),
        ]
    return _struct(adjust_schema_name(f"{topic}.Envelope", adjustment), fields, version=None)


def key_schema(topic: str, *, adjustment: str = "none") -> dict[str, Any]:
    """The key schema ``<topic>.Key``: ``{id: string}``."""
    return _struct(adjust_schema_name(f"{topic}.Key", adjustment), [_f("id", "string", False)], version=None)


def transaction_key_schema() -> dict[str, Any]:
    return _struct(TRANSACTION_KEY_SCHEMA_NAME, [_f("id", "string", False)])


def transaction_value_schema() -> dict[str, Any]:
    collection = _struct(
        TRANSACTION_COLLECTION_SCHEMA_NAME,
        [_f("data_collection", "string", False), _f("event_count", "int64", False)],
        optional=True,
    )
    return _struct(
        TRANSACTION_VALUE_SCHEMA_NAME,
        [
            _f("status", "string", False),
            _f("id", "string", False),
            _f("event_count", "int64", True),
            _f("data_collections", "array", True, items=collection),
            _f("ts_ms", "int64", False),
        ],
    )


def heartbeat_key_schema() -> dict[str, Any]:
    return _struct(HEARTBEAT_KEY_SCHEMA_NAME, [_f("serverName", "string", False)])


def heartbeat_value_schema() -> dict[str, Any]:
    return _struct(HEARTBEAT_VALUE_SCHEMA_NAME, [_f("ts_ms", "int64", False)])


# -- serialisation ---------------------------------------------------------------------------------
def compact(value: Any) -> str:
    """JSON as Kafka Connect writes it: no whitespace, non-ASCII kept (UTF-8)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


class Framing:
    """Bytes around a payload: ``{"schema":<schema>,"payload":`` ... ``}``, or nothing when
    schemas are disabled. ``wrap(payload_bytes)`` frames one serialised payload."""

    __slots__ = ("head", "tail")

    def __init__(self, schema: dict[str, Any] | None):
        if schema is None:
            self.head, self.tail = b"", b""
        else:
            self.head = b'{"schema":' + compact(schema).encode() + b',"payload":'
            self.tail = b"}"

    def wrap(self, payload: bytes) -> bytes:
        if not self.head:
            return payload
        return self.head + payload + self.tail


class Record(NamedTuple):
    """One Kafka record: ``value`` is ``None`` for a tombstone. ``headers``: the record's Kafka
    headers, name and bytes (data records and tombstones: Debezium's context headers,
    :mod:`airflow_provider_mongocdc.core.events.headers`)."""

    topic: str
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def size(self) -> int:
        """Bytes of key and value, the part of the record ``event.max.bytes`` limits."""
        return len(self.key or b"") + len(self.value or b"")
