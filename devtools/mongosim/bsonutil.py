"""BSON values as MongoDB orders and compares them, and the codec the simulator uses.

MongoDB compares values of different types by a fixed type order (MinKey < null < numbers <
strings < objects < arrays < binary < ObjectId < bool < date < timestamp < regex < MaxKey) and
queries with comparison operators only match values of the queried type's bracket. mongomock's
comparison knows most of that order but not MinKey, MaxKey, Timestamp or Decimal128;
``patch_mongomock()`` teaches it those, so that mongomock's matching, sorting and aggregation can
be used as is.
"""

from __future__ import annotations

import datetime
import decimal
import math
import re
import uuid

import bson
from bson import CodecOptions
from bson.binary import Binary, UuidRepresentation
from bson.codec_options import DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

CODEC = CodecOptions(
    document_class=dict,
    tz_aware=False,
    uuid_representation=UuidRepresentation.UNSPECIFIED,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
)

MAX_BSON_SIZE = 16 * 1024 * 1024  # maxBsonObjectSize
MAX_INTERNAL_BSON_SIZE = MAX_BSON_SIZE + 16 * 1024  # BSONObjMaxInternalSize (16793600)
MAX_MESSAGE_SIZE = 48_000_000
MAX_WRITE_BATCH = 100_000

_RE_TYPE = type(re.compile(""))


def encode(doc) -> bytes:
    return bson.encode(doc, codec_options=CODEC)


def decode(data: bytes) -> dict:
    return bson.decode(data, codec_options=CODEC)


def decode_all(data: bytes) -> list:
    return bson.decode_all(data, codec_options=CODEC)


def bson_size(doc) -> int:
    return len(encode(doc))


# -- type order -------------------------------------------------------------------------------------
def type_order(value) -> int:
    """The canonical type order of MongoDB (bsontypes.h canonicalizeBSONType)."""
    if value is None:
        return 5
    t = type(value)
    if t is bool:
        return 40
    if t in (int, float, Int64, Decimal128) or isinstance(value, (int, float, decimal.Decimal)):
        return 10
    if t is str:
        return 15
    if isinstance(value, dict):
        return 20
    if isinstance(value, (list, tuple)):
        return 25
    if isinstance(value, (bytes, uuid.UUID)):
        return 30
    if t is ObjectId:
        return 35
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return 45
    if t is Timestamp:
        return 47
    if isinstance(value, (Regex, _RE_TYPE)):
        return 50
    if t is MinKey:
        return -1
    if t is MaxKey:
        return 127
    if isinstance(value, bson.code.Code):
        return 60
    if isinstance(value, bson.dbref.DBRef):
        return 20
    return 100


def _number(value):
    if type(value) is Decimal128:
        return value.to_decimal()
    return value


def _datetime_ms(value) -> int:
    if isinstance(value, DatetimeMS):
        return int(value)
    if value.tzinfo is not None:
        value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    delta = value - datetime.datetime(1970, 1, 1)
    return (delta.days * 86400 + delta.seconds) * 1000 + delta.microseconds // 1000


def sort_key(value):
    """A Python-comparable key that orders values as MongoDB's BSON comparison does."""
    order = type_order(value)
    if order == 10:
        number = _number(value)
        if isinstance(number, float) and math.isnan(number):
            return (order, 0, float("-inf"))  # NaN sorts before every other number
        if isinstance(number, decimal.Decimal) and number.is_nan():
            return (order, 0, float("-inf"))
        return (order, 1, number)
    if order == 15:
        return (order, value)
    if order == 35:
        return (order, value.binary)
    if order == 40:
        return (order, value)
    if order == 45:
        return (order, _datetime_ms(value))
    if order == 47:
        return (order, value.time, value.inc)
    if order == 5 or order == -1 or order == 127:
        return (order,)
    if order == 30:
        if isinstance(value, uuid.UUID):
            return (order, 16, 4, value.bytes)
        subtype = value.subtype if isinstance(value, Binary) else 0
        return (order, len(value), subtype, bytes(value))
    if order == 20:
        if isinstance(value, bson.dbref.DBRef):
            value = value.as_doc()
        return (order, tuple((type_order(v), k, sort_key(v)) for k, v in value.items()))
    if order == 25:
        return (order, tuple(sort_key(v) for v in value))
    if order == 50:
        pattern = value.pattern if hasattr(value, "pattern") else str(value)
        flags = value.flags if isinstance(value, Regex) else ""
        return (order, str(pattern), str(flags))
    return (order, repr(value))


def compare(a, b) -> int:
    ka, kb = sort_key(a), sort_key(b)
    return (ka > kb) - (ka < kb)


def values_equal(a, b) -> bool:
    """MongoDB equality: numbers by value across types, documents field by field in order."""
    return sort_key(a) == sort_key(b)


def id_key(value):
    """A hashable key for an _id value; equal for _ids MongoDB treats as duplicates."""
    t = type(value)
    if t is ObjectId or t is str:
        return value
    if t is int or t is Int64:
        return int(value)
    if t is float:
        return value
    if t is bool:
        return ("bool", value)
    if t is Decimal128:
        d = value.to_decimal()
        if d == d.to_integral_value():
            return int(d)
        return float(d)
    if value is None:
        return ("null",)
    if isinstance(value, dict):
        return ("doc",) + tuple((k, id_key(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return ("arr",) + tuple(id_key(v) for v in value)
    if isinstance(value, Binary):
        return ("bin", value.subtype, bytes(value))
    if isinstance(value, bytes):
        return ("bin", 0, value)
    if isinstance(value, uuid.UUID):
        return ("bin", 4, value.bytes)
    if isinstance(value, (datetime.datetime, DatetimeMS)):
        return ("date", _datetime_ms(value))
    if t is Timestamp:
        return ("ts", value.time, value.inc)
    if t is MinKey:
        return ("minkey",)
    if t is MaxKey:
        return ("maxkey",)
    return ("other", repr(value))


def ts_key(ts: Timestamp) -> int:
    return (ts.time << 32) | ts.inc


def ts_from_key(key: int) -> Timestamp:
    return Timestamp(key >> 32, key & 0xFFFFFFFF)


def type_name(value) -> str:
    return {
        5: "null",
        10: "number",
        15: "string",
        20: "object",
        25: "array",
        30: "binData",
        35: "objectId",
        40: "bool",
        45: "date",
        47: "timestamp",
        50: "regex",
        -1: "minKey",
        127: "maxKey",
    }.get(type_order(value), "unknown")


def to_relaxed_json(value) -> str:
    """A shell-like rendering used in error messages ({ _id: 1 })."""
    if isinstance(value, dict):
        if not value:
            return "{}"
        return "{ " + ", ".join(f"{k}: {to_relaxed_json(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[ " + ", ".join(to_relaxed_json(v) for v in value) + " ]"
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, ObjectId):
        return f"ObjectId('{value}')"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Timestamp):
        return f"Timestamp({value.time}, {value.inc})"
    return str(value)


# -- mongomock -------------------------------------------------------------------------------------
_PATCHED = False


def patch_mongomock() -> None:
    """Make mongomock compare MinKey, MaxKey, Timestamp and Decimal128 as MongoDB does."""
    global _PATCHED
    if _PATCHED:
        return
    from mongomock import filtering

    def bson_compare(op, a, b, can_compare_types=True):
        a_order, b_order = type_order(a), type_order(b)
        if a_order != b_order:
            # MinKey and MaxKey bound every type bracket ({$gte: MinKey} matches everything).
            if not can_compare_types and b_order not in (-1, 127) and a_order not in (-1, 127):
                return False
            return op(a_order, b_order)
        return op(sort_key(a), sort_key(b))

    def get_compare_type(val):
        return type_order(val)

    filtering.bson_compare = bson_compare
    filtering._get_compare_type = get_compare_type  # pylint: disable=protected-access
    _patch_bson_size()

    _PATCHED = True


def _patch_bson_size() -> None:
    """``$bsonSize`` (MongoDB 4.4): the BSON size of a document, null for null or a missing
    field; any other type fails with 31393."""
    from mongomock import OperationFailure, aggregate

    original = aggregate._Parser.parse  # pylint: disable=protected-access

    def parse(self, expression):
        if isinstance(expression, dict) and len(expression) == 1 and "$bsonSize" in expression:
            argument = expression["$bsonSize"]
            if isinstance(argument, list) and len(argument) == 1:
                argument = argument[0]
            try:
                value = original(self, argument)
            except KeyError:
                value = None
            if value is None:
                return None
            if not isinstance(value, dict):
                raise OperationFailure(
                    f"$bsonSize requires a document input, found: {type_name(value)}", code=31393
                )
            return len(encode(value))
        return original(self, expression)

    aggregate._Parser.parse = parse  # pylint: disable=protected-access
