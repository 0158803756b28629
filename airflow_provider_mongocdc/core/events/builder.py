"""Debezium-compatible change events from MongoDB change stream and snapshot documents.

:class:`EventBuilder` turns one change stream document (as pymongo returns it) or one snapshot
document into the :class:`Record` objects to send to Kafka: the event on
``<topic.prefix>.<db>.<collection>`` and, for deletes, a tombstone (``tombstones.on.delete``); plus
transaction BEGIN/END records when ``provide.transaction.metadata`` is on. The bytes are Debezium
3.x's (``event.format=change_streams``) or the Debezium 1.x shape (``event.format=oplog``). The key
holds ``documentKey._id`` only, so all events of a document share one key and one partition.
Operations other than inserts, updates, replaces and deletes (``drop``, ``rename``,
``dropDatabase``, ``invalidate``), skipped operations and uncaptured collections produce no
records; :func:`is_invalidate` lets the reader notice a closed stream. An event larger than
``event.max.bytes`` raises :class:`OversizeEventError` or is dropped with a warning, per
``cursor.oversize.handling.mode``. The fields: docs/configuration.md, "Events"; the decisions:
docs/design.md, "Events".
"""

from __future__ import annotations

import datetime
import logging
import time
from collections.abc import Callable, Mapping
from json.encoder import encode_basestring as _quote
from typing import Any

from airflow_provider_mongocdc import __version__
from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OversizeEventError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import EventFormat, JsonSerializationMode, OversizeMode
from airflow_provider_mongocdc.core.events.fields import FieldRules, FieldTransform
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.events.heartbeat import Heartbeat
from airflow_provider_mongocdc.core.events.java_json import (
    document_writer,
    key_writer,
    quote_text,
    updated_fields_writer,
)
from airflow_provider_mongocdc.core.events.schema import Framing, Record, compact, envelope_schema, key_schema
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.events.transactions import TransactionTracker, lsid_text, transaction_id

log = logging.getLogger(__name__)

CONNECTOR = "mongodb"
OPERATION_CODES = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}
_EPOCH = datetime.datetime(1970, 1, 1)
_EPOCH_UTC = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)
_MS = datetime.timedelta(milliseconds=1)


def now_ms() -> int:
    """The current time in epoch milliseconds (the default clock of :class:`EventBuilder`)."""
    return time.time_ns() // 1_000_000


def is_invalidate(change: Mapping[str, Any]) -> bool:
    """Whether a change stream document is an ``invalidate`` (the stream has closed)."""
    return change.get("operationType") == "invalidate"


def _millis(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, datetime.datetime):
        epoch = _EPOCH if value.tzinfo is None else _EPOCH_UTC
        return (value - epoch) // _MS
    return int(value)  # bson.datetime_ms.DatetimeMS or a number


class _Collection:
    """Everything about one collection's events that does not change from event to event."""

    __slots__ = (
        "database",
        "collection",
        "topic",
        "key_head",
        "key_tail",
        "value_head",
        "value_tail",
        "source_head",
        "db_part",
        "collection_part",
        "data_collection",
        "fields",
        "rs_parts",
    )

    def __init__(self, builder: EventBuilder, database: str, collection: str):
        config = builder.config
        self.database = database
        self.collection = collection
        self.topic = builder.namer.data_topic(database, collection)
        adjustment = config.schema_name_adjustment_mode
        key_framing = Framing(
            key_schema(self.topic, adjustment=adjustment) if config.key_converter_schemas_enable else None
        )
        self.key_head = key_framing.head + b'{"id":'
        self.key_tail = b"}" + key_framing.tail
        value_framing = Framing(
            envelope_schema(
                self.topic,
                event_format=config.event_format,
                transaction_metadata=config.provide_transaction_metadata,
                adjustment=adjustment,
            )
            if config.value_converter_schemas_enable
            else None
        )
        self.value_head = value_framing.head
        self.value_tail = value_framing.tail
        self.source_head = (
            '{"version":'
            + _quote(__version__)
            + ',"connector":"'
            + CONNECTOR
            + '","name":'
            + _quote(config.topic_prefix)
            + ',"ts_ms":'
        )
        self.db_part = ',"db":' + _quote(database)
        self.collection_part = ',"collection":' + _quote(collection) + ',"ord":'
        self.data_collection = f"{database}.{collection}"
        self.fields: FieldTransform | None = builder.fields.for_collection(database, collection)
        self.rs_parts: dict[str, str] = {}

    def oplog_source(self, ts_ms: int, snapshot: str, rs: str, increment: int) -> str:
        """The 1.x (``event.format=oplog``) source block: ``snapshot`` is ``true`` or ``false``,
        ``rs`` the text of :meth:`rs_part`."""
        return (
            self.source_head
            + str(ts_ms)
            + ',"snapshot":'
            + snapshot
            + self.db_part
            + rs
            + self.collection_part
            + str(increment)
            + ',"h":null}'
        )

    def source(self, ts_ns: int, snapshot: str, increment: int, session: str) -> str:
        """The 3.x source block: ``ts_ns`` its instant in epoch nanoseconds (``ts_ms``, ``ts_us``
        and ``ts_ns`` are that instant, as AbstractSourceInfoStructMaker writes it), ``snapshot``
        its value (``false``, ``true``, ``last``, ``incremental``), ``session`` the text of its
        ``lsid``, ``txnNumber`` and ``wallTime``."""
        return (
            f'{self.source_head}{ts_ns // 1_000_000},"snapshot":"{snapshot}"{self.db_part},"sequence":null,'
            f'"ts_us":{ts_ns // 1000},"ts_ns":{ts_ns}{self.collection_part}{increment}{session}}}'
        )

    def rs_part(self, replica_set: str) -> str:
        part = self.rs_parts.get(replica_set)
        if part is None:
            part = self.rs_parts[replica_set] = ',"rs":' + _quote(replica_set)
        return part


class EventBuilder:
    """Builds the records of change events, snapshot reads and heartbeats for one configuration.

    ``replica_set`` fills ``source.rs`` of ``event.format=oplog`` events (the replica set or shard
    the stream reads; a call can override it). ``clock`` returns the current time in epoch
    milliseconds (the envelope's ``ts_ms``); ``clock_ns`` in epoch nanoseconds (the source times of
    snapshot reads; default: ``clock``'s time when ``clock`` is given, else the system clock's).
    One builder follows one stream: it holds the transaction state of that stream.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        replica_set: str = "",
        clock: Callable[[], int] | None = None,
        clock_ns: Callable[[], int] | None = None,
    ):
        self.config = config
        self.replica_set = replica_set
        self.encoder = document_writer(config.extended_json_mode)
        self.key_encoder = key_writer(config.resolved_key_json_mode)
        # json.serialization.mode=strict: Debezium writes updatedFields as its documents.
        self.updated_fields_encoder = (
            document_writer("strict")
            if config.json_serialization_mode == JsonSerializationMode.STRICT
            else updated_fields_writer(config.extended_json_mode)
        )
        self.namer = TopicNamer(config)
        self.filters = Filters(config)
        self.fields = FieldRules(config)
        self.heartbeat = Heartbeat(config, namer=self.namer)
        self.transactions = (
            TransactionTracker(config, namer=self.namer) if config.provide_transaction_metadata else None
        )
        self._clock = clock or now_ms
        self._clock_ns = clock_ns or ((lambda: clock() * 1_000_000) if clock else time.time_ns)
        self._oplog = config.event_format == EventFormat.OPLOG
        skipped = config.skipped_operations
        self._operations = {name: code for name, code in OPERATION_CODES.items() if code not in skipped}
        self._collections: dict[tuple[str, str], _Collection] = {}
        self._dumps = self.encoder.dumps
        self._key_dumps = self.key_encoder.dumps
        self._updated_dumps = self.updated_fields_encoder.dumps

    # -- public API ------------------------------------------------------------------------------
    def topic_for(self, database: str, collection: str) -> str:
        """The data topic of a collection."""
        return self.namer.data_topic(database, collection)

    def build_change(self, change: Mapping[str, Any], *, replica_set: str | None = None) -> list[Record]:
        """Records for one change stream document, in the order to send them (BEGIN/END of
        transactions, the event, its tombstone). Empty when the change produces no event."""
        operation = change.get("operationType")
        op = self._operations.get(operation)  # type: ignore[arg-type]
        if op is None:
            if operation not in OPERATION_CODES:
                log.debug("No event for a %s change (see core.events)", operation)
            return []
        namespace = change.get("ns") or {}
        database, collection = namespace.get("db"), namespace.get("coll")
        if (
            database is None
            or collection is None
            or not self.filters.collection_included(database, collection)
        ):
            return []
        info = self._collection(database, collection)
        document_key = change.get("documentKey")
        if not document_key or "_id" not in document_key:
            raise MongoCdcError(
                f"A {operation} change of {database}.{collection} has no documentKey._id",
                cause="the change stream document lacks the key every data change carries",
                fix="read changes with the connector's own change stream pipeline (no stage may "
                "remove or rename documentKey)",
            )
        document_id = document_key["_id"]

        cluster_time = change.get("clusterTime")
        seconds = cluster_time.time if cluster_time is not None else 0
        increment = cluster_time.inc if cluster_time is not None else 0
        wall_time = _millis(change.get("wallTime")) or 0
        # source.ts_ms: Debezium 3.x's SourceInfo.timestamp() prefers the change's wallTime (in ms)
        # and falls back to the clusterTime seconds; Debezium 1.x (event.format=oplog) has the latter.
        source_ms = wall_time if wall_time and not self._oplog else seconds * 1000
        config = self.config
        fields = info.fields

        before = after = None
        update_description = None
        if op == "c":
            after = change.get("fullDocument")
        elif op == "d":
            if config.pre_image:
                before = change.get("fullDocumentBeforeChange")
        else:
            if operation == "replace" or config.update_full:
                after = change.get("fullDocument")
            if config.pre_image:
                before = change.get("fullDocumentBeforeChange")
            if operation == "update":
                update_description = change.get("updateDescription") or {}

        lsid = change.get("lsid")
        txn_number = change.get("txnNumber")
        records: list[Record] = []
        block_text = "null"
        if self.transactions is not None:
            data_collection = (
                f"{replica_set or self.replica_set}.{info.data_collection}"
                if self._oplog
                else info.data_collection
            )
            pre, block = self.transactions.on_event(
                transaction_id(change, config.event_format), data_collection, source_ms
            )
            records.extend(pre)
            if block is not None:
                block_text = (
                    '{"id":'
                    + _quote(block["id"])
                    + ',"total_order":'
                    + str(block["total_order"])
                    + ',"data_collection_order":'
                    + str(block["data_collection_order"])
                    + "}"
                )

        if self._oplog:
            rs = info.rs_part(replica_set if replica_set is not None else self.replica_set)
            payload = self._oplog_payload(
                info,
                op,
                operation,
                after,
                update_description,
                document_key,
                fields,
                seconds,
                increment,
                rs,
                block_text,
            )
        else:
            before_text = (
                "null"
                if before is None
                else quote_text(self._dumps(fields.document(before) if fields else before))
            )
            after_text = (
                "null"
                if after is None
                else quote_text(self._dumps(fields.document(after) if fields else after))
            )
            description = (
                "null" if update_description is None else self._update_description(update_description, fields)
            )
            # MongoDbSourceInfoStructMaker: lsid and txnNumber only together, wallTime only when set.
            session = lsid is not None and txn_number is not None
            source = info.source(
                source_ms * 1_000_000,
                "false",
                increment,
                ',"lsid":'
                + (_quote(lsid_text(lsid) or "") if session else "null")
                + ',"txnNumber":'
                + (str(int(txn_number)) if session else "null")
                + ',"wallTime":'
                + (str(wall_time) if wall_time else "null"),
            )
            # One f-string: a chain of + copies the growing text (the document's included) each time.
            payload = (
                f'{{"before":{before_text},"after":{after_text},"updateDescription":{description},'
                f'"source":{source},"op":"{op}","ts_ms":{self._clock()},"transaction":{block_text}}}'
            )

        key = info.key_head + _quote(self._key_dumps(document_id)).encode() + info.key_tail
        value = b"".join((info.value_head, payload.encode(), info.value_tail))
        event = Record(info.topic, key, value)
        if not self._fits(event, f"{operation} of {database}.{collection}"):
            if self.transactions is not None and block_text != "null":
                self.transactions.forget_last()
            return records
        records.append(event)
        if op == "d" and config.tombstones_on_delete:
            records.append(Record(info.topic, key, None))
        return records

    def omits_document(self, change: Mapping[str, Any]) -> bool:
        """Whether ``change`` leaves a document in its collection that no event of it carries
        whole: an update whose event holds the change only (``updateDescription``: capture modes
        without ``update_full``, ``event.format=oplog``, or a lookup that found nothing), or an
        insert, update or replace whose operation ``skipped.operations`` drops. A delete leaves no
        document; drops and renames are not about one document."""
        operation = change.get("operationType")
        if operation not in ("insert", "update", "replace"):
            return False
        if operation not in self._operations:  # skipped: no event at all
            return True
        if operation == "update":
            return self._oplog or not self.config.update_full or change.get("fullDocument") is None
        return False

    def build_snapshot(
        self,
        document: Mapping[str, Any],
        database: str,
        collection: str,
        *,
        last: bool = False,
        position: Any = None,
        replica_set: str | None = None,
        incremental: bool = False,
    ) -> list[Record]:
        """The read event (``op`` ``r``) of one snapshot document. ``last`` marks the snapshot's
        final event (``source.snapshot`` "last"); ``position`` is the ``bson.Timestamp`` of the
        stream position recorded when the snapshot started (``source.ord``). ``incremental``: a
        row of an incremental snapshot (``source.snapshot`` "incremental", ``position`` the
        stream position it was emitted at), as Debezium writes them.

        The source times (``ts_ms``, ``ts_us``, ``ts_ns``), as Debezium 3.x sets them: a read of
        an initial or blocking snapshot carries the instant its event is built. Debezium's snapshot offset holds
        the stream's resume token without a cluster time (MongoDbSnapshotChangeEventSource
        ``initSnapshotStartOffsets``, ``SourceInfo.noEvent``), so ``SourceInfo.timestamp()`` is
        null and ``AbstractSourceInfoStructMaker.commonStruct`` takes ``Instant.now()``. An
        incremental read carries the cluster time of the stream position in whole seconds
        (MongoDbIncrementalSnapshotChangeEventSource ``sendEvent``: ``readEvent`` keeps the
        streaming offset's position, and ``timestamp()`` gives its seconds); so does every read
        of ``event.format=oplog`` (Debezium 1.x: the position recorded at the start)."""
        if "_id" not in document:
            raise MongoCdcError(
                f"A snapshot document of {database}.{collection} has no _id",
                cause="every MongoDB document has an _id unless a projection removed it",
                fix="read snapshot documents without a projection on _id",
            )
        info = self._collection(database, collection)
        fields = info.fields
        now = self._clock()
        if position is not None:
            seconds, increment = position.time, position.inc
            source_ns = seconds * 1_000_000_000
        else:
            seconds, increment, source_ns = now // 1000, 0, now * 1_000_000
        if not incremental and not self._oplog:
            source_ns = self._clock_ns()
        after_text = quote_text(self._dumps(fields.document(document) if fields else document))
        if self._oplog:
            rs = info.rs_part(replica_set if replica_set is not None else self.replica_set)
            source = info.oplog_source(source_ns // 1_000_000, "true", rs, increment)
            payload = (
                '{"after":'
                + after_text
                + ',"patch":null,"filter":null,"source":'
                + source
                + ',"op":"r","ts_ms":'
                + str(now)
                + (',"transaction":null}' if self.config.provide_transaction_metadata else "}")
            )
        else:
            source = info.source(
                source_ns,
                "incremental" if incremental else "last" if last else "true",
                increment,
                ',"lsid":null,"txnNumber":null,"wallTime":null',
            )
            payload = (
                f'{{"before":null,"after":{after_text},"updateDescription":null,'
                f'"source":{source},"op":"r","ts_ms":{now},"transaction":null}}'
            )
        key = info.key_head + _quote(self._key_dumps(document["_id"])).encode() + info.key_tail
        event = Record(info.topic, key, b"".join((info.value_head, payload.encode(), info.value_tail)))
        return [event] if self._fits(event, f"snapshot read of {database}.{collection}") else []

    def build_heartbeat(self, ts_ms: int | None = None) -> Record:
        """A heartbeat record (see :mod:`airflow_provider_mongocdc.core.events.heartbeat`)."""
        return self.heartbeat.record(self._clock() if ts_ms is None else ts_ms)

    def finish(self) -> list[Record]:
        """Records that close the window: END of a transaction still open, if any."""
        return self.transactions.finish() if self.transactions is not None else []

    # -- pieces ---------------------------------------------------------------------------------
    def _collection(self, database: str, collection: str) -> _Collection:
        info = self._collections.get((database, collection))
        if info is None:
            info = self._collections[(database, collection)] = _Collection(self, database, collection)
        return info

    def _update_description(self, description: Mapping[str, Any], fields: FieldTransform | None) -> str:
        updated = description.get("updatedFields")
        removed = description.get("removedFields")
        truncated = description.get("truncatedArrays")
        if fields is not None:
            updated = fields.updated_fields(updated)
            removed = fields.paths(removed)
            truncated = fields.truncated_arrays(truncated)
        return compact(
            {
                "removedFields": list(removed) if removed else None,
                "updatedFields": None if updated is None else self._updated_dumps(updated),
                "truncatedArrays": [
                    {"field": entry["field"], "size": int(entry["newSize"])} for entry in truncated
                ]
                if truncated
                else None,
            }
        )

    def _oplog_payload(
        self,
        info: _Collection,
        op: str,
        operation: str,
        after: Any,
        description: Mapping[str, Any] | None,
        document_key: Any,
        fields: FieldTransform | None,
        seconds: int,
        increment: int,
        rs: str,
        block_text: str,
    ) -> str:
        after_text = patch_text = filter_text = "null"
        if op == "c":
            after_text = quote_text(self._dumps(fields.document(after) if fields else after))
        else:
            filter_text = quote_text(self._dumps(fields.document(document_key) if fields else document_key))
            if operation == "replace":
                patch_text = quote_text(self._dumps(fields.document(after) if fields else after))
            elif operation == "update":
                patch_text = quote_text(self._dumps(self._patch(description or {}, fields)))
        source = info.oplog_source(seconds * 1000, "false", rs, increment)
        payload = (
            '{"after":'
            + after_text
            + ',"patch":'
            + patch_text
            + ',"filter":'
            + filter_text
            + ',"source":'
            + source
            + ',"op":"'
            + op
            + '","ts_ms":'
            + str(self._clock())
        )
        if self.config.provide_transaction_metadata:
            payload += ',"transaction":' + block_text
        return payload + "}"

    @staticmethod
    def _patch(description: Mapping[str, Any], fields: FieldTransform | None) -> dict[str, Any]:
        updated = description.get("updatedFields") or {}
        removed = description.get("removedFields") or []
        if fields is not None:
            updated = fields.updated_fields(updated) or {}
            removed = fields.paths(removed) or []
        patch: dict[str, Any] = {}
        if updated:
            patch["$set"] = updated
        if removed:
            patch["$unset"] = {path: True for path in removed}
        return patch

    def _fits(self, record: Record, what: str) -> bool:
        size = record.size
        limit = self.config.event_max_bytes
        if size <= limit:
            return True
        key = (record.key or b"")[-200:].decode("utf-8", "replace")
        if self.config.event_oversize_handling_mode == OversizeMode.SKIP:
            log.warning(
                "Skipped a %d-byte event (%s) on %s with key %s: larger than "
                "event.max.bytes=%d (cursor.oversize.handling.mode=skip)",
                size,
                what,
                record.topic,
                key,
                limit,
            )
            return False
        raise OversizeEventError(
            f"The {what} produced a {size}-byte event for topic {record.topic} (key {key}), "
            f"more than event.max.bytes={limit}",
            cause="the document is too large for one Kafka message with the current limits",
            fix="raise event.max.bytes together with the topic's max.message.bytes and the "
            "producer's message.max.bytes, exclude large fields with field.exclude.list, or "
            "set cursor.oversize.handling.mode=skip to drop such events",
        )
