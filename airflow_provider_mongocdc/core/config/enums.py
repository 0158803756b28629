"""The enumerated connector settings: a string enum each, and the tuple of its allowed values.

A member compares equal to its value (``SnapshotMode.NO_DATA == "no_data"``), so code compares a
parsed setting (a plain ``str``) with a member instead of a string literal. Parsing returns the
plain strings, so messages, JSON and stored offsets read exactly as before. A member is named by
its value in upper case (``NO_DATA``), except in :class:`CaptureMode`.
"""

from __future__ import annotations

import sys
from enum import Enum

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # Python 3.10: the same behaviour for what is used here

    class StrEnum(str, Enum):
        def __str__(self) -> str:
            return str(self.value)

        def __format__(self, spec: str) -> str:
            return format(str(self.value), spec)


__all__ = [
    "CaptureMode",
    "CAPTURE_MODES",
    "CaptureScope",
    "CAPTURE_SCOPES",
    "SnapshotMode",
    "SNAPSHOT_MODES",
    "FullUpdateType",
    "FULL_UPDATE_TYPES",
    "ConnectionMode",
    "CONNECTION_MODES",
    "MatchMode",
    "MATCH_MODES",
    "NameAdjustmentMode",
    "NAME_ADJUSTMENT_MODES",
    "OversizeMode",
    "OVERSIZE_MODES",
    "PipelineOrder",
    "PIPELINE_ORDERS",
    "EventFormat",
    "EVENT_FORMATS",
    "JsonMode",
    "JSON_MODES",
    "KEY_JSON_MODES",
    "JsonSerializationMode",
    "JSON_SERIALIZATION_MODES",
    "JSON_SERIALIZATION_TO_EXTENDED",
]


def values(enum: type[StrEnum]) -> tuple[str, ...]:
    """The allowed values of a setting, as plain strings, in declaration order."""
    return tuple(member.value for member in enum)


def _enum(name: str, *allowed: str) -> type[StrEnum]:
    """A string enum of the ``allowed`` values in this order, each member named by its value in
    upper case (``"no_data"`` -> ``NO_DATA``)."""
    return StrEnum(name, [(value.upper(), value) for value in allowed])


class CaptureMode(StrEnum):
    """``capture.mode``: what update (and delete) events carry."""

    CHANGE_STREAMS = "change_streams"
    UPDATE_FULL = "change_streams_update_full"
    WITH_PRE_IMAGE = "change_streams_with_pre_image"
    UPDATE_FULL_WITH_PRE_IMAGE = "change_streams_update_full_with_pre_image"


CAPTURE_MODES = values(CaptureMode)

# capture.scope: what the change stream watches.
CaptureScope = _enum("CaptureScope", "deployment", "database", "collection")
CAPTURE_SCOPES = values(CaptureScope)

# snapshot.mode (the deprecated spelling ``never`` is read as ``no_data``).
SnapshotMode = _enum("SnapshotMode", "initial", "always", "initial_only", "no_data", "when_needed")
SNAPSHOT_MODES = values(SnapshotMode)

# capture.mode.full.update.type
FullUpdateType = _enum("FullUpdateType", "lookup", "post_image")
FULL_UPDATE_TYPES = values(FullUpdateType)

# mongodb.connection.mode
ConnectionMode = _enum("ConnectionMode", "sharded", "replica_set")
CONNECTION_MODES = values(ConnectionMode)

# filters.match.mode
MatchMode = _enum("MatchMode", "regex", "literal")
MATCH_MODES = values(MatchMode)

# field.name.adjustment.mode and schema.name.adjustment.mode
NameAdjustmentMode = _enum("NameAdjustmentMode", "none", "avro", "avro_unicode")
NAME_ADJUSTMENT_MODES = values(NameAdjustmentMode)

# cursor.oversize.handling.mode (alias event.oversize.handling.mode)
OversizeMode = _enum("OversizeMode", "fail", "skip", "split")
OVERSIZE_MODES = values(OversizeMode)

# cursor.pipeline.order
PipelineOrder = _enum("PipelineOrder", "internal_first", "user_first", "user_only")
PIPELINE_ORDERS = values(PipelineOrder)

# event.format: Debezium 2.x/3.x change stream events, or the 1.x oplog shape.
EventFormat = _enum("EventFormat", "change_streams", "oplog")
EVENT_FORMATS = values(EventFormat)

# extended.json.mode
JsonMode = _enum("JsonMode", "strict", "relaxed", "canonical", "legacy")
JSON_MODES = values(JsonMode)

# key.json.mode (no code compares it with a value: no enum)
KEY_JSON_MODES = ("relaxed", "strict")

# Debezium's json.serialization.mode (3.7+), mapped onto extended.json.mode.
JsonSerializationMode = _enum("JsonSerializationMode", "legacy", "strict", "extended", "relaxed")
JSON_SERIALIZATION_MODES = values(JsonSerializationMode)

# json.serialization.mode -> the extended.json.mode writing the same documents (Debezium's
# JsonSerialization document settings).
JSON_SERIALIZATION_TO_EXTENDED = {
    JsonSerializationMode.LEGACY.value: JsonMode.STRICT.value,
    JsonSerializationMode.STRICT.value: JsonMode.STRICT.value,
    JsonSerializationMode.EXTENDED.value: JsonMode.CANONICAL.value,
    JsonSerializationMode.RELAXED.value: JsonMode.RELAXED.value,
}
