"""Offsets: where each capture partition stands, stored in a compacted Kafka topic.

An offset is written in the SAME Kafka transaction as the events it covers (see
:mod:`airflow_provider_mongocdc.core.writer`): readers with ``isolation.level=read_committed``
see both or neither, so a killed run leaves no offset past undelivered events.

Layout, following Kafka Connect's offset storage (which Debezium's connectors use):

key (JSON)
    ``["<connector>", {"server_id": "<topic.prefix>", "rs": "<replica set or cluster>"}]`` —
    Kafka Connect's ``[connector name, source partition]`` with Debezium MongoDB's partition
    fields. One partition per replica set (per-shard mode) or one for the whole deployment.
value (JSON)
    Debezium's MongoDB offset fields at the top level — ``sec``, ``ord`` (the cluster time of the
    position: seconds and increment), ``resume_token`` (the token's ``_data``) and ``initsync``
    while a snapshot runs — plus this connector's state: ``snapshot`` (status ``none`` /
    ``in_progress`` with its id, recorded start position and plan size / ``completed``),
    ``last_window_end``, ``counters`` and ``updated_at``. A tombstone (null value) deletes it.

Snapshot chunk markers are separate records, keyed by the partition plus the snapshot and chunk
ids: ``["<connector>", {"server_id", "rs", "snapshot": "<id>", "chunk": "<chunk id>"}]``. Many
Spark tasks finish chunks concurrently, each in its own transaction with the chunk's events; with
one record per chunk no task ever rewrites another task's progress.

The value keeps the token's ``_data`` hex string (the form of Debezium before 2.7) and the ``rs``
field in the key, as before; Debezium 2.7+'s base64 BSON token is read too. Debezium 3.x's own
offsets live in Kafka Connect's offsets topic under ``["<connector>", {"server_id":
"<topic.prefix>"}]`` (one partition for the whole deployment): :meth:`OffsetStore.import_debezium`
and :meth:`OffsetStore.export_debezium` move a position between the two, so a deployment switches
from or to Debezium without a re-snapshot (see "Debezium's offsets" below).

Reading returns the last committed state: a ``read_committed`` consumer without a consumer group
reads every partition of the topic from the beginning to the end offsets seen when the read
started (the last stable offset) and keeps the last value per key.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import bson
from bson import json_util
from bson.json_util import JSONMode, JSONOptions
from bson.timestamp import Timestamp
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from airflow_provider_mongocdc.core.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.events import Record
from airflow_provider_mongocdc.core.writer import (
    DEFAULT_PRODUCER_CONFIG,
    REQUIRED_PRODUCER_CONFIG,
    TopicSpec,
    TransactionalWriter,
    describe_topic,
    ensure_topics,
    librdkafka_log,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
SNAPSHOT_NONE, SNAPSHOT_IN_PROGRESS, SNAPSHOT_COMPLETED = "none", "in_progress", "completed"
SNAPSHOT_STATUSES = (SNAPSHOT_NONE, SNAPSHOT_IN_PROGRESS, SNAPSHOT_COMPLETED)
# Partition name of a whole-deployment change stream (mongodb.connection.mode=sharded through
# mongos); a replica set's partition is named after the replica set.
CLUSTER_PARTITION = "cluster"

# The offsets topic: compacted (only the last value per key is needed), one partition (all keys
# in one ordered log), segments rolled daily so that compaction keeps it small, tombstones kept
# a week so that readers see deletions.
OFFSETS_TOPIC_CONFIG = {
    "cleanup.policy": "compact",
    "min.compaction.lag.ms": "0",
    "segment.ms": str(24 * 3600 * 1000),
    "delete.retention.ms": str(7 * 24 * 3600 * 1000),
}
_CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL)
_CONSUMER_ONLY = {
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "allow.auto.create.topics": False,
    "fetch.wait.max.ms": 50,  # end of partition is noticed sooner
}
_NOT_FOR_CONSUMERS = (
    set(DEFAULT_PRODUCER_CONFIG)
    | set(REQUIRED_PRODUCER_CONFIG)
    | {
        "transactional.id",
        "transaction.timeout.ms",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.num.messages",
        "delivery.timeout.ms",
        "message.timeout.ms",
        "retries",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "partitioner",
        "request.required.acks",
        "compression.codec",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
    }
)


# -- time helpers -----------------------------------------------------------------------------------
def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _parse_iso(value: Any) -> datetime | None:
    if value in (None, ""):
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def timestamp_datetime(ts: Timestamp | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts.time, timezone.utc)


# -- the model --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OffsetPartition:
    """What one offset belongs to: a connector's replica set (or whole cluster)."""

    server_id: str
    rs: str
    connector: str | None = None  # Kafka Connect's connector name; defaults to server_id

    def __post_init__(self) -> None:
        if not self.connector:
            object.__setattr__(self, "connector", self.server_id)
        if not self.server_id or not self.rs:
            raise ConfigError(
                "An offset partition needs a topic prefix (server_id) and a replica set name",
                cause=f"got server_id={self.server_id!r}, rs={self.rs!r}",
                fix="pass topic.prefix and the replica set (or 'cluster') name",
            )

    @property
    def connector_name(self) -> str:
        return self.connector  # defaults to server_id

    def source_partition(self) -> dict[str, str]:
        return {"server_id": self.server_id, "rs": self.rs}

    def key(self) -> bytes:
        return _compact([self.connector_name, self.source_partition()])

    def chunk_key(self, snapshot_id: str, chunk_id: str) -> bytes:
        partition = self.source_partition()
        partition.update(snapshot=str(snapshot_id), chunk=str(chunk_id))
        return _compact([self.connector_name, partition])

    def describe(self) -> str:
        return f"{self.connector_name}/{self.server_id}/{self.rs}"

    def to_dict(self) -> dict[str, str]:
        return {"connector": self.connector_name, "server_id": self.server_id, "rs": self.rs}


@dataclass(frozen=True)
class Position:
    """A point in the change stream.

    ``resume_token`` is the token of the last change processed (a new window resumes after it);
    ``cluster_time`` is that change's cluster time. A position with only a ``cluster_time`` (set by
    an operator, or recorded before a snapshot when no token exists) means: start at that
    operation time (``startAtOperationTime``, inclusive).
    """

    resume_token: Mapping[str, Any] | None = None
    cluster_time: Timestamp | None = None

    def __post_init__(self) -> None:
        if self.resume_token is None and self.cluster_time is None:
            raise OffsetError(
                "A position needs a resume token or a cluster time",
                fix="give --resume-token or --cluster-time",
            )
        if self.resume_token is not None and not isinstance(self.resume_token, Mapping):
            raise OffsetError(
                f"A resume token is a document, not {type(self.resume_token).__name__}",
                fix='pass the token as a document, e.g. {"_data": "8263..."}',
            )
        if self.cluster_time is not None and not isinstance(self.cluster_time, Timestamp):
            raise OffsetError(
                "A cluster time is a BSON Timestamp",
                cause=f"got {self.cluster_time!r}",
                fix="pass bson.Timestamp(seconds, increment)",
            )

    @property
    def cluster_datetime(self) -> datetime | None:
        return timestamp_datetime(self.cluster_time)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.cluster_time is not None:
            data["sec"] = self.cluster_time.time
            data["ord"] = self.cluster_time.inc
        if self.resume_token is not None:
            data["resume_token"] = _token_to_json(self.resume_token)
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Position | None:
        token = data.get("resume_token")
        sec, ord_ = data.get("sec"), data.get("ord")
        cluster_time = Timestamp(int(sec), int(ord_ or 0)) if sec is not None else None
        if token is None and cluster_time is None:
            return None
        return cls(_token_from_json(token) if token is not None else None, cluster_time)

    def describe(self) -> str:
        parts = []
        if self.cluster_time is not None:
            parts.append(
                f"cluster time {self.cluster_time.time}:{self.cluster_time.inc} "
                f"({_iso(self.cluster_datetime)})"
            )
        if self.resume_token is not None:
            parts.append(f"resume token {_token_to_json(self.resume_token)}")
        return ", ".join(parts)


@dataclass(frozen=True)
class SnapshotState:
    """A partition's snapshot: none yet, running (with its recorded start), or completed."""

    status: str = SNAPSHOT_NONE
    snapshot_id: str | None = None
    start: Position | None = None
    plan_size: int | None = None
    started_at: datetime | None = None
    completed_at: datetime | None = None

    def __post_init__(self) -> None:
        if self.status not in SNAPSHOT_STATUSES:
            raise OffsetError(
                f"Unknown snapshot status {self.status!r}", fix=f"use one of {', '.join(SNAPSHOT_STATUSES)}"
            )
        if self.status != SNAPSHOT_NONE and not self.snapshot_id:
            raise OffsetError(
                f"A snapshot {self.status.replace('_', ' ')} needs its id", fix="pass snapshot_id"
            )

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"status": self.status}
        if self.status != SNAPSHOT_NONE:
            data.update(
                id=self.snapshot_id,
                start=self.start.to_json() if self.start else None,
                plan_size=self.plan_size,
                started_at=_iso(self.started_at),
                completed_at=_iso(self.completed_at),
            )
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> SnapshotState:
        if not data:
            return cls()
        start = data.get("start")
        return cls(
            status=data.get("status", SNAPSHOT_NONE),
            snapshot_id=data.get("id"),
            start=Position.from_json(start) if start else None,
            plan_size=data.get("plan_size"),
            started_at=_parse_iso(data.get("started_at")),
            completed_at=_parse_iso(data.get("completed_at")),
        )


@dataclass(frozen=True)
class OffsetState:
    """The committed state of one partition."""

    position: Position | None = None
    snapshot: SnapshotState = field(default_factory=SnapshotState)
    last_window_end: datetime | None = None
    events: int = 0
    windows: int = 0
    snapshots: int = 0
    updated_at: datetime | None = None
    # The incremental snapshot's progress (core/incremental.py), as stored JSON; None: none.
    incremental: Mapping[str, Any] | None = None

    # -- convenience --
    @property
    def resume_token(self) -> Mapping[str, Any] | None:
        return self.position.resume_token if self.position else None

    @property
    def cluster_time(self) -> Timestamp | None:
        return self.position.cluster_time if self.position else None

    # -- transitions (pure: each returns a new state) --
    def after_window(self, position: Position | None, window_end: datetime, events: int) -> OffsetState:
        """The state after a committed window: its end position (unchanged when None)."""
        return replace(
            self,
            position=position or self.position,
            last_window_end=window_end,
            events=self.events + events,
            windows=self.windows + 1,
        )

    def snapshot_started(self, snapshot_id: str, start: Position, plan_size: int) -> OffsetState:
        """A snapshot begins: its start position (recorded before copying) and its chunk count."""
        return replace(
            self,
            snapshot=SnapshotState(
                SNAPSHOT_IN_PROGRESS, str(snapshot_id), start, int(plan_size), started_at=utcnow()
            ),
        )

    def snapshot_completed(self, events: int = 0) -> OffsetState:
        """The running snapshot finished: streaming continues from its recorded start."""
        if self.snapshot.status != SNAPSHOT_IN_PROGRESS:
            raise OffsetError(
                "No snapshot is in progress for this partition",
                cause=f"the snapshot status is {self.snapshot.status!r}",
                fix="start a snapshot before completing one",
            )
        return replace(
            self,
            position=self.snapshot.start,
            snapshot=replace(self.snapshot, status=SNAPSHOT_COMPLETED, completed_at=utcnow()),
            events=self.events + events,
            snapshots=self.snapshots + 1,
        )

    def with_position(self, position: Position) -> OffsetState:
        return replace(self, position=position)

    # -- serialisation --
    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.position is not None:
            data.update(self.position.to_json())
        if self.snapshot.status == SNAPSHOT_IN_PROGRESS:
            data["initsync"] = True  # Debezium's flag for "snapshot running"
        data["snapshot"] = self.snapshot.to_json()
        data["last_window_end"] = _iso(self.last_window_end)
        data["counters"] = {"events": self.events, "windows": self.windows, "snapshots": self.snapshots}
        data["updated_at"] = _iso(self.updated_at)
        if self.incremental is not None:
            data["incremental_snapshot"] = dict(self.incremental)
        data["format"] = FORMAT_VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OffsetState:
        counters = data.get("counters") or {}
        return cls(
            position=Position.from_json(data),
            snapshot=SnapshotState.from_json(data.get("snapshot")),
            last_window_end=_parse_iso(data.get("last_window_end")),
            events=int(counters.get("events", 0)),
            windows=int(counters.get("windows", 0)),
            snapshots=int(counters.get("snapshots", 0)),
            updated_at=_parse_iso(data.get("updated_at")),
            incremental=data.get("incremental_snapshot"),
        )

    def to_bytes(self) -> bytes:
        return _compact(self.to_json())

    @classmethod
    def from_bytes(cls, value: bytes) -> OffsetState:
        return cls.from_json(json.loads(value))

    def to_dict(self) -> dict[str, Any]:
        """For display: the stored JSON plus readable times."""
        data = self.to_json()
        if self.cluster_time is not None:
            data["cluster_time"] = _iso(timestamp_datetime(self.cluster_time))
        return data


@dataclass(frozen=True)
class ChunkMarker:
    """A finished snapshot chunk (committed with the chunk's events)."""

    snapshot_id: str
    chunk_id: str
    stats: Mapping[str, Any]
    finished_at: datetime | None


def _compact(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _token_to_json(token: Mapping[str, Any]) -> Any:
    """Debezium stores a resume token as its ``_data`` string; other fields keep Extended JSON."""
    if set(token) == {"_data"} and isinstance(token["_data"], str):
        return token["_data"]
    return json.loads(json_util.dumps(dict(token), json_options=_CANONICAL))


def _token_from_json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # the _data hex string (written here), or Debezium 2.7+'s base64 BSON
        return _debezium_token_document(value) or {"_data": value}
    if isinstance(value, Mapping):
        return json_util.loads(json.dumps(value))
    raise OffsetError(
        f"Unreadable resume token {value!r}",
        fix='a resume token is a document like {"_data": "8263..."} or its _data string',
    )


def parse_key(key: bytes | None) -> tuple[OffsetPartition, tuple[str, str] | None] | None:
    """The partition (and ``(snapshot id, chunk id)`` for a chunk marker) of a record key, or None
    for a key that is not an offset key."""
    if not key:
        return None
    try:
        data = json.loads(key)
    except ValueError:
        return None
    if not (
        isinstance(data, list) and len(data) == 2 and isinstance(data[0], str) and isinstance(data[1], dict)
    ):
        return None
    fields = data[1]
    server_id, rs = fields.get("server_id"), fields.get("rs")
    if not isinstance(server_id, str) or not isinstance(rs, str) or not server_id or not rs:
        return None
    partition = OffsetPartition(server_id, rs, data[0])
    if "snapshot" in fields or "chunk" in fields:
        return partition, (str(fields.get("snapshot")), str(fields.get("chunk")))
    return partition, None


# -- the store --------------------------------------------------------------------------------------
@dataclass
class OffsetTopicContents:
    """Everything committed in the offsets topic, folded to the last value per key."""

    states: dict[OffsetPartition, OffsetState] = field(default_factory=dict)
    chunks: dict[tuple[OffsetPartition, str], dict[str, ChunkMarker]] = field(default_factory=dict)
    # incremental snapshot requests by (connector, server_id), as stored JSON
    requests: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    skipped: int = 0


class OffsetStore:
    """The offsets of one offsets topic.

    ``kafka_config`` is the Kafka connection's librdkafka configuration (bootstrap.servers and the
    security settings). Records for the data path come from :meth:`offset_record` and
    :meth:`chunk_record` and are sent inside the writer's transaction with the events; the
    operator actions :meth:`write`, :meth:`reset` and :meth:`set_position` commit on their own.

    Create the run's :class:`TransactionalWriter` before reading: its ``init_transactions`` aborts
    a killed predecessor's open transaction (same ``transactional.id``), which would otherwise hold
    back the last stable offset, so reads could miss offsets committed after it until the broker
    times it out.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic: str,
        *,
        read_timeout_s: float = 60.0,
        admin_transactional_id: str | None = None,
    ):
        if not topic:
            raise ConfigError(
                "No offsets topic given",
                fix="set offset.storage.topic, or topic.prefix for <topic.prefix>.offsets",
            )
        if not kafka_config.get("bootstrap.servers"):
            raise ConfigError(
                "The Kafka configuration has no bootstrap.servers",
                fix='add "bootstrap.servers" to the Kafka connection\'s config',
            )
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self.admin_transactional_id = admin_transactional_id or f"mongocdc-offsets-admin-{topic}"

    @classmethod
    def from_config(cls, kafka_config: Mapping[str, Any], config, **kwargs: Any) -> OffsetStore:
        """The store of a ConnectorConfig: its offset.storage.topic or <topic.prefix>.offsets."""
        return cls(kafka_config, config.offsets_topic, **kwargs)

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
    def read_everything(self) -> OffsetTopicContents:
        """Fold the committed records of the topic (see the module docstring)."""
        folded = OffsetTopicContents()
        for key, value in self.read_committed_records():
            parsed = parse_key(key)
            if parsed is None:
                owner = request_owner(key)
                if owner is not None:
                    if value is None:
                        folded.requests.pop(owner, None)
                    else:
                        folded.requests[owner] = json.loads(value)
                elif not is_lease_key(key):  # leases share the topic (core/lease.py)
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
                        snapshot_id, chunk_id, data.get("stats") or {}, _parse_iso(data.get("finished_at"))
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
        config = {
            key: value
            for key, value in self.kafka_config.items()
            if key not in _NOT_FOR_CONSUMERS and not callable(value)
        }
        config.update(_CONSUMER_ONLY)
        # Never joins or commits to this group: it only satisfies the client.
        config["group.id"] = f"mongocdc-offsets-reader-{uuid.uuid4().hex}"
        config["logger"] = librdkafka_log
        return config

    def read_committed_records(self) -> list[tuple[bytes | None, bytes | None]]:
        """Every committed ``(key, value)`` record of the topic, oldest first, before folding."""
        deadline = time.monotonic() + self.read_timeout_s
        consumer = Consumer(self._consumer_config())
        try:
            try:
                metadata = consumer.list_topics(timeout=self.read_timeout_s)
            except KafkaException as error:
                raise self._unreadable(error) from None
            info = metadata.topics.get(self.topic)
            if info is None or (
                info.error is not None
                and info.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
            ):
                return []  # no topic yet: no offsets yet
            if info.error is not None:
                # Never mistake an unreadable topic for an empty one: that would start over.
                raise self._unreadable(KafkaException(info.error))
            ends: dict[int, int] = {}
            for partition_id in sorted(info.partitions):
                try:
                    _low, high = consumer.get_watermark_offsets(
                        TopicPartition(self.topic, partition_id),
                        timeout=max(1.0, deadline - time.monotonic()),
                        cached=False,
                    )
                except KafkaException as error:
                    raise self._unreadable(error) from None
                if high > 0:
                    ends[partition_id] = high  # the last stable offset (read_committed)
            if not ends:
                return []
            consumer.assign([TopicPartition(self.topic, pid, -2) for pid in ends])  # -2: beginning
            records: list[tuple[bytes | None, bytes | None]] = []
            pending = set(ends)
            while pending:
                if time.monotonic() >= deadline:
                    raise OffsetError(
                        f"Could not read the offsets topic {self.topic!r} to its end within "
                        f"{self.read_timeout_s:g} s",
                        cause=f"partitions {sorted(pending)} still had records to read",
                        fix="check that the Kafka brokers are reachable and healthy, then retry",
                    )
                message = consumer.poll(0.5)
                if message is None:
                    continue
                pid = message.partition()
                if message.error():
                    code = message.error().code()
                    if code == KafkaError._PARTITION_EOF:
                        if message.offset() >= ends.get(pid, 0):
                            pending.discard(pid)
                        continue
                    if message.error().fatal() or code in (
                        KafkaError.TOPIC_AUTHORIZATION_FAILED,
                        KafkaError.GROUP_AUTHORIZATION_FAILED,
                    ):
                        raise self._unreadable(KafkaException(message.error()))
                    log.warning("Offsets topic %s: %s", self.topic, message.error().str())
                    continue
                if pid not in pending:
                    continue
                if message.offset() < ends[pid]:
                    records.append((message.key(), message.value()))
                if message.offset() + 1 >= ends[pid]:
                    pending.discard(pid)
            return records
        finally:
            consumer.close()

    def _unreadable(self, error: KafkaException) -> OffsetError:
        kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
        return OffsetError(
            f"Could not read the offsets topic {self.topic!r} from {self.kafka_config.get('bootstrap.servers')!r}",
            cause=f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error),
            fix="check bootstrap.servers and the security settings of the Kafka connection, and grant "
            "the Kafka principal READ and DESCRIBE on the offsets topic",
        )

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
        return {"topic": self.topic, "partitions": entries, "incremental_snapshot_requests": requests}

    # -- records for the data path --
    def offset_record(self, partition: OffsetPartition, state: OffsetState) -> Record:
        """The record storing ``state`` (stamped with the current time); send it in the writer's
        transaction together with the events it covers."""
        stamped = replace(state, updated_at=utcnow())
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
            "finished_at": _iso(utcnow()),
            "format": FORMAT_VERSION,
        }
        return Record(self.topic, partition.chunk_key(snapshot_id, chunk_id), _compact(value))

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
        self._commit([Record(self.topic, request_key(server_id, connector), _compact(dict(request)))])

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
        everything = self.read_everything()
        before = everything.states.get(partition)
        records = [self.tombstone(partition)]
        for (owner, snapshot_id), markers in everything.chunks.items():
            if owner == partition and markers:
                records.extend(self.chunk_tombstones(partition, snapshot_id, markers))
        self._commit(records)
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
        before = self.read(partition)
        after = self.write(partition, (before or OffsetState()).with_position(position))
        return before, after

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
        before = self.read(partition)
        base = before or OffsetState()
        if base.snapshot.status == SNAPSHOT_IN_PROGRESS:
            base = replace(base, snapshot=SnapshotState())  # Debezium's position replaces it
        after = self.write(partition, base.with_position(position))
        return entry, before, after

    def export_debezium(
        self, partition: OffsetPartition, connect_topic: str, debezium_connector: str
    ) -> tuple[OffsetState, bytes, bytes]:
        """Write ``partition``'s position as a Debezium 3.x MongoDB connector's offset (connector
        ``debezium_connector``, server_id = the topic prefix) into the Kafka Connect offsets topic
        ``connect_topic``; returns ``(our state, key, value)``. Debezium then resumes right after
        the last change this connector delivered."""
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

    def _commit(self, records: list[Record]) -> None:
        self.ensure_topic()
        with TransactionalWriter(self.kafka_config, self.admin_transactional_id) as writer:
            writer.begin()
            writer.commit(records)


# -- connector leases (see core/lease.py) ------------------------------------------------------------
# A connector's lease is one record in its offsets topic, keyed like the offsets but with a
# ``lease`` field in place of the replica set:
# ``["<connector>", {"server_id": "<topic.prefix>", "lease": "connector"}]``. parse_key() reads it
# as neither an offset nor a chunk marker; compaction keeps its last value, a tombstone frees it.
LEASE_NAME = "connector"


def lease_key(server_id: str, connector: str | None = None) -> bytes:
    """The key of the lease of connector ``server_id`` (its topic.prefix)."""
    return _compact([connector or server_id, {"server_id": server_id, "lease": LEASE_NAME}])


REQUEST_NAME = "request"


def request_key(server_id: str, connector: str | None = None) -> bytes:
    """The key of a connector's incremental snapshot request (see core/incremental.py)."""
    return _compact([connector or server_id, {"server_id": server_id, "incremental_snapshot": REQUEST_NAME}])


def request_owner(key: bytes | None) -> tuple[str, str] | None:
    """``(connector, server_id)`` of an incremental snapshot request key, else None."""
    if not key or b"incremental_snapshot" not in key:
        return None
    try:
        data = json.loads(key)
    except ValueError:
        return None
    if (
        isinstance(data, list)
        and len(data) == 2
        and isinstance(data[1], dict)
        and data[1].get("incremental_snapshot") == REQUEST_NAME
        and isinstance(data[1].get("server_id"), str)
    ):
        return str(data[0]), data[1]["server_id"]
    return None


def is_lease_key(key: bytes | None) -> bool:
    """Whether a record key of the offsets topic is a connector lease's (see :func:`lease_key`)."""
    if not key:
        return False
    try:
        data = json.loads(key)
    except ValueError:
        return False
    return (
        isinstance(data, list)
        and len(data) == 2
        and isinstance(data[1], dict)
        and data[1].get("lease") == LEASE_NAME
        and "rs" not in data[1]
    )


# -- Debezium's offsets (switching from or to Debezium's MongoDB connector) ---------------------------
# A Debezium 3.x MongoDB connector keeps one offset in Kafka Connect's offsets topic
# (offset.storage.topic of the Connect worker), written by Kafka Connect's JsonConverter:
#   key   ["<connector name>", {"server_id": "<topic.prefix>"}]      (MongoDbPartition)
#   value {"sec": <int>, "ord": <int>, "resume_token": "<base64 BSON of the token document>",
#          "lsid": "<compact JSON>", "txnNumber": <long>, "initsync": true, "transaction_id": ...}
# (MongoDbOffsetContext.getOffset, SourceInfo, ResumeTokens.toBase64). Debezium before 2.7 stored
# the token's ``_data`` hex string; Debezium still reads both (lastResumeTokenDoc), and so does
# this module. Keys with an ``rs`` field are the per-replica-set partitions of Debezium before 2.6,
# which 3.x still reads once to consolidate them.
DEBEZIUM_PARTITIONER = "murmur2_random"  # librdkafka's Java-compatible partitioner (Connect's keys)


@dataclass(frozen=True)
class DebeziumOffset:
    """One entry of a Kafka Connect offsets topic written by Debezium's MongoDB connector."""

    connector: str
    source_partition: Mapping[str, Any]
    value: Mapping[str, Any]

    def describe(self) -> str:
        return f"connector {self.connector!r} partition {_compact(dict(self.source_partition)).decode()}"

    @property
    def token_format(self) -> str | None:
        """``base64`` (Debezium >= 2.7), ``hex`` (older) or None when the entry has no token."""
        token = self.value.get("resume_token")
        if token is None:
            return None
        return "base64" if _debezium_token_document(token) is not None else "hex"

    def position(self) -> Position:
        """The position Debezium resumes from: after its resume token (or, without one, at its
        ``sec``/``ord`` operation time, inclusive, as Debezium's ``startAtOperationTime``)."""
        if self.value.get("initsync"):
            raise OffsetError(
                f"The Debezium offset of {self.describe()} is taken during its initial snapshot",
                cause="initsync=true: Debezium restarts such a snapshot from the beginning, the offset "
                "holds no position to stream from",
                fix="let the Debezium connector finish its snapshot (or snapshot here instead), then "
                "import again",
            )
        if self.value.get("incremental_snapshot_collections"):
            raise OffsetError(
                f"The Debezium offset of {self.describe()} is taken during an incremental snapshot",
                cause="the collections it still had to read "
                f"({self.value['incremental_snapshot_collections']}) would never be copied here",
                fix="let the Debezium connector finish its incremental snapshot, then import again",
            )
        token = self.value.get("resume_token")
        sec, ord_ = self.value.get("sec"), self.value.get("ord")
        cluster_time = None
        if isinstance(sec, int) and sec >= 0:
            cluster_time = Timestamp(sec, int(ord_) if isinstance(ord_, int) and ord_ >= 0 else 0)
        document = None
        if token is not None:
            if not isinstance(token, str) or not token:
                raise OffsetError(
                    f"The Debezium offset of {self.describe()} holds an unreadable resume_token",
                    cause=f"got {token!r}",
                    fix="import the position with mongocdc offsets set --resume-token instead",
                )
            document = _debezium_token_document(token) or {"_data": token}
            if cluster_time is None:
                cluster_time = token_cluster_time(document)
        if document is None and cluster_time is None:
            raise OffsetError(
                f"The Debezium offset of {self.describe()} holds no position",
                cause=f"no resume_token and no sec/ord in {_compact(dict(self.value)).decode()}",
                fix="let the Debezium connector stream at least once, or use mongocdc offsets set",
            )
        return Position(document, cluster_time)


def _debezium_token_document(token: str) -> dict[str, Any] | None:
    """The token document of Debezium's base64 BSON form, or None when ``token`` is not that form
    (then it is the ``_data`` hex string of Debezium before 2.7)."""
    try:  # a hex _data string is often valid base64 too: only a whole BSON document decides
        document = bson.decode(base64.b64decode(token, validate=True))
    except (binascii.Error, ValueError, bson.errors.BSONError):
        return None
    return document if "_data" in document else None


def token_cluster_time(token: Mapping[str, Any]) -> Timestamp | None:
    """The cluster time inside a resume token's ``_data`` (key-string type 130, then the 64-bit
    timestamp; as Debezium's ResumeTokens.getTimestamp), or None when it cannot be read."""
    data = token.get("_data")
    try:
        raw = bytes.fromhex(data) if isinstance(data, str) else bytes(data)
    except (TypeError, ValueError):
        return None
    if len(raw) < 9 or raw[0] != 130:
        return None
    value = int.from_bytes(raw[1:9], "big")
    return Timestamp(value >> 32, value & 0xFFFFFFFF)


def debezium_key(connector: str, server_id: str) -> bytes:
    """Kafka Connect's key of a Debezium 3.x MongoDB connector's offset."""
    return _compact([connector, {"server_id": server_id}])


def debezium_value(position: Position) -> dict[str, Any]:
    """The offset Debezium 3.x writes for ``position`` (MongoDbOffsetContext.getOffset)."""
    cluster_time = position.cluster_time
    if cluster_time is None and position.resume_token is not None:
        cluster_time = token_cluster_time(position.resume_token)
    value: dict[str, Any] = {
        "sec": cluster_time.time if cluster_time is not None else -1,
        "ord": cluster_time.inc if cluster_time is not None else -1,
    }
    if position.resume_token is not None:
        value["resume_token"] = base64.b64encode(bson.encode(dict(position.resume_token))).decode("ascii")
    return value


def read_debezium_offsets(
    kafka_config: Mapping[str, Any], connect_topic: str, *, read_timeout_s: float = 60.0
) -> list[DebeziumOffset]:
    """The live entries (last value per key, tombstones dropped) of a Kafka Connect offsets
    topic whose partitions are Debezium MongoDB partitions (a ``server_id`` field)."""
    reader = OffsetStore(kafka_config, connect_topic, read_timeout_s=read_timeout_s)
    described = describe_topic(reader.kafka_config, connect_topic)
    if described is None:
        raise OffsetError(
            f"The Kafka Connect offsets topic {connect_topic!r} does not exist",
            fix="give the offset.storage.topic of the Kafka Connect worker that runs the Debezium connector",
        )
    latest: dict[bytes, bytes | None] = {}
    for key, value in reader.read_committed_records():
        if key:
            latest[key] = value
    entries = []
    for key, value in latest.items():
        if value is None:
            continue
        try:
            data, offset = json.loads(key), json.loads(value)
        except ValueError:
            continue
        if (
            isinstance(data, list)
            and len(data) == 2
            and isinstance(data[0], str)
            and isinstance(data[1], dict)
            and isinstance(data[1].get("server_id"), str)
            and isinstance(offset, dict)
            and not ({"snapshot", "chunk", "lease"} & set(data[1]))
        ):
            entries.append(DebeziumOffset(data[0], data[1], offset))
    return entries


def find_debezium_offset(
    entries: list[DebeziumOffset], connector: str | None, server_id: str, rs: str | None = None
) -> DebeziumOffset:
    """The entry of Debezium connector ``connector`` (any name when None) for ``server_id``: its
    3.x partition ``{"server_id"}``, or else the pre-2.6 partition of replica set ``rs``."""
    matching = [
        entry
        for entry in entries
        if entry.source_partition.get("server_id") == server_id
        and (connector is None or entry.connector == connector)
    ]
    current = [entry for entry in matching if set(entry.source_partition) == {"server_id"}]
    older = [entry for entry in matching if entry.source_partition.get("rs") == rs and rs is not None]
    chosen = current or older
    wanted = f"connector {connector!r}" if connector else "any connector"
    if len(chosen) == 1:
        return chosen[0]
    found = ", ".join(entry.describe() for entry in entries) or "no Debezium MongoDB offset at all"
    if not chosen:
        raise OffsetError(
            f"No Debezium offset for {wanted} with server_id {server_id!r}",
            cause=f"the topic holds: {found}",
            fix="give the Kafka Connect connector name (--debezium-connector) and the topic.prefix the "
            "Debezium connector used, and the worker's offset.storage.topic",
        )
    raise OffsetError(
        f"Several Debezium offsets match {wanted} with server_id {server_id!r}",
        cause=f"found: {', '.join(entry.describe() for entry in chosen)}",
        fix="name the Kafka Connect connector (--debezium-connector)",
    )


def write_debezium_offset(
    kafka_config: Mapping[str, Any],
    connect_topic: str,
    connector: str,
    server_id: str,
    position: Position,
    *,
    timeout_s: float = 60.0,
) -> tuple[bytes, bytes]:
    """Write ``position`` as Debezium 3.x's offset of ``connector`` into a Kafka Connect offsets
    topic, on the partition Kafka Connect's Java producer picks for the key (murmur2), so that
    Connect reads it as the key's last value. Returns the ``(key, value)`` written."""
    if describe_topic(kafka_config, connect_topic) is None:
        raise OffsetError(
            f"The Kafka Connect offsets topic {connect_topic!r} does not exist",
            fix="give the offset.storage.topic of the Kafka Connect worker that will run the "
            "Debezium connector (the worker creates it when it starts)",
        )
    key, value = debezium_key(connector, server_id), _compact(debezium_value(position))
    settings = {
        k: v for k, v in kafka_config.items() if k not in _NOT_FOR_CONSUMERS and k not in _CONSUMER_ONLY
    }
    settings.pop("group.id", None)
    settings.update(
        {
            "partitioner": DEBEZIUM_PARTITIONER,
            "acks": "all",
            "enable.idempotence": True,
            "logger": librdkafka_log,
        }
    )
    failures: list[str] = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(f"{error.name()}: {error.str()}")

    producer = Producer(settings)
    producer.produce(connect_topic, key=key, value=value, on_delivery=delivered)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise OffsetError(
            f"Could not write the Debezium offset into {connect_topic!r}",
            cause="; ".join(failures) or f"not delivered within {timeout_s:g} s",
            fix="check that the Kafka brokers are reachable and the principal may WRITE to the topic",
        )
    return key, value
