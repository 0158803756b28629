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
``cursor.oversize.handling.mode``. What an event takes from a change:
:mod:`~airflow_provider_mongocdc.core.events.change`; its text:
:mod:`~airflow_provider_mongocdc.core.events.envelope`. The fields: docs/configuration.md,
"Events"; the decisions: docs/design.md, "Events".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OversizeEventError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import EventFormat, OversizeMode
from airflow_provider_mongocdc.core.events.change import read_change
from airflow_provider_mongocdc.core.events.envelope import (
    ChangeStreamsEnvelope,
    CollectionEvents,
    OplogEnvelope,
    ReadSource,
    transaction_text,
)
from airflow_provider_mongocdc.core.events.fields import FieldRules
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.events.headers import context_headers, new_run_id
from airflow_provider_mongocdc.core.events.heartbeat import Heartbeat
from airflow_provider_mongocdc.core.events.java_json import key_writer
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.events.transactions import TransactionTracker, transaction_id

log = logging.getLogger(__name__)

OPERATION_CODES = {"insert": "c", "update": "u", "replace": "u", "delete": "d"}


def now_ms() -> int:
    """The current time in epoch milliseconds (the default clock of :class:`EventBuilder`)."""
    return time.time_ns() // 1_000_000


def is_invalidate(change: Mapping[str, Any]) -> bool:
    """Whether a change stream document is an ``invalidate`` (the stream has closed)."""
    return change.get("operationType") == "invalidate"


class EventBuilder:
    """Builds the records of change events, snapshot reads and heartbeats for one configuration.

    ``replica_set`` fills ``source.rs`` of ``event.format=oplog`` events (the replica set or shard
    the stream reads; a call can override it). ``clock`` returns the current time in epoch
    milliseconds (the envelope's ``ts_ms``); ``clock_ns`` in epoch nanoseconds (the source times of
    snapshot reads; default: ``clock``'s time when ``clock`` is given, else the system clock's).
    ``run_id`` is the run's id in Debezium's ``__debezium.context.runId`` header (default: a new
    one; :mod:`~airflow_provider_mongocdc.core.events.headers`).
    One builder follows one stream: it holds the transaction state of that stream. The steps of a change event follow Debezium's ``MongoDbChangeRecordEmitter``: the
    operation, the collection, the change's facts (:func:`~airflow_provider_mongocdc.core.events.change.read_change`),
    the transaction block, the envelope (:mod:`~airflow_provider_mongocdc.core.events.envelope`),
    the key, the size check, the tombstone.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        replica_set: str = "",
        clock: Callable[[], int] | None = None,
        clock_ns: Callable[[], int] | None = None,
        run_id: str | None = None,
    ):
        self.config = config
        self.run_id = run_id or new_run_id()
        self.headers = context_headers(config, self.run_id)
        self.replica_set = replica_set
        self.namer = TopicNamer(config)
        self.filters = Filters(config)
        self.fields = FieldRules(config)
        self.heartbeat = Heartbeat(config, namer=self.namer)
        self.transactions = (
            TransactionTracker(config, namer=self.namer) if config.provide_transaction_metadata else None
        )
        self.envelope = (
            OplogEnvelope(config)
            if config.event_format == EventFormat.OPLOG
            else ChangeStreamsEnvelope(config)
        )
        self._key_dumps = key_writer(config.resolved_key_json_mode).dumps
        self._clock = clock or now_ms
        self._clock_ns = clock_ns or ((lambda: clock() * 1_000_000) if clock else time.time_ns)
        skipped = config.skipped_operations
        self._operations = {name: code for name, code in OPERATION_CODES.items() if code not in skipped}
        self._collections: dict[tuple[str, str], CollectionEvents] = {}

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
        events = self._captured(change.get("ns") or {})
        if events is None:
            return []
        facts = read_change(change, operation, op, events.data_collection, self.config)
        records, transaction = self._transaction(change, events, self.envelope.source_ms(facts), replica_set)
        rs = replica_set if replica_set is not None else self.replica_set
        payload = self.envelope.change(events, facts, transaction, self._clock(), rs)
        key = events.key(self._key_dumps(facts.document_key["_id"]))
        event = events.record(key, payload)
        if not self._fits(event, f"{operation} of {events.data_collection}"):
            if self.transactions is not None and transaction != "null":
                self.transactions.forget_last()
            return records
        records.append(event)
        if op == "d" and self.config.tombstones_on_delete:
            records.append(events.tombstone(key))
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
            return (
                self.config.event_format == EventFormat.OPLOG
                or not self.config.update_full
                or change.get("fullDocument") is None
            )
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
        stream position recorded when the snapshot started. ``incremental``: a row of an
        incremental snapshot (``source.snapshot`` "incremental", ``position`` the stream position
        it was emitted at), as Debezium writes them. The source times and ``source.ord``: the
        envelope's ``read_time_ns`` and ``read_increment``."""
        if "_id" not in document:
            raise MongoCdcError(
                f"A snapshot document of {database}.{collection} has no _id",
                cause="every MongoDB document has an _id unless a projection removed it",
                fix="read snapshot documents without a projection on _id",
            )
        events = self._collection(database, collection)
        now = self._clock()
        if position is not None:
            position_ns, increment = position.time * 1_000_000_000, position.inc
        else:
            position_ns, increment = now * 1_000_000, 0
        at = ReadSource(
            "incremental" if incremental else "last" if last else "true",
            self.envelope.read_time_ns(position_ns, incremental, self._clock_ns),
            self.envelope.read_increment(increment, incremental),
            replica_set if replica_set is not None else self.replica_set,
        )
        payload = self.envelope.read(events, document, at, now)
        event = events.record(events.key(self._key_dumps(document["_id"])), payload)
        return [event] if self._fits(event, f"snapshot read of {database}.{collection}") else []

    def build_heartbeat(self, ts_ms: int | None = None) -> Record:
        """A heartbeat record (see :mod:`airflow_provider_mongocdc.core.events.heartbeat`)."""
        return self.heartbeat.record(self._clock() if ts_ms is None else ts_ms)

    def finish(self) -> list[Record]:
        """Records that close the window: END of a transaction still open, if any."""
        return self.transactions.finish() if self.transactions is not None else []

    # -- steps ----------------------------------------------------------------------------------
    def _captured(self, namespace: Mapping[str, Any]) -> CollectionEvents | None:
        """The collection of a change when the connector captures it, else None."""
        database, collection = namespace.get("db"), namespace.get("coll")
        if (
            database is None
            or collection is None
            or not self.filters.collection_included(database, collection)
        ):
            return None
        return self._collection(database, collection)

    def _collection(self, database: str, collection: str) -> CollectionEvents:
        events = self._collections.get((database, collection))
        if events is None:
            events = self._collections[(database, collection)] = CollectionEvents(
                self.config,
                self.namer.data_topic(database, collection),
                self.fields.for_collection(database, collection),
                database,
                collection,
                self.headers,
            )
        return events

    def _transaction(
        self, change: Mapping[str, Any], events: CollectionEvents, source_ms: int, replica_set: str | None
    ) -> tuple[list[Record], str]:
        """The records before the event (END of the previous transaction, BEGIN of a new one) and
        the event's ``transaction`` block, with ``provide.transaction.metadata``."""
        if self.transactions is None:
            return [], "null"
        data_collection = self.envelope.data_collection(events, replica_set or self.replica_set)
        records, block = self.transactions.on_event(
            transaction_id(change, self.config.event_format), data_collection, source_ms
        )
        return records, transaction_text(block)

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
