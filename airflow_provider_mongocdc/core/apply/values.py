"""A declared column's value in a row of a collection's Delta table
(:class:`~airflow_provider_mongocdc.core.apply.layout.DeclaredColumn`): the field read from the
event's document (extended JSON decoded to its BSON value) and converted to the column's Delta type.
A value that does not fit (another type, out of range, more digits than a decimal holds) is left out
of the column (null), counted and reported (:class:`Misfits`), and stays in ``_doc``.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation, localcontext
from typing import Any

import orjson
from bson import Binary, Decimal128, Int64, ObjectId, json_util

from airflow_provider_mongocdc.core.apply.layout import DeclaredColumn, TableLayout, decimal_digits

_INT_RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "short": (-(2**15), 2**15 - 1),
    "byte": (-(2**7), 2**7 - 1),
}


def convert(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    """``(fits, value)``: a field's value (decoded from extended JSON) as ``column``'s type. None
    fits (null); a value of another type or out of range does not."""
    if value is None:
        return True, None
    try:
        return _CONVERTERS.get(column.type, _convert_decimal)(column, value)
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
        fits, converted = convert(column, value)
        if not fits:
            misfits.add(column, key, value)
        values.append(converted)
    return values
