"""The orjson fast path of the Java JSON writer (core/events/java_json.py ``_FastPath``) writes, byte for byte,
what the value-by-value writer (``JavaJsonWriter.dumps_exact``, checked against the Java driver in
test_debezium3_format.py and tests/interop) writes, for every ``extended.json.mode`` and writer
variant, on generated documents: every BSON type, nesting, unicode categories, doubles of all
magnitudes, integers at the int32/int64 borders, and the text shapes where orjson's compact text
cannot be turned into the Java writer's by adding a space after each name's colon.

Each test also checks that the fast path wrote the text itself where it should (so that the
comparison is not between the slow writer and itself).
"""

from __future__ import annotations

import datetime
import math
import random
import re
import struct
import uuid

import bson
import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.son import SON

from airflow_provider_mongocdc.core.events.extended_json import decimal128_text
from airflow_provider_mongocdc.core.events.java_json import (
    JavaJsonWriter,
    document_writer,
    key_writer,
    quote_text,
    updated_fields_writer,
)

pytestmark = pytest.mark.unit

MODES = ("strict", "relaxed", "canonical")


def writers() -> list[tuple[str, JavaJsonWriter]]:
    """Every Java writer variant the events use, and the non-compact layout of each mode."""
    out = []
    for mode in MODES:
        out.append((f"document[{mode}]", document_writer(mode)))
        out.append((f"updatedFields[{mode}]", updated_fields_writer(mode)))
        out.append((f"toJson[{mode}]", JavaJsonWriter(mode, compact=False)))
    for key_mode in ("strict", "relaxed"):
        out.append((f"key[{key_mode}]", key_writer(key_mode)))
    return out


# Characters of every Character.getType group the Java writer treats apart: controls, DEL, quote,
# backslash, letters of several scripts, marks, format characters, separators, private use,
# unassigned, modifier letters and symbols, astral characters (emoji, musical symbols).
CHARS = (
    [chr(code) for code in range(0x80)]
    + list("éÜñßøΩЖж日本語한국어")
    + ["\u0301", "\u0308", "\u20dd", "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u2028", "\u2029"]
    + ["\u00a0", "\u3000", "\u0085", "\ue000", "\uf8ff", "\u0378", "\u02b0", "\u02c6", "\u00a9", "\u20ac"]
    + ["\U0001f600", "\U0001f468\u200d\U0001f469", "\U0001d11e", "\U00010000", "\U0010fffd", "\ufffd"]
)
TRICKY_STRINGS = [
    "",
    ":",
    ":starts with a colon",
    'quote" before',
    '":',
    '\\":',
    "ends with a backslash\\",
    "{",
    "[",
    ",",
    "null",
    "1e+16",
    "12345678.5",
    "0.0001",
    "2147483648",
    "6f2a1c3e-8d4b-4f6a-9c2e-1b7d5e3a9f10",
    '{"$date": 1}',
]
TRICKY_KEYS = ["", ":", ":a", "a:", "a{", "a[", "a,", "a\\", 'a"', "{", "[", ",", "\\", "$oid", "é", "\u200b"]


def doubles(rng: random.Random) -> list[float]:
    fixed = [0.0, -0.0, 1.0, -1.0, 0.1, 1e-3, -1e-3, 9.999999999999998e-4, 1e7, 9999999.999999998, -1e7]
    fixed += [1e16, 1e-5, 1e-4, 1e15, 9.5e15, 1e22, 1e-7, 5e-324, -5e-324, 1e-323, 2.2250738585072014e-308]
    fixed += [2.225073858507201e-308, 1.7976931348623157e308, -1.7976931348623157e308, 123456789.0, 0.5]
    fixed += [math.nan, math.inf, -math.inf, 4.35, 2.0**53, 2.0**63, 1 / 3, 100.0, 12345678.9]
    drawn = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(40)]
    drawn += [rng.uniform(-1, 1) * 10 ** rng.uniform(-330, 308) for _ in range(40)]
    drawn += [rng.uniform(-1, 1) * 10 ** rng.uniform(-4, 8) for _ in range(80)]
    drawn += [rng.uniform(0, 1) * 2.2250738585072014e-308 for _ in range(10)]  # subnormals
    return fixed + drawn


INTS = [0, 1, -1, 2**31 - 1, -(2**31), 2**31, -(2**31) - 1, 2**53, 2**63 - 1, -(2**63), 10**9, 2 * 10**9]
INT64S = [Int64(0), Int64(5), Int64(-7), Int64(2**31), Int64(2**63 - 1), Int64(-(2**63))]


def scalars(rng: random.Random) -> list:
    text = "".join(rng.choice(CHARS) for _ in range(rng.randrange(0, 12)))
    return [
        rng.choice(doubles(rng)),
        rng.choice(INTS),
        rng.choice(INT64S),
        text,
        rng.choice(TRICKY_STRINGS),
        rng.choice([True, False, None]),
        ObjectId(bytes(rng.randrange(256) for _ in range(12))),
        datetime.datetime(1970, 1, 1) + datetime.timedelta(milliseconds=rng.randrange(-(10**13), 10**13)),
        rng.choice(
            [
                datetime.datetime(1, 1, 1),
                datetime.datetime(9999, 12, 31, 23, 59, 59, 999999),
                datetime.datetime(2024, 1, 1, 5, 30, tzinfo=datetime.timezone(datetime.timedelta(hours=5))),
                DatetimeMS(-5),
                DatetimeMS(2**62),
                DatetimeMS(253402300800000),
            ]
        ),
        Decimal128(
            f"{'-' if rng.random() < 0.5 else ''}{rng.randrange(10 ** rng.randrange(1, 34))}E{rng.randrange(-40, 10)}"
        ),
        rng.choice([Decimal128("NaN"), Decimal128("-Infinity"), Decimal128("1E+6144"), Decimal128("-0.000")]),
        Binary(
            bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20))), rng.choice([0, 1, 2, 3, 5, 0x80])
        ),
        bytes(rng.randrange(256) for _ in range(rng.randrange(0, 20))),
        Binary(uuid.UUID(int=rng.getrandbits(128)).bytes, 4),
        uuid.UUID(int=rng.getrandbits(128)),
        Timestamp(rng.randrange(2**32), rng.randrange(2**32)),
        Regex('^a"b\\\\c' + text, rng.choice(["", "i", "imsx", "u"])),
        Regex("x", re.I | re.M),
        re.compile("a.b", re.S),
        rng.choice([MinKey(), MaxKey()]),
        Code("function () { return 1; }"),
        Code("f(x)", {"x": rng.choice(doubles(rng)), "n": Int64(3)}),
        DBRef("things", ObjectId(b"\x01" * 12), "db", extra=1.5),
        SON([("b", 1), ("a", 2.5)]),
        (1, "tuple"),
    ]


def generated(rng: random.Random, depth: int = 0) -> dict:
    document = {}
    for _ in range(rng.randrange(0, 8)):
        key = rng.choice(TRICKY_KEYS) if rng.random() < 0.1 else f"k{rng.randrange(1000)}"
        roll = rng.random()
        if roll < 0.15 and depth < 4:
            value = generated(rng, depth + 1)
        elif roll < 0.3 and depth < 4:
            value = [
                generated(rng, depth + 1) if rng.random() < 0.3 else rng.choice(scalars(rng))
                for _ in range(rng.randrange(0, 5))
            ]
        else:
            value = rng.choice(scalars(rng))
        document[key] = value
    return document


def plain_document(rng: random.Random, index: int) -> dict:
    """A usual document: no value the fast path leaves to the slow writer."""
    return {
        "_id": ObjectId(),
        "customer_id": Int64(rng.randrange(1, 10**12)),
        "name": f"Customer {index} Ünïcødé 日本",
        "score": rng.random() * 100,
        "zero": -0.0,
        "balance": Decimal128(f"{rng.randrange(10**7)}.{rng.randrange(100):02d}"),
        "created": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=rng.randrange(10**8)),
        "tags": [f"tag{rng.randrange(50)}" for _ in range(3)],
        "empty": {"document": {}, "array": []},
        "orders": [{"qty": rng.randrange(-(2**31), 2**31), "ts": Timestamp(1_700_000_000, 3)}],
        "avatar": Binary(bytes(rng.randrange(256) for _ in range(16)), 0),
        "notes": 'a "quoted" text: with a colon, a backslash \\ and a tab\t.',
    }


def roundtrip(document: dict) -> dict | None:
    """The document as a default pymongo client returns it (None when BSON cannot hold it)."""
    try:
        raw = bson.encode(document)
    except Exception:
        return None
    return bson.decode(raw, codec_options=CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO))


def check(writer: JavaJsonWriter, value) -> bool:
    """Fast text == exact text; returns whether the fast path wrote it."""
    fast = writer._fast.text(value) if writer._fast is not None else None
    exact = writer.dumps_exact(value)
    assert writer.dumps(value) == exact
    if fast is not None:
        assert fast == exact, f"fast path text differs for {value!r}"
    return fast is not None


@pytest.mark.parametrize(("name", "writer"), writers(), ids=[name for name, _ in writers()])
def test_fast_path_text_equals_the_exact_writers_on_generated_documents(name, writer):
    rng = random.Random(f"fast-path-{name}")
    taken = total = 0
    for _ in range(400):
        document = generated(rng)
        for value in (document, roundtrip(document)):
            if value is None:
                continue
            try:
                exact = writer.dumps_exact(value)
            except TypeError:  # not a BSON value: the fast path must not write it either
                with pytest.raises(TypeError):
                    writer.dumps(value)
                continue
            assert writer.dumps(value) == exact
            total += 1
            taken += check(writer, value)
    assert total > 400
    if writer._fast is not None:
        assert taken > total // 5, f"the fast path wrote only {taken} of {total} documents"


def test_the_compact_strict_and_relaxed_writers_have_the_fast_path():
    with_fast = {name for name, writer in writers() if writer._fast is not None}
    # updatedFields in relaxed mode is the relaxed document writer (compact); in strict mode it is
    # BsonDocument.toJson()'s layout, value by value, as are the non-compact and canonical writers.
    expected = {
        "document[strict]",
        "document[relaxed]",
        "updatedFields[relaxed]",
        "key[strict]",
        "key[relaxed]",
    }
    assert with_fast == expected


@pytest.mark.parametrize(("name", "writer"), writers(), ids=[name for name, _ in writers()])
def test_usual_documents_take_the_fast_path(name, writer):
    rng = random.Random(11)
    for index in range(200):
        document = plain_document(rng, index)
        for value in (document, roundtrip(document)):
            taken = check(writer, value)
            assert taken == (writer._fast is not None), f"{name}: fast path {taken} for {value!r}"


@pytest.mark.parametrize("mode", ["strict", "relaxed"])
def test_every_double_magnitude_and_scalar_alone_in_a_document_and_an_array(mode):
    writer = document_writer(mode)
    rng = random.Random(5)
    values = doubles(rng) + INTS + INT64S + scalars(rng) + [2**64, -(2**64)]
    values += [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(3000)]
    values += [rng.uniform(-1, 1) * 10 ** rng.uniform(-3, 7) for _ in range(3000)]
    for value in values:
        for wrapped in (value, {"v": value}, [value, {"w": [value]}]):
            check(writer, wrapped)


@pytest.mark.parametrize("mode", ["strict", "relaxed"])
def test_every_character_in_keys_and_strings(mode):
    writer = document_writer(mode)
    for char in CHARS + TRICKY_STRINGS + ["\ud800", "\udc00a", "a\ud83d"]:
        for value in ({"s": char, "t": "x" + char + "y"}, {char: 1, "a" + char: [char]}, [char]):
            check(writer, value)
    # Characters Java writes as they are (letters) take the fast path; others are escaped exactly.
    assert writer._fast.text({"s": "Ünïcødé 日本語"}) == '{"s": "Ünïcødé 日本語"}'
    assert writer.dumps({"s": "a\u200bb\U0001f600\x7f"}) == '{"s": "a\\u200bb\\ud83d\\ude00\\u007f"}'


def test_the_fast_path_refuses_what_it_cannot_write_and_the_exact_writer_writes_it():
    strict, relaxed = document_writer("strict"), document_writer("relaxed")
    refused = [
        {"d": 1e16},
        {"d": 1e-4},
        {"d": math.nan},
        {"u": uuid.UUID(int=5)},
        {"c": Code("x", {"d": 1.5})},
        {"a": 'x":y'},
        {'k":': 1},
        {"a": ":b"},
        {"s": "\ud800"},
        {1: "int key"},
    ]
    for value in refused:
        assert strict._fast.text(value) is None, value
        assert relaxed._fast.text(value) is None, value
    assert strict._fast.text({"i": 2**31}) is None
    assert strict.dumps({"i": 2**31}) == '{"i": {"$numberLong": "2147483648"}}'
    assert relaxed._fast.text({"i": 2**31}) == '{"i": 2147483648}'
    assert strict.dumps({"d": 1e16, "n": math.nan}) == '{"d": 1.0E16,"n": NaN}'
    assert relaxed.dumps({"n": -math.inf}) == '{"n": {"$numberDouble": "-Infinity"}}'


def test_decimal128_text_is_decimals_string():
    rng = random.Random(3)
    values = [
        Decimal128(f"{sign}{c}E{e}")
        for e in range(-6176, 6112, 61)
        for c in (0, 1, 10, 10**34 - 1)
        for sign in "+-"
    ]
    for _ in range(20000):
        c = rng.randrange(10 ** rng.randrange(1, 35))
        values.append(Decimal128(f"{'-' if rng.random() < 0.5 else ''}{c}E{rng.randrange(-60, 20)}"))
    for value in values:
        assert decimal128_text(value) == str(value)


def test_quote_text_is_json_encode_basestring():
    from json.encoder import encode_basestring

    rng = random.Random(9)
    writer = document_writer("strict")
    texts = [writer.dumps(generated(rng)) for _ in range(300)]
    texts += ["".join(CHARS), "\ud800 lone", 'a"b\\c\x00\x7f', ""] + TRICKY_STRINGS
    for text in texts:
        assert quote_text(text) == encode_basestring(text)
