"""MongoDB extended JSON for event payloads, on top of :mod:`bson.json_util`.

``bson.json_util`` does the encoding. This module only chooses its options per
``extended.json.mode`` and covers what ``json_util`` alone cannot do for Kafka consumers:

* In the ``strict`` and ``legacy`` modes ``json_util`` writes non-finite doubles as the bare words
  ``NaN``/``Infinity``, which are not JSON. Such values are written as Extended JSON v2
  ``{"$numberDouble": "NaN"}`` instead (``json_util.loads`` reads them back as floats). The
  conversion only runs for documents that hold such a value.

UUIDs: a pymongo client with the default ``uuidRepresentation`` (unspecified) returns BSON binary
subtype 3/4 values as :class:`bson.binary.Binary`, written ``{"$binary": ..., "$type": "04"}`` in
strict mode as Debezium does. A client decoding with ``uuidRepresentation=standard`` returns
:class:`uuid.UUID` objects instead; ``json_util`` writes those as ``{"$binary"}`` subtype 4 in the
relaxed and canonical modes and as ``{"$uuid": "<hex>"}`` in the strict and legacy modes (read
back as the same UUID). Readers should therefore keep the default UUID representation.

Modes (``extended.json.mode``):

``strict`` (default)
    What Debezium writes (the Java driver's ``JsonMode.STRICT``, "strict mode" in Debezium's key
    table): ``{"$numberLong": "1004"}`` for 64-bit integers, plain numbers for 32-bit integers
    and doubles, ``{"$date": <epoch ms>}``, ``{"$binary": "<base64>", "$type": "00"}``,
    ``{"$oid": ...}``, ``{"$numberDecimal": ...}``, ``{"$timestamp": {"t", "i"}}``.
``legacy``
    ``json_util``'s legacy mode: as strict but 64-bit integers are plain numbers (type is lost).
``relaxed`` / ``canonical``
    MongoDB Extended JSON v2. Canonical keeps every type (``$numberInt``, ``$numberDouble``);
    relaxed writes numbers plainly (64-bit integers lose their type) and dates as ISO-8601 strings.

Separators are ``","`` between members and ``": "`` after names: the layout the Java driver writes
for Debezium (``{"_id": {"$oid": "..."},"name": "x"}``), so the keys of ObjectId, 32-bit integer
and string ``_id`` values are byte-identical to Debezium's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache
from typing import Any

from bson import json_util
from bson.binary import UuidRepresentation
from bson.json_util import DatetimeRepresentation, JSONMode, JSONOptions

SEPARATORS = (",", ": ")

_BASE = {"uuid_representation": UuidRepresentation.STANDARD}


@lru_cache(maxsize=None)
def json_options(mode: str) -> JSONOptions:
    """The ``JSONOptions`` for an ``extended.json.mode`` value."""
    if mode == "strict":
        return JSONOptions(json_mode=JSONMode.LEGACY, strict_number_long=True,
                           datetime_representation=DatetimeRepresentation.LEGACY, **_BASE)
    if mode == "legacy":
        return JSONOptions(json_mode=JSONMode.LEGACY,
                           datetime_representation=DatetimeRepresentation.LEGACY, **_BASE)
    if mode == "relaxed":
        return JSONOptions(json_mode=JSONMode.RELAXED, **_BASE)
    if mode == "canonical":
        return JSONOptions(json_mode=JSONMode.CANONICAL, **_BASE)
    raise ValueError(f"unknown extended JSON mode {mode!r}")


@lru_cache(maxsize=None)
def decode_options(mode: str) -> JSONOptions:
    """Options for reading an event's JSON back into the BSON values a default pymongo client
    returns (naive UTC datetimes, UUIDs as Binary subtype 4)."""
    return JSONOptions(json_mode=json_options(mode).json_mode, tz_aware=False,
                       uuid_representation=UuidRepresentation.UNSPECIFIED)


class Encoder:
    """Serialises BSON values and documents to extended JSON text in one mode."""

    __slots__ = ("mode", "options", "_lenient")

    def __init__(self, mode: str = "strict"):
        self.mode = mode
        self.options = json_options(mode)
        # Non-finite doubles need a rewrite only where json_util leaves floats untouched.
        self._lenient = self.options.json_mode == JSONMode.LEGACY

    def __reduce__(self):  # JSONOptions cannot be unpickled: rebuild from the mode
        return (Encoder, (self.mode,))

    def dumps(self, value: Any) -> str:
        """Extended JSON text of ``value`` (a document, an array or a single BSON value)."""
        try:
            return json_util.dumps(value, json_options=self.options, separators=SEPARATORS,
                                   ensure_ascii=False, allow_nan=False)
        except ValueError:
            # A NaN or infinity in legacy/strict mode (json_util would write invalid JSON).
            return json_util.dumps(_portable(value, self._lenient), json_options=self.options,
                                   separators=SEPARATORS, ensure_ascii=False, allow_nan=False)

    def loads(self, text: str) -> Any:
        """Parse text written by :meth:`dumps` back to BSON values."""
        return json_util.loads(text, json_options=decode_options(self.mode))


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
