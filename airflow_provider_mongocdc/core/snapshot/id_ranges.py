"""``_id`` ranges in MongoDB's BSON order, and how their bounds are read and stored.

A range is half-open, ``[lower, upper)`` (None: unbounded), over ``_id`` values of any types
(:func:`range_query`). Bounds are the ``_id`` values exactly as stored (:func:`bound_codec_options`)
and travel as canonical extended JSON (:func:`bound_json`). See docs/design.md, "Snapshots".
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from bson import json_util
from bson.binary import UuidRepresentation
from bson.code import Code
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import ConfigError

# Types whose values the query operators order within the type: a range bounded on both sides by
# values of one of these types is read with plain $gte/$lt (an index range on any version).
_ORDERED_TYPES = frozenset({"number", "string", "object", "binData", "objectId", "bool", "date", "timestamp"})


def id_type(value: Any) -> str:
    """The ``$type`` alias of a BSON value's canonical type (as pymongo decodes it)."""
    if isinstance(value, MinKey):
        return "minKey"
    if isinstance(value, MaxKey):
        return "maxKey"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float, Decimal128)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (bytes, uuid.UUID)):  # Binary is a bytes subclass
        return "binData"
    if isinstance(value, ObjectId):
        return "objectId"
    if isinstance(value, Timestamp):
        return "timestamp"
    if isinstance(value, Regex) or type(value).__name__ == "Pattern":
        return "regex"
    if isinstance(value, Code):
        return "javascriptWithScope" if value.scope is not None else "javascript"
    if isinstance(value, (Mapping, DBRef)):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    if isinstance(value, datetime) or type(value).__name__ == "DatetimeMS":
        return "date"
    raise ConfigError(
        f"Unsupported _id value type {type(value).__name__}",
        fix="report the collection's _id type to the connector's maintainers",
    )


def _is_nan(value: Any) -> bool:
    if isinstance(value, float):
        return math.isnan(value)
    if isinstance(value, Decimal128):
        return value.to_decimal().is_nan()
    return False


def same_type_range(lower: Any, upper: Any) -> bool:
    """Whether ``[lower, upper)`` lies within one type that plain ``$gte``/``$lt`` order."""
    if lower is None or upper is None or _is_nan(lower) or _is_nan(upper):
        return False
    kind = id_type(lower)
    return kind == id_type(upper) and kind in _ORDERED_TYPES


def range_query(lower: Any = None, upper: Any = None) -> dict[str, Any]:
    """The filter matching every ``_id`` in ``[lower, upper)`` of the BSON order (None: unbounded).

    Query operators compare values of one type only ("type bracketing"): ``{$gte: 5, $lt: "k"}``
    matches nothing, and ``{$lt: 5}`` misses ``null`` or MinKey ids. A range within one ordered
    type uses ``{_id: {$gte, $lt}}``; any other range (unbounded, or across types) uses ``$expr``
    comparisons, which follow the BSON order across types (and use the ``_id`` index on MongoDB
    5.0 and later).
    """
    if lower is None and upper is None:
        return {}
    if same_type_range(lower, upper):
        return {"_id": {"$gte": lower, "$lt": upper}}
    conditions = []
    if lower is not None:
        conditions.append({"$gte": ["$_id", {"$literal": lower}]})
    if upper is not None:
        conditions.append({"$lt": ["$_id", {"$literal": upper}]})
    return {"$expr": conditions[0] if len(conditions) == 1 else {"$and": conditions}}


# How the snapshot decodes what it reads. Dates: DATETIME_AUTO, so that every BSON date (a signed
# 64-bit count of milliseconds, also outside Python's years 1-9999) decodes, out-of-range ones as
# bson.DatetimeMS. Chunk bounds are sampled with uuid_representation UNSPECIFIED: binary _ids (UUIDs
# of any subtype) stay bson.Binary, so the bounds stored in the plan and sent in range queries are
# the stored bytes whatever uuidRepresentation the connection sets. Documents are read with the
# client's codec options (binary values as stored too, see core/connection.py), as the window's
# change stream reads them, so that a document's read event and its change events carry the same key.
BOUNDS_JSON = CANONICAL_JSON_OPTIONS.with_options(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def bound_codec_options(client: MongoClient) -> CodecOptions:
    """The codec options of planning reads: ``_id`` values exactly as stored."""
    return client.codec_options.with_options(
        uuid_representation=UuidRepresentation.UNSPECIFIED,
        datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    )


def document_codec_options(client: MongoClient) -> CodecOptions:
    """The codec options of chunk reads: the client's, with every BSON date decodable."""
    return client.codec_options.with_options(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def bound_json(value: Any) -> str | None:
    return None if value is None else json_util.dumps(value, json_options=BOUNDS_JSON)


def bound_from_json(text: str | None) -> Any:
    return None if text is None else json_util.loads(text, json_options=BOUNDS_JSON)
