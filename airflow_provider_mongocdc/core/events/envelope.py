"""The text of an event: a collection's fixed parts, the ``source`` block and the two envelopes.

:class:`CollectionEvents` holds what does not change from one event of a collection to the next
(topic, key and value framing, field rules, headers, and the fixed parts of its :class:`SourceBlock`), as
Debezium's ``MongoDbCollectionSchema`` does. The envelope of the payload depends on
``event.format``: :class:`ChangeStreamsEnvelope` writes Debezium 3.x's (``before``, ``after``,
``updateDescription``; ``change_streams``), :class:`OplogEnvelope` Debezium 1.x's (``after``,
``patch``, ``filter``; ``oplog``), for change events and snapshot reads alike. Texts are joined
from pieces written once per collection; a document's text is written once (one f-string, not a
chain of ``+`` that copies it again at each step). The fields: docs/configuration.md, "Events".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from json.encoder import encode_basestring as _quote
from typing import Any, NamedTuple

from airflow_provider_mongocdc import __version__
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import JsonSerializationMode
from airflow_provider_mongocdc.core.events.change import ChangeFacts
from airflow_provider_mongocdc.core.events.fields import FieldTransform
from airflow_provider_mongocdc.core.events.java_json import document_writer, quote_text, updated_fields_writer
from airflow_provider_mongocdc.core.events.schema import Framing, Record, compact, envelope_schema, key_schema
from airflow_provider_mongocdc.core.events.transactions import lsid_text

CONNECTOR = "mongodb"
# A snapshot read's session fields (3.x): none.
NO_SESSION = ',"lsid":null,"txnNumber":null,"wallTime":null'


class ReadSource(NamedTuple):
    """The ``source`` block of a snapshot read: ``snapshot`` its value (3.x: ``true``, ``last``,
    ``incremental``), ``ts_ns`` its instant in epoch nanoseconds, ``increment`` its ``ord`` (the
    envelope's ``read_increment``)."""

    snapshot: str
    ts_ns: int
    increment: int
    replica_set: str


class SourceBlock:
    """The ``source`` block of one collection's events, its fixed parts written once."""

    __slots__ = ("head", "db_part", "collection_part", "rs_parts")

    def __init__(self, topic_prefix: str, database: str, collection: str):
        self.head = (
            '{"version":'
            + _quote(__version__)
            + ',"connector":"'
            + CONNECTOR
            + '","name":'
            + _quote(topic_prefix)
            + ',"ts_ms":'
        )
        self.db_part = ',"db":' + _quote(database)
        self.collection_part = ',"collection":' + _quote(collection) + ',"ord":'
        self.rs_parts: dict[str, str] = {}

    def change_streams(self, ts_ns: int, snapshot: str, increment: int, session: str) -> str:
        """The 3.x source block: ``ts_ns`` its instant in epoch nanoseconds (``ts_ms``, ``ts_us``
        and ``ts_ns`` are that instant, as AbstractSourceInfoStructMaker writes it), ``snapshot``
        its value (``false``, ``true``, ``last``, ``incremental``), ``session`` the text of its
        ``lsid``, ``txnNumber`` and ``wallTime``."""
        return (
            f'{self.head}{ts_ns // 1_000_000},"snapshot":"{snapshot}"{self.db_part},"sequence":null,'
            f'"ts_us":{ts_ns // 1000},"ts_ns":{ts_ns}{self.collection_part}{increment}{session}}}'
        )

    def oplog(self, ts_ms: int, snapshot: str, replica_set: str, increment: int) -> str:
        """The 1.x (``event.format=oplog``) source block: ``snapshot`` is ``true`` or ``false``."""
        return (
            self.head
            + str(ts_ms)
            + ',"snapshot":'
            + snapshot
            + self.db_part
            + self._rs_part(replica_set)
            + self.collection_part
            + str(increment)
            + ',"h":null}'
        )

    def _rs_part(self, replica_set: str) -> str:
        part = self.rs_parts.get(replica_set)
        if part is None:
            part = self.rs_parts[replica_set] = ',"rs":' + _quote(replica_set)
        return part


class CollectionEvents:
    """Everything about one collection's events that does not change from event to event."""

    __slots__ = (
        "topic",
        "data_collection",
        "fields",
        "source",
        "key_head",
        "key_tail",
        "value_head",
        "value_tail",
        "headers",
    )

    def __init__(
        self,
        config: ConnectorConfig,
        topic: str,
        fields: FieldTransform | None,
        database: str,
        collection: str,
        headers: tuple[tuple[str, bytes], ...] = (),
    ):
        self.topic = topic
        self.headers = headers
        self.data_collection = f"{database}.{collection}"
        self.fields = fields
        self.source = SourceBlock(config.topic_prefix, database, collection)
        adjustment = config.schema_name_adjustment_mode
        key_framing = Framing(
            key_schema(topic, adjustment=adjustment) if config.key_converter_schemas_enable else None
        )
        self.key_head = key_framing.head + b'{"id":'
        self.key_tail = b"}" + key_framing.tail
        value_framing = Framing(
            envelope_schema(
                topic,
                event_format=config.event_format,
                transaction_metadata=config.provide_transaction_metadata,
                adjustment=adjustment,
            )
            if config.value_converter_schemas_enable
            else None
        )
        self.value_head = value_framing.head
        self.value_tail = value_framing.tail

    def key(self, id_text: str) -> bytes:
        """The key of a document whose ``_id`` is written as ``id_text`` (``key.json.mode``)."""
        return self.key_head + _quote(id_text).encode() + self.key_tail

    def record(self, key: bytes, payload: str) -> Record:
        return Record(
            self.topic, key, b"".join((self.value_head, payload.encode(), self.value_tail)), self.headers
        )

    def tombstone(self, key: bytes) -> Record:
        """The tombstone after a delete: the event's key and headers, no value."""
        return Record(self.topic, key, None, self.headers)

    def document(self, document: Any) -> Any:
        """``document`` with the collection's field exclusions and renames applied."""
        return self.fields.document(document) if self.fields else document


class ChangeStreamsEnvelope:
    """Debezium 3.x's envelope (``event.format=change_streams``)."""

    def __init__(self, config: ConnectorConfig):
        self.dumps = document_writer(config.extended_json_mode).dumps
        # json.serialization.mode=strict: Debezium writes updatedFields as its documents.
        self.updated_dumps = (
            document_writer("strict")
            if config.json_serialization_mode == JsonSerializationMode.STRICT
            else updated_fields_writer(config.extended_json_mode)
        ).dumps

    @staticmethod
    def source_ms(facts: ChangeFacts) -> int:
        """``source.ts_ms``: Debezium 3.x's SourceInfo.timestamp() prefers the change's wallTime (in
        ms) and falls back to the clusterTime seconds."""
        return facts.wall_ms if facts.wall_ms else facts.seconds * 1000

    @staticmethod
    def data_collection(events: CollectionEvents, replica_set: str) -> str:
        """The name of the collection in transaction metadata."""
        return events.data_collection

    @staticmethod
    def read_time_ns(position_ns: int, incremental: bool, clock_ns: Callable[[], int]) -> int:
        """The source times of a snapshot read, as Debezium 3.x sets them: an incremental read
        carries the cluster time of the stream position in whole seconds
        (MongoDbIncrementalSnapshotChangeEventSource ``sendEvent``: ``readEvent`` keeps the
        streaming offset's position, and ``timestamp()`` gives its seconds); a read of an initial
        or blocking snapshot the instant its event is built. Debezium's snapshot offset holds the
        stream's resume token without a cluster time (MongoDbSnapshotChangeEventSource
        ``initSnapshotStartOffsets``, ``SourceInfo.noEvent``), so ``SourceInfo.timestamp()`` is
        null and ``AbstractSourceInfoStructMaker.commonStruct`` takes ``Instant.now()``."""
        return position_ns if incremental else clock_ns()

    @staticmethod
    def read_increment(increment: int, incremental: bool) -> int:
        """``source.ord`` of a snapshot read (``SourceInfo.Position.getInc()``): an incremental
        read keeps the increment of the stream position; a read of an initial or blocking
        snapshot has -1, the increment of a position without a cluster time (the snapshot
        offset's resume token alone, the same absence that makes its time the read's instant)."""
        return increment if incremental else -1

    def change(
        self, events: CollectionEvents, facts: ChangeFacts, transaction: str, ts_ms: int, rs: str
    ) -> str:
        before, after = facts.before, facts.after
        before_text = "null" if before is None else quote_text(self.dumps(events.document(before)))
        after_text = "null" if after is None else quote_text(self.dumps(events.document(after)))
        description = facts.update_description
        description_text = (
            "null" if description is None else self._update_description(description, events.fields)
        )
        source = events.source.change_streams(
            self.source_ms(facts) * 1_000_000,
            "false",
            facts.increment,
            session_text(facts.lsid, facts.txn_number, facts.wall_ms),
        )
        return (
            f'{{"before":{before_text},"after":{after_text},"updateDescription":{description_text},'
            f'"source":{source},"op":"{facts.op}","ts_ms":{ts_ms},"transaction":{transaction}}}'
        )

    def read(self, events: CollectionEvents, document: Any, at: ReadSource, ts_ms: int) -> str:
        """A snapshot read."""
        after_text = quote_text(self.dumps(events.document(document)))
        source = events.source.change_streams(at.ts_ns, at.snapshot, at.increment, NO_SESSION)
        return (
            f'{{"before":null,"after":{after_text},"updateDescription":null,'
            f'"source":{source},"op":"r","ts_ms":{ts_ms},"transaction":null}}'
        )

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
                "updatedFields": None if updated is None else self.updated_dumps(updated),
                "truncatedArrays": [
                    {"field": entry["field"], "size": int(entry["newSize"])} for entry in truncated
                ]
                if truncated
                else None,
            }
        )


class OplogEnvelope:
    """Debezium 1.x's envelope (``event.format=oplog``): ``after`` of inserts, ``patch`` of updates
    and replaces, ``filter`` (the document key) of every change but inserts."""

    def __init__(self, config: ConnectorConfig):
        self.dumps = document_writer(config.extended_json_mode).dumps
        self.transaction_metadata = config.provide_transaction_metadata

    @staticmethod
    def source_ms(facts: ChangeFacts) -> int:
        """``source.ts_ms``: Debezium 1.x has the clusterTime seconds."""
        return facts.seconds * 1000

    @staticmethod
    def data_collection(events: CollectionEvents, replica_set: str) -> str:
        """The name of the collection in transaction metadata: with its replica set."""
        return f"{replica_set}.{events.data_collection}"

    @staticmethod
    def read_time_ns(position_ns: int, incremental: bool, clock_ns: Callable[[], int]) -> int:
        """The source times of a snapshot read (Debezium 1.x): the position recorded at the start."""
        return position_ns

    @staticmethod
    def read_increment(increment: int, incremental: bool) -> int:
        """``source.ord`` of a snapshot read (Debezium 1.x): the recorded position's increment."""
        return increment

    def change(
        self, events: CollectionEvents, facts: ChangeFacts, transaction: str, ts_ms: int, rs: str
    ) -> str:
        after_text = patch_text = filter_text = "null"
        if facts.op == "c":
            after_text = quote_text(self.dumps(events.document(facts.after)))
        else:
            filter_text = quote_text(self.dumps(events.document(facts.document_key)))
            if facts.operation == "replace":
                patch_text = quote_text(self.dumps(events.document(facts.after)))
            elif facts.operation == "update":
                patch_text = quote_text(self.dumps(_patch(facts.update_description or {}, events.fields)))
        source = events.source.oplog(facts.seconds * 1000, "false", rs, facts.increment)
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
            + facts.op
            + '","ts_ms":'
            + str(ts_ms)
        )
        if self.transaction_metadata:
            payload += ',"transaction":' + transaction
        return payload + "}"

    def read(self, events: CollectionEvents, document: Any, at: ReadSource, ts_ms: int) -> str:
        """A snapshot read (``source.snapshot`` true, whatever ``at.snapshot`` says)."""
        return (
            '{"after":'
            + quote_text(self.dumps(events.document(document)))
            + ',"patch":null,"filter":null,"source":'
            + events.source.oplog(at.ts_ns // 1_000_000, "true", at.replica_set, at.increment)
            + ',"op":"r","ts_ms":'
            + str(ts_ms)
            + (',"transaction":null}' if self.transaction_metadata else "}")
        )


def session_text(lsid: Any, txn_number: Any, wall_ms: int) -> str:
    """The 3.x source block's session fields (MongoDbSourceInfoStructMaker): ``lsid`` and
    ``txnNumber`` only together, ``wallTime`` only when set."""
    session = lsid is not None and txn_number is not None
    return (
        ',"lsid":'
        + (_quote(lsid_text(lsid) or "") if session else "null")
        + ',"txnNumber":'
        + (str(int(txn_number)) if session else "null")
        + ',"wallTime":'
        + (str(wall_ms) if wall_ms else "null")
    )


def transaction_text(block: Mapping[str, Any] | None) -> str:
    """An event's ``transaction`` block (``null`` outside transactions)."""
    if block is None:
        return "null"
    return (
        '{"id":'
        + _quote(block["id"])
        + ',"total_order":'
        + str(block["total_order"])
        + ',"data_collection_order":'
        + str(block["data_collection_order"])
        + "}"
    )


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
