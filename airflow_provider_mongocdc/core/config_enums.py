"""The enumerated connector settings, one string enum each.

A member compares equal to its value (``SnapshotMode.NO_DATA == "no_data"``), so code compares a
parsed setting (a plain ``str``) with a member instead of a string literal. Parsing returns the
plain strings, so messages, JSON and stored offsets read exactly as before.
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


class CaptureMode(StrEnum):
    """``capture.mode``: what update (and delete) events carry."""

    CHANGE_STREAMS = "change_streams"
    UPDATE_FULL = "change_streams_update_full"
    WITH_PRE_IMAGE = "change_streams_with_pre_image"
    UPDATE_FULL_WITH_PRE_IMAGE = "change_streams_update_full_with_pre_image"


class CaptureScope(StrEnum):
    """``capture.scope``: what the change stream watches."""

    DEPLOYMENT = "deployment"
    DATABASE = "database"
    COLLECTION = "collection"


class SnapshotMode(StrEnum):
    """``snapshot.mode`` (the deprecated spelling ``never`` is read as ``no_data``)."""

    INITIAL = "initial"
    ALWAYS = "always"
    INITIAL_ONLY = "initial_only"
    NO_DATA = "no_data"
    WHEN_NEEDED = "when_needed"


class FullUpdateType(StrEnum):
    """``capture.mode.full.update.type``."""

    LOOKUP = "lookup"
    POST_IMAGE = "post_image"


class ConnectionMode(StrEnum):
    """``mongodb.connection.mode``."""

    SHARDED = "sharded"
    REPLICA_SET = "replica_set"


class MatchMode(StrEnum):
    """``filters.match.mode``."""

    REGEX = "regex"
    LITERAL = "literal"


class NameAdjustmentMode(StrEnum):
    """``field.name.adjustment.mode`` and ``schema.name.adjustment.mode``."""

    NONE = "none"
    AVRO = "avro"
    AVRO_UNICODE = "avro_unicode"


class OversizeMode(StrEnum):
    """``cursor.oversize.handling.mode`` (alias ``event.oversize.handling.mode``)."""

    FAIL = "fail"
    SKIP = "skip"
    SPLIT = "split"


class PipelineOrder(StrEnum):
    """``cursor.pipeline.order``."""

    INTERNAL_FIRST = "internal_first"
    USER_FIRST = "user_first"
    USER_ONLY = "user_only"


class EventFormat(StrEnum):
    """``event.format``: Debezium 2.x/3.x change stream events, or the 1.x oplog shape."""

    CHANGE_STREAMS = "change_streams"
    OPLOG = "oplog"


class JsonMode(StrEnum):
    """``extended.json.mode``."""

    STRICT = "strict"
    RELAXED = "relaxed"
    CANONICAL = "canonical"
    LEGACY = "legacy"


class KeyJsonMode(StrEnum):
    """``key.json.mode``."""

    RELAXED = "relaxed"
    STRICT = "strict"


class JsonSerializationMode(StrEnum):
    """Debezium's ``json.serialization.mode`` (3.7+), mapped onto ``extended.json.mode``."""

    LEGACY = "legacy"
    STRICT = "strict"
    EXTENDED = "extended"
    RELAXED = "relaxed"


def values(enum: type[StrEnum]) -> tuple[str, ...]:
    """The allowed values of a setting, as plain strings, in declaration order."""
    return tuple(member.value for member in enum)


CAPTURE_MODES = values(CaptureMode)
CAPTURE_SCOPES = values(CaptureScope)
SNAPSHOT_MODES = values(SnapshotMode)
FULL_UPDATE_TYPES = values(FullUpdateType)
CONNECTION_MODES = values(ConnectionMode)
MATCH_MODES = values(MatchMode)
NAME_ADJUSTMENT_MODES = values(NameAdjustmentMode)
OVERSIZE_MODES = values(OversizeMode)
PIPELINE_ORDERS = values(PipelineOrder)
EVENT_FORMATS = values(EventFormat)
JSON_MODES = values(JsonMode)
KEY_JSON_MODES = values(KeyJsonMode)
JSON_SERIALIZATION_MODES = values(JsonSerializationMode)
# json.serialization.mode -> the extended.json.mode writing the same documents (Debezium's
# JsonSerialization document settings).
JSON_SERIALIZATION_TO_EXTENDED = {
    JsonSerializationMode.LEGACY.value: JsonMode.STRICT.value,
    JsonSerializationMode.STRICT.value: JsonMode.STRICT.value,
    JsonSerializationMode.EXTENDED.value: JsonMode.CANONICAL.value,
    JsonSerializationMode.RELAXED.value: JsonMode.RELAXED.value,
}
