"""Declared columns' values (core/apply/values.py) over every BSON value the connector's writers (and
Debezium's, the Java driver's) can put in a document: each value either fits a declared type, with the
value a SQL cast gives, or is a counted misfit (null in the column, kept in ``_doc``); never an
exception that would stop the apply."""

from __future__ import annotations

import datetime
import math
import random
import uuid
from decimal import Decimal
from typing import Any

import pytest
from bson import Binary, Code, DBRef, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS

from airflow_provider_mongocdc.core.apply.layout import DeclaredColumn, TableLayout
from airflow_provider_mongocdc.core.apply.values import Misfits, column_values, convert
from airflow_provider_mongocdc.core.events.java_json import document_writer

pytestmark = pytest.mark.unit

MODES = ("strict", "relaxed", "canonical", "legacy")
TYPES = (
    "string",
    "long",
    "integer",
    "short",
    "byte",
    "double",
    "float",
    "boolean",
    "date",
    "timestamp",
    "binary",
    "decimal(12,2)",
)
INTS = ("long", "integer", "short", "byte")
FLOATS = ("double", "float")
UTC = datetime.timezone.utc
MISFIT = object()  # the expectation of a value that does not fit its column

# Valid BSON dates Python's datetime cannot hold: one millisecond before 0001-01-01 and 10000-01-01.
BEFORE_YEAR_1 = -62_135_596_800_001
AFTER_9999 = 253_402_300_800_000
OID = ObjectId("596e275826f08b2730779e1f")
UUID = uuid.UUID("87654321-4321-8765-4321-876543218765")


def numbers(value: Any, ints: tuple[str, ...] = INTS, decimal: Any = MISFIT, floats: Any = None) -> dict:
    """The expectations of a number: the same value in the integer columns named, ``floats`` (or
    float(value)) in double and float, ``decimal`` in decimal(12,2)."""
    expected: dict[str, Any] = {name: int(value) for name in ints}
    expected.update(dict.fromkeys(FLOATS, float(value) if floats is None else floats))
    expected["decimal(12,2)"] = decimal
    return expected


def moment(value: datetime.datetime) -> dict:
    return {"timestamp": value.replace(tzinfo=UTC), "date": value.date()}


def everywhere(value: Any) -> dict:
    return dict.fromkeys(TYPES, value)


# name: (the value as a pymongo client returns it, {type: the column's value}); a type not named
# is a misfit.
BSON_VALUES: dict[str, tuple[Any, dict]] = {
    "int32 7": (7, numbers(7, decimal=Decimal("7.00"))),
    "int32 0": (0, numbers(0, decimal=Decimal("0.00"))),
    "int32 -128": (-128, numbers(-128, decimal=Decimal("-128.00"))),
    "int32 128": (128, numbers(128, INTS[:3], Decimal("128.00"))),
    "int32 -32768": (-32768, numbers(-32768, INTS[:3], Decimal("-32768.00"))),
    "int32 32768": (32768, numbers(32768, INTS[:2], Decimal("32768.00"))),
    "int32 max": (2**31 - 1, numbers(2**31 - 1, INTS[:2], Decimal("2147483647.00"))),
    "int32 min": (-(2**31), numbers(-(2**31), INTS[:2], Decimal("-2147483648.00"))),
    "int64 5": (Int64(5), numbers(5, decimal=Decimal("5.00"))),
    "int64 2^31": (Int64(2**31), numbers(2**31, INTS[:1], Decimal("2147483648.00"))),
    "int64 max": (Int64(2**63 - 1), numbers(2**63 - 1, INTS[:1])),
    "int64 min": (Int64(-(2**63)), numbers(-(2**63), INTS[:1])),
    "double 12.34": (12.34, numbers(12.34, (), Decimal("12.34"))),
    "double 0.1": (0.1, numbers(0.1, (), Decimal("0.10"))),
    "double 1/3": (1 / 3, numbers(1 / 3, ())),
    "double 10.0": (10.0, numbers(10, decimal=Decimal("10.00"))),
    "double -0.0": (-0.0, numbers(0, decimal=Decimal("0.00"), floats=-0.0)),
    "double 127.0": (127.0, numbers(127, decimal=Decimal("127.00"))),
    "double -129.0": (-129.0, numbers(-129, INTS[:3], Decimal("-129.00"))),
    "double 2^53": (2.0**53, numbers(2**53, INTS[:1])),
    "double 2^63": (2.0**63, numbers(2**63, ())),
    "double 1e20": (1e20, numbers(1e20, ())),
    "double 1e300": (1e300, {"double": 1e300}),
    "double 1e-7": (1e-7, numbers(1e-7, ())),
    "double 5e-324": (5e-324, numbers(5e-324, ())),
    "double NaN": (math.nan, dict.fromkeys(FLOATS, math.nan)),
    "double Infinity": (math.inf, dict.fromkeys(FLOATS, math.inf)),
    "double -Infinity": (-math.inf, dict.fromkeys(FLOATS, -math.inf)),
    "decimal 12.5": (Decimal128("12.5"), numbers(12.5, (), Decimal("12.50"))),
    "decimal 12.00": (Decimal128("12.00"), numbers(12, decimal=Decimal("12.00"))),
    "decimal 1E+3": (Decimal128("1E+3"), numbers(1000, INTS[:3], Decimal("1000.00"))),
    "decimal -0.000": (Decimal128("-0.000"), numbers(0, decimal=Decimal("0.00"), floats=-0.0)),
    "decimal 0.005": (Decimal128("0.005"), numbers(0.005, ())),
    "decimal int64 max": (Decimal128("9223372036854775807"), numbers(2**63 - 1, INTS[:1])),
    "decimal int64 max + 1": (Decimal128("9223372036854775808"), numbers(2**63, ())),
    "decimal 34 digits": (
        Decimal128("1234567890.123456789012345678901234"),
        numbers(Decimal("1234567890.123456789012345678901234"), ()),
    ),
    "decimal 1E+6144": (Decimal128("1E+6144"), {}),
    "decimal 1E-6176": (Decimal128("1E-6176"), dict.fromkeys(FLOATS, 0.0)),
    "decimal -1E+40": (Decimal128("-1E+40"), {"double": -1e40}),
    "decimal NaN": (Decimal128("NaN"), dict.fromkeys(FLOATS, math.nan)),
    "decimal Infinity": (Decimal128("Infinity"), dict.fromkeys(FLOATS, math.inf)),
    "decimal -Infinity": (Decimal128("-Infinity"), dict.fromkeys(FLOATS, -math.inf)),
    "true": (True, {"boolean": True}),
    "false": (False, {"boolean": False}),
    "string": ("plain ascii", {"string": "plain ascii"}),
    "string of digits": ("12", {"string": "12"}),
    "empty string": ("", {"string": ""}),
    "unicode string": ("Grüße, 東京, \U0001f600, \u2028", {"string": "Grüße, 東京, \U0001f600, \u2028"}),
    "string NaN": ("NaN", {"string": "NaN"}),
    "null": (None, everywhere(None)),
    "objectid": (OID, {"string": "596e275826f08b2730779e1f"}),
    "date": (
        datetime.datetime(2024, 2, 29, 23, 59, 59, 999000),
        moment(datetime.datetime(2024, 2, 29, 23, 59, 59, 999000)),
    ),
    "date before 1970": (
        datetime.datetime(1901, 12, 13, 20, 45, 52, 1000),
        moment(datetime.datetime(1901, 12, 13, 20, 45, 52, 1000)),
    ),
    "date 1970": (datetime.datetime(1970, 1, 1), moment(datetime.datetime(1970, 1, 1))),
    "date year 1": (datetime.datetime(1, 1, 1), moment(datetime.datetime(1, 1, 1))),
    "date end of 9999": (
        datetime.datetime(9999, 12, 31, 23, 59, 59, 999000),
        moment(datetime.datetime(9999, 12, 31, 23, 59, 59, 999000)),
    ),
    "date before year 1": (DatetimeMS(BEFORE_YEAR_1), {}),
    "date after 9999": (DatetimeMS(AFTER_9999), {}),
    "date far after 9999": (DatetimeMS(2**62), {}),
    "date far before year 1": (DatetimeMS(-(2**63)), {}),
    "timestamp": (Timestamp(1_700_000_000, 42), {}),
    "bytes": (b"\x00\x01\xff", {"binary": b"\x00\x01\xff"}),
    "empty bytes": (b"", {"binary": b""}),
    **{
        f"binary subtype {subtype}": (Binary(b"data", subtype), {"binary": b"data"})
        for subtype in (1, 2, 5, 6, 7, 8, 0x80)
    },
    "uuid subtype 3": (Binary(UUID.bytes, 3), {"binary": UUID.bytes}),
    "uuid subtype 4": (Binary(UUID.bytes, 4), {"binary": UUID.bytes}),
    "regex": (Regex("^ab.*c$", "imsx"), {}),
    "code": (Code("function () { return 1; }"), {}),
    "code with scope": (Code("function () { return x; }", {"x": Int64(1), "y": [1, "two"]}), {}),
    "minkey": (MinKey(), {}),
    "maxkey": (MaxKey(), {}),
    "dbref": (DBRef("customers", OID, "inventory"), {}),
    "document": ({"a": 1, "b": {"c": "d"}}, {}),
    "empty document": ({}, {}),
    "document of $-names": ({"$leading": "and nested $ names"}, {}),
    "document of a wrapper's name": ({"$date": "garbage"}, {}),
    "array": ([1, "two", 3.0], {}),
    "empty array": ([], {}),
}

# JSON texts only other writers put in documents: the Java driver's (Debezium's own topics, symbols and
# undefined as it reads them from BSON) and hand-made ones.
FOREIGN_TEXTS: dict[str, tuple[str, dict]] = {
    "bare NaN": ("NaN", dict.fromkeys(FLOATS, math.nan)),
    "bare Infinity": ("Infinity", dict.fromkeys(FLOATS, math.inf)),
    "bare -Infinity": ("-Infinity", dict.fromkeys(FLOATS, -math.inf)),
    "java 1.0E22": ("1.0E22", numbers(1e22, ())),
    "java 4.9E-324": ("4.9E-324", numbers(5e-324, ())),
    "strict date before year 1": (f'{{"$date": {BEFORE_YEAR_1}}}', {}),
    "canonical date before year 1": (f'{{"$date": {{"$numberLong": "{BEFORE_YEAR_1}"}}}}', {}),
    "canonical date after 9999": (f'{{"$date": {{"$numberLong": "{AFTER_9999}"}}}}', {}),
    "date beyond int64": ('{"$date": {"$numberLong": "99999999999999999999999"}}', {}),
    "date 1e300": ('{"$date": 1e300}', {}),
    "date garbage": ('{"$date": "garbage"}', {}),
    "date empty": ('{"$date": ""}', {}),
    "date with offset": (
        '{"$date": "2024-01-01T05:30:00.5+05:30"}',
        moment(datetime.datetime(2024, 1, 1, 0, 0, 0, 500000)),
    ),
    "symbol": ('{"$symbol": "sym"}', {"string": "sym"}),
    "undefined": ('{"$undefined": true}', everywhere(None)),
    "dbpointer": ('{"$dbPointer": {"$ref": "c", "$id": {"$oid": "596e275826f08b2730779e1f"}}}', {}),
    "int beyond int64": (str(10**30), {"double": 1e30, "float": 1e30}),
    "int beyond double": (str(10**400), {}),
    "numberLong garbage": ('{"$numberLong": "x"}', {}),
    "numberInt beyond int32": ('{"$numberInt": "99999999999"}', numbers(99999999999, INTS[:1])),
    "numberDecimal garbage": ('{"$numberDecimal": "zz"}', {}),
    "numberDouble garbage": ('{"$numberDouble": "zz"}', {}),
    "oid garbage": ('{"$oid": "zz"}', {}),
    "uuid garbage": ('{"$uuid": "zz"}', {}),
    "binary garbage": ('{"$binary": 5}', {}),
    "binary bad base64": ('{"$binary": {"base64": "abc", "subType": "00"}}', {}),
    "timestamp negative": ('{"$timestamp": {"t": -1, "i": 1}}', {}),
    "regex of a number": ('{"$regex": 5}', {}),
    "code garbage": ('{"$code": "f", "x": 1}', {}),
}


def layout_of_every_type(path: str = "f") -> TableLayout:
    return TableLayout(tuple(DeclaredColumn(f"c{index}", path, name) for index, name in enumerate(TYPES)))


def same(got: Any, expected: Any) -> bool:
    """Equal and of the same type (NaN equals NaN, a float's sign counts)."""
    if type(got) is not type(expected):
        return False
    if isinstance(expected, float):
        if math.isnan(expected):
            return math.isnan(got)
        return got == expected and math.copysign(1.0, got) == math.copysign(1.0, expected)
    if isinstance(expected, datetime.datetime):
        return got == expected and got.utcoffset() == expected.utcoffset()
    return got == expected


def check_row(document_text: str, expected: dict, what: str) -> None:
    layout = layout_of_every_type()
    misfits = Misfits()
    values = column_values(layout, "1", document_text, misfits)
    wrong = []
    for column, got in zip(layout.declared, values):
        want = expected.get(column.type, MISFIT)
        if want is MISFIT:
            if got is not None or misfits.counts.get(column.name) != 1:
                wrong.append(
                    f"{column.type}: {got!r}, counted {misfits.counts.get(column.name)}, expected a misfit"
                )
        elif not same(got, want) or column.name in misfits.counts:
            wrong.append(f"{column.type}: {got!r} ({type(got).__name__}), expected {want!r}")
    assert not wrong, f"{what} in {document_text}: " + "; ".join(wrong)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", list(BSON_VALUES))
def test_every_bson_value_fits_or_is_a_misfit_of_every_declared_type(mode, name):
    value, expected = BSON_VALUES[name]
    text = document_writer(mode).dumps({"_id": 1, "f": value})
    check_row(text, expected, f"{name} ({mode})")


@pytest.mark.parametrize("name", list(FOREIGN_TEXTS))
def test_values_of_other_writers_fit_or_are_misfits_of_every_declared_type(name):
    value_text, expected = FOREIGN_TEXTS[name]
    check_row('{"_id": 1, "f": ' + value_text + "}", expected, name)


@pytest.mark.parametrize(
    "value_text",
    [
        '{"$date": {"$numberLong": "-62135596800001"}}',
        f'{{"$date": {{"$numberLong": "{AFTER_9999}"}}}}',
        '{"$date": "garbage"}',
    ],
    ids=["before year 1", "after 9999", "garbage"],
)
def test_an_out_of_range_or_unreadable_date_is_a_misfit_not_a_stop(value_text):
    layout = TableLayout(
        (
            DeclaredColumn("placed", "placed_at", "timestamp"),
            DeclaredColumn("day", "placed_at", "date"),
            DeclaredColumn("status", "status", "string"),
        )
    )
    text = '{"_id": 7, "placed_at": ' + value_text + ', "status": "open"}'
    misfits = Misfits()
    assert column_values(layout, "7", text, misfits) == [None, None, "open"]
    assert misfits.counts == {"placed": 1, "day": 1}
    (line_day, line_placed) = misfits.describe(layout.declared)
    assert line_placed.startswith(
        "1 value(s) of placed_at did not fit the column placed (timestamp) and stay in _doc only, e.g. _id 7: "
    )
    assert ("DatetimeMS" if "garbage" not in value_text else "'garbage'") in line_placed


def column(type_name: str) -> DeclaredColumn:
    return DeclaredColumn("c", "c", type_name)


@pytest.mark.parametrize(
    "type_name, value, expected",
    [
        # Decimal128 and integers into double and float convert (rounded to the nearest).
        ("double", Decimal128("199.99"), 199.99),
        ("double", Decimal128("0.1"), 0.1),
        ("float", Decimal128("199.99"), 199.99),
        ("double", Int64(2**63 - 1), 9.223372036854776e18),
        ("double", 2**31 - 1, 2147483647.0),
        ("float", Int64(-(2**63)), -9.223372036854776e18),
        # Integral doubles and decimals into the integer types, in range.
        ("long", 42.0, 42),
        ("long", -(2.0**63), -(2**63)),
        ("long", 2.0**63, MISFIT),
        ("integer", 2.0**31, MISFIT),
        ("short", Decimal128("-32768"), -32768),
        ("short", Decimal128("32768"), MISFIT),
        ("byte", Decimal128("1.270E+2"), 127),
        ("long", 42.5, MISFIT),
        ("long", Decimal128("0.5"), MISFIT),
        ("integer", 2**31, MISFIT),
        ("integer", Int64(2**31 - 1), 2**31 - 1),
        # Into a decimal: exactly at its scale (a double through its shortest decimal text).
        ("decimal(6,2)", 0.1, Decimal("0.10")),
        ("decimal(6,2)", 1234.5, Decimal("1234.50")),
        ("decimal(6,2)", 12345.5, MISFIT),
        ("decimal(6,2)", 0.125, MISFIT),
        ("decimal(6,2)", 1e-7, MISFIT),
        ("decimal(2,2)", 0.99, Decimal("0.99")),
        ("decimal(2,2)", 1.0, MISFIT),
        ("decimal(38,0)", 1e20, Decimal("100000000000000000000")),
        ("decimal(38,0)", 1e38, MISFIT),
        (
            "decimal(38,10)",
            Decimal128("1234567890123456789012345678.000000"),
            Decimal("1234567890123456789012345678.0000000000"),
        ),
        ("decimal(38,10)", Decimal128("1E+6144"), MISFIT),
        ("decimal(38,10)", Decimal128("0E+6000"), Decimal("0E-10")),
        ("decimal(6,2)", math.nan, MISFIT),
        ("decimal(6,2)", Decimal128("Infinity"), MISFIT),
        ("decimal(6,2)", Int64(1234), Decimal("1234.00")),
        # Overflow is a misfit; non-finite doubles fit double and float.
        ("float", 3.5e38, MISFIT),
        ("float", Decimal128("1E+39"), MISFIT),
        ("double", Decimal128("1E+309"), MISFIT),
        ("float", 3.4e38, 3.4e38),
        ("double", -math.inf, -math.inf),
        ("float", math.nan, math.nan),
        # bool is never a number, text never one, and string stays strict.
        ("long", True, MISFIT),
        ("double", False, MISFIT),
        ("decimal(6,2)", True, MISFIT),
        ("double", "12.5", MISFIT),
        ("long", "12", MISFIT),
        ("string", 12, MISFIT),
        ("string", OID, "596e275826f08b2730779e1f"),
        ("boolean", 1, MISFIT),
    ],
)
def test_numbers_convert_as_a_sql_cast_does(type_name, value, expected):
    fits, got = convert(column(type_name), value)
    if expected is MISFIT:
        assert (fits, got) == (False, None)
    else:
        assert fits is True and same(got, expected), got


def test_every_value_that_fits_is_a_value_of_its_columns_arrow_type():
    pa = pytest.importorskip("pyarrow")
    delta_tables = pytest.importorskip("airflow_provider_mongocdc.tables.arrow")
    layout = layout_of_every_type()
    for name, (value, _) in BSON_VALUES.items():
        text = document_writer("strict").dumps({"_id": 1, "f": value})
        for column, got in zip(layout.declared, column_values(layout, "1", text, Misfits())):
            array = pa.array([got], delta_tables.arrow_type(column.type))
            if column.type not in FLOATS:
                assert array.to_pylist() == [got], (name, column.type)


@pytest.mark.parametrize("mode", MODES)
def test_generated_documents_of_every_bson_type_never_stop_the_apply(mode):
    """The fast-path test's generated documents (every BSON type, nested, at the borders), each top
    field declared as every type: each value fits or is counted."""
    from tests.unit.test_ejson_fast_path import generated, roundtrip

    rng = random.Random(f"declared values {mode}")
    writer = document_writer(mode)
    for _ in range(150):
        document = roundtrip({"_id": 1, **generated(rng)})
        if document is None:
            continue
        names = [name for name in document if name and "." not in name and not name.startswith("$")]
        layout = TableLayout(
            tuple(
                DeclaredColumn(f"c{index}_{kind}", name, type_name)
                for index, name in enumerate(names)
                for kind, type_name in enumerate(TYPES)
            )
        )
        misfits = Misfits()
        values = column_values(layout, "1", writer.dumps(document), misfits)
        for declared, value in zip(layout.declared, values):
            if value is None and document[declared.path] is not None:
                assert misfits.counts.get(declared.name) == 1, (declared, document[declared.path])
