"""The json_util-based encoder (core/events/java_json.py ``Encoder``) writes, byte for byte, what
``bson.json_util.dumps`` writes with the JSONOptions of each mode, for every BSON type.

Events use ``Encoder`` for ``extended.json.mode=legacy`` only; the other modes, keys and
``updatedFields`` are written as the MongoDB Java driver writes them for Debezium 3.x
(``JavaJsonWriter``, with explicit expected Java output in tests/unit/test_debezium3_format.py).
``Encoder`` keeps its json_util identity in every mode, which is what this module checks.

The JSONOptions per mode are written out here rather than taken from the encoder, so that a change
of the mode mapping shows too. The layout arguments are the encoder's documented ones: ``","``
between members and ``": "`` after names (the Java driver's layout that Debezium writes), and UTF-8
text rather than ``\\u`` escapes. Each value is checked on its own, inside a document and an array,
and as a default pymongo client returns it after a BSON round trip (what the connector encodes).
"""

from __future__ import annotations

import datetime
import math
import re
import uuid

import bson
import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp, json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.json_util import DatetimeRepresentation, JSONMode, JSONOptions

from airflow_provider_mongocdc.core.config.enums import JSON_MODES
from airflow_provider_mongocdc.core.events.extended_json import Encoder

pytestmark = pytest.mark.unit

LAYOUT = {"separators": (",", ": "), "ensure_ascii": False}
OPTIONS = {
    # Debezium's "strict": the Java driver's JsonMode.STRICT ($numberLong, $date as epoch ms).
    "strict": JSONOptions(
        json_mode=JSONMode.LEGACY,
        strict_number_long=True,
        datetime_representation=DatetimeRepresentation.LEGACY,
        uuid_representation=UuidRepresentation.STANDARD,
    ),
    "legacy": JSONOptions(
        json_mode=JSONMode.LEGACY,
        datetime_representation=DatetimeRepresentation.LEGACY,
        uuid_representation=UuidRepresentation.STANDARD,
    ),
    "relaxed": JSONOptions(json_mode=JSONMode.RELAXED, uuid_representation=UuidRepresentation.STANDARD),
    "canonical": JSONOptions(json_mode=JSONMode.CANONICAL, uuid_representation=UuidRepresentation.STANDARD),
}

OID = ObjectId("596e275826f08b2730779e1f")
UUID4 = uuid.UUID("6f2a1c3e-8d4b-4f6a-9c2e-1b7d5e3a9f10")
UUID3 = uuid.uuid3(uuid.NAMESPACE_DNS, "example.org")

VALUES = {
    # double
    "double": 12.34,
    "double_whole": 10.0,
    "double_small": 1e-07,
    "double_large": 1e22,
    "double_max": 1.7976931348623157e308,
    "double_min_subnormal": 5e-324,
    "double_negative_zero": -0.0,
    "double_nan": float("nan"),
    "double_inf": float("inf"),
    "double_negative_inf": float("-inf"),
    # int32 / int64
    "int32": 2_147_483_647,
    "int32_min": -2_147_483_648,
    "int32_zero": 0,
    "int64": Int64(9_223_372_036_854_775_807),
    "int64_min": Int64(-9_223_372_036_854_775_808),
    "int64_small": Int64(5),
    "int_beyond_int32": 2**40,
    # Decimal128
    "decimal": Decimal128("1234567890.123456789012345678901234"),
    "decimal_trailing_zero": Decimal128("1.10"),
    "decimal_negative_zero": Decimal128("-0.000"),
    "decimal_exponent": Decimal128("1E+6144"),
    "decimal_tiny": Decimal128("1E-6176"),
    "decimal_max": Decimal128("9.999999999999999999999999999999999E+6144"),
    "decimal_nan": Decimal128("NaN"),
    "decimal_negative_nan": Decimal128("-NaN"),
    "decimal_snan": Decimal128("sNaN"),
    "decimal_inf": Decimal128("Infinity"),
    "decimal_negative_inf": Decimal128("-Infinity"),
    # A coefficient above 10**34 - 1: a non-canonical encoding, whose value is zero.
    "decimal_non_canonical": Decimal128.from_bid(((0x3040 << 112) | (10**34)).to_bytes(16, "little")),
    # string
    "string": "plain",
    "string_empty": "",
    "string_astral": "emoji \U0001f600 clef \U0001d11e",
    "string_control": "nul \x00 soh \x01 us \x1f del \x7f tab \t newline \n cr \r",
    "string_escapes": 'quote " backslash \\ slash / ',
    "string_unicode": "Ünïcødé \u2028 \u2029 \ufeff \u00a0 日本語",
    # ObjectId, bool, null
    "objectid": OID,
    "true": True,
    "false": False,
    "null": None,
    # datetime
    "datetime": datetime.datetime(2024, 2, 29, 23, 59, 59, 999000),
    "datetime_microseconds": datetime.datetime(2024, 1, 1, 12, 0, 0, 123456),
    "datetime_aware_utc": datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
    "datetime_aware_offset": datetime.datetime(
        2024, 1, 1, 5, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=5, minutes=30))
    ),
    "datetime_epoch": datetime.datetime(1970, 1, 1),
    "datetime_pre_1970": datetime.datetime(1960, 6, 15, 8, 30),
    "datetime_1901": datetime.datetime(1901, 12, 13, 20, 45, 52, 1000),
    "datetime_year_1": datetime.datetime(1, 1, 1),
    "datetime_year_9999": datetime.datetime(9999, 12, 31, 23, 59, 59, 999000),
    "datetime_ms_negative": DatetimeMS(-5),
    "datetime_ms_beyond_9999": DatetimeMS(2**62),
    "datetime_ms_before_year_1": DatetimeMS(-(2**62)),
    # regex
    "regex": Regex("^a.*b$", "imsx"),
    "regex_flags_lu": Regex("caf\u00e9", "lu"),
    "regex_no_flags": Regex("x+"),
    "regex_compiled": re.compile("b.c", re.I | re.M | re.S | re.X),
    # JavaScript
    "code": Code("function () { return 1; }"),
    "code_with_scope": Code("function () { return x; }", {"x": Int64(1), "y": [1, "z"]}),
    "code_with_empty_scope": Code("x", {}),
    # Timestamp
    "timestamp": Timestamp(1_700_000_000, 7),
    "timestamp_zero": Timestamp(0, 0),
    "timestamp_max": Timestamp(2**32 - 1, 2**32 - 1),
    # binary, every subtype
    "binary_generic": Binary(b"\x00\x01\xfe\xff", 0),
    "binary_empty": Binary(b"", 0),
    "binary_bytes": b"raw bytes",
    "binary_function": Binary(b"fn", 1),
    "binary_old": Binary(b"old binary", 2),
    "binary_uuid_legacy": Binary(UUID3.bytes, 3),
    "binary_uuid": Binary(UUID4.bytes, 4),
    "uuid_object": UUID4,
    "binary_md5": Binary(bytes(range(16)), 5),
    "binary_encrypted": Binary(b"\x01encrypted", 6),
    "binary_column": Binary(b"\x01column", 7),
    "binary_sensitive": Binary(b"sensitive", 8),
    "binary_vector": Binary(b"\x03\x00\x01\x02", 9),
    "binary_user_defined": Binary(b"user", 0x80),
    "binary_user_defined_max": Binary(b"user", 0xFF),
    # MinKey, MaxKey, DBRef
    "minkey": MinKey(),
    "maxkey": MaxKey(),
    "dbref": DBRef("orders", OID),
    "dbref_database": DBRef("orders", 5, "shop"),
    "dbref_extra": DBRef("orders", "k", "shop", note="extra", n=Int64(2)),
    # documents and arrays
    "document_empty": {},
    "array_empty": [],
    "document_nested": {"a": {"b": {"c": [1, {"d": Int64(2), "e": {"f": Decimal128("1.5")}}]}}, "g": {}},
    "array_nested": [[1, [2, [Int64(3), [{"x": [Timestamp(1, 2)]}]]]], []],
}
VALUES["array_mixed"] = [
    value for name, value in VALUES.items() if not name.startswith(("document", "array"))
]
VALUES["document_mixed"] = {name: value for name, value in VALUES.items() if name != "array_mixed"}

# Where the encoder writes something else than json_util, on purpose (see core/events/java_json.py): in the
# strict and legacy modes json_util writes a non-finite double as the bare word NaN, Infinity or
# -Infinity, which is not JSON; the encoder writes {"$numberDouble": "NaN"} (Extended JSON v2),
# which JSON parsers read and json_util.loads turns back into the float.
NON_FINITE = {"double_nan", "double_inf", "double_negative_inf", "array_mixed", "document_mixed"}
NOT_JSON = (
    "json_util writes a non-finite double as a bare NaN/Infinity/-Infinity (not JSON) in this mode; "
    'the encoder writes {"$numberDouble": ...} instead'
)


def expected_difference(mode: str, name: str) -> str | None:
    if mode in ("strict", "legacy") and name in NON_FINITE:
        return NOT_JSON
    return None


def as_pymongo_returns(value):
    """``value`` inside a document, encoded to BSON and decoded as the connector's clients decode
    (default UUID representation; dates out of Python's range as DatetimeMS)."""
    raw = bson.encode(
        {"v": value}, codec_options=CodecOptions(uuid_representation=UuidRepresentation.STANDARD)
    )
    return bson.decode(raw, codec_options=CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO))


def shapes(value) -> dict:
    return {
        "value": value,
        "in_document": {"_id": 1, "v": value, "n": [value, {"w": value}]},
        "from_bson": as_pymongo_returns(value),
    }


def cases():
    for mode in JSON_MODES:
        for name in VALUES:
            reason = expected_difference(mode, name)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            yield pytest.param(mode, name, id=f"{mode}-{name}", marks=marks)


def test_every_mode_the_configuration_accepts_is_checked():
    assert set(JSON_MODES) == set(OPTIONS), "a new extended.json.mode needs its JSONOptions here"


@pytest.mark.parametrize(("mode", "name"), list(cases()))
def test_encoder_writes_what_json_util_writes(mode, name):
    encoder = Encoder(mode)
    for shape, value in shapes(VALUES[name]).items():
        expected = json_util.dumps(value, json_options=OPTIONS[mode], **LAYOUT).encode("utf-8")
        written = encoder.dumps(value).encode("utf-8")
        assert written == expected, (
            f"{mode} {name} ({shape}):\n ours:      {written!r}\n json_util: {expected!r}"
        )


@pytest.mark.parametrize("mode", ["strict", "legacy"])
@pytest.mark.parametrize("name", ["double_nan", "double_inf", "double_negative_inf"])
def test_non_finite_doubles_are_json_and_read_back(mode, name):
    # The documented difference above: valid JSON, read back by json_util as the same float.
    value = VALUES[name]
    text = Encoder(mode).dumps({"v": value})
    word = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    assert text == f'{{"v": {{"$numberDouble": "{word}"}}}}'
    back = json_util.loads(text, json_options=OPTIONS[mode])["v"]
    assert (math.isnan(back) and math.isnan(value)) or back == value
