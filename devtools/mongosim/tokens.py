"""Change-stream resume tokens in MongoDB's format: ``{_data: <hex of a KeyString>}``.

MongoDB encodes the resume token data (clusterTime, version, tokenType, txnOpIndex,
fromInvalidate, collection UUID, event identifier) as a KeyString V1 and hex-encodes it, so that
tokens sort by their bytes: by cluster time first, then by position inside a transaction. The
simulator writes the same layout (version 2 tokens, as MongoDB 7.0 and 8.0 do), for example a
high-water-mark token ``8265A1B2C3000000012B0429296E04``. Type bits (``_typeBits``, which MongoDB
adds when a document key holds a long, double or decimal) are not written.
"""

from __future__ import annotations

import datetime
import math
import struct
import uuid as uuidlib

from bson.binary import Binary
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.max_key import MaxKey
from bson.min_key import MinKey
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from devtools.mongosim.bsonutil import _datetime_ms

# KeyString CTypes (mongo/db/storage/key_string.cpp)
K_MINKEY = 10
K_NULLISH = 20
K_NUMERIC_NAN = 30
K_NUMERIC_NEG_LARGE = 31
K_NUMERIC_NEG_8 = 32
K_NUMERIC_NEG_1 = 39
K_NUMERIC_NEG_SMALL = 40
K_NUMERIC_ZERO = 41
K_NUMERIC_POS_SMALL = 42
K_NUMERIC_POS_1 = 43
K_NUMERIC_POS_8 = 50
K_NUMERIC_POS_LARGE = 51
K_STRING = 60
K_OBJECT = 70
K_ARRAY = 80
K_BINDATA = 90
K_OID = 100
K_BOOL_FALSE = 110
K_BOOL_TRUE = 111
K_DATE = 120
K_TIMESTAMP = 130
K_REGEX = 140
K_MAXKEY = 240
K_END = 4

TOKEN_VERSION = 2
TOKEN_TYPE_HIGH_WATER_MARK = 0
TOKEN_TYPE_EVENT = 128


class TokenError(ValueError):
    """The resume token could not be decoded."""


def _ctype(value) -> int:
    if value is None:
        return K_NULLISH
    if isinstance(value, bool):
        return K_BOOL_TRUE if value else K_BOOL_FALSE
    if isinstance(value, (int, float, Int64, Decimal128)):
        return -1  # numbers carry their own ctype
    if isinstance(value, str):
        return K_STRING
    if isinstance(value, dict):
        return K_OBJECT
    if isinstance(value, (list, tuple)):
        return K_ARRAY
    if isinstance(value, (bytes, uuidlib.UUID)):
        return K_BINDATA
    if isinstance(value, ObjectId):
        return K_OID
    if isinstance(value, datetime.datetime):
        return K_DATE
    if isinstance(value, Timestamp):
        return K_TIMESTAMP
    if isinstance(value, MinKey):
        return K_MINKEY
    if isinstance(value, MaxKey):
        return K_MAXKEY
    return K_STRING


def _int_bytes(magnitude: int) -> bytes:
    length = max(1, (magnitude.bit_length() + 7) // 8)
    return magnitude.to_bytes(length, "big")


def _encode_number(value, out: bytearray) -> None:
    if isinstance(value, Decimal128):
        value = float(value.to_decimal())
    if isinstance(value, float):
        if math.isnan(value):
            out.append(K_NUMERIC_NAN)
            return
        if value.is_integer() and abs(value) < 2**63:
            value = int(value)
        else:
            # Non-integral doubles: a large/small magnitude marker and the IEEE bits, which keeps
            # the order of positive and negative values.
            bits = struct.unpack(">Q", struct.pack(">d", abs(value)))[0]
            if value > 0:
                out.append(K_NUMERIC_POS_LARGE if abs(value) >= 1 else K_NUMERIC_POS_SMALL)
                out += bits.to_bytes(8, "big")
            else:
                out.append(K_NUMERIC_NEG_LARGE if abs(value) >= 1 else K_NUMERIC_NEG_SMALL)
                out += (~bits & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
            return
    value = int(value)
    if value == 0:
        out.append(K_NUMERIC_ZERO)
        return
    encoded = _int_bytes(abs(value) << 1)
    if value > 0:
        out.append(K_NUMERIC_POS_1 + len(encoded) - 1)
        out += encoded
    else:
        out.append(K_NUMERIC_NEG_1 - (len(encoded) - 1))
        out += bytes(~b & 0xFF for b in encoded)


def _encode_string(value: str, out: bytearray) -> None:
    out += value.encode("utf-8").replace(b"\x00", b"\x00\xff")
    out.append(0)


def _encode_value(value, out: bytearray, name: str | None = None) -> None:
    """Append a value (with its ctype), the field name first when inside an object."""
    ctype = _ctype(value)
    if name is not None:
        # Inside objects each element is: ctype, field name, then the value with its ctype.
        if ctype == -1:
            probe = bytearray()
            _encode_number(value, probe)
            out.append(probe[0])
        else:
            out.append(ctype)
        _encode_string(name, out)
    if ctype == -1:
        _encode_number(value, out)
    elif ctype in (K_NULLISH, K_MINKEY, K_MAXKEY, K_BOOL_TRUE, K_BOOL_FALSE):
        out.append(ctype)
    elif ctype == K_STRING:
        out.append(K_STRING)
        _encode_string(value if isinstance(value, str) else str(value), out)
    elif ctype == K_OBJECT:
        out.append(K_OBJECT)
        for key, item in value.items():
            _encode_value(item, out, key)
        out.append(0)
    elif ctype == K_ARRAY:
        out.append(K_ARRAY)
        for item in value:
            _encode_value(item, out)
        out.append(0)
    elif ctype == K_BINDATA:
        if isinstance(value, uuidlib.UUID):
            data, subtype = value.bytes, 4
        else:
            data, subtype = bytes(value), (value.subtype if isinstance(value, Binary) else 0)
        out.append(K_BINDATA)
        if len(data) < 0xFF:
            out.append(len(data))
        else:
            out.append(0xFF)
            out += len(data).to_bytes(4, "big")
        out.append(subtype)
        out += data
    elif ctype == K_OID:
        out.append(K_OID)
        out += value.binary
    elif ctype == K_DATE:
        out.append(K_DATE)
        out += ((_datetime_ms(value) ^ (1 << 63)) & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
    elif ctype == K_TIMESTAMP:
        out.append(K_TIMESTAMP)
        out += value.time.to_bytes(4, "big") + value.inc.to_bytes(4, "big")


def encode_token(
    cluster_time: Timestamp,
    token_type: int = TOKEN_TYPE_EVENT,
    txn_op_index: int = 0,
    from_invalidate: bool = False,
    collection_uuid=None,
    event_identifier=None,
    version: int = TOKEN_VERSION,
    fragment_num: int | None = None,
) -> dict:
    """A resume token; ``fragment_num`` (0-based) is the suffix MongoDB gives the token of each
    ``$changeStreamSplitLargeEvent`` fragment."""
    out = bytearray()
    _encode_value(cluster_time, out)
    _encode_number(version, out)
    _encode_number(token_type, out)
    _encode_number(txn_op_index, out)
    out.append(K_BOOL_TRUE if from_invalidate else K_BOOL_FALSE)
    if collection_uuid is not None:
        _encode_value(collection_uuid, out)
    if event_identifier is not None:
        _encode_value(event_identifier, out)
    if fragment_num is not None:
        _encode_number(fragment_num, out)
    out.append(K_END)
    return {"_data": out.hex().upper()}


def high_water_mark(cluster_time: Timestamp) -> dict:
    return encode_token(cluster_time, token_type=TOKEN_TYPE_HIGH_WATER_MARK)


class TokenData:
    """The decoded prefix of a resume token (what ordering and resuming need)."""

    __slots__ = ("cluster_time", "version", "token_type", "txn_op_index", "from_invalidate", "data")

    def __init__(self, cluster_time, version, token_type, txn_op_index, from_invalidate, data):
        self.cluster_time = cluster_time
        self.version = version
        self.token_type = token_type
        self.txn_op_index = txn_op_index
        self.from_invalidate = from_invalidate
        self.data = data

    @property
    def is_high_water_mark(self) -> bool:
        return self.token_type == TOKEN_TYPE_HIGH_WATER_MARK

    def position(self) -> tuple:
        """Sort position: (ts key, token type, txnOpIndex, fromInvalidate)."""
        return (
            (self.cluster_time.time << 32) | self.cluster_time.inc,
            self.token_type,
            self.txn_op_index,
            int(self.from_invalidate),
        )


def fragment_of(token_data: str, event_data: str) -> int | None:
    """The fragment number (0-based) when ``token_data`` is the token of a fragment of the event
    whose token is ``event_data`` (the event's token with a fragmentNum suffix), else None."""
    head = event_data[:-2]
    if event_data[-2:] != "04" or not token_data.startswith(head) or len(token_data) <= len(event_data):
        return None
    rest = bytes.fromhex(token_data[len(head) :])
    try:
        number, pos = _read_int(rest, 0)
    except (TokenError, IndexError):
        return None
    return number if rest[pos:] == bytes([K_END]) else None


def _read_int(raw: bytes, pos: int) -> tuple[int, int]:
    ctype = raw[pos]
    if ctype == K_NUMERIC_ZERO:
        return 0, pos + 1
    if K_NUMERIC_POS_1 <= ctype <= K_NUMERIC_POS_8:
        length = ctype - K_NUMERIC_POS_1 + 1
        value = int.from_bytes(raw[pos + 1 : pos + 1 + length], "big") >> 1
        return value, pos + 1 + length
    raise TokenError(f"unexpected KeyString type {ctype} at offset {pos}")


def decode_token(token) -> TokenData:
    if not isinstance(token, dict) or not isinstance(token.get("_data"), str):
        raise TokenError("the resume token must be a document with a string '_data' field")
    data = token["_data"]
    try:
        raw = bytes.fromhex(data)
    except ValueError as error:
        raise TokenError("the resume token '_data' is not a hex string") from error
    if len(raw) < 12 or raw[0] != K_TIMESTAMP:
        raise TokenError("the resume token does not start with a timestamp")
    cluster_time = Timestamp(int.from_bytes(raw[1:5], "big"), int.from_bytes(raw[5:9], "big"))
    version, pos = _read_int(raw, 9)
    token_type, pos = _read_int(raw, pos)
    txn_op_index, pos = _read_int(raw, pos)
    if pos >= len(raw) or raw[pos] not in (K_BOOL_FALSE, K_BOOL_TRUE):
        raise TokenError("the resume token has no fromInvalidate flag")
    from_invalidate = raw[pos] == K_BOOL_TRUE
    return TokenData(cluster_time, version, token_type, txn_op_index, from_invalidate, data.upper())
