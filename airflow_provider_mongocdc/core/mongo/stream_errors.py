"""What a change stream's errors mean, and the errors a window raises for them.

Resumable errors (:func:`is_transient`: network errors, elections, the change streams
specification's resumable codes) let the window re-open the stream from its last position. A
purged oplog (:func:`is_history_lost`) needs a new snapshot (:func:`purged_error`). A stored
position MongoDB refuses as invalid (:func:`is_unusable_position`: 260, 280) is a wrong offset, not
a gap (:func:`unusable_position_error`). A change over 16 MB (:func:`is_oversize_change`) fails per
``cursor.oversize.handling.mode``. A window whose cluster time stalled before an end in the past
fails with :class:`WindowEndNotReachedError`. Reasons: docs/design.md, "Stream windows".
"""

from __future__ import annotations

from pymongo.errors import ConnectionFailure, OperationFailure

from airflow_provider_mongocdc.core.base.dag_ids import RESNAPSHOT
from airflow_provider_mongocdc.core.base.errors import (
    ConnectionFailedError,
    MongoCdcError,
    OffsetError,
    OversizeEventError,
    ResumePointPurgedError,
)
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import SnapshotMode
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position, describe_position

# Errors that mean the resume point is gone from the oplog (Debezium's documentation: how the
# MongoDB connector handles failures and problems).
HISTORY_LOST_CODES = {
    286: "ChangeStreamHistoryLost",
    136: "CappedPositionLost",
}
# The server's text for a purged resume point (older servers raise it with other codes). Not "resume
# of change stream was not possible" alone: MongoDB also starts "the resume token was not found"
# with it, which is not history loss.
HISTORY_LOST_MESSAGES = ("resume point may no longer be in the oplog",)
# Errors that mean the stored position is unusable on this deployment, whatever the oplog holds.
UNUSABLE_POSITION_CODES = {
    260: "InvalidResumeToken",
    280: "ChangeStreamFatalError",
}

BSON_OBJECT_TOO_LARGE = 10334  # BSONObjectTooLarge: a change over 16 MB cannot be returned
# Errors after which a change stream can be re-opened from its last token: the change streams
# specification's resumable codes. MongoDB 4.4+ labels the errors of a stream's own aggregate and
# getMore ResumableChangeStreamError for them (ErrorLabelBuilder; pymongo resumes those once by
# itself); the codes also cover older servers and errors raised before a getMore's cursor is
# checked out, which carry no label. Re-opening at the window's own position is safe for both.
_RESUMABLE_CODES = {
    6,
    7,
    43,
    63,
    89,
    91,
    133,
    150,
    189,
    234,
    262,
    9001,
    10107,
    11600,
    11602,
    13388,
    13435,
    13436,
}


def _server_error(error: BaseException) -> OperationFailure | None:
    if isinstance(error, ConnectionFailure) or not isinstance(error, OperationFailure):
        return None
    return error


def is_history_lost(error: BaseException) -> bool:
    """Whether a server error says the stream cannot resume because the oplog rolled past it.

    Connection errors, timeouts and stepDowns are not: they are transient and the stream resumes.
    Nor are 260 and 280 (see :func:`is_unusable_position`).
    """
    error = _server_error(error)
    if error is None:
        return False
    if error.code in HISTORY_LOST_CODES:
        return True
    message = str(error).lower()
    return any(text in message for text in HISTORY_LOST_MESSAGES)


def is_unusable_position(error: BaseException) -> bool:
    """Whether a server error says the stored resume token cannot be used on this deployment
    (``InvalidResumeToken`` 260, ``ChangeStreamFatalError`` 280), which is no purged oplog."""
    error = _server_error(error)
    return error is not None and error.code in UNUSABLE_POSITION_CODES and not is_history_lost(error)


def is_oversize_change(error: BaseException) -> bool:
    """Whether MongoDB could not return a change because it is over its 16 MB limit
    (``BSONObjectTooLarge`` 10334)."""
    error = _server_error(error)
    return error is not None and error.code == BSON_OBJECT_TOO_LARGE


def is_transient(error: BaseException) -> bool:
    """Whether the stream can be re-opened from its last token after this error."""
    if isinstance(error, ConnectionFailure):
        return True
    if isinstance(error, OperationFailure):
        if is_history_lost(error):
            return False
        if error.has_error_label("NonResumableChangeStreamError"):
            return False
        return error.has_error_label("ResumableChangeStreamError") or error.code in _RESUMABLE_CODES
    return False


def oversize_change_error(
    config: ConnectorConfig, partition: OffsetPartition | None, error: BaseException
) -> OversizeEventError:
    """The error for a change MongoDB cannot return (over 16 MB), with the settings that handle it
    (Debezium's ``cursor.oversize.handling.mode``)."""
    where = f" of {partition.describe()}" if partition is not None else ""
    mode = config.event_oversize_handling_mode
    return OversizeEventError(
        f"The change stream{where} stopped at a change larger than MongoDB's 16 MB limit; nothing "
        "past the last commit is visible",
        cause=f"MongoDB answered BSONObjectTooLarge ({BSON_OBJECT_TOO_LARGE}): {error_text(error)} "
        f"(cursor.oversize.handling.mode={mode})",
        fix="set cursor.oversize.handling.mode=split to read such changes in fragments and emit them "
        "whole (MongoDB 6.0.9+/7.0), or cursor.oversize.handling.mode=skip with "
        "cursor.oversize.skip.threshold=<bytes> to drop changes of larger documents; or leave "
        "fullDocument/fullDocumentBeforeChange out (capture.mode) or shrink them with cursor.pipeline",
    )


def offsets_cli(config: ConnectorConfig, partition: OffsetPartition | None) -> str:
    """The ``mongocdc offsets`` options that select a connector's partition (the Kafka option is
    the user's: ``--kafka-conn-id``, ``--kafka-config`` or ``--bootstrap-servers``)."""
    options = f"--topic-prefix {config.topic_prefix}"
    if config.offsets_topic != f"{config.topic_prefix}.offsets":
        options += f" --offsets-topic {config.offsets_topic}"
    if partition is not None and partition.connector_name != partition.server_id:
        options += f" --connector {partition.connector_name}"
    return options + f" --partition {partition.rs if partition is not None else '<replica set>'}"


def unusable_position_error(
    config: ConnectorConfig,
    partition: OffsetPartition | None,
    position: Position | None,
    error: BaseException,
) -> OffsetError:
    """The error for a stored position MongoDB refuses as invalid (260, 280): it names the offset
    and how to inspect and repair it. Nothing is lost from the oplog, so it is not a gap."""
    code = getattr(error, "code", None)
    name = UNUSABLE_POSITION_CODES.get(code, "an error")
    where = f"of {partition.describe()} " if partition is not None else ""
    stored = position.describe() if position is not None else "unknown"
    cli = offsets_cli(config, partition)
    return OffsetError(
        f"MongoDB refuses the stored offset {where}({stored}) as a change stream position; "
        "no offset was changed",
        cause=f"MongoDB answered {name} ({code}): {error_text(error)}. The resume token is "
        "malformed or names an event this deployment does not have (an offset copied from another "
        "deployment or edited by hand, or a restored deployment); the oplog was not purged, so "
        "this is not a gap",
        fix=f"inspect the offset with 'mongocdc offsets show {cli}' (plus --kafka-conn-id, "
        "--kafka-config or --bootstrap-servers); move it to a cluster time of this deployment "
        f"with 'mongocdc offsets set {cli} --cluster-time SEC:INC --yes' (streaming starts there), "
        f"or delete it with 'mongocdc offsets reset {cli} --yes' and take a new snapshot",
    )


def stream_failed_error(partition: OffsetPartition, error: BaseException) -> MongoCdcError:
    """A change stream error that re-opening the stream does not cure (neither transient nor one
    of the refusals above)."""
    return MongoCdcError(
        f"The change stream of {partition.describe()} failed; the window "
        "stopped and nothing past the last commit is visible",
        cause=error_text(error),
        fix="check the MongoDB user's roles (changeStream and find on the captured "
        "databases) and the server's logs, then re-run; the window continues "
        "from the last committed offset",
    )


def retries_exhausted_error(
    partition: OffsetPartition, failures: int, error: BaseException, committed: Position
) -> ConnectionFailedError:
    """The stream failed ``failures`` times in a row (``connect.max.attempts``)."""
    return ConnectionFailedError(
        f"The change stream of {partition.describe()} failed {failures} times in a row; the window stopped",
        cause=error_text(error),
        fix="check that the MongoDB servers run and a primary is elected; the next "
        "run continues from the last committed offset "
        f"({committed.describe()})",
    )


def purged_error(
    config: ConnectorConfig, partition: OffsetPartition, position: Position | None, error: BaseException
) -> ResumePointPurgedError:
    code = getattr(error, "code", None)
    name = HISTORY_LOST_CODES.get(code, "error")
    where = describe_position(position)
    cause = (
        f"MongoDB answered {name}"
        + (f" ({code})" if code is not None else "")
        + f": {error_text(error)}. The oplog no longer holds the position the last window "
        "stored; the changes in between are lost to streaming (the connector was stopped, or "
        "fell behind, for longer than the oplog window)"
    )
    if config.snapshot_mode == SnapshotMode.WHEN_NEEDED:
        fix = (
            "with snapshot.mode=when_needed a new snapshot must run first: the hourly DAG's "
            "snapshot task takes it before the next window (or run MongoSnapshotOperator); "
            "then streaming continues from the snapshot's position"
        )
    else:
        fix = (
            f"re-snapshot: trigger the DAG {RESNAPSHOT} (it resets the offset of this "
            "replica set and takes a new snapshot); to keep it from happening again, enlarge "
            "the oplog (replSetResizeOplog) or run windows more often than the oplog window"
        )
    return ResumePointPurgedError(
        f"The stored resume point of {partition.describe()} "
        f"({where.get('time') if where else 'unknown'}) is no longer in the oplog; no offset was changed",
        cause=cause,
        fix=fix,
    )
