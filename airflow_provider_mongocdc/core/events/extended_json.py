"""bson.json_util's extended JSON text, as events carry it with ``extended.json.mode=legacy``.

:class:`Encoder` writes exactly ``json_util.dumps(value, json_options=...)``'s text for its mode
(``strict``: ``JSONMode.LEGACY`` with ``strict_number_long``; ``relaxed``; ``canonical``;
``legacy``), with ``","`` between members and ``": "`` after names, except that non-finite doubles
are written ``{"$numberDouble": "NaN"}`` (``json_util`` writes the bare ``NaN``/``Infinity`` in the
strict and legacy modes). It is faster: one reused C-accelerated ``json.JSONEncoder`` writes the
document without copying it first. How the text stays the same: docs/design.md, "Events", "JSON
text".
"""

from __future__ import annotations

import datetime
import json
import math
import re
import uuid
from collections.abc import Mapping
from functools import cache
from typing import Any

from bson import json_util
from bson.binary import Binary, UuidRepresentation
from bson.datetime_ms import DatetimeMS
from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64
from bson.json_util import DatetimeRepresentation, JSONMode, JSONOptions
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.config.enums import JsonMode

SEPARATORS = (",", ": ")

_BASE = {"uuid_representation": UuidRepresentation.STANDARD}


@cache
def json_options(mode: str) -> JSONOptions:
    """The ``JSONOptions`` for an ``extended.json.mode`` value."""
    if mode == JsonMode.STRICT:
        return JSONOptions(
            json_mode=JSONMode.LEGACY,
            strict_number_long=True,
            datetime_representation=DatetimeRepresentation.LEGACY,
            **_BASE,
        )
    if mode == JsonMode.LEGACY:
        return JSONOptions(
            json_mode=JSONMode.LEGACY, datetime_representation=DatetimeRepresentation.LEGACY, **_BASE
        )
    if mode == JsonMode.RELAXED:
        return JSONOptions(json_mode=JSONMode.RELAXED, **_BASE)
    if mode == JsonMode.CANONICAL:
        return JSONOptions(json_mode=JSONMode.CANONICAL, **_BASE)
    raise ValueError(f"unknown extended JSON mode {mode!r}")


@cache
def decode_options(mode: str) -> JSONOptions:
    """Options for reading an event's JSON back into the BSON values a default pymongo client
    returns (naive UTC datetimes, UUIDs as Binary subtype 4)."""
    return JSONOptions(
        json_mode=json_options(mode).json_mode,
        tz_aware=False,
        uuid_representation=UuidRepresentation.UNSPECIFIED,
    )


# Values the C JSON encoder writes exactly as json_util does, by itself (str, bool, None, and the
# numbers of the non-canonical modes) or through json_util.default (types it cannot write).
_AS_IS = frozenset(
    {
        str,
        bool,
        type(None),
        ObjectId,
        datetime.datetime,
        DatetimeMS,
        Decimal128,
        Binary,
        bytes,
        Timestamp,
        uuid.UUID,
        Regex,
        re.Pattern,
        MinKey,
        MaxKey,
    }
)
_NUMBERS = {
    "strict": (int, float),
    "legacy": (int, float, Int64),
    "relaxed": (int, float, Int64),
    "canonical": (),
}

_DECIMAL128_CONTEXT = create_decimal128_context()
_COEFFICIENT_BITS = (1 << 113) - 1
_MAX_COEFFICIENT = 10**34 - 1
_SPECIAL_BITS = 0x6000000000000000  # combination field 11...: infinity, NaN or non-canonical


def decimal128_text(value: Decimal128) -> str:
    """``str(value)``, computed from the value's BID bytes (see the module documentation)."""
    bits = int.from_bytes(value.bid, "little")
    high = bits >> 64
    coefficient = bits & _COEFFICIENT_BITS
    if (high & _SPECIAL_BITS) == _SPECIAL_BITS or coefficient > _MAX_COEFFICIENT:
        return str(value)
    exponent = ((high >> 49) & 0x3FFF) - 6176
    sign = "-" if high >> 63 else ""
    digits = str(coefficient)
    point = len(digits) + exponent
    if exponent > 0 or point < -5:  # scientific notation
        return str(_DECIMAL128_CONTEXT.create_decimal(f"{sign}{coefficient}E{exponent}"))
    # Plain notation (exponent <= 0, adjusted exponent >= -6), as Decimal's to-scientific-string.
    if exponent == 0:
        return sign + digits
    if point > 0:
        return sign + digits[:point] + "." + digits[point:]
    return sign + "0." + "0" * -point + digits


class Encoder:
    """Serialises BSON values and documents to extended JSON text in one mode."""

    __slots__ = ("mode", "options", "_lenient", "_as_is", "_encode", "_convert")

    def __init__(self, mode: str = "strict"):
        self.mode = mode
        self.options = json_options(mode)
        # Non-finite doubles need a rewrite only where json_util leaves floats untouched.
        self._lenient = self.options.json_mode == JSONMode.LEGACY
        self._as_is = _AS_IS.union(_NUMBERS[mode])
        options = self.options
        convert = json_util._json_convert
        default = json_util.default
        self._convert = lambda value: convert(value, options)

        def encode_default(value: Any) -> Any:
            if type(value) is Decimal128:
                return {"$numberDecimal": decimal128_text(value)}
            return default(value, options)

        self._encode = json.JSONEncoder(
            separators=SEPARATORS,
            ensure_ascii=False,
            allow_nan=False,
            check_circular=False,
            default=encode_default,
        ).encode

    def __reduce__(self):  # JSONOptions cannot be unpickled: rebuild from the mode
        return (Encoder, (self.mode,))

    def dumps(self, value: Any) -> str:
        """Extended JSON text of ``value`` (a document, an array or a single BSON value)."""
        try:
            return self._encode(self._prepared(value))
        except ValueError:
            # A NaN or infinity in legacy/strict mode (json_util would write invalid JSON).
            return json_util.dumps(
                _portable(value, self._lenient),
                json_options=self.options,
                separators=SEPARATORS,
                ensure_ascii=False,
                allow_nan=False,
            )

    def loads(self, text: str) -> Any:
        """Parse text written by :meth:`dumps` back to BSON values."""
        return json_util.loads(text, json_options=decode_options(self.mode))

    def _prepared(self, value: Any) -> Any:
        """``value`` with every part the C encoder would write differently from json_util already
        converted by json_util; unchanged containers are not copied."""
        kind = type(value)
        if kind is dict:
            items = value.values()
        elif kind is list:
            items = value
        elif kind in self._as_is:
            return value
        else:
            return self._convert(value)
        as_is = self._as_is
        kinds = set(map(type, items))
        if kinds <= as_is:
            return value
        copy = None
        for key, item in value.items() if kind is dict else enumerate(value):
            item_kind = type(item)
            if (
                item_kind in as_is
                or (item_kind is dict and set(map(type, item.values())) <= as_is)
                or (item_kind is list and set(map(type, item)) <= as_is)
            ):
                continue
            converted = self._prepared(item)
            if converted is not item:
                if copy is None:
                    copy = dict(value) if kind is dict else list(value)
                copy[key] = converted
        return value if copy is None else copy


def _portable(value: Any, lenient: bool) -> Any:
    """A copy with non-finite doubles written as ``{"$numberDouble": ...}``."""
    if isinstance(value, float):
        if lenient and not math.isfinite(value):
            text = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
            return {"$numberDouble": text}
        return value
    if isinstance(value, Mapping):
        return {key: _portable(item, lenient) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_portable(item, lenient) for item in value]
    return value


def dumps(value: Any, mode: str = "strict") -> str:
    """Convenience: :meth:`Encoder.dumps` in ``mode``."""
    return Encoder(mode).dumps(value)
