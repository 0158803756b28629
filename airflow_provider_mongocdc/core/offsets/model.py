"""The offset model: what one offset belongs to (:class:`OffsetPartition`), a point in the change
stream (:class:`Position`), a partition's snapshot (:class:`SnapshotState`) and its whole committed
state (:class:`OffsetState`), with their JSON forms (the value layout: docs/design.md, "Offsets").

Pure data: nothing here reads or writes Kafka (that is :class:`~airflow_provider_mongocdc.core.offsets.store.OffsetStore`).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

import bson
from bson import json_util
from bson.json_util import JSONMode, JSONOptions
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso

FORMAT_VERSION = 1
SNAPSHOT_NONE, SNAPSHOT_IN_PROGRESS, SNAPSHOT_COMPLETED = "none", "in_progress", "completed"
SNAPSHOT_STATUSES = (SNAPSHOT_NONE, SNAPSHOT_IN_PROGRESS, SNAPSHOT_COMPLETED)
# Partition name of a whole-deployment change stream (mongodb.connection.mode=sharded through
# mongos); a replica set's partition is named after the replica set.
CLUSTER_PARTITION = "cluster"
_CANONICAL = JSONOptions(json_mode=JSONMode.CANONICAL)


# -- time helpers -----------------------------------------------------------------------------------
def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def timestamp_datetime(ts: Timestamp | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts.time, timezone.utc)


# -- validation -------------------------------------------------------------------------------------
def check_status(status: str, known: tuple[str, ...], what: str) -> None:
    """A stored ``what``'s ``status`` must be one of ``known`` (else an :class:`OffsetError`)."""
    if status not in known:
        raise OffsetError(f"Unknown {what} status {status!r}", fix=f"use one of {', '.join(known)}")


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
        return compact([self.connector_name, self.source_partition()])

    def chunk_key(self, snapshot_id: str, chunk_id: str) -> bytes:
        partition = self.source_partition()
        partition.update(snapshot=str(snapshot_id), chunk=str(chunk_id))
        return compact([self.connector_name, partition])

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
                f"({iso_z(self.cluster_datetime)})"
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
        check_status(self.status, SNAPSHOT_STATUSES, "snapshot")
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
                started_at=iso_z(self.started_at),
                completed_at=iso_z(self.completed_at),
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
            started_at=parse_iso(data.get("started_at")),
            completed_at=parse_iso(data.get("completed_at")),
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
    # The incremental snapshot's progress (core/window/incremental.py), as stored JSON; None: none.
    incremental: Mapping[str, Any] | None = None
    # The name of the connector that wrote it (the connector property ``name``: the entry's name in
    # the connector list); None: a connector without a name, or an offset written before names.
    connector: str | None = None
    # While an open window of the partition runs: its marker (core/offsets/open_window.py), as
    # stored JSON, written with each of its commits and removed by its last; None otherwise.
    open_window: Mapping[str, Any] | None = None
    # What the tries of the Airflow task instance that committed last have committed so far
    # (core/window/batch.py: ``task``, the events and their counts), as stored JSON; a retry of
    # that task instance counts them in its summary. None: not written by a task's window.
    run: Mapping[str, Any] | None = None

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
            open_window=None,
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
        data["last_window_end"] = iso_z(self.last_window_end)
        data["counters"] = {"events": self.events, "windows": self.windows, "snapshots": self.snapshots}
        data["updated_at"] = iso_z(self.updated_at)
        if self.incremental is not None:
            data["incremental_snapshot"] = dict(self.incremental)
        if self.connector is not None:
            data["connector"] = self.connector
        if self.open_window is not None:
            data["open_window"] = dict(self.open_window)
        if self.run is not None:
            data["run"] = dict(self.run)
        data["format"] = FORMAT_VERSION
        return data

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OffsetState:
        counters = data.get("counters") or {}
        return cls(
            position=Position.from_json(data),
            snapshot=SnapshotState.from_json(data.get("snapshot")),
            last_window_end=parse_iso(data.get("last_window_end")),
            events=int(counters.get("events", 0)),
            windows=int(counters.get("windows", 0)),
            snapshots=int(counters.get("snapshots", 0)),
            updated_at=parse_iso(data.get("updated_at")),
            incremental=data.get("incremental_snapshot"),
            connector=data.get("connector") if isinstance(data.get("connector"), str) else None,
            open_window=data.get("open_window") if isinstance(data.get("open_window"), Mapping) else None,
            run=data.get("run") if isinstance(data.get("run"), Mapping) else None,
        )

    def to_bytes(self) -> bytes:
        return compact(self.to_json())

    @classmethod
    def from_bytes(cls, value: bytes) -> OffsetState:
        return cls.from_json(json.loads(value))

    def to_dict(self) -> dict[str, Any]:
        """For display: the stored JSON plus readable times."""
        data = self.to_json()
        if self.cluster_time is not None:
            data["cluster_time"] = iso_z(timestamp_datetime(self.cluster_time))
        return data


@dataclass(frozen=True)
class ChunkMarker:
    """A finished snapshot chunk (committed with the chunk's events)."""

    snapshot_id: str
    chunk_id: str
    stats: Mapping[str, Any]
    finished_at: datetime | None


def compact(data: Any) -> bytes:
    """Compact JSON as UTF-8 (the form of every key and value of the offsets topic)."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def _token_to_json(token: Mapping[str, Any]) -> Any:
    """Debezium stores a resume token as its ``_data`` string; other fields keep Extended JSON."""
    if set(token) == {"_data"} and isinstance(token["_data"], str):
        return token["_data"]
    return json.loads(json_util.dumps(dict(token), json_options=_CANONICAL))


def _token_from_json(value: Any) -> dict[str, Any]:
    if isinstance(value, str):  # the _data hex string (written here), or Debezium 2.7+'s base64 BSON
        return base64_token_document(value) or {"_data": value}
    if isinstance(value, Mapping):
        return json_util.loads(json.dumps(value))
    raise OffsetError(
        f"Unreadable resume token {value!r}",
        fix='a resume token is a document like {"_data": "8263..."} or its _data string',
    )


def base64_token_document(token: str) -> dict[str, Any] | None:
    """The token document of Debezium's base64 BSON form (Debezium 2.7+), or None when ``token``
    is not that form (then it is the ``_data`` hex string of Debezium before 2.7, and of this
    connector)."""
    try:  # a hex _data string is often valid base64 too: only a whole BSON document decides
        document = bson.decode(base64.b64decode(token, validate=True))
    except (binascii.Error, ValueError, bson.errors.BSONError):
        return None
    return document if "_data" in document else None


def token_cluster_time(token: Mapping[str, Any] | None) -> Timestamp | None:
    """The cluster time at the start of a resume token, or None when it cannot be read.

    MongoDB writes a token's ``_data`` as a KeyString that starts with the event's cluster time:
    type byte 130 (``0x82``), then seconds and increment as two big-endian 32-bit integers (as
    Debezium's ResumeTokens.getTimestamp reads it). ``_data`` is a hex string, or its bytes.
    """
    if not token:
        return None
    data = token.get("_data")
    if isinstance(data, str):
        if len(data) < 18 or data[:2] != "82":
            return None
        try:
            return Timestamp(int(data[2:10], 16), int(data[10:18], 16))
        except ValueError:
            return None
    try:
        raw = bytes(data)
    except (TypeError, ValueError):
        return None
    if len(raw) < 9 or raw[0] != 130:
        return None
    value = int.from_bytes(raw[1:9], "big")
    return Timestamp(value >> 32, value & 0xFFFFFFFF)


def position_time(position: Position | None) -> Timestamp | None:
    """The cluster time of a position: its own, or the one inside its resume token."""
    if position is None:
        return None
    return position.cluster_time or token_cluster_time(position.resume_token)


def moves_back(before: Position | None, after: Position | None) -> bool:
    """Whether ``after`` lies before ``before`` in the change stream (by cluster time; a position
    without one is never said to move back)."""
    first, second = position_time(before), position_time(after)
    return first is not None and second is not None and second < first


def describe_position(position: Position | None) -> dict[str, Any] | None:
    """A position for summaries: Debezium's offset fields plus the cluster time as ISO text."""
    if position is None:
        return None
    data = position.to_json()
    cluster_time = position_time(position)
    if cluster_time is not None:
        data["time"] = iso_z(datetime.fromtimestamp(cluster_time.time, timezone.utc))
    return data
