"""The change watcher's view of the connector's change stream: the same stream a window reads
(scope, ``$changeStream`` options and pipeline, :mod:`~airflow_provider_mongocdc.core.mongo.change_stream`),
projected down to each change's position, time, namespace and operation, and opened as a plain
``aggregate`` so that a poll counts whole batches of raw documents instead of decoding every change
(docs/design.md, "Change-driven windows"; bench/RESULTS.md, (j)).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import CaptureScope, PipelineOrder
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.mongo.change_stream import stream_pipeline, watch_options, watch_target
from airflow_provider_mongocdc.core.offsets.model import Position, position_time, token_cluster_time

# What the watcher keeps of a change (``_id`` is the resume token, which MongoDB requires unchanged).
PROJECTION = {"$project": {"_id": 1, "clusterTime": 1, "ns": 1, "operationType": 1}}
SPLIT_STAGE = "$changeStreamSplitLargeEvent"
# watch() keyword arguments as fields of the $changeStream stage (pymongo's ChangeStream does the same).
_STAGE_FIELDS = {
    "full_document": "fullDocument",
    "full_document_before_change": "fullDocumentBeforeChange",
    "start_after": "startAfter",
    "start_at_operation_time": "startAtOperationTime",
}
_CURSOR_FIELDS = {"batch_size": "batchSize"}


def watch_pipeline(config: ConnectorConfig) -> list[dict[str, Any]]:
    """The window's pipeline with :data:`PROJECTION` last, or just before
    ``$changeStreamSplitLargeEvent`` (which MongoDB requires last; a projected change never needs
    splitting)."""
    pipeline = stream_pipeline(config)
    if pipeline and SPLIT_STAGE in pipeline[-1]:
        return [*pipeline[:-1], PROJECTION, pipeline[-1]]
    return [*pipeline, PROJECTION]


def watch_aggregate(
    config: ConnectorConfig, position: Position | None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``(pipeline, options)`` of the ``aggregate`` that opens the watcher's stream after
    ``position``: the ``$changeStream`` stage as pymongo's ``watch()`` builds it from
    :func:`~airflow_provider_mongocdc.core.mongo.change_stream.watch_options`, then
    :func:`watch_pipeline`; ``options`` are the cursor's (``batchSize``)."""
    stage: dict[str, Any] = {}
    options: dict[str, Any] = {}
    for name, value in watch_options(config, position).items():
        if name in _STAGE_FIELDS:
            stage[_STAGE_FIELDS[name]] = value
        elif name in _CURSOR_FIELDS:
            options[_CURSOR_FIELDS[name]] = value
        elif name != "max_await_time_ms":  # the watcher waits its own poll interval
            raise TypeError(f"watch option {name!r} has no $changeStream equivalent here")
    if config.capture_scope == CaptureScope.DEPLOYMENT:
        stage["allChangesForCluster"] = True
    return [{"$changeStream": stage}, *watch_pipeline(config)], options


def aggregate_target(client: Any, config: ConnectorConfig) -> Any:
    """What runs the watcher's ``aggregate``: ``admin`` for a whole deployment (with
    ``allChangesForCluster``), else the captured database or collection."""
    if config.capture_scope == CaptureScope.DEPLOYMENT:
        return client["admin"]
    return watch_target(client, config)


def capture_check(config: ConnectorConfig) -> Callable[[Mapping[str, Any]], bool] | None:
    """A test of whether a window would emit an event for a change (its operation and namespace),
    or None when the stream's own ``$match`` already leaves only those: the watcher filters each
    change itself only with ``cursor.pipeline.order=user_only``, where the connector's ``$match``
    is not in the pipeline (a window then filters every change client side)."""
    if config.cursor_pipeline_order != PipelineOrder.USER_ONLY:
        return None
    filters = Filters(config)
    operations = frozenset(filters.operation_types())

    def captured(change: Mapping[str, Any]) -> bool:
        if change.get("operationType") not in operations:
            return False
        namespace = change.get("ns") or {}
        database, collection = namespace.get("db"), namespace.get("coll")
        return (
            database is not None
            and collection is not None
            and filters.collection_included(database, collection)
        )

    return captured


def change_time(change: Mapping[str, Any]) -> Timestamp | None:
    """A change's cluster time (its own, or the one in its resume token)."""
    return change.get("clusterTime") or token_cluster_time(change.get("_id"))


def change_position(change: Mapping[str, Any]) -> Position:
    """The position right after ``change``: its resume token (and cluster time)."""
    return Position(dict(change["_id"]), change_time(change))


def position_order(position: Position) -> tuple:
    """A sort key of positions of one stream. A position with only a cluster time means "at that
    time, inclusive" and sorts before every change of that time; tokens of the same time sort by
    their KeyString (``_data``), whose hex text keeps the server's order."""
    cluster_time = position_time(position) or Timestamp(0, 0)
    if position.resume_token is None:
        return (cluster_time, 0, "")
    return (cluster_time, 1, str(position.resume_token.get("_data", "")))
