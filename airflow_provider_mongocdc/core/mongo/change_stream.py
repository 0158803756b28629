"""Opening the connector's change stream, and where the stream stands now.

The stream's scope follows ``capture.scope`` (the whole deployment by default, or one database or
one collection given by ``capture.target``); its pipeline and options come from
:class:`~airflow_provider_mongocdc.core.events.filters.Filters`, so that the server drops uncaptured
changes before they cross the network. :class:`SplitEventStream` hands over changes split by
``$changeStreamSplitLargeEvent`` as whole events.

What the stream's errors mean lives in :mod:`airflow_provider_mongocdc.core.mongo.stream_errors`, the cluster time inside a resume
token in :mod:`airflow_provider_mongocdc.core.offsets.model` (:func:`token_cluster_time`); both are importable from here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream

from airflow_provider_mongocdc.core.base.errors import ConfigError, MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import CaptureScope, OversizeMode, PipelineOrder
from airflow_provider_mongocdc.core.config.parsing import parse_pipeline
from airflow_provider_mongocdc.core.events.builder import is_invalidate
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.offsets.model import Position, token_cluster_time


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
        options.update(_start_options(position))
    return options


def _start_options(position: Position) -> dict[str, Any]:
    """After a position's resume token (``startAfter``), or at its cluster time."""
    if position.resume_token is not None:
        return {"start_after": dict(position.resume_token)}
    return {"start_at_operation_time": position.cluster_time}


def buffered_changes(stream: Any) -> int | None:
    """How many changes of the server's last reply ``stream`` still holds: 0 when its next
    ``try_next`` asks the server (a ``getMore``); None when this pymongo does not say (pymongo's
    sync and asyncio change streams keep the reply in their cursor's ``_data``)."""
    data = getattr(getattr(stream, "_cursor", None), "_data", None)
    try:
        return len(data) if data is not None else None
    except TypeError:
        return None


def read_invalidate_token(
    client: MongoClient, config: ConnectorConfig, position: Position, *, max_await_time_ms: int
) -> Mapping[str, Any] | None:
    """The resume token of the invalidate event after ``position``, read with an invalidate-only
    stream, or None when none came within three reads. Raises pymongo's errors.

    MongoDB reports that token as the closing batch's PBRT even when ``$match`` filtered the
    invalidate out; servers without PBRTs (and some test servers) keep the last event's token
    instead, which would make every later window stop at the same invalidate.
    """
    options = {"max_await_time_ms": max_await_time_ms, **_start_options(position)}
    with watch_target(client, config).watch(
        [{"$match": {"operationType": "invalidate"}}], **options
    ) as stream:
        for _ in range(3):
            change = stream.try_next()
            if change is not None and is_invalidate(change):
                return change["_id"]
            if not stream.alive:
                break
    return None


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
