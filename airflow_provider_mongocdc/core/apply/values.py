"""A declared column's value in a row of a collection's Delta table
(:class:`~airflow_provider_mongocdc.core.apply.layout.DeclaredColumn`): the field read from the
event's document (extended JSON decoded to its BSON value) and converted to the column's Delta type
as a SQL cast converts it (a Decimal128 or an integer into ``double``, an integral double into
``long``...). A value that does not fit (another type, out of range, more digits than a decimal
holds, a wrapper such as ``{"$date": ...}`` that cannot be read, a date outside years 1-9999) is left
out of the column (null), counted and reported (:class:`Misfits`), and stays in ``_doc``: no value
stops the apply.
"""

from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Context, Decimal
from functools import cache
from typing import Any

import orjson
from bson import Binary, Decimal128, Int64, ObjectId, json_util
from bson.codec_options import DatetimeConversion
from bson.json_util import JSONOptions

from airflow_provider_mongocdc.core.apply.layout import DeclaredColumn, TableLayout, decimal_digits
from airflow_provider_mongocdc.core.base.errors import TableError

_INT_RANGES = {
    "long": (-(2**63), 2**63 - 1),
    "integer": (-(2**31), 2**31 - 1),
    "short": (-(2**15), 2**15 - 1),
    "byte": (-(2**7), 2**7 - 1),
}
_FLOAT_LIMITS = {"double": 1.7976931348623157e308, "float": 3.4028234663852886e38}
# Naive UTC datetimes; a date outside Python's years 1-9999 as a DatetimeMS (a misfit of a date or
# timestamp column) instead of an error.
_DECODE_OPTIONS = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
# A value with fewer whole digits than its column's precision, at the column's scale (at most 38
# digits each side), quantized without rounding to the context's precision.
_QUANTIZE_CONTEXT = Context(prec=80)
_SCALE_UNITS = [Decimal(1).scaleb(-scale) for scale in range(39)]  # 1, 0.1, 0.01...
_decimal_digits = cache(decimal_digits)


def convert(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    """``(fits, value)``: a field's value (decoded from extended JSON) as ``column``'s type, converted
    as a SQL cast converts it. None fits (null); a value of another type, out of the type's range or
    not held exactly (a fraction in an integer or beyond a decimal's scale) does not."""
    if value is None:
        return True, None
    try:
        return _CONVERTERS.get(column.type, _convert_decimal)(column, value)
    except (ValueError, TypeError, OverflowError, ArithmeticError):
        return False, None


def _convert_string(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if type(value) is str:  # not a Code, which is a str too
        return True, value
    if isinstance(value, ObjectId):
        return True, str(value)
    return False, None


def _convert_int(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    """An integer, or an integral double or Decimal128, in the column's range."""
    if isinstance(value, int):
        if isinstance(value, bool):
            return False, None
        number = int(value)
    elif isinstance(value, float):
        if not value.is_integer():  # also NaN and the infinities
            return False, None
        number = int(value)
    elif isinstance(value, Decimal128):
        decimal = value.to_decimal()
        if not decimal.is_finite():
            return False, None
        number = int(decimal)
        if number != decimal:
            return False, None
    else:
        return False, None
    low, high = _INT_RANGES[column.type]
    return (True, number) if low <= number <= high else (False, None)


def _convert_float(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    """A double, integer or Decimal128 rounded to the nearest double; NaN and the infinities fit,
    a finite value beyond the column's range (a float's 3.4e38) does not."""
    if isinstance(value, float):
        if not math.isfinite(value):
            return True, value
        number = value
    elif isinstance(value, int):
        if isinstance(value, bool):
            return False, None
        number = float(value)
    elif isinstance(value, Decimal128):
        decimal = value.to_decimal()
        if decimal.is_nan():
            return True, math.nan
        number = float(decimal)
        if decimal.is_infinite():
            return True, number
    else:
        return False, None
    return (True, number) if abs(number) <= _FLOAT_LIMITS[column.type] else (False, None)


def _convert_bool(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    return (True, value) if isinstance(value, bool) else (False, None)


def _convert_timestamp(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if not isinstance(value, dt.datetime):  # also a DatetimeMS: a date outside years 1-9999
        return False, None
    return True, value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)


def _convert_date(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    if not isinstance(value, dt.datetime):
        return False, None
    return True, (value if value.tzinfo is None else value.astimezone(dt.timezone.utc)).date()


def _convert_binary(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    return (True, bytes(value)) if isinstance(value, (bytes, Binary)) else (False, None)


def _convert_decimal(column: DeclaredColumn, value: Any) -> tuple[bool, Any]:
    """An integer, Decimal128 or double (its shortest decimal text, ``repr``: 0.1 is 0.1) that the
    column holds exactly: at most its scale's fraction digits and its precision's whole digits."""
    digits = _decimal_digits(column.type)
    if digits is None:
        return False, None
    if isinstance(value, Decimal128):
        number = value.to_decimal()
        if not number.is_finite():
            return False, None
    elif isinstance(value, float):
        if not math.isfinite(value):
            return False, None
        number = Decimal(repr(value))
    elif isinstance(value, int) and not isinstance(value, bool):
        number = Decimal(value)
    else:
        return False, None
    precision, scale = digits
    if number and number.adjusted() >= precision - scale:  # more whole digits than the column's
        return False, None
    quantized = number.quantize(_SCALE_UNITS[scale], context=_QUANTIZE_CONTEXT)
    return (True, quantized) if quantized == number else (False, None)


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
    """Values that did not fit their declared column, per column: how many and a first example.
    ``refuse``: the table's ``fail_on_misfit``, the first one is an error naming it (``table``)."""

    counts: dict[str, int] = field(default_factory=dict)
    examples: dict[str, str] = field(default_factory=dict)
    refuse: bool = False
    table: str = ""

    def add(self, column: DeclaredColumn, key: str, value: Any) -> None:
        if self.refuse:
            raise misfit_error(self.table, column, key, value)
        self.counts[column.name] = self.counts.get(column.name, 0) + 1
        if column.name not in self.examples:
            self.examples[column.name] = f"_id {key}: {type(value).__name__} {_shown(value)}"

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

    def to_json(self, totals: Mapping[str, int] | None = None) -> dict[str, Any]:
        """Per column: this run's count, its first example, and with ``totals`` the table's count
        since it was created (columns with misfits in earlier runs only too)."""
        shown = {
            name: {"count": count, "example": self.examples.get(name)} for name, count in self.counts.items()
        }
        for name, total in (totals or {}).items():
            if total:
                shown.setdefault(name, {"count": 0, "example": None})["total"] = total
        return shown


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else shown[:79] + "…"


def misfit_error(table: str, column: DeclaredColumn, key: str, value: Any) -> TableError:
    """The error of a misfit in a table that refuses them (``fail_on_misfit``)."""
    return TableError(
        f"The value of {column.path} of the document _id {key} does not fit the column {column.name} "
        f"({column.type}) of the table at {table}: {type(value).__name__} {_shown(value)}",
        cause="the table is applied with fail_on_misfit, which refuses a value its declared column cannot "
        "hold instead of leaving the column null",
        fix="declare the column with a type that takes the value, correct the document in MongoDB, or "
        "leave fail_on_misfit off; nothing of this batch was applied, the table stays at its last commit",
    )


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
    """An extended JSON value (``{"$numberLong": "1"}``, ``{"$date": ...}``...) as its BSON value; a
    document of ``$`` names that is no extended JSON ``bson.json_util`` reads (``{"$date": "soon"}``)
    stays the document it is, which fits no column."""
    if isinstance(value, dict) and value and next(iter(value)).startswith("$"):
        try:
            decoded = _bson_value(value)
        except Exception:  # json_util raises errors of many kinds: ValueError, TypeError, InvalidBSON...
            return value
        return int(decoded) if isinstance(decoded, Int64) else decoded
    return value


def _bson_value(value: Any) -> Any:
    """``json_util.loads(json.dumps(value))`` without the text: json_util's object hook applied to
    every object of the parsed value, innermost first, as ``json.loads`` applies it."""
    kind = type(value)
    if kind is dict:
        return json_util.object_hook(
            {name: _bson_value(item) for name, item in value.items()}, _DECODE_OPTIONS
        )
    if kind is list:
        return [_bson_value(item) for item in value]
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
