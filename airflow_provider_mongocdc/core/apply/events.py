"""A collection topic's records as the apply reads them (:class:`ChangeEvent`), from the Kafka key
and value of a Debezium MongoDB change event: this connector's, or Debezium 2.x/3.x's own (the
``change_streams`` envelope; with or without Kafka Connect's ``schema``/``payload`` wrapping).

The apply needs only: the key's ``id`` (the document key), ``op``, ``after`` (the whole document as
JSON text), ``updateDescription`` (updates whose event carries no document), the source block's
time (``ts_us``, else ``ts_ms``), ``ord``, ``lsid``/``txnNumber`` (the MongoDB transaction) and
``snapshot`` (a snapshot read, blocking or incremental, or its last record). A tombstone (a null
value) deletes its key. A record that is none of these is an :class:`EventFormatError` naming the
topic, partition and offset: the apply stops before it commits anything of its batch.

Speed: with schemas on, most of a record is its schema, the same for every record of a topic. The
payload is cut out of the value where it starts (``"payload":`` is the envelope's last key, found in
the first record; a record with the marker at the same place is cut there, see :class:`_Prefix`) and
only it is parsed. A payload is decoded by msgspec into the fields above alone (the others are
skipped, not built, and ``updateDescription`` stays raw text until an update without a document needs
it); a payload that does not fit those fields' types is read again as a whole by orjson, which says
what is wrong with it, so both ways give the same event or the same error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
import orjson

from airflow_provider_mongocdc.core.base.errors import EventFormatError

CHANGE_OPS = ("c", "u", "d")
READ, DELETE = "r", "d"
# source.snapshot of a read: blocking ("true", "first", "last", ...) or incremental.
INCREMENTAL = "incremental"
LAST = "last"
_PAYLOAD = b'"payload":'
_SCHEMA_START = b'{"schema":'
_OPS = frozenset((*CHANGE_OPS, READ))


_ABSENT = msgspec.Raw(b"")


class _Source(msgspec.Struct):
    """The fields of an envelope's source block the apply uses."""

    ts_us: int | None = None
    ts_ms: int | None = None
    ord: int | None = None
    lsid: str | None = None
    txnNumber: int | None = None  # noqa: N815 (Debezium's field name)
    snapshot: str | bool | None = None


class _Payload(msgspec.Struct):
    """The fields of an envelope's payload the apply uses (``patch``/``filter``: only whether present)."""

    op: str
    source: _Source
    after: str | None = None
    # Raw JSON text (empty: the field is absent); msgspec.Raw takes no union with None.
    updateDescription: msgspec.Raw = _ABSENT  # noqa: N815
    patch: msgspec.Raw = _ABSENT
    filter: msgspec.Raw = _ABSENT


_PAYLOAD_DECODER = msgspec.json.Decoder(_Payload)
_FAST_ERRORS = (msgspec.ValidationError, msgspec.DecodeError)


@dataclass(slots=True)
class ChangeEvent:
    """One record of a collection topic, as the apply uses it."""

    key: str  # the document key: the event key's ``id`` (extended JSON of ``_id``)
    op: str  # c, u, d, r
    document: str | None  # the whole document (``after``), None for deletes and bare updates
    partition: int
    offset: int
    timestamp: int = 0  # the Kafka record's timestamp (ms): the order of several partitions
    ts_us: int | None = None  # the source time
    ord: int | None = None
    txn: str | None = None  # "<lsid>:<txnNumber>" of a change in a MongoDB transaction
    snapshot: str | None = None  # of a read: "true", "last", "incremental"...
    update: Mapping[str, Any] | None = None  # updateDescription of an update without ``after``
    # A tombstone (a null value): no source block; it belongs to the delete event before it (its
    # transaction too: a commit never ends between them, see Batch.at_boundary).
    tombstone: bool = False

    @property
    def is_read(self) -> bool:
        return self.op == READ

    @property
    def is_delete(self) -> bool:
        return self.op == DELETE

    @property
    def incremental(self) -> bool:
        return self.snapshot == INCREMENTAL


def _wrapped(raw: bytes) -> Any:
    """The payload of a JSON record: Kafka Connect's ``{"schema": ..., "payload": ...}`` unwrapped
    (only the payload parsed when the record starts with its schema), else the whole value."""
    if raw.startswith(_SCHEMA_START) and raw.endswith(b"}"):
        start = raw.find(_PAYLOAD)
        if start > 0:
            try:
                return orjson.loads(raw[start + len(_PAYLOAD) : -1])
            except orjson.JSONDecodeError:
                pass  # not where it was expected: read the whole record
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        value = json.loads(raw)  # the bare NaN/Infinity of the Java driver's strict mode
    if isinstance(value, dict) and set(value) == {"schema", "payload"}:
        return value["payload"]
    return value


class _Prefix:
    """Where the payload starts in a topic's records (after its schema, the same for each record of
    a topic), learnt from the first record. A record that starts with ``{"schema":``, has the
    payload's marker at the same place and ends with ``tail`` (what closes the record after the
    payload) has only its payload parsed; its schema bytes are not compared, as the apply uses no
    schema. A cut in the wrong place cannot be read as a payload (the bytes after a ``"payload":``
    inside the schema do not end as one JSON value where the record ends): its decoding fails and the
    record is read as a whole."""

    __slots__ = ("head", "tail", "size", "at", "_marker")

    def __init__(self, marker: bytes, tail: bytes):
        self.head: bytes | None = None
        self.tail = tail
        self.size = 0
        self.at = 0  # where the marker starts
        self._marker = marker

    def learn(self, raw: bytes) -> None:
        if raw.startswith(_SCHEMA_START) and raw.endswith(self.tail):
            start = raw.find(self._marker)
            if start > 0:
                self.head = raw[: start + len(self._marker)]
                self.size = len(self.head)
                self.at = start

    def cut(self, raw: bytes) -> bytes | None:
        if (
            self.head is not None
            and raw.startswith(self._marker, self.at)
            and raw.startswith(_SCHEMA_START)
            and raw.endswith(self.tail)
        ):
            return raw[self.size : len(raw) - len(self.tail)]
        return None


@dataclass(slots=True)
class Changes:
    """The events of one fetch of one partition as columns, when each is a plain change: an insert,
    update or replace with its document, a delete or a tombstone (no snapshot read, no update without
    a document, nothing the snapshot tracker must see). The fold keeps them as they are until the
    commit: no object per event. Index ``i`` of every list is the fetch's ``i``-th record."""

    partition: int
    keys: list[str]
    ops: list[str]
    documents: list[str | None]
    ts_us: list[int | None]
    ords: list[int | None]
    txns: list[str | None]
    offsets: list[int]
    tombstones: list[int] = field(default_factory=list)  # the indexes of the tombstones

    def __len__(self) -> int:
        return len(self.keys)

    def events(self) -> list[ChangeEvent]:
        """The same events as objects, for a fold that must see each one (their Kafka timestamps,
        which only order several partitions, are not kept)."""
        partition = self.partition
        events = [
            ChangeEvent(key, op, document, partition, offset, 0, ts_us, ord_, txn)
            for key, op, document, ts_us, ord_, txn, offset in zip(
                self.keys, self.ops, self.documents, self.ts_us, self.ords, self.txns, self.offsets
            )
        ]
        for index in self.tombstones:
            events[index].tombstone = True
        return events

    def last_txn(self, before: str | None) -> str | None:
        """The transaction of the run's last event that is not a tombstone (``before``: the one
        before the run, when every event of the run is a tombstone)."""
        tombstones = set(self.tombstones)
        for index in range(len(self.keys) - 1, -1, -1):
            if index not in tombstones:
                return self.txns[index]
        return before


class Record(Protocol):
    """A Kafka record as :meth:`EventReader.read_all` reads it (a confluent-kafka ``Message``)."""

    def offset(self) -> int: ...

    def key(self) -> bytes | None: ...

    def value(self) -> bytes | None: ...

    def timestamp(self) -> tuple[int, int]: ...


class EventReader:
    """Reads the records of one topic; keeps the topic's name for its errors."""

    def __init__(self, topic: str):
        self.topic = topic
        self._key = _Prefix(b'"payload":{"id":', b"}}")
        self._value = _Prefix(_PAYLOAD, b"}")

    def error(self, partition: int, offset: int, problem: str, cause: str) -> EventFormatError:
        return EventFormatError(
            f"The record at offset {offset} of partition {partition} of the topic {self.topic!r} is not "
            f"a MongoDB change event: {problem}",
            cause=cause,
            fix="apply only the topics of a MongoDB connector (this provider's, or Debezium 2.x/3.x's "
            "MongoDB connector with its default change_streams events and JSON converter); nothing of "
            "this batch was applied, the table stays at its last commit",
        )

    def key(self, partition: int, offset: int, raw: bytes | None) -> str:
        if raw is None:
            raise self.error(
                partition, offset, "it has no key", "every change event is keyed by its document's _id"
            )
        cut = self._key.cut(raw)
        if cut is not None:
            try:
                text = orjson.loads(cut)
            except orjson.JSONDecodeError:
                text = None
            if isinstance(text, str):
                return text
        try:
            key = _wrapped(raw)
            if self._key.head is None:
                self._key.learn(raw)
        except (ValueError, TypeError) as failure:
            raise self.error(partition, offset, "its key is not JSON", str(failure)) from None
        if not isinstance(key, Mapping) or not isinstance(key.get("id"), str):
            raise self.error(
                partition,
                offset,
                f"its key {raw[:120]!r} has no 'id'",
                'a MongoDB change event\'s key is {"id": "<_id as extended JSON>"}',
            )
        return key["id"]

    @staticmethod
    def _typed(key: str, partition: int, offset: int, timestamp: int, text: bytes) -> ChangeEvent | None:
        """The event of a payload decoded into the fields the apply uses; None when it does not fit
        them (then :meth:`read` reads the whole payload and names what is wrong)."""
        try:
            payload = _PAYLOAD_DECODER.decode(text)
        except _FAST_ERRORS:
            return None
        op = payload.op
        if op not in _OPS or len(payload.patch) or len(payload.filter):
            return None
        after = payload.after
        update = None
        if op == "u" and after is None and len(payload.updateDescription):
            try:
                update = orjson.loads(bytes(payload.updateDescription))
            except orjson.JSONDecodeError:
                return None
            if type(update) is not dict:
                update = None
        elif op in ("c", READ) and after is None:
            return None
        source = payload.source
        ts_us = source.ts_us
        if ts_us is None:
            ts_us = source.ts_ms * 1000 if source.ts_ms is not None else None
        lsid, txn_number = source.lsid, source.txnNumber
        snapshot = source.snapshot if op == READ else None
        if snapshot is True:
            snapshot = "true"
        return ChangeEvent(
            key,
            op,
            after if op != DELETE else None,
            partition,
            offset,
            timestamp,
            ts_us,
            source.ord,
            f"{lsid}:{txn_number}" if lsid is not None and txn_number is not None else None,
            str(snapshot) if snapshot not in (None, False, "false") else ("true" if op == READ else None),
            update,
        )

    def _cuts(self) -> tuple[int, bytes, bytes, int, int, int, bytes, bytes, int, int]:
        """The key's and the value's cut as the loops of a fetch make it: where the marker is (-1:
        not learnt yet), the marker, the tail, where the payload starts and where it ends."""
        key, value = self._key, self._value
        return (
            key.at if key.head is not None else -1,
            key._marker,
            key.tail,
            key.size,
            -len(key.tail),
            value.at if value.head is not None else -1,
            value._marker,
            value.tail,
            value.size,
            -len(value.tail),
        )

    def read_all(self, partition: int, records: Iterable[Record]) -> list[ChangeEvent]:
        """The events of records of one partition, in order: for each what :meth:`read` gives. The
        common record (its key and value cut where the topic's first record had its payload, a key
        whose ``id`` is text) is read in this one loop, as it runs for every record; any other goes
        through :meth:`read`."""
        events: list[ChangeEvent] = []
        append = events.append
        read, typed, loads = self.read, self._typed, orjson.loads
        (
            key_at,
            key_marker,
            key_tail,
            key_size,
            key_end,
            value_at,
            value_marker,
            value_tail,
            value_size,
            value_end,
        ) = self._cuts()
        for record in records:
            offset = record.offset()
            raw_key = record.key()
            raw_value = record.value()
            timestamp = record.timestamp()[1]
            event = None
            if (
                key_at >= 0
                and raw_key is not None
                and raw_key.startswith(key_marker, key_at)
                and raw_key.startswith(_SCHEMA_START)
                and raw_key.endswith(key_tail)
            ):
                try:
                    key = loads(raw_key[key_size:key_end])
                except orjson.JSONDecodeError:
                    key = None
                if type(key) is str:
                    if raw_value is None:
                        event = ChangeEvent(key, DELETE, None, partition, offset, timestamp, tombstone=True)
                    elif (
                        value_at >= 0
                        and raw_value.startswith(value_marker, value_at)
                        and raw_value.startswith(_SCHEMA_START)
                        and raw_value.endswith(value_tail)
                    ):
                        payload = raw_value[value_size:value_end]
                        event = typed(key, partition, offset, timestamp, payload)
            if event is None:
                event = read(partition, offset, raw_key, raw_value, timestamp)
                key_at, _, _, key_size, _, value_at, _, _, value_size, _ = self._cuts()  # learnt by read()
            append(event)
        return events

    def read_changes(self, partition: int, records: list[Record]) -> Changes | list[ChangeEvent]:
        """The records of one partition, in order: as :class:`Changes` when every one is a plain
        change (the common fetch of a stream of changes), else as :meth:`read_all` reads them."""
        changes = self._changes(partition, records)
        return changes if changes is not None else self.read_all(partition, records)

    def _changes(self, partition: int, records: list[Record]) -> Changes | None:
        """:meth:`read_changes`'s columns; None at the first record that is not a plain change. The
        common record is cut and decoded here as in :meth:`read_all`; any other is read by
        :meth:`read` (which learns the topic's prefixes, or names what is wrong with it)."""
        keys: list[str] = []
        ops: list[str] = []
        documents: list[str | None] = []
        stamps: list[int | None] = []
        ords: list[int | None] = []
        txns: list[str | None] = []
        offsets: list[int] = []
        tombstones: list[int] = []
        add_key, add_op, add_document = keys.append, ops.append, documents.append
        add_stamp, add_ord, add_txn, add_offset = stamps.append, ords.append, txns.append, offsets.append
        decode, loads = _PAYLOAD_DECODER.decode, orjson.loads
        (
            key_at,
            key_marker,
            key_tail,
            key_size,
            key_end,
            value_at,
            value_marker,
            value_tail,
            value_size,
            value_end,
        ) = self._cuts()
        for record in records:
            offset = record.offset()
            raw_key = record.key()
            raw_value = record.value()
            plain = tombstone = False
            if (
                key_at >= 0
                and raw_key is not None
                and raw_key.startswith(key_marker, key_at)
                and raw_key.startswith(_SCHEMA_START)
                and raw_key.endswith(key_tail)
            ):
                try:
                    key = loads(raw_key[key_size:key_end])
                except orjson.JSONDecodeError:
                    key = None
                if type(key) is str:
                    if raw_value is None:  # a tombstone
                        op, document, ts_us, ord_, txn = DELETE, None, None, None, None
                        plain = tombstone = True
                    elif (
                        value_at >= 0
                        and raw_value.startswith(value_marker, value_at)
                        and raw_value.startswith(_SCHEMA_START)
                        and raw_value.endswith(value_tail)
                    ):
                        try:
                            payload = decode(raw_value[value_size:value_end])
                        except _FAST_ERRORS:
                            payload = None
                        if payload is not None and not len(payload.patch) and not len(payload.filter):
                            op = payload.op
                            document = payload.after
                            if op == DELETE or (document is not None and (op == "c" or op == "u")):
                                source = payload.source
                                ts_us = source.ts_us
                                if ts_us is None and source.ts_ms is not None:
                                    ts_us = source.ts_ms * 1000
                                ord_ = source.ord
                                lsid, number = source.lsid, source.txnNumber
                                txn = f"{lsid}:{number}" if lsid is not None and number is not None else None
                                if op == DELETE:
                                    document = None
                                plain = True
            if not plain:
                event = self.read(partition, offset, raw_key, raw_value, record.timestamp()[1])
                key_at, _, _, key_size, _, value_at, _, _, value_size, _ = self._cuts()  # learnt by read()
                if (
                    event.op == READ
                    or event.update is not None
                    or (event.document is None and event.op != DELETE)
                ):
                    return None
                key, op, document, ts_us, ord_, txn = (
                    event.key,
                    event.op,
                    event.document,
                    event.ts_us,
                    event.ord,
                    event.txn,
                )
                tombstone = event.tombstone
            if tombstone:
                tombstones.append(len(keys))
            add_key(key)
            add_op(op)
            add_document(document)
            add_stamp(ts_us)
            add_ord(ord_)
            add_txn(txn)
            add_offset(offset)
        return Changes(partition, keys, ops, documents, stamps, ords, txns, offsets, tombstones)

    def read(
        self, partition: int, offset: int, raw_key: bytes | None, raw_value: bytes | None, timestamp: int = 0
    ) -> ChangeEvent:
        """The event of one record (a tombstone: a delete of its key)."""
        key = self.key(partition, offset, raw_key)
        if raw_value is None:
            return ChangeEvent(key, DELETE, None, partition, offset, timestamp, tombstone=True)
        payload = None
        cut = self._value.cut(raw_value)
        event = self._typed(key, partition, offset, timestamp, cut if cut is not None else raw_value)
        if event is not None:
            return event
        if cut is not None:
            try:
                payload = orjson.loads(cut)
            except orjson.JSONDecodeError:
                payload = None
        try:
            if payload is None:
                payload = _wrapped(raw_value)
                if self._value.head is None:
                    self._value.learn(raw_value)
        except (ValueError, TypeError) as failure:
            raise self.error(partition, offset, "its value is not JSON", str(failure)) from None
        if type(payload) is not dict:
            raise self.error(
                partition, offset, "its value is not a JSON object", f"got {type(payload).__name__}"
            )
        op = payload.get("op")
        source = payload.get("source")
        if op not in _OPS or type(source) is not dict:
            raise self.error(
                partition,
                offset,
                f"its value has op {op!r} and {'a' if isinstance(source, Mapping) else 'no'} source block",
                "a change event has op c, u, d or r and a source block (heartbeats and transaction "
                "records have their own topics)",
            )
        if "patch" in payload or "filter" in payload:
            raise self.error(
                partition,
                offset,
                "it is a Debezium 1.x event (patch/filter)",
                "the apply reads the change_streams events of Debezium 2.x/3.x and of this connector's "
                "default event.format",
            )
        after = payload.get("after")
        if after is not None and type(after) is not str:
            raise self.error(partition, offset, "its 'after' is not JSON text", f"got {type(after).__name__}")
        update = None
        if op == "u" and after is None:
            update = payload.get("updateDescription")
            if not isinstance(update, Mapping):
                update = None
        elif op in ("c", READ) and after is None:
            raise self.error(partition, offset, f"its op is {op!r} but it has no document", "'after' is null")
        ts_us = source.get("ts_us")
        if type(ts_us) is not int:
            ts_ms = source.get("ts_ms")
            ts_us = ts_ms * 1000 if isinstance(ts_ms, int) else None
        lsid, txn_number = source.get("lsid"), source.get("txnNumber")
        snapshot = source.get("snapshot") if op == READ else None
        if snapshot is True:
            snapshot = "true"
        ord_ = source.get("ord")
        return ChangeEvent(
            key,
            op,
            after if op != DELETE else None,
            partition,
            offset,
            timestamp,
            ts_us,
            ord_ if isinstance(ord_, int) else None,
            f"{lsid}:{txn_number}" if lsid is not None and txn_number is not None else None,
            str(snapshot) if snapshot not in (None, False, "false") else ("true" if op == READ else None),
            update,
        )
