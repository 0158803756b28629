"""Offsets: where each capture partition stands, stored in a compacted Kafka topic.

An offset is written in the SAME Kafka transaction as the events it covers (see :mod:`airflow_provider_mongocdc.core.kafka.writer`):
readers with ``isolation.level=read_committed`` see both or neither, so a killed run leaves no
offset past undelivered events. :class:`OffsetStore` reads the topic (the last committed value per
key) and makes its records. The model lives in :mod:`airflow_provider_mongocdc.core.offsets.model`, the keys in
:mod:`airflow_provider_mongocdc.core.offsets.keys`, Debezium's offsets in :mod:`airflow_provider_mongocdc.core.offsets.debezium`; their names are importable
from here too. The layout and its reasons: docs/design.md, "Offsets".
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from bson import json_util
from bson.timestamp import Timestamp
from confluent_kafka import KafkaException

from airflow_provider_mongocdc.core.base.errors import LeaseHeldError, OffsetError
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, describe_topic, ensure_topics
from airflow_provider_mongocdc.core.kafka.client import consumer_config
from airflow_provider_mongocdc.core.kafka.committed_records import (
    CommittedFollower,
    CommittedRead,
    Settling,
    check_settings,
    read_settled,
    unreadable_error,
)
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.debezium import (
    DebeziumOffset,
    find_debezium_offset,
    read_debezium_offsets,
    write_debezium_offset,
)
from airflow_provider_mongocdc.core.offsets.keys import (
    is_lease_key,
    parse_key,
    request_key,
    request_owner,
    watch_owner,
)
from airflow_provider_mongocdc.core.offsets.model import (
    FORMAT_VERSION,
    SNAPSHOT_IN_PROGRESS,
    ChunkMarker,
    OffsetPartition,
    OffsetState,
    Position,
    SnapshotState,
    compact,
    utcnow,
)
from airflow_provider_mongocdc.core.offsets.writers import (
    SETTLE_S,
    Observe,
    TakeOver,
    offsets_admin_transactional_id,
)

log = logging.getLogger(__name__)

# The offsets topic: compacted (only the last value per key is needed), one partition (all keys
# in one ordered log), segments rolled hourly so that compaction keeps it small (an open window
# commits an offset record every commit interval, ~3 600 an hour, and every run reads the topic
# from its start), tombstones kept a week so that readers see deletions.
OFFSETS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "0",
    "segment.ms": str(3600 * 1000),
    "delete.retention.ms": str(7 * 24 * 3600 * 1000),
}


# -- the store --------------------------------------------------------------------------------------
@dataclass
class OffsetTopicContents:
    """Everything committed in the offsets topic, folded to the last value per key."""

    states: dict[OffsetPartition, OffsetState] = field(default_factory=dict)
    chunks: dict[tuple[OffsetPartition, str], dict[str, ChunkMarker]] = field(default_factory=dict)
    # incremental snapshot requests by (connector, server_id), as stored JSON
    requests: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # what each connector's change watcher last counted, by (connector, server_id), as stored JSON
    watchers: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    skipped: int = 0
    # transactions still open on the topic after what was read (a reader that only shows offsets)
    open_transactions: list[OpenTransaction] = field(default_factory=list)


class OffsetStore:
    """The offsets of one offsets topic.

    ``kafka_config`` is the Kafka connection's librdkafka configuration (bootstrap.servers and the
    security settings). Records for the data path come from :meth:`offset_record` and
    :meth:`chunk_record` and are sent inside the writer's transaction with the events; the
    operator actions :meth:`write`, :meth:`reset` and :meth:`set_position` commit on their own.

    Create the run's :class:`TransactionalWriter` before reading: its ``init_transactions`` aborts
    a killed predecessor's open transaction (same ``transactional.id``), which would otherwise hold
    back the last stable offset, so reads could miss offsets committed after it until the broker
    times it out. The operator actions that read a state before acting on it (:meth:`reset`,
    :meth:`set_position`, :meth:`import_debezium`, :meth:`export_debezium`) do so too, with the
    actions' own ``transactional.id`` (``admin_transactional_id``).

    ``settling`` is how a read deals with transactions of other writers open on the topic
    (:mod:`airflow_provider_mongocdc.core.offsets.writers`): a run reads with
    :meth:`for_connector`'s :class:`~airflow_provider_mongocdc.core.offsets.writers.TakeOver`
    (everything committed before it read, or an error); by default a read waits briefly and then
    shows what is committed, with the open transactions in
    :attr:`OffsetTopicContents.open_transactions`.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str,
        *,
        read_timeout_s: float = 60.0,
        admin_transactional_id: str | None = None,
        settling: Settling | None = None,
    ):
        check_settings(kafka_config, topic)
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self.admin_transactional_id = admin_transactional_id or offsets_admin_transactional_id(topic)
        self.settling: Settling = settling or Observe()

    @classmethod
    def from_config(cls, kafka_config: Mapping[str, Any], config, **kwargs: Any) -> OffsetStore:
        """The store of a ConnectorConfig: its offset.storage.topic or <topic.prefix>.offsets."""
        return cls(kafka_config, config.offsets_topic, **kwargs)

    @classmethod
    def for_connector(
        cls,
        kafka_config: Mapping[str, Any],
        config,
        *,
        running: Iterable[str] = (),
        settle_s: float = SETTLE_S,
        **kwargs: Any,
    ) -> OffsetStore:
        """The store a run of connector ``config`` reads where it starts from: it sees everything
        committed before it read (its own writers' transactions left open are ended, another
        writer's is an error). ``running``: the transactional ids of the writers of the same run
        that run beside this reader, each started after the run took its id over (the window
        writers of a window run's streams, :func:`~airflow_provider_mongocdc.core.window.streams.check_offsets`):
        their transactions are waited for, never taken over
        (:class:`~airflow_provider_mongocdc.core.offsets.writers.TakeOver`). ``settle_s``: how long
        a read waits for open transactions before it settles them."""
        settling = TakeOver(
            dict(kafka_config), config.topic_prefix, config.offsets_topic, settle_s, frozenset(running)
        )
        return cls(kafka_config, config.offsets_topic, settling=settling, **kwargs)

    def __repr__(self) -> str:
        return (
            f"OffsetStore(topic={self.topic!r}, bootstrap.servers={self.kafka_config['bootstrap.servers']!r})"
        )

    # -- topic --
    def ensure_topic(self, replication_factor: int = -1) -> str:
        """Create the compacted offsets topic when missing; check an existing one is compacted.

        Returns ``"created"`` or ``"exists"``.
        """
        outcome = ensure_topics(
            self.kafka_config, [TopicSpec(self.topic, 1, replication_factor, OFFSETS_TOPIC_CONFIG)]
        )[self.topic]
        if outcome == "exists":
            self.check_topic()
        return outcome

    def check_topic(self) -> None:
        described = describe_topic(self.kafka_config, self.topic)
        if described is None:
            raise OffsetError(
                f"The offsets topic {self.topic!r} does not exist",
                fix="run the connector once (it creates the topic) or create it with cleanup.policy=compact",
            )
        _partitions, configs = described
        policy = configs.get("cleanup.policy", "")
        if policy.replace(" ", "") != "compact":
            raise OffsetError(
                f"The offsets topic {self.topic!r} is not compacted (cleanup.policy={policy})",
                cause="with time or size based deletion Kafka would delete the offsets of a quiet "
                "connector, and the next run would start over",
                fix=f"set cleanup.policy=compact on {self.topic!r} (kafka-configs --alter "
                "--entity-type topics --add-config cleanup.policy=compact), or choose another "
                "offset.storage.topic",
            )

    # -- reading --
    def read_everything(
        self, records: Iterable[tuple[bytes | None, bytes | None]] | None = None
    ) -> OffsetTopicContents:
        """Fold the committed records of the topic (or ``records``, read from it before): the last
        value per key, tombstones delete."""
        folded = OffsetTopicContents()
        if records is None:
            read = self.read_records()
            records, folded.open_transactions = read.records, read.open_transactions
        for key, value in records:
            parsed = parse_key(key)
            if parsed is None:
                owner = request_owner(key)
                watcher = watch_owner(key) if owner is None else None
                if owner is not None:
                    if value is None:
                        folded.requests.pop(owner, None)
                    else:
                        folded.requests[owner] = json.loads(value)
                elif watcher is not None:
                    try:
                        folded.watchers[watcher] = json.loads(value) if value is not None else None
                    except ValueError:
                        folded.watchers.pop(watcher, None)  # a status is a hint: an unreadable one is none
                    if folded.watchers.get(watcher) is None:
                        folded.watchers.pop(watcher, None)
                elif not is_lease_key(key):  # leases share the topic (core/offsets/lease.py)
                    folded.skipped += 1
                continue
            partition, chunk = parsed
            try:
                if chunk is None:
                    if value is None:
                        folded.states.pop(partition, None)
                    else:
                        folded.states[partition] = OffsetState.from_bytes(value)
                    continue
                snapshot_id, chunk_id = chunk
                markers = folded.chunks.setdefault((partition, snapshot_id), {})
                if value is None:
                    markers.pop(chunk_id, None)
                else:
                    data = json.loads(value)
                    markers[chunk_id] = ChunkMarker(
                        snapshot_id, chunk_id, data.get("stats") or {}, parse_iso(data.get("finished_at"))
                    )
            except (ValueError, TypeError, KeyError, OffsetError) as error:
                raise OffsetError(
                    f"The offsets topic {self.topic!r} holds an unreadable value for {partition.describe()}",
                    cause=str(error),
                    fix="reset this partition's offset (mongocdc offsets reset) and re-snapshot",
                ) from None
        if folded.skipped:
            log.warning(
                "Offsets topic %s: ignored %d records whose keys are not offset keys",
                self.topic,
                folded.skipped,
            )
        return folded

    def read_all(self) -> dict[OffsetPartition, OffsetState]:
        """The committed state of every partition in the topic."""
        return self.read_everything().states

    def read(self, partition: OffsetPartition) -> OffsetState | None:
        """The committed state of ``partition``, or None when it has no offset."""
        return self.read_all().get(partition)

    def chunk_markers(self, partition: OffsetPartition, snapshot_id: str) -> dict[str, ChunkMarker]:
        return dict(self.read_everything().chunks.get((partition, str(snapshot_id)), {}))

    def finished_chunks(self, partition: OffsetPartition, snapshot_id: str) -> set[str]:
        """Ids of the chunks of ``snapshot_id`` whose transactions committed."""
        return set(self.chunk_markers(partition, snapshot_id))

    def _consumer_config(self) -> dict[str, Any]:
        return consumer_config(self.kafka_config)

    def read_committed_records(self) -> list[tuple[bytes | None, bytes | None]]:
        """Every committed ``(key, value)`` record of the topic, oldest first, before folding."""
        return self.read_records().records

    def read_records(self) -> CommittedRead:
        """The committed records, oldest first, before folding, and the transactions still open
        after them (read with the store's ``settling``)."""
        return read_settled(self.kafka_config, self.topic, self.read_timeout_s, self.settling)

    def follower(self) -> CommittedFollower:
        """A kept reader of the topic for a caller that reads it again and again: each of its
        reads (``follower.read()``, as :meth:`read_records` returns) fetches only what was committed
        since the last one. Close it when done."""
        return CommittedFollower(self.kafka_config, self.topic, self.read_timeout_s, self.settling)

    def _unreadable(self, error: KafkaException) -> OffsetError:
        return unreadable_error(self.kafka_config, self.topic, error)

    def show(
        self, server_id: str | None = None, rs: str | None = None, connector: str | None = None
    ) -> dict[str, Any]:
        """The committed offsets (all, or one connector / partition), JSON-serialisable."""
        everything = self.read_everything()
        entries = []
        for partition, state in sorted(
            everything.states.items(), key=lambda item: (item[0].connector, item[0].server_id, item[0].rs)
        ):
            if server_id is not None and partition.server_id != server_id:
                continue
            if connector is not None and partition.connector != connector:
                continue
            if rs is not None and partition.rs != rs:
                continue
            chunks = {
                snapshot_id: sorted(markers)
                for (owner, snapshot_id), markers in everything.chunks.items()
                if owner == partition and markers
            }
            entries.append(
                {"partition": partition.to_dict(), "offset": state.to_dict(), "finished_chunks": chunks}
            )
        requests = [
            {"connector": owner, "server_id": sid, "request": request}
            for (owner, sid), request in sorted(everything.requests.items())
            if (server_id is None or sid == server_id) and (connector is None or owner == connector)
        ]
        shown = {"topic": self.topic, "partitions": entries, "incremental_snapshot_requests": requests}
        if everything.open_transactions:
            shown["open_transactions"] = [open_one.to_json() for open_one in everything.open_transactions]
            shown["warning"] = (
                "a transaction is open on the offsets topic: offsets committed after it are not shown "
                "until it ends (" + "; ".join(t.describe() for t in everything.open_transactions) + ")"
            )
        return shown

    # -- records for the data path --
    def offset_record(
        self, partition: OffsetPartition, state: OffsetState, *, connector: str | None = None
    ) -> Record:
        """The record storing ``state`` (stamped with the current time, and with the name of the
        ``connector`` that writes it); send it in the writer's transaction together with the events
        it covers. ``state`` comes from the partition's committed state: one written under another
        connector name is refused (:func:`check_owner`)."""
        check_owner(partition, state.connector, connector, self.topic)
        stamped = replace(state, updated_at=utcnow(), connector=connector or state.connector)
        return Record(self.topic, partition.key(), stamped.to_bytes())

    def chunk_record(
        self,
        partition: OffsetPartition,
        snapshot_id: str,
        chunk_id: str,
        stats: Mapping[str, Any] | None = None,
    ) -> Record:
        """The marker of a finished chunk; send it in the transaction holding the chunk's events."""
        value = {
            "snapshot": str(snapshot_id),
            "chunk": str(chunk_id),
            "stats": json.loads(json_util.dumps(dict(stats or {}))),
            "finished_at": iso_z(utcnow()),
            "format": FORMAT_VERSION,
        }
        return Record(self.topic, partition.chunk_key(snapshot_id, chunk_id), compact(value))

    def chunk_tombstones(
        self, partition: OffsetPartition, snapshot_id: str, chunk_ids: Iterable[str]
    ) -> list[Record]:
        """Tombstones removing a snapshot's chunk markers (e.g. with the completion record)."""
        return [
            Record(self.topic, partition.chunk_key(snapshot_id, chunk_id), None)
            for chunk_id in sorted(set(map(str, chunk_ids)))
        ]

    def tombstone(self, partition: OffsetPartition) -> Record:
        return Record(self.topic, partition.key(), None)

    def incremental_request(self, connector: str, server_id: str) -> dict[str, Any] | None:
        """The stored incremental snapshot request of a connector (JSON), or None."""
        return self.read_everything().requests.get((connector, server_id))

    def write_incremental_request(self, connector: str, server_id: str, request: Mapping[str, Any]) -> None:
        """Store a connector's incremental snapshot request (replacing the previous one)."""
        self._commit([Record(self.topic, request_key(server_id, connector), compact(dict(request)))])

    # -- operator actions (each in its own transaction) --
    def write(self, partition: OffsetPartition, state: OffsetState) -> OffsetState:
        """Store ``state`` for ``partition``; returns it as stored."""
        record = self.offset_record(partition, state)
        self._commit([record])
        return OffsetState.from_bytes(record.value)

    def reset(self, partition: OffsetPartition) -> OffsetState | None:
        """Delete the partition's offset and its chunk markers; returns the state it had.

        The next run starts as if the connector had never run for this partition (a snapshot
        when snapshot.mode asks for one).
        """
        with self._admin_writer() as writer:
            everything = self.read_everything()
            before = everything.states.get(partition)
            records = [self.tombstone(partition)]
            for (owner, snapshot_id), markers in everything.chunks.items():
                if owner == partition and markers:
                    records.extend(self.chunk_tombstones(partition, snapshot_id, markers))
            _commit_with(writer, records)
        return before

    def set_position(
        self, partition: OffsetPartition, position: Position | Timestamp | Mapping[str, Any]
    ) -> tuple[OffsetState | None, OffsetState]:
        """Move the partition to ``position`` (a Position, a resume token or a cluster time);
        returns ``(before, after)``. Counters and snapshot state are kept."""
        if isinstance(position, Timestamp):
            position = Position(cluster_time=position)
        elif not isinstance(position, Position):
            position = Position(resume_token=position)
        with self._admin_writer() as writer:
            before = self.read(partition)
            record = self.offset_record(partition, (before or OffsetState()).with_position(position))
            _commit_with(writer, [record])
        return before, OffsetState.from_bytes(record.value)

    def adopt(self, server_id: str, connector: str) -> list[tuple[OffsetPartition, OffsetState]]:
        """Hand the offsets of topic prefix ``server_id`` to the connector named ``connector`` (a
        renamed connector: its runs refuse offsets written under another name); returns the
        partitions and their states as stored now."""
        with self._admin_writer() as writer:
            states = {
                partition: state
                for partition, state in self.read_everything().states.items()
                if partition.server_id == server_id
            }
            records = [
                Record(self.topic, partition.key(), replace(state, connector=connector).to_bytes())
                for partition, state in sorted(states.items(), key=lambda item: item[0].rs)
            ]
            if records:
                _commit_with(writer, records)
        return [
            (partition, OffsetState.from_bytes(record.value)) for partition, record in zip(states, records)
        ]

    def import_debezium(
        self,
        partition: OffsetPartition,
        connect_topic: str,
        debezium_connector: str | None = None,
    ) -> tuple[DebeziumOffset, OffsetState | None, OffsetState]:
        """Move ``partition`` to the position of a Debezium MongoDB connector, read from the Kafka
        Connect offsets topic ``connect_topic`` (either resume token form); returns
        ``(the Debezium entry, before, after)``. The next window resumes right after the last
        change Debezium processed. Counters and snapshot state are kept."""
        entries = read_debezium_offsets(self.kafka_config, connect_topic, read_timeout_s=self.read_timeout_s)
        entry = find_debezium_offset(entries, debezium_connector, partition.server_id, partition.rs)
        position = entry.position()
        with self._admin_writer() as writer:
            before = self.read(partition)
            base = before or OffsetState()
            if base.snapshot.status == SNAPSHOT_IN_PROGRESS:
                base = replace(base, snapshot=SnapshotState())  # Debezium's position replaces it
            record = self.offset_record(partition, base.with_position(position))
            _commit_with(writer, [record])
        return entry, before, OffsetState.from_bytes(record.value)

    def export_debezium(
        self, partition: OffsetPartition, connect_topic: str, debezium_connector: str
    ) -> tuple[OffsetState, bytes, bytes]:
        """Write ``partition``'s position as a Debezium 3.x MongoDB connector's offset (connector
        ``debezium_connector``, server_id = the topic prefix) into the Kafka Connect offsets topic
        ``connect_topic``; returns ``(our state, key, value)``. Debezium then resumes right after
        the last change this connector delivered."""
        with self._admin_writer():  # only its start: it ends a killed change that would hide offsets
            state = self.read(partition)
        if state is None or state.position is None:
            raise OffsetError(
                f"No position to export for {partition.describe()}",
                cause="no offset is stored" if state is None else "the offset holds no stream position",
                fix="run a snapshot or window first (mongocdc offsets show lists what is stored)",
            )
        if state.snapshot.status == SNAPSHOT_IN_PROGRESS:
            raise OffsetError(
                f"A snapshot of {partition.describe()} is in progress",
                cause="its events are only partly written; Debezium would stream after its start and "
                "never copy the rest",
                fix="let the snapshot finish (or reset the offset), then export",
            )
        key, value = write_debezium_offset(
            self.kafka_config, connect_topic, debezium_connector, partition.server_id, state.position
        )
        return state, key, value

    def _admin_writer(self) -> TransactionalWriter:
        """The operator actions' writer (``admin_transactional_id``), on the ensured topic. Create it
        before reading what an action changes: its ``init_transactions`` aborts the open
        transaction of an earlier action that was killed before its commit, which would hold back
        the topic's last stable offset, so that the read would miss every offset committed after
        it (by windows that ran meanwhile) until the broker times it out."""
        self.ensure_topic()
        return TransactionalWriter(self.kafka_config, self.admin_transactional_id)

    def _commit(self, records: list[Record]) -> None:
        with self._admin_writer() as writer:
            _commit_with(writer, records)


def check_owner(
    partition: OffsetPartition, written_by: str | None, connector: str | None, topic: str
) -> None:
    """Refuse connector ``connector`` to write over what connector ``written_by`` wrote: two
    connectors with one topic prefix would share its offsets, and each would commit positions past
    changes that only the other emits (they would be lost)."""
    if connector is None or written_by is None or written_by == connector:
        return
    raise OffsetError(
        f"Connector {connector!r} may not commit the offset of {partition.describe()} in {topic!r}: it "
        f"was last written by connector {written_by!r}",
        cause=f"connectors {written_by!r} and {connector!r} have the same topic.prefix "
        f"{partition.server_id!r}; a topic prefix (and its offsets and lease) belongs to one connector, "
        "and a shared one would commit positions past changes the other connector never emitted",
        fix=f"give connector {connector!r} a topic.prefix of its own; if {connector!r} replaces "
        f"{written_by!r} (a renamed connector), hand the offsets over with mongocdc offsets adopt "
        f"--topic-prefix {partition.server_id} --name {connector} --yes",
    )


def other_owner(
    states: Mapping[OffsetPartition, OffsetState],
    lease_connector: str | None,
    server_id: str,
    connector: str | None,
) -> tuple[str, OffsetPartition | None] | None:
    """``(the name, the partition)`` of another connector than ``connector`` that last wrote the
    offset of a partition of topic prefix ``server_id`` (any partition), else ``(the name, None)``
    when another connector took its lease (``lease_connector``: the name in the stored lease, live
    or expired); None when none did. Offsets and leases written without a name (``mongocdc offsets
    set``, older versions) belong to whoever runs."""
    if connector is None:
        return None
    for partition, state in sorted(states.items(), key=lambda item: (item[0].rs, item[0].connector)):
        if partition.server_id == server_id and state.connector not in (None, connector):
            return state.connector, partition
    if lease_connector not in (None, connector):
        return lease_connector, None
    return None


def check_prefix_owner(
    states: Mapping[OffsetPartition, OffsetState],
    lease_connector: str | None,
    server_id: str,
    connector: str | None,
    topic: str,
) -> None:
    """Refuse a run of connector ``connector`` on topic prefix ``server_id`` when another connector
    last wrote one of its offsets (any partition, not only those the run streams) or took its lease
    (:func:`other_owner`): the run would commit positions past changes that only the other emits,
    or copy into its topics. Every run checks it before it writes, with the configuration it runs
    with (a Variable may have changed since the connector list was parsed)."""
    found = other_owner(states, lease_connector, server_id, connector)
    if found is None:
        return
    other, partition = found
    if partition is not None:
        check_owner(partition, other, connector, topic)
    raise LeaseHeldError(
        f"Connector {connector!r} may not run on topic prefix {server_id!r}: its lease in {topic!r} was "
        f"last taken by connector {other!r}",
        cause=f"connectors {other!r} and {connector!r} have the same topic.prefix {server_id!r}; a topic "
        "prefix (its offsets and its lease) belongs to one connector, and a shared one would commit "
        "positions past changes the other connector never emitted",
        fix=f"give connector {connector!r} a topic.prefix of its own; if {connector!r} replaces {other!r} "
        f"(a renamed connector), let the last run of {other!r} end, then hand the offsets over with "
        f"mongocdc offsets adopt --topic-prefix {server_id} --name {connector} --yes",
    )


def _commit_with(writer: TransactionalWriter, records: list[Record]) -> None:
    """``records`` in one transaction of ``writer``."""
    writer.begin()
    writer.commit(records)
