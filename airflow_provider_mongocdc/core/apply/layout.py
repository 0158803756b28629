"""The layout of a collection's Delta table: the columns every table has, and the typed columns a
user declares (top-level or dotted fields of the document, each to a Delta type).

Every table has the document key, the whole document as the event's JSON text (lossless), the last
operation, the source time and position, the position in the topic, the time applied and the
snapshot generation the re-snapshot sweep reads (:mod:`airflow_provider_mongocdc.core.apply.snapshots`);
with ``soft_delete`` also ``_deleted``. A declared column holds a field's value converted to its
type (:mod:`airflow_provider_mongocdc.core.apply.values`). The layout names Delta types as Delta
writes them in its schema (``string``, ``long``, ``timestamp``, ``decimal(10,2)``...); the delta-rs
adapter turns them into Arrow types. README, "Delta Lake tables", shows the table.

The declared columns are checked where a connector's ``delta`` settings are read, also when a DAG
file is parsed: this module does not import bson.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

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
