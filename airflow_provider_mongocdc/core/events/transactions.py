"""Transaction metadata (``provide.transaction.metadata=true``), as Debezium emits it.

:class:`TransactionTracker` frames every MongoDB multi-document transaction with a ``BEGIN`` record
before its first change event and an ``END`` record after its last one, on
``<topic.prefix>.transaction``, and gives each of its change events a ``transaction`` block
{``id``, ``total_order``, ``data_collection_order``}. A change belongs to a transaction by its
``lsid`` and ``txnNumber`` (:func:`transaction_id`); a transaction ends when the next captured event
is not part of it, or when the window ends (:meth:`TransactionTracker.finish`). Only captured
events count. :meth:`TransactionTracker.state` / ``TransactionTracker(config, state=...)`` carry an
open transaction across windows. The records: docs/configuration.md, "Transaction metadata"; ids,
boundaries and per-shard streams: docs/design.md, "Events", "Transaction metadata".
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import EventFormat
from airflow_provider_mongocdc.core.events.java_json import JavaJsonWriter
from airflow_provider_mongocdc.core.events.schema import (
    Framing,
    Record,
    compact,
    transaction_key_schema,
    transaction_value_schema,
)
from airflow_provider_mongocdc.core.events.topics import TopicNamer

_LSID_ENCODER = JavaJsonWriter("strict")  # MongoUtils: lsid.toJson(JsonSerialization.COMPACT_JSON_SETTINGS)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` (over UTF-16 units, 32-bit signed overflow)."""
    value = 0
    for unit in text.encode("utf-16-be").hex(" ", 2).split():
        value = (31 * value + int(unit, 16)) & 0xFFFFFFFF
    return value


def java_hash_map_order(names: list[str]) -> list[str]:
    """The order in which a ``java.util.HashMap`` that received ``names`` in this order (default
    capacity 16, load factor 0.75) iterates its keys: by bucket (``(h ^ h >>> 16) & (capacity - 1)``
    of ``String.hashCode``), then by insertion within a bucket. Debezium's ``TransactionContext``
    keeps the per-collection counts in such a map, so END records list ``data_collections`` in
    this order. (A map that grew past 12 collections in an earlier transaction keeps its larger
    table after ``clear()``; only then can Debezium's order differ.)"""
    capacity = 16
    while len(names) > capacity * 3 // 4:
        capacity *= 2

    def bucket(name: str) -> int:
        hashed = java_string_hash(name)
        return (hashed ^ (hashed >> 16)) & (capacity - 1)

    return sorted(names, key=bucket)  # sorted() is stable: insertion order within a bucket


def lsid_text(lsid: Mapping[str, Any] | None) -> str | None:
    """``source.lsid``: the session id as compact strict extended JSON (Debezium's format)."""
    if lsid is None:
        return None
    if any(isinstance(value, uuid.UUID) for value in lsid.values()):
        lsid = {
            key: Binary.from_uuid(value) if isinstance(value, uuid.UUID) else value
            for key, value in lsid.items()
        }
    return _LSID_ENCODER.dumps(lsid)


def _lsid_uuid(lsid: Mapping[str, Any]) -> str:
    value = lsid.get("id")
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, Binary) and len(value) == 16:
        return str(uuid.UUID(bytes=bytes(value)))
    return str(value)


def transaction_id(change: Mapping[str, Any], event_format: str = "change_streams") -> str | None:
    """The transaction id of a change event, or ``None`` outside transactions."""
    lsid = change.get("lsid")
    txn_number = change.get("txnNumber")
    if lsid is None and txn_number is None:
        return None
    if event_format == EventFormat.OPLOG:
        head = _lsid_uuid(lsid) if lsid is not None else None
    else:
        head = lsid_text(lsid)
    if head is None:
        return str(int(txn_number))
    if txn_number is None:
        return head
    return f"{head}:{int(txn_number)}"


class TransactionTracker:
    """Follows transactions event by event and produces their BEGIN/END records.

    Feed every captured change event in stream order with :meth:`on_event`; emit the returned
    records *before* the event and put the returned block in the event's ``transaction`` field.
    Call :meth:`finish` at the end of a window and emit its records last. ``begun`` counts the
    BEGIN records produced (a window's summary counts its ``transactions`` from it).
    """

    def __init__(
        self,
        config: ConnectorConfig,
        *,
        state: Mapping[str, Any] | None = None,
        namer: TopicNamer | None = None,
    ):
        self.config = config
        self.topic = (namer or TopicNamer(config)).transaction_topic
        self._key_framing = Framing(transaction_key_schema() if config.key_converter_schemas_enable else None)
        self._value_framing = Framing(
            transaction_value_schema() if config.value_converter_schemas_enable else None
        )
        self._id: str | None = None
        self._total = 0
        self._per_collection: dict[str, int] = {}
        self._ts_ms = 0
        self._last: str | None = None
        self.begun = 0  # BEGIN records produced: the transactions this tracker saw start
        if state:
            self._id = state["id"]
            self._total = int(state["total_order"])
            self._per_collection = {str(k): int(v) for k, v in state["data_collections"].items()}
            self._ts_ms = int(state["ts_ms"])

    @property
    def current_id(self) -> str | None:
        """The id of the open transaction, if any."""
        return self._id

    def on_event(
        self, txn_id: str | None, data_collection: str, ts_ms: int
    ) -> tuple[list[Record], dict[str, Any] | None]:
        """Account for one captured event. Returns the records to emit before it (END of the
        previous transaction, BEGIN of a new one) and its transaction block (``None`` outside
        transactions)."""
        records: list[Record] = []
        if txn_id != self._id:
            records.extend(self.finish(ts_ms))
            if txn_id is not None:
                self._id, self._ts_ms = txn_id, ts_ms
                records.append(self._record("BEGIN", None, None))
                self.begun += 1
        if txn_id is None:
            return records, None
        self._ts_ms = ts_ms
        self._total += 1
        order = self._per_collection.get(data_collection, 0) + 1
        self._per_collection[data_collection] = order
        self._last = data_collection
        return records, {"id": txn_id, "total_order": self._total, "data_collection_order": order}

    def forget_last(self) -> None:
        """Take back the last event passed to :meth:`on_event` (it was not emitted, e.g. an
        oversize event that was skipped), so END counts only emitted events."""
        if self._id is None or self._last is None:
            return
        self._total -= 1
        remaining = self._per_collection[self._last] - 1
        if remaining:
            self._per_collection[self._last] = remaining
        else:
            del self._per_collection[self._last]
        self._last = None

    def finish(self, ts_ms: int | None = None) -> list[Record]:
        """END of the open transaction (nothing when none is open). Its ``ts_ms`` is ``ts_ms``,
        the time of the event that closes the transaction (Debezium's TransactionMonitor), or,
        at the end of a window, that of the transaction's last event."""
        if self._id is None:
            return []
        if ts_ms is not None:
            self._ts_ms = ts_ms
        collections = [
            {"data_collection": name, "event_count": self._per_collection[name]}
            for name in java_hash_map_order(list(self._per_collection))
        ]
        record = self._record("END", self._total, collections)
        self._id, self._total, self._per_collection, self._ts_ms = None, 0, {}, 0
        self._last = None
        return [record]

    def state(self) -> dict[str, Any] | None:
        """The open transaction as JSON-friendly data (``None`` when none is open)."""
        if self._id is None:
            return None
        return {
            "id": self._id,
            "total_order": self._total,
            "data_collections": dict(self._per_collection),
            "ts_ms": self._ts_ms,
        }

    def _record(self, status: str, count: int | None, collections: list[dict[str, Any]] | None) -> Record:
        assert self._id is not None
        key = self._key_framing.wrap(compact({"id": self._id}).encode())
        value = self._value_framing.wrap(
            compact(
                {
                    "status": status,
                    "id": self._id,
                    "event_count": count,
                    "data_collections": collections,
                    "ts_ms": self._ts_ms,
                }
            ).encode()
        )
        return Record(self.topic, key, value)
