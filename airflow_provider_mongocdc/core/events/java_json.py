"""MongoDB extended JSON for event payloads.

:class:`JavaJsonWriter` writes what events carry by default: the text the MongoDB Java driver's
``JsonWriter`` writes with the settings of Debezium 3.x's ``JsonSerialization``.
:func:`document_writer`, :func:`updated_fields_writer` and :func:`key_writer` choose the writer for
``extended.json.mode`` / ``key.json.mode``; documents with ``extended.json.mode=legacy`` get
``bson.json_util``'s text (:class:`~airflow_provider_mongocdc.core.events.extended_json.Encoder`). The compact writers let orjson write
whole values whose text cannot differ from the value-by-value one (``_FastPath``;
tests/unit/test_ejson_fast_path.py compares both texts). The connector's clients decode binary
values as stored (core/connection.py), so UUIDs arrive as :class:`bson.binary.Binary` of subtype 3
or 4 and keep it; a :class:`uuid.UUID` is written as subtype 4. Details and reasons:
docs/design.md, "Events", "JSON text".
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import math
import re
import unicodedata
import uuid
from collections.abc import Mapping
from functools import cache
from json.encoder import encode_basestring as _quote
from typing import Any

import orjson
from bson.binary import Binary
from bson.code import Code
from bson.datetime_ms import DatetimeMS
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.regex import Regex
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.config.enums import JsonMode
from airflow_provider_mongocdc.core.events.extended_json import (  # noqa: F401  (re-exported)
    _AS_IS,
    _BASE,
    _NUMBERS,
    SEPARATORS,
    Encoder,
    _portable,
    decimal128_text,
    decode_options,
    dumps,
    json_options,
)

# -- the Java driver's JsonWriter --------------------------------------------------------------------
# Debezium's MongoDB connector writes every JSON text of an event with the Java driver's
# org.bson.json.JsonWriter (JsonSerialization, MongoDbCollectionSchema, MongoUtils). JavaJsonWriter
# reproduces that writer's output for the values a pymongo client returns.

# Character.getType categories StrictCharacterStreamJsonWriter.writeStringHelper writes as they are;
# every other UTF-16 unit (controls, format characters, surrogates, private use, unassigned, marks,
# modifier letters, line/paragraph separators) is written as a lowercase "\uXXXX" escape.
_JAVA_VERBATIM = frozenset(
    {"Lu", "Ll", "Lt", "Lo", "Nd", "Nl", "No", "Zs", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc"}
    | {"Sk", "So"}
)
_JAVA_ESCAPED = re.compile("[^\x00-\x7e]")
_INT32 = (-(2**31), 2**31)
_CONTAINERS = frozenset({dict, list})
_LAST_MS_OF_YEAR_9999 = 253402300799999
_JAVA_MODES = {"strict": "strict", "relaxed": "relaxed", "canonical": "extended", "extended": "extended"}


@cache
def _java_char(char: str) -> str:
    code = ord(char)
    if code > 0xFFFF:  # a surrogate pair in Java's UTF-16 string: both units escaped
        code -= 0x10000
        return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"
    if code != 0x7F and unicodedata.category(char) in _JAVA_VERBATIM:
        return char
    return f"\\u{code:04x}"


def _java_escape_match(match: re.Match) -> str:
    return _java_char(match.group())


def java_escape(text: str) -> str:
    """Rewrite the non-ASCII characters (and DEL) of JSON text written with ``ensure_ascii=False``
    as StrictCharacterStreamJsonWriter escapes them (the rest of its escaping, ``"``, ``\\``, the
    short escapes and ``\\u00XX`` for other controls, is what :mod:`json` writes already)."""
    if text.isascii() and "\x7f" not in text:
        return text
    return _JAVA_ESCAPED.sub(_java_escape_match, text)


def quote_text(text: str) -> str:
    """``json.encoder.encode_basestring(text)`` (the JSON string of a document's text in an event),
    written by orjson, whose escaping is the same (a lone surrogate, which orjson refuses, by json)."""
    try:
        return orjson.dumps(text).decode()
    except orjson.JSONEncodeError:
        return _quote(text)


def java_double(value: float) -> str:
    """``Double.toString(value)`` (JDK 19+: the shortest decimal that rounds to the value), as the
    Java driver that Debezium 3.6 ships (bson 5.6) writes doubles in JSON: ``1.0``, ``0.001``,
    ``1.0E-7``, ``1.0E22``, ``NaN``, ``Infinity``."""
    magnitude = abs(value)
    if 1e-3 <= magnitude < 1e7:
        # repr is the shortest decimal that rounds to the value, closest to it (as Java's); in
        # this range it is written in plain notation with at least one fraction digit, as Java's.
        return repr(value)
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    if value == 0:
        return "-0.0" if math.copysign(1.0, value) < 0 else "0.0"
    sign, digit_tuple, exponent = decimal.Decimal(repr(value)).as_tuple()
    digits = "".join(map(str, digit_tuple))
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    if len(digits) == 1:
        # Java chooses among the decimals of length 1 *and 2* that round to the value the one
        # closest to it (Double.toString, JDK 19+): only subnormals near 4.9E-324 are affected.
        two = decimal.Decimal(format(value, ".1e"))
        exact = decimal.Decimal(value)
        if float(two) == value and abs(two - exact) < abs(decimal.Decimal(repr(value)) - exact):
            sign, digit_tuple, exponent = two.as_tuple()
            digits = "".join(map(str, digit_tuple))
    point = len(digits) + exponent  # digits * 10**exponent == 0.<digits> * 10**point
    if 1e-3 <= magnitude < 1e7:
        if point <= 0:
            text = "0." + "0" * -point + digits
        elif point >= len(digits):
            text = digits + "0" * (point - len(digits)) + ".0"
        else:
            text = digits[:point] + "." + digits[point:]
    else:
        scientific = point - 1
        text = digits[0] + "." + (digits[1:] or "0") + "E" + str(scientific)
    return "-" + text if sign else text


def java_date(millis: int) -> str:
    """RelaxedExtendedJsonDateTimeConverter's ISO text: ``DateTimeFormatter.ISO_OFFSET_DATE_TIME``
    in UTC, seconds always, the fraction without trailing zeros and only when not zero."""
    moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=millis)
    fraction = millis % 1000
    text = (
        f"{moment.year:04d}-{moment.month:02d}-{moment.day:02d}T"
        f"{moment.hour:02d}:{moment.minute:02d}:{moment.second:02d}"
    )
    if fraction:
        text += ("." + f"{fraction:03d}").rstrip("0")
    return text + "Z"


_EPOCH = datetime.datetime(1970, 1, 1)
_ONE_MS = datetime.timedelta(milliseconds=1)


def _epoch_millis(value: Any) -> int:
    if isinstance(value, datetime.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(datetime.timezone.utc).replace(tzinfo=None)
        return (value - _EPOCH) // _ONE_MS
    return int(value)


_RE_FLAGS = ((re.IGNORECASE, "i"), (re.LOCALE, "l"), (re.MULTILINE, "m"), (re.DOTALL, "s"))
_RE_FLAGS += ((re.UNICODE, "u"), (re.VERBOSE, "x"))


def _regex_options(flags: Any) -> str:
    if isinstance(flags, str):
        return "".join(sorted(flags))
    return "".join(letter for flag, letter in _RE_FLAGS if flags & flag)


class JavaJsonWriter:
    """Extended JSON text exactly as the MongoDB Java driver's ``BsonDocument.toJson(settings)``
    writes it, for the settings Debezium uses.

    ``mode``: ``strict`` (``JsonMode.STRICT``: ``{"$numberLong": "5"}``, ``{"$date": <ms>}``,
    ``{"$binary": "<b64>", "$type": "00"}``, doubles and NaN bare), ``relaxed`` (``JsonMode.RELAXED``:
    64-bit integers plain, ``{"$date": "2023-11-14T22:13:20Z"}``, ``{"$binary": {"base64", "subType"}}``,
    ``{"$numberDouble": "NaN"}``) or ``extended`` / ``canonical`` (``JsonMode.EXTENDED``: every
    number typed). ``compact`` is Debezium's ``indent(true)`` with empty indent and newline
    characters (``{"a": 1,"b": [1,2]}``); otherwise the driver's default layout
    (``{"a": 1, "b": [1, 2]}``, what ``BsonDocument.toJson()`` gives). Doubles follow
    ``Double.toString`` (:func:`java_double`), strings Java's escaping (:func:`java_escape`, with
    Python's Unicode tables for the character categories).
    """

    __slots__ = ("mode", "compact", "_sep", "_plain", "_c_encode", "_ints_plain", "_scalars", "_fast")

    def __init__(self, mode: str = "strict", *, compact: bool = True):
        if mode not in _JAVA_MODES:
            raise ValueError(f"unknown Java JSON mode {mode!r}")
        self.mode = _JAVA_MODES[mode]
        self.compact = compact
        self._sep = "," if compact else ", "
        self._ints_plain = self.mode != "extended"
        # Values json's C encoder writes as the Java writer does (ints only when int32 or relaxed).
        self._plain = frozenset({str, bool, type(None)} | ({int} if self._ints_plain else set()))
        self._c_encode = json.JSONEncoder(
            separators=(self._sep, ": "), ensure_ascii=False, allow_nan=False, check_circular=False
        ).encode
        self._scalars: dict[type, Any] = {
            str: _quote,
            bool: lambda value: "true" if value else "false",
            type(None): lambda value: "null",
            int: self._int,
            Int64: self._int64,
            float: self._double,
            ObjectId: lambda value: self._object1("$oid", _quote(str(value))),
            datetime.datetime: self._date,
            DatetimeMS: self._date,
            Decimal128: lambda value: self._object1("$numberDecimal", _quote(decimal128_text(value))),
            bytes: lambda value: self._binary(value, 0),
            Binary: lambda value: self._binary(value, value.subtype),
            uuid.UUID: lambda value: self._binary(value.bytes, 4),
            Timestamp: self._timestamp,
            Regex: lambda value: self._regex(value.pattern, _regex_options(value.flags)),
            re.Pattern: lambda value: self._regex(value.pattern, _regex_options(value.flags)),
            MinKey: lambda value: self._object1("$minKey", "1"),
            MaxKey: lambda value: self._object1("$maxKey", "1"),
            Code: self._code,
            DBRef: lambda value: self._write(value.as_doc()),
        }
        self._fast = _FastPath(self.mode) if compact and self.mode != "extended" else None

    def __reduce__(self):  # rebuilt from its settings (the encoder functions cannot be pickled)
        return (_java_json_writer, (self.mode, self.compact))

    def dumps(self, value: Any) -> str:
        """The JSON text of ``value`` (a document, an array or a single BSON value)."""
        if self._fast is not None and type(value) in _CONTAINERS:  # a scalar is quicker value by value
            text = self._fast.text(value)
            if text is not None:
                return text
        return java_escape(self._write(value))

    def dumps_exact(self, value: Any) -> str:
        """:meth:`dumps` without the orjson fast path (the value-by-value writer)."""
        return java_escape(self._write(value))

    # -- values -----------------------------------------------------------------------------------
    def _write(self, value: Any) -> str:
        kind = type(value)
        if kind is dict:
            return self._document(value)
        if kind is list:
            return self._array(value)
        writer = self._scalars.get(kind)
        if writer is not None:
            return writer(value)
        if isinstance(value, Mapping):
            return self._document(value)
        if isinstance(value, (list, tuple)):
            return self._array(value)
        for base, writer in self._scalars.items():
            if isinstance(value, base) and base is not bool:
                return writer(value)
        raise TypeError(f"{type(value).__name__} is not a BSON value")

    def _fits_c(self, values: Any) -> bool:
        kinds = set(map(type, values))
        if not kinds <= self._plain:
            return False
        if int in kinds and self.mode == "strict":
            low, high = _INT32
            return all(low <= item < high for item in values if type(item) is int)
        return True

    def _document(self, document: Mapping[str, Any]) -> str:
        if not document:
            return "{}"
        if type(document) is dict and self._fits_c(document.values()):
            return self._c_encode(document)
        write = self._write
        return "{" + self._sep.join([_quote(str(k)) + ": " + write(v) for k, v in document.items()]) + "}"

    def _array(self, array: Any) -> str:
        if not array:
            return "[]"
        if type(array) is list and self._fits_c(array):
            return self._c_encode(array)
        write = self._write
        return "[" + self._sep.join([write(item) for item in array]) + "]"

    def _object1(self, name: str, text: str) -> str:
        return '{"' + name + '": ' + text + "}"

    def _int(self, value: int) -> str:
        low, high = _INT32
        if low <= value < high:  # BSON int32
            return str(value) if self._ints_plain else self._object1("$numberInt", '"' + str(value) + '"')
        return self._int64(value)

    def _int64(self, value: int) -> str:
        if self.mode == "relaxed":
            return str(int(value))
        return self._object1("$numberLong", '"' + str(int(value)) + '"')

    def _double(self, value: float) -> str:
        text = java_double(value)
        if self.mode == "extended" or (self.mode == "relaxed" and not math.isfinite(value)):
            return self._object1("$numberDouble", '"' + text + '"')
        return text

    def _date(self, value: Any) -> str:
        millis = _epoch_millis(value)
        if self.mode == "strict":
            return self._object1("$date", str(millis))
        if self.mode == "relaxed" and 0 <= millis <= _LAST_MS_OF_YEAR_9999:
            return self._object1("$date", '"' + java_date(millis) + '"')
        return self._object1("$date", self._object1("$numberLong", '"' + str(millis) + '"'))

    def _binary(self, data: bytes, subtype: int) -> str:
        encoded = '"' + base64.b64encode(bytes(data)).decode() + '"'
        kind = f'"{subtype:02X}"'
        if self.mode == "strict":
            return '{"$binary": ' + encoded + self._sep + '"$type": ' + kind + "}"
        return self._object1("$binary", '{"base64": ' + encoded + self._sep + '"subType": ' + kind + "}")

    def _timestamp(self, value: Timestamp) -> str:
        inner = '{"t": ' + str(value.time) + self._sep + '"i": ' + str(value.inc) + "}"
        return self._object1("$timestamp", inner)

    def _regex(self, pattern: str, options: str) -> str:
        if self.mode == "strict":
            return '{"$regex": ' + _quote(pattern) + self._sep + '"$options": ' + _quote(options) + "}"
        inner = '{"pattern": ' + _quote(pattern) + self._sep + '"options": ' + _quote(options) + "}"
        return self._object1("$regularExpression", inner)

    def _code(self, value: Code) -> str:
        if value.scope is None:
            return self._object1("$code", _quote(str(value)))
        return '{"$code": ' + _quote(str(value)) + self._sep + '"$scope": ' + self._write(value.scope) + "}"


# -- the orjson fast path -----------------------------------------------------------------------------
# A compact strict or relaxed JavaJsonWriter has orjson write the whole value (in Rust) and turns its
# compact text into the Java writer's by adding a space after every name's colon. orjson writes
# strings (ASCII escapes as json's; the non-ASCII characters Java escapes are rewritten as in
# java_escape), booleans, null, lists, tuples and dicts as the Java writer does; the BSON types go
# through _FastPath._default. A walk over the value first (_exact) sends to the value-by-value
# writer every value where orjson's text could differ:
# - a double outside [1e-3, 1e7) other than zero, NaN or an infinity: in that range orjson writes the
#   shortest decimal in plain notation, as Double.toString does (checked on ~600 000 doubles);
#   outside it the notations differ, and orjson writes NaN and infinities as null;
# - in strict mode a plain int outside int32 (the Java writer writes it as $numberLong);
# - a uuid.UUID (orjson writes it as a string), Code, DBRef, subclasses of mappings, sequences or
#   scalar types, anything not a BSON value.
# orjson refuses a str with lone surrogates or a dict key that is not a str: value by value too. And
# text where a '":' may not be a name's colon (see _COLONS) is written value by value.


class _Slow(Exception):
    """A value the fast path leaves to the value-by-value writer."""


_ORJSON_OPTIONS = (
    orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_DATACLASS
)
# In orjson's compact text a '"' is a string's delimiter unless escaped (\"). '":' is then a name's
# closing quote and its colon, a string's opening quote before a ':' the string starts with (after
# '{', '[', ',' or ':'), or an escaped quote before a ':' (after '\\'). With those five characters
# and the colon mapped to '#', text without '#"#' has a name's colon at every '":'. (The check also
# refuses, on the safe side, names ending in one of the five and strings starting with '{', '[', ','
# or an escape.)
_COLONS = bytes.maketrans(b"{[,:\\", b"#####")
_ASCII = bytes(range(128))
_VERBATIM: set[str] = set()  # non-ASCII characters seen that Java writes as they are
_LOW32, _HIGH32 = _INT32
# Leaves the exact walk lets orjson and _FastPath._default write (containers are walked).
_FAST_LEAVES = (_AS_IS - {uuid.UUID}) | {Int64}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _regex_pattern(value: Any) -> str:
    if type(value.pattern) is not str:
        raise _Slow
    return value.pattern


# The leaves orjson cannot write, as a strict (JsonMode.STRICT) and a relaxed writer has them.
def _strict_date(value: Any) -> Any:
    return {"$date": _epoch_millis(value)}


def _strict_binary(data: bytes, subtype: int) -> Any:
    return {"$binary": _b64(data), "$type": f"{subtype:02X}"}


def _strict_regex(value: Any) -> Any:
    return {"$regex": _regex_pattern(value), "$options": _regex_options(value.flags)}


def _strict_int64(value: Any) -> Any:
    return {"$numberLong": str(int(value))}


def _relaxed_date(value: Any) -> Any:
    millis = _epoch_millis(value)
    if 0 <= millis <= _LAST_MS_OF_YEAR_9999:
        return {"$date": java_date(millis)}
    return {"$date": {"$numberLong": str(millis)}}


def _relaxed_binary(data: bytes, subtype: int) -> Any:
    return {"$binary": {"base64": _b64(data), "subType": f"{subtype:02X}"}}


def _relaxed_regex(value: Any) -> Any:
    return {"$regularExpression": {"pattern": _regex_pattern(value), "options": _regex_options(value.flags)}}


class _FastPath:
    """orjson-based text of a compact strict or relaxed :class:`JavaJsonWriter` (see above)."""

    __slots__ = ("_strict", "_types", "_default")

    def __init__(self, mode: str):
        strict = self._strict = mode == "strict"
        if strict:
            date, binary, regex, int64 = _strict_date, _strict_binary, _strict_regex, _strict_int64
        else:
            date, binary, regex, int64 = _relaxed_date, _relaxed_binary, _relaxed_regex, int
        self._types: dict[type, Any] = {
            datetime.datetime: date,
            DatetimeMS: date,
            bytes: lambda value: binary(value, 0),
            Binary: lambda value: binary(value, value.subtype),
            Timestamp: lambda value: {"$timestamp": {"t": value.time, "i": value.inc}},
            Regex: regex,
            re.Pattern: regex,
            MinKey: lambda value: {"$minKey": 1},
            MaxKey: lambda value: {"$maxKey": 1},
            Int64: int64,
        }
        types = self._types

        def default(value: Any) -> Any:
            kind = type(value)
            if kind is ObjectId:  # the usual ones without a second call
                return {"$oid": str(value)}
            if kind is Decimal128:
                return {"$numberDecimal": decimal128_text(value)}
            writer = types.get(kind)
            if writer is None:  # not a leaf _exact lets through
                raise _Slow
            return writer(value)

        self._default = default

    def text(self, value: Any) -> str | None:
        """The Java writer's text of ``value`` (escaped as :func:`java_escape` does), or None where
        the fast path cannot tell that orjson's text becomes it."""
        if not _exact((value,), self._strict):
            return None
        try:
            data = orjson.dumps(value, default=self._default, option=_ORJSON_OPTIONS)
        except orjson.JSONEncodeError:
            return None
        if b'":' in data:
            if b'#"#' in data.translate(_COLONS):
                return None
            data = data.replace(b'":', b'": ')
        if data.isascii():
            return data.decode() if b"\x7f" not in data else java_escape(data.decode())
        # Only the non-ASCII characters Java does not write as they are need java_escape.
        text = data.decode()
        wide = set(data.translate(None, _ASCII).decode())
        if not wide <= _VERBATIM:
            for char in wide - _VERBATIM:
                if _java_char(char) != char:
                    return java_escape(text)
                _VERBATIM.add(char)
        return text if b"\x7f" not in data else java_escape(text)


def _exact(values: Any, strict: bool) -> bool:
    """Whether orjson writes every number of ``values`` (nested) as the Java writer does (doubles in
    [1e-3, 1e7) or zero; in ``strict`` mode ints within int32) and ``values`` hold nothing but
    containers and :data:`_FAST_LEAVES`."""
    for value in values:
        kind = type(value)
        if kind in _FAST_LEAVES:
            continue
        if kind is float:
            if not (value == 0 or 1e-3 <= abs(value) < 1e7):
                return False
        elif kind is int:
            if strict and not _LOW32 <= value < _HIGH32:
                return False
        elif kind is dict:
            if not _exact(value.values(), strict):
                return False
        elif kind is list or kind is tuple:
            if not _exact(value, strict):
                return False
        else:
            return False
    return True


def _java_json_writer(mode: str, compact: bool) -> JavaJsonWriter:
    return JavaJsonWriter(mode, compact=compact)


def document_writer(mode: str) -> JavaJsonWriter | Encoder:
    """The writer of ``before``/``after`` (and ``patch``/``filter``) for an ``extended.json.mode``:
    Debezium's ``JsonSerialization`` document settings (``strict``: ``COMPACT_JSON_SETTINGS``,
    ``relaxed``: ``SIMPLE_JSON_SETTINGS``, ``canonical``: ``EXTENDED_JSON_SETTINGS``); ``legacy``
    keeps this connector's earlier ``bson.json_util`` output (:class:`Encoder`)."""
    if mode == JsonMode.LEGACY:
        return Encoder(mode)
    return JavaJsonWriter(mode, compact=True)


def updated_fields_writer(mode: str) -> JavaJsonWriter | Encoder:
    """The writer of ``updateDescription.updatedFields``. With ``strict`` (the default) Debezium
    writes it with ``BsonDocument.toJson()``: relaxed mode in the driver's default layout
    (``{"a": 1, "b": 2}``); the other modes use their document settings."""
    if mode == JsonMode.STRICT:
        return JavaJsonWriter("relaxed", compact=False)
    return document_writer(mode)


def key_writer(key_mode: str) -> JavaJsonWriter:
    """The writer of the key's ``id`` for a ``key.json.mode``: ``relaxed`` is Debezium 2.x/3.x's
    ``JsonSerialization.getDocumentId`` (``SIMPLE_JSON_SETTINGS``); ``strict`` the strict mode of
    Debezium 1.x keys."""
    return JavaJsonWriter(key_mode, compact=True)
