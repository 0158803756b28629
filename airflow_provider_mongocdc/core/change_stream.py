"""Opening the connector's change stream, and where the stream stands now.

The stream's scope follows ``capture.scope`` (the whole deployment by default, or one database or
one collection given by ``capture.target``); its pipeline and options come from
:class:`~airflow_provider_mongocdc.core.filters.Filters`, so that the server drops uncaptured
changes before they cross the network.

Resume tokens are opaque to users, but MongoDB writes their ``_data`` as a hex KeyString that
starts with the event's cluster time (type byte ``0x82``, then seconds and increment as two
big-endian 32-bit integers); :func:`token_cluster_time` reads it, which lets a window compare a
``postBatchResumeToken`` with its end when no event came.

Refusals of a stored position
    Only a purged oplog is *history lost* (:func:`is_history_lost`: ``ChangeStreamHistoryLost``
    286, ``CappedPositionLost`` 136, or the server's "resume point may no longer be in the oplog");
    it needs a new snapshot. ``InvalidResumeToken`` 260 (a malformed token, or ``resumeAfter`` on
    an invalidate) and ``ChangeStreamFatalError`` 280 (the token names an event this deployment
    does not have: a token of another deployment, or edited by hand) say that the stored offset
    itself is wrong, however long the oplog: :func:`unusable_position_error` names the offset and
    how to inspect and repair it with ``mongocdc offsets``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream

from airflow_provider_mongocdc.core.config import ConnectorConfig, parse_pipeline
from airflow_provider_mongocdc.core.config_enums import CaptureScope, OversizeMode, PipelineOrder
from airflow_provider_mongocdc.core.errors import ConfigError, MongoCdcError, OffsetError, OversizeEventError
from airflow_provider_mongocdc.core.filters import Filters
from airflow_provider_mongocdc.core.offsets import OffsetPartition, Position

_TIMESTAMP_CTYPE = "82"

# Errors that mean the resume point is gone from the oplog (seed 002).
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


def _server_error(error: BaseException):
    from pymongo.errors import ConnectionFailure, OperationFailure

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


BSON_OBJECT_TOO_LARGE = 10334


def is_oversize_change(error: BaseException) -> bool:
    """Whether MongoDB could not return a change because it is over its 16 MB limit
    (``BSONObjectTooLarge`` 10334)."""
    error = _server_error(error)
    return error is not None and error.code == BSON_OBJECT_TOO_LARGE


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
        cause=f"MongoDB answered BSONObjectTooLarge ({BSON_OBJECT_TOO_LARGE}): {_server_text(error)} "
        f"(cursor.oversize.handling.mode={mode})",
        fix="set cursor.oversize.handling.mode=split to read such changes in fragments and emit them "
        "whole (MongoDB 6.0.9+/7.0), or cursor.oversize.handling.mode=skip with "
        "cursor.oversize.skip.threshold=<bytes> to drop changes of larger documents; or leave "
        "fullDocument/fullDocumentBeforeChange out (capture.mode) or shrink them with cursor.pipeline",
    )


def _server_text(error: BaseException) -> str:
    details = getattr(error, "details", None) or {}
    return str(details.get("errmsg") or error).split(", full error:")[0]


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
        cause=f"MongoDB answered {name} ({code}): {_server_text(error)}. The resume token is "
        "malformed or names an event this deployment does not have (an offset copied from another "
        "deployment or edited by hand, or a restored deployment); the oplog was not purged, so "
        "this is not a gap",
        fix=f"inspect the offset with 'mongocdc offsets show {cli}' (plus --kafka-conn-id, "
        "--kafka-config or --bootstrap-servers); move it to a cluster time of this deployment "
        f"with 'mongocdc offsets set {cli} --cluster-time SEC:INC --yes' (streaming starts there), "
        f"or delete it with 'mongocdc offsets reset {cli} --yes' and take a new snapshot",
    )


def token_cluster_time(token: Mapping[str, Any] | None) -> Timestamp | None:
    """The cluster time at the start of a resume token, or None when it cannot be read."""
    if not token:
        return None
    data = token.get("_data")
    if not isinstance(data, str) or len(data) < 18 or data[:2].upper() != _TIMESTAMP_CTYPE.upper():
        return None
    try:
        return Timestamp(int(data[2:10], 16), int(data[10:18], 16))
    except ValueError:
        return None


def watch_target(client: MongoClient, config: ConnectorConfig):
    """The object whose ``watch()`` opens the connector's stream: client, database or collection."""
    scope, target = config.capture_scope, config.capture_target
    if scope == CaptureScope.DEPLOYMENT:
        return client
    if not target:
        raise ConfigError(
            f"capture.scope={scope} needs capture.target",
            fix="set capture.target to the database name (scope database) or to "
            "<database>.<collection> (scope collection)",
        )
    if scope == CaptureScope.DATABASE:
        return client[target]
    database, _, collection = target.partition(".")
    if not collection:
        raise ConfigError(
            f"capture.target={target!r} does not name a collection",
            fix="use <database>.<collection> with capture.scope=collection",
        )
    return client[database][collection]


def stream_pipeline(config: ConnectorConfig) -> list[dict[str, Any]]:
    """The change stream's pipeline, built as Debezium's ``ChangeStreamPipelineFactory`` builds it:
    the size stage (``cursor.oversize.handling.mode=skip`` with a threshold), then the connector's
    filter stage and the user's ``cursor.pipeline`` in ``cursor.pipeline.order``, then
    ``$changeStreamSplitLargeEvent`` (``split``; MongoDB requires it last)."""
    pipeline: list[dict[str, Any]] = []
    mode = config.event_oversize_handling_mode
    threshold = config.cursor_oversize_skip_threshold
    if mode == OversizeMode.SKIP and threshold > 0:
        pipeline.append(
            {
                "$match": {
                    "$and": [
                        {"$expr": {"$lte": [{"$bsonSize": "$fullDocument"}, threshold]}},
                        {"$expr": {"$lte": [{"$bsonSize": "$fullDocumentBeforeChange"}, threshold]}},
                    ]
                }
            }
        )
    internal = Filters(config).change_stream_pipeline()
    user = parse_pipeline(config.cursor_pipeline)
    order = config.cursor_pipeline_order
    if order == PipelineOrder.USER_ONLY:
        pipeline += user
    elif order == PipelineOrder.USER_FIRST:
        pipeline += user + internal
    else:
        pipeline += internal + user
    if mode == OversizeMode.SPLIT:
        pipeline.append({"$changeStreamSplitLargeEvent": {}})
    return pipeline


def open_stream(
    client: MongoClient,
    config: ConnectorConfig,
    position: Position | None = None,
    *,
    max_await_time_ms: int | None = None,
    session=None,
) -> ChangeStream:
    """Open the connector's change stream after ``position`` (or from now when None).

    A position with a resume token resumes after that token (``startAfter``, which also accepts
    an invalidate event's token); one with only a cluster time starts at that operation time.
    """
    options = watch_options(config, position, max_await_time_ms=max_await_time_ms)
    stream = watch_target(client, config).watch(stream_pipeline(config), session=session, **options)
    return SplitEventStream(stream) if config.event_oversize_handling_mode == OversizeMode.SPLIT else stream


def watch_options(
    config: ConnectorConfig, position: Position | None = None, *, max_await_time_ms: int | None = None
) -> dict[str, Any]:
    """The keyword arguments of ``watch()`` that open the connector's stream after ``position``
    (pymongo's sync and asyncio ``watch()`` take the same ones; see :func:`open_stream`)."""
    options = Filters(config).change_stream_options()
    if max_await_time_ms is not None:
        options["max_await_time_ms"] = max_await_time_ms
    if position is not None:
        if position.resume_token is not None:
            options["start_after"] = dict(position.resume_token)
        else:
            options["start_at_operation_time"] = position.cluster_time
    return options


def start_op_time(config: ConnectorConfig) -> Timestamp | None:
    """``capture.start.op.time`` as a MongoDB timestamp (Debezium's ``new BsonTimestamp(long)``:
    seconds in the high 32 bits, increment in the low 32), or None when it is not set (-1)."""
    value = config.capture_start_op_time
    if value is None or value < 0:
        return None
    return Timestamp(value >> 32, value & 0xFFFFFFFF)


def no_data_start_position(client: MongoClient, config: ConnectorConfig) -> Position:
    """Where streaming starts when no offset is stored and no data is copied
    (``snapshot.mode=no_data``): at ``capture.start.op.time`` when set (Debezium opens the stream
    with ``startAtOperationTime`` then, inclusive), otherwise the current position."""
    start = start_op_time(config)
    if start is not None:
        return Position(cluster_time=start)
    return current_position(client, config)


def current_position(client: MongoClient, config: ConnectorConfig) -> Position:
    """Where the connector's change stream stands now, before any change is consumed. A snapshot
    records this before copying, so that streaming continues from it.

    The position is the ``postBatchResumeToken`` of the stream's opening ``aggregate`` (pymongo
    keeps it as the stream's resume token when that first batch is empty): every change after it
    is still ahead. Reading a change first would make the position that change's token, and a
    stream resumed after it would lose that change, and split its transaction. When the first
    batch did hold changes (written while the stream opened), the position is the first one's
    cluster time without a token: the next stream starts *at* it (``startAtOperationTime``,
    inclusive), so that change and every other change of its transaction are streamed.
    """
    with client.start_session() as session:
        with open_stream(client, config, max_await_time_ms=100, session=session) as stream:
            token = stream.resume_token
            opened_at = session.operation_time
            if token is None:
                change = stream.try_next()
                if change is not None:
                    first = change.get("clusterTime") or token_cluster_time(change.get("_id"))
                    return Position(cluster_time=first or opened_at)
                token = stream.resume_token
        cluster_time = token_cluster_time(token) or opened_at or session.operation_time
    return Position(resume_token=dict(token) if token else None, cluster_time=cluster_time)


class SplitEventStream:
    """A change stream opened with ``$changeStreamSplitLargeEvent`` that hands over whole events.

    MongoDB returns a change larger than 16 MB as fragments (``splitEvent: {fragment: n, of:
    m}``), each with its own resume token. They are put back together as Debezium's
    ``SplitEventHandler`` does: each field is taken from the first fragment that has it, and the
    event's ``_id`` is the last fragment's token, so a position taken after it resumes after the
    whole event. While fragments are buffered, :attr:`resume_token` stays at the last whole event
    (a window that stops or fails between fragments stores no position inside the event; the
    next stream reads it again from its first fragment). A fragment missing from the sequence
    fails, as in Debezium ("Missing event fragment").
    """

    def __init__(self, stream: ChangeStream):
        self._stream = stream
        self._fragments: list[Mapping[str, Any]] = []
        self._before: Mapping[str, Any] | None = None

    def __enter__(self) -> SplitEventStream:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def close(self) -> None:
        self._stream.close()

    @property
    def alive(self) -> bool:
        return self._stream.alive

    @property
    def resume_token(self) -> Mapping[str, Any] | None:
        return self._before if self._fragments else self._stream.resume_token

    def try_next(self) -> Mapping[str, Any] | None:
        while True:
            if not self._fragments:
                self._before = self._stream.resume_token
            change = self._stream.try_next()
            if change is None:
                return None
            split = change.get("splitEvent")
            if split is None:
                if self._fragments:
                    raise _missing_fragment(self._fragments, change)
                return change
            expected = len(self._fragments) + 1
            if split.get("fragment") != expected:
                raise _missing_fragment(self._fragments, change)
            self._fragments.append(change)
            if split.get("fragment") == split.get("of"):
                merged = merge_fragments(self._fragments)
                self._fragments = []
                return merged

    def next(self) -> Mapping[str, Any]:
        while True:
            change = self.try_next()
            if change is not None:
                return change
            if not self._stream.alive:
                raise StopIteration


def merge_fragments(fragments: list[Mapping[str, Any]]) -> dict[str, Any]:
    """One change from its ``$changeStreamSplitLargeEvent`` fragments (Debezium's
    ``SplitEventHandler.mergeEventFragments``): the first value of each field, the last token."""
    merged: dict[str, Any] = {"_id": fragments[-1]["_id"]}
    for fragment in fragments:
        for name, value in fragment.items():
            if name not in ("_id", "splitEvent") and name not in merged:
                merged[name] = value
    return merged


def _missing_fragment(fragments: list[Mapping[str, Any]], change: Mapping[str, Any]) -> MongoCdcError:
    got = change.get("splitEvent")
    return MongoCdcError(
        "A change split by $changeStreamSplitLargeEvent is missing a fragment; the window stopped "
        "and nothing past the last commit is visible",
        cause=f"after fragment {len(fragments)} of {fragments[0]['splitEvent'].get('of')} the "
        f"stream returned {'fragment ' + str(got.get('fragment')) if got else 'a new event'} "
        "(a user stage in cursor.pipeline that drops or reorders fragments, or a server fault)",
        fix="keep cursor.pipeline free of stages that filter fragments, then re-run; the window "
        "reads the change again from its first fragment",
    )
