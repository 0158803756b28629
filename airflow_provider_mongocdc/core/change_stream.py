"""Opening the connector's change stream, and where the stream stands now.

The stream's scope follows ``capture.scope`` (the whole deployment by default, or one database or
one collection given by ``capture.target``); its pipeline and options come from
:class:`~airflow_provider_mongocdc.core.filters.Filters`, so that the server drops uncaptured
changes before they cross the network.

Resume tokens are opaque to users, but MongoDB writes their ``_data`` as a hex KeyString that
starts with the event's cluster time (type byte ``0x82``, then seconds and increment as two
big-endian 32-bit integers); :func:`token_cluster_time` reads it, which lets a window compare a
``postBatchResumeToken`` with its end when no event came.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.change_stream import ChangeStream

from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.errors import ConfigError
from airflow_provider_mongocdc.core.filters import Filters
from airflow_provider_mongocdc.core.offsets import Position

_TIMESTAMP_CTYPE = "82"

# Errors that mean the resume point is gone from the oplog (seed 002).
HISTORY_LOST_CODES = {
    286: "ChangeStreamHistoryLost",
    280: "ChangeStreamFatalError",
    260: "InvalidResumeToken",
    136: "CappedPositionLost",
}
HISTORY_LOST_MESSAGES = (
    "resume point may no longer be in the oplog",
    "resume of change stream was not possible",
)


def is_history_lost(error: BaseException) -> bool:
    """Whether a server error says the stream cannot resume because the oplog rolled past it.

    Connection errors, timeouts and stepDowns are not: they are transient and the stream resumes.
    """
    from pymongo.errors import ConnectionFailure, OperationFailure

    if isinstance(error, ConnectionFailure) or not isinstance(error, OperationFailure):
        return False
    if error.code in HISTORY_LOST_CODES:
        return True
    message = str(error).lower()
    return any(text in message for text in HISTORY_LOST_MESSAGES)


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
    if scope == "deployment":
        return client
    if not target:
        raise ConfigError(
            f"capture.scope={scope} needs capture.target",
            fix="set capture.target to the database name (scope database) or to "
            "<database>.<collection> (scope collection)",
        )
    if scope == "database":
        return client[target]
    database, _, collection = target.partition(".")
    if not collection:
        raise ConfigError(
            f"capture.target={target!r} does not name a collection",
            fix="use <database>.<collection> with capture.scope=collection",
        )
    return client[database][collection]


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
    filters = Filters(config)
    options = filters.change_stream_options()
    if max_await_time_ms is not None:
        options["max_await_time_ms"] = max_await_time_ms
    if position is not None:
        if position.resume_token is not None:
            options["start_after"] = dict(position.resume_token)
        else:
            options["start_at_operation_time"] = position.cluster_time
    return watch_target(client, config).watch(filters.change_stream_pipeline(), session=session, **options)


def current_position(client: MongoClient, config: ConnectorConfig) -> Position:
    """Where the connector's change stream stands now: its high-water-mark resume token and
    cluster time. A snapshot records this before copying, so that streaming continues from it."""
    with client.start_session() as session:
        with open_stream(client, config, max_await_time_ms=100, session=session) as stream:
            stream.try_next()
            token = stream.resume_token
        cluster_time = token_cluster_time(token) or session.operation_time
    return Position(resume_token=dict(token) if token else None, cluster_time=cluster_time)
