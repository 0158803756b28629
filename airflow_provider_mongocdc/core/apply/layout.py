"""The layout of a collection's Delta table: the columns every table has, and the typed columns a
user declares (top-level or dotted fields of the document, each to a Delta type).

Every table has the document key, the whole document as the event's JSON text (lossless), the last
operation, the source time and position, the position in the topic, the time applied and the
snapshot generation the re-snapshot sweep reads (:mod:`airflow_provider_mongocdc.core.apply.snapshots`);
with ``soft_delete`` also ``_deleted``. A declared column holds a field's value converted to its
type; a value that does not fit (another type, out of range, more digits than a decimal holds) is
left out of the column (null), counted and reported, and stays in ``_doc``. The layout names Delta
types as Delta writes them in its schema (``string``, ``long``, ``timestamp``, ``decimal(10,2)``...);
the delta-rs adapter turns them into Arrow types. README, "Delta Lake tables", shows the table.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

import orjson
from bson import Binary, Decimal128, Int64, ObjectId, json_util

from airflow_provider_mongocdc.core.base.errors import ConfigError

# -- the columns of every table --------------------------------------------------------------------
ID = "_id"
DOCUMENT = "_doc"
OP = "_op"
SOURCE_TS = "_source_ts"
SOURCE_ORD = "_source_ord"
TXN = "_txn"
KAFKA_PARTITION = "_kafka_partition"
KAFKA_OFFSET = "_kafka_offset"
APPLIED_AT = "_applied_at"
GENERATION = "_snapshot_gen"
DELETED = "_deleted"

# (name, Delta type, nullable, what it holds): the order of the table's columns.
SYSTEM_COLUMNS: tuple[tuple[str, str, bool, str], ...] = (
    (ID, "string", False, 'the document key: `_id` as extended JSON, as in the event\'s key (`{"id": ...}`)'),
    (
        DOCUMENT,
        "string",
        True,
        "the whole document, the event's JSON text (`after`, extended JSON, lossless)",
    ),
    (
        OP,
        "string",
        False,
        "the last operation applied: `c` insert, `u` update or replace, `r` snapshot read, `d` delete (soft delete only)",
    ),
    (
        SOURCE_TS,
        "timestamp",
        True,
        "the source time of the last event (`source.ts_us`: when the change was made, or when a snapshot read it)",
    ),
    (
        SOURCE_ORD,
        "integer",
        True,
        "the source position within that second (`source.ord`, the cluster time's increment)",
    ),
    (TXN, "string", True, "the MongoDB transaction of the last change (`<lsid>:<txnNumber>`), else null"),
    (KAFKA_PARTITION, "integer", False, "the topic partition of the last event applied"),
    (KAFKA_OFFSET, "long", False, "its offset: where the row's state was read"),
    (APPLIED_AT, "timestamp", False, "when the apply committed the row"),
    (
        GENERATION,
        "long",
        False,
        "the table's snapshot generation when the row was last written (the re-snapshot sweep)",
    ),
)
SOFT_DELETE_COLUMN = (
    DELETED,
    "boolean",
    False,
    "true: the document was deleted (soft delete); its last `_doc` is kept",
)
SYSTEM_NAMES = frozenset(name for name, *_ in (*SYSTEM_COLUMNS, SOFT_DELETE_COLUMN))

# The Delta types a column may be declared as (aliases on the left).
TYPE_ALIASES = {
    "string": "string",
    "str": "string",
    "long": "long",
    "bigint": "long",
    "int64": "long",
    "integer": "integer",
    "int": "integer",
    "int32": "integer",
    "short": "short",
    "smallint": "short",
    "byte": "byte",
    "tinyint": "byte",
    "double": "double",
    "float64": "double",
    "float": "float",
    "float32": "float",
    "boolean": "boolean",
    "bool": "boolean",
    "date": "date",
    "timestamp": "timestamp",
    "binary": "binary",
}
_DECIMAL = re.compile(r"^\s*decimal\s*\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*$", re.IGNORECASE)
_INT_RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "short": (-(2**15), 2**15 - 1),
    "byte": (-(2**7), 2**7 - 1),
}
_COLUMN_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")
_FIELD_PATH = re.compile(r"^[^.$\s][^.]*(\.[^.]+)*$")
KNOWN_TYPES = (
    "string, long, integer, short, byte, double, float, boolean, date, timestamp, binary, decimal(p,s)"
)


def delta_type(text: Any, what: str) -> str:
    """The Delta type name of a declared type (``"bigint"`` -> ``"long"``); a ConfigError in words
    for a type that is not one of :data:`KNOWN_TYPES`."""
    if isinstance(text, str):
        name = TYPE_ALIASES.get(text.strip().lower())
        if name:
            return name
        match = _DECIMAL.match(text)
        if match:
            precision, scale = int(match.group(1)), int(match.group(2))
            if 1 <= precision <= 38 and scale <= precision:
                return f"decimal({precision},{scale})"
            raise ConfigError(
                f"{what}: the type {text!r} is not a Delta decimal",
                cause="a decimal has a precision of 1 to 38 digits and a scale of at most its precision",
                fix="declare e.g. decimal(18,2)",
            )
    raise ConfigError(
        f"{what}: the type {text!r} is unknown",
        cause=f"a declared column is one of the Delta types {KNOWN_TYPES}",
        fix='declare e.g. {"total": "double", "customer.name": "string"}',
    )


def decimal_digits(type_name: str) -> tuple[int, int] | None:
    """``(precision, scale)`` of a ``decimal(p,s)`` type, else None."""
    match = _DECIMAL.match(type_name)
    return (int(match.group(1)), int(match.group(2))) if match else None


@dataclass(frozen=True)
class DeclaredColumn:
    """A column the user declared: its name, the document field it holds (dotted path) and its type."""

    name: str
    path: str
    type: str

    @property
    def parts(self) -> tuple[str, ...]:
        return tuple(self.path.split("."))

    def convert(self, value: Any) -> tuple[bool, Any]:
        """``(fits, value)``: the field's value (decoded from extended JSON) as this column's type.
        None fits (null); a value of another type or out of range does not."""
        if value is None:
            return True, None
        try:
            return _CONVERTERS.get(self.type, _convert_decimal)(self, value)
        except (ValueError, TypeError, OverflowError, InvalidOperation, ArithmeticError):
            return False, None


def _convert_string(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if isinstance(value, str):
        return True, value
    if isinstance(value, ObjectId):
        return True, str(value)
    return False, None


def _convert_int(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool) or not isinstance(value, int):
        return False, None
    low, high = _INT_RANGES[column.type]
    return (True, int(value)) if low <= value <= high else (False, None)


def _convert_float(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False, None
    number = float(value)
    if column.type == "float" and math.isfinite(number) and abs(number) > 3.4028234663852886e38:
        return False, None
    return True, number


def _convert_bool(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    return (True, value) if isinstance(value, bool) else (False, None)


def _convert_timestamp(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if not isinstance(value, dt.datetime):
        return False, None
    return True, value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _convert_date(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if not isinstance(value, dt.datetime):
        return False, None
    return True, (value if value.tzinfo is None else value.astimezone(dt.timezone.utc)).date()


def _convert_binary(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    return (True, bytes(value)) if isinstance(value, (bytes, Binary)) else (False, None)


def _convert_decimal(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    digits = decimal_digits(column.type)
    if digits is None:
        return False, None
    if isinstance(value, Decimal128):
        number = value.to_decimal()
    elif isinstance(value, int) and not isinstance(value, bool):
        number = Decimal(value)
    else:
        return False, None
    if not number.is_finite():
        return False, None
    precision, scale = digits
    with localcontext() as context:
        context.prec = 80
        quantized = number.quantize(Decimal(1).scaleb(-scale))
        whole = abs(int(quantized))
    if quantized != number or (whole and len(str(whole)) > precision - scale):
        return False, None
    return True, quantized


_CONVERTERS = {
    "string": _convert_string,
    "long": _convert_int,
    "integer": _convert_int,
    "short": _convert_int,
    "byte": _convert_int,
    "double": _convert_float,
    "float": _convert_float,
    "boolean": _convert_bool,
    "timestamp": _convert_timestamp,
    "date": _convert_date,
    "binary": _convert_binary,
}


def declared_columns(value: Any, what: str) -> tuple[DeclaredColumn, ...]:
    """The declared columns of one collection: ``{"<field path>": "<type>"}`` (the column is named
    after the path, dots as ``_``) or ``{"<column>": {"field": "<path>", "type": "<type>"}}``."""
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"{what} must be a JSON object of field paths and types, got {type(value).__name__}",
            fix='give e.g. {"status": "string", "total": "double", "customer.name": "string"}',
        )
    columns: list[DeclaredColumn] = []
    for key, spec in value.items():
        if isinstance(spec, Mapping):
            unknown = sorted(set(spec) - {"field", "type"})
            if unknown or "type" not in spec:
                raise ConfigError(
                    f"{what}: column {key!r} must be a type or an object with 'field' and 'type'",
                    cause=f"unknown key(s) {', '.join(unknown)}" if unknown else "its 'type' is missing",
                    fix='give e.g. {"customer_name": {"field": "customer.name", "type": "string"}}',
                )
            name, path, type_text = str(key), str(spec.get("field") or key), spec["type"]
        else:
            name, path, type_text = re.sub(r"[^A-Za-z0-9_]", "_", str(key)), str(key), spec
        if not _FIELD_PATH.match(path):
            raise ConfigError(
                f"{what}: {path!r} is not a document field path",
                fix="name a top-level field (total) or a dotted path (customer.address.city)",
            )
        if not _COLUMN_NAME.match(name) or name in SYSTEM_NAMES:
            raise ConfigError(
                f"{what}: {name!r} cannot be a column name",
                cause="a declared column's name starts with a letter and holds letters, digits and _; "
                f"the names {', '.join(sorted(SYSTEM_NAMES))} belong to the table's own columns",
                fix='name the column yourself: {"<column>": {"field": "<path>", "type": "<type>"}}',
            )
        columns.append(DeclaredColumn(name, path, delta_type(type_text, f"{what}: column {name!r}")))
    names = [column.name for column in columns]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ConfigError(
            f"{what}: the column name(s) {', '.join(repeated)} are declared twice",
            fix="give each declared column its own name",
        )
    return tuple(columns)


# -- a table's layout -------------------------------------------------------------------------------
@dataclass(frozen=True)
class TableLayout:
    """The columns of one table: the system ones, ``_deleted`` with soft deletes, the declared ones."""

    declared: tuple[DeclaredColumn, ...] = ()
    soft_delete: bool = False

    def columns(self) -> list[tuple[str, str, bool]]:
        """``(name, Delta type, nullable)`` of every column, in order."""
        system = [*SYSTEM_COLUMNS, *([SOFT_DELETE_COLUMN] if self.soft_delete else [])]
        return [(name, kind, nullable) for name, kind, nullable, _ in system] + [
            (column.name, column.type, True) for column in self.declared
        ]

    def names(self) -> list[str]:
        return [name for name, _, _ in self.columns()]


@dataclass
class Misfits:
    """Values that did not fit their declared column, per column: how many and a first example."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, column: DeclaredColumn, key: str, value: Any) -> None:
        self.counts[column.name] = self.counts.get(column.name, 0) + 1
        if column.name not in self.examples:
            shown = repr(value)
            shown = shown if len(shown) <= 80 else shown[:79] + "…"
            self.examples[column.name] = f"_id {key}: {type(value).__name__} {shown}"

    def merge(self, other: Misfits) -> None:
        for name, count in other.counts.items():
            self.counts[name] = self.counts.get(name, 0) + count
            self.examples.setdefault(name, other.examples.get(name, ""))

    def describe(self, columns: tuple[DeclaredColumn, ...]) -> list[str]:
        by_name = {column.name: column for column in columns}
        return [
            f"{count} value(s) of {by_name[name].path} did not fit the column {name} ({by_name[name].type}) "
            f"and stay in _doc only, e.g. {self.examples.get(name, '')}"
            for name, count in sorted(self.counts.items())
            if name in by_name
        ]

    def to_json(self) -> dict[str, Any]:
        return {
            name: {"count": count, "example": self.examples.get(name)} for name, count in self.counts.items()
        }


def parse_document(text: str) -> Any:
    """The document of an event's JSON text as plain JSON values (extended JSON left as objects):
    orjson, or Python's reader for the bare ``NaN``/``Infinity`` the Java driver writes."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


def field_value(document: Any, parts: tuple[str, ...]) -> tuple[bool, Any]:
    """``(present, value)`` of a dotted path in a parsed document; an array index may be a part."""
    current = document
    for part in parts:
        if isinstance(current, dict):
            if part not in current:
                return False, None
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            return False, None
    return True, _decoded(current)


def _decoded(value: Any) -> Any:
    """An extended JSON value (``{"$numberLong": "1"}``, ``{"$date": ...}``...) as its BSON value."""
    if isinstance(value, dict) and value and next(iter(value)).startswith("$"):
        decoded = json_util.loads(json.dumps(value))
        return int(decoded) if isinstance(decoded, Int64) else decoded
    return value


def column_values(layout: TableLayout, key: str, document_text: str | None, misfits: Misfits) -> list[Any]:
    """The declared columns' values of one row (None for each when there is no document)."""
    if not layout.declared:
        return []
    if document_text is None:
        return [None] * len(layout.declared)
    document = parse_document(document_text)
    values = []
    for column in layout.declared:
        present, value = field_value(document, column.parts)
        if not present:
            values.append(None)
            continue
        fits, converted = column.convert(value)
        if not fits:
            misfits.add(column, key, value)
        values.append(converted)
    return values
