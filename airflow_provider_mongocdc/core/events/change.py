"""What a change event takes from one change stream document (:func:`read_change`).

As in Debezium's ``MongoDbCollectionSchema.valueFromDocumentChangeStream``, the operation decides
the images: an insert has ``after`` (the full document); an update or a replace has ``before``
(the pre-image, with ``capture.mode`` ``..._with_pre_image``), ``after`` (a replace's document, or an
update's full document with ``capture.mode`` ``..._update_full...``) and, for an update, the
``updateDescription``; a delete has ``before`` (the pre-image, as above).
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any, NamedTuple

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)


class ChangeFacts(NamedTuple):
    """The parts of a change stream document that its event is written from."""

    operation: str  # operationType: insert, update, replace, delete
    op: str  # the event's op: c, u, d
    document_key: Mapping[str, Any]  # documentKey, with its _id
    seconds: int  # clusterTime
    increment: int
    wall_ms: int  # wallTime in epoch milliseconds, 0 when absent
    before: Any
    after: Any
    update_description: Mapping[str, Any] | None
    lsid: Any
    txn_number: Any


def read_change(
    change: Mapping[str, Any], operation: str, op: str, data_collection: str, config: ConnectorConfig
) -> ChangeFacts:
    """The facts of a change (``op`` its event's code) of the collection ``data_collection``."""
    document_key = change.get("documentKey")
    if not document_key or "_id" not in document_key:
        raise MongoCdcError(
            f"A {operation} change of {data_collection} has no documentKey._id",
            cause="the change stream document lacks the key every data change carries",
            fix="read changes with the connector's own change stream pipeline (no stage may "
            "remove or rename documentKey)",
        )
    cluster_time = change.get("clusterTime")
    before, after, update_description = _images(change, operation, op, config)
    return ChangeFacts(
        operation,
        op,
        document_key,
        cluster_time.time if cluster_time is not None else 0,
        cluster_time.inc if cluster_time is not None else 0,
        _millis(change.get("wallTime")) or 0,
        before,
        after,
        update_description,
        change.get("lsid"),
        change.get("txnNumber"),
    )


def _images(
    change: Mapping[str, Any], operation: str, op: str, config: ConnectorConfig
) -> tuple[Any, Any, Mapping[str, Any] | None]:
    """``before``, ``after`` and the update description of a change, per its operation."""
    if op == "c":
        return None, change.get("fullDocument"), None
    before = change.get("fullDocumentBeforeChange") if config.pre_image else None
    if op == "d":
        return before, None, None
    after = change.get("fullDocument") if operation == "replace" or config.update_full else None
    description = (change.get("updateDescription") or {}) if operation == "update" else None
    return before, after, description


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        epoch = _EPOCH if value.tzinfo is None else _EPOCH_UTC
        return (value - epoch) // _MS
    return int(value)  # bson.datetime_ms.DatetimeMS or a number
