"""Oplog gaps: whether a connector's stored resume points are still in the oplog, and for how long.

A change stream can only resume from a position the oplog still holds. MongoDB's oplog is a capped
collection: when it is full, every new entry pushes out the oldest one, and a connector stopped
for longer than the oplog window finds its resume point gone (seed 002: error 286
``ChangeStreamHistoryLost``, "the resume point may no longer be in the oplog"). Only a new
snapshot can recover from that (seed 000).

For each offset partition of a connector this module gathers two kinds of evidence:

Stream check (always)
    The connector's change stream is opened from the stored position, exactly as a window opens
    it (:func:`~.change_stream.open_stream`), and read once. MongoDB refuses a purged position with
    one of the errors :func:`~.change_stream.is_history_lost` recognises. Connection errors,
    timeouts and elections are *not* evidence of a gap: they raise
    :class:`~.errors.ConnectionFailedError`, so that the caller retries instead of re-snapshotting.
Oplog comparison (where ``local.oplog.rs`` can be read)
    The stored cluster time is compared with the oldest oplog entry, by the server's own rule
    (:func:`oplog_covers`): the oplog still covers the position when its first entry is at or
    before it, *or* when that first entry is the replica set's initiation (``op: "n"``,
    ``o.msg: "initiating set"``): such an oplog never lost an entry, and MongoDB resumes a change
    stream from any earlier time on it (``isNewRS`` in the server's resumability check). That is
    the case of a shard added to the cluster after the stored position: its young oplog is not a
    gap. For a replica set (or a shard's own stream in per-shard mode,
    ``mongodb.connection.mode=replica_set``) this is the replica set's oplog; for a cluster-wide
    stream through mongos every shard's oplog matters (the position is lost as soon as one shard
    purged it). mongos itself refuses to serve the ``local`` database, so the shards are
    contacted directly with the connection's credentials; a shard that cannot be reached (or
    read: ``local.oplog.rs`` needs the ``clusterMonitor`` role or read access to ``local``) is
    noted in the report, and for it only the stream check applies.

A partition has a *gap* when the stream check says its position is gone (MongoDB's verdict
decides whenever the stream could be opened); the oplog comparison decides only where no stream
check ran. The lost history is the time between the stored position and the oldest entry still in
the oplog. A stream MongoDB refuses for another reason than a purged oplog (``InvalidResumeToken``
260, ``ChangeStreamFatalError`` 280: a malformed token, or one of another deployment) is not a
gap: the check fails with :class:`~.errors.OffsetError`, whose fix is to inspect and repair the
offset (``mongocdc offsets show|set|reset``).

Headroom
    How long until the stored position would be purged at the current oplog rate. When the oplog
    is full its oldest entry advances at the speed of writes, that is as fast as time passes, so
    the position is purged after ``stored - oldest`` seconds. An oplog that is not full yet
    (``size < maxSize``, or ``count < max`` where a document limit is set) first fills at the
    observed rate: ``(newest - oldest) x (1 - fill) / fill`` more seconds. Where the size is
    unreadable the oplog is assumed full (the smaller, safer estimate). Servers with
    ``oplogMinRetentionHours`` keep entries longer than this estimate.

Partitions without an offset have nothing to lose and are reported as ``no_offset``; partitions
whose snapshot is in progress (``snapshot_in_progress``, with the headroom of the snapshot's
recorded start position) or which store no position (``no_position``) are reported, never
treated as gaps.

The checks run on pymongo's synchronous API (:class:`GapChecker`, used by the sensor's poke) or
on its asyncio API (:class:`AsyncGapChecker`, used by the deferrable sensor's trigger); both share
the planning and assessment functions of this module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from airflow_provider_mongocdc.core.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.change_stream import (
    is_history_lost,
    is_unusable_position,
    open_stream,
    token_cluster_time,
    unusable_position_error,
    watch_target,
)
from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.connection import (
    AUTHENTICATION_FAILED,
    MongoConnectionDetails,
    connect,
    redact_uri,
)
from airflow_provider_mongocdc.core.errors import (
    AuthenticationError,
    ConnectionFailedError,
    MongoCdcError,
    TopologyError,
)
from airflow_provider_mongocdc.core.filters import Filters
from airflow_provider_mongocdc.core.offsets import (
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
    timestamp_datetime,
)
from airflow_provider_mongocdc.core.topology import CLUSTER_PARTITION, ShardAddress

log = logging.getLogger(__name__)

# Partition statuses.
OK, GAP, NO_OFFSET, NO_POSITION, SNAPSHOT_RUNNING = (
    "ok",
    "gap",
    "no_offset",
    "no_position",
    "snapshot_in_progress",
)
# Outcomes of the stream check.
RESUMABLE, HISTORY_LOST = "resumable", "history_lost"

# Kinds of deployment as far as the gap check is concerned.
REPLICA_SET, SHARDED = "replica_set", "sharded"

# How long the stream check waits for the first batch (it reads one batch at most).
STREAM_PROBE_AWAIT_MS = 100
# Shards contacted directly only to read their oplog: one attempt, bounded server selection.
SHARD_PROBE_TIMEOUT_MS = 5000


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _ts_json(ts: Timestamp | None) -> dict[str, int] | None:
    return None if ts is None else {"t": ts.time, "i": ts.inc}


def _error_text(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, OperationFailure) and error.details:
        text = str(error.details.get("errmsg", text))
    return redact_uri(text.split(", full error:")[0])


# -- the oplog of one replica set -------------------------------------------------------------------
INITIATING_SET = "initiating set"  # o.msg of the no-op that starts a new replica set's oplog


def is_initiation_entry(entry: Mapping[str, Any] | None) -> bool:
    """Whether an oplog entry is a replica set's initiation: ``op: "n"`` with ``o.msg:
    "initiating set"``, the first entry MongoDB writes when a replica set is initiated."""
    if not entry or entry.get("op") != "n":
        return False
    o = entry.get("o")
    return isinstance(o, Mapping) and o.get("msg") == INITIATING_SET


def oplog_covers(oldest: Timestamp, starts_at_initiation: bool, cluster_time: Timestamp) -> bool:
    """MongoDB's rule for whether a change stream can still start at ``cluster_time`` on an oplog
    whose first entry is at ``oldest``: that entry is at or before it, or it is the replica set's
    initiation (nothing was ever dropped from that oplog, so nothing before it can be missing:
    the server's ``isNewRS``)."""
    return starts_at_initiation or oldest <= cluster_time


@dataclass(frozen=True)
class OplogSpan:
    """The oldest and newest entries of one replica set's oplog, and how full it is.

    ``error`` says why the oplog could not be read (then ``oldest`` is None);
    ``starts_at_initiation``: the oldest entry is the replica set's initiation (see
    :func:`oplog_covers`).
    """

    replica_set: str
    oldest: Timestamp | None = None
    newest: Timestamp | None = None
    size_bytes: int | None = None
    max_size_bytes: int | None = None
    count: int | None = None
    max_count: int | None = None
    error: str | None = None
    starts_at_initiation: bool = False

    @property
    def readable(self) -> bool:
        return self.oldest is not None

    @property
    def window_seconds(self) -> int | None:
        """Seconds of history the oplog holds now (newest - oldest)."""
        if self.oldest is None or self.newest is None:
            return None
        return max(0, self.newest.time - self.oldest.time)

    @property
    def fill(self) -> float | None:
        """How full the oplog is (0..1), by bytes or by documents, whichever is fuller."""
        ratios = []
        if self.size_bytes is not None and self.max_size_bytes:
            ratios.append(self.size_bytes / self.max_size_bytes)
        if self.count is not None and self.max_count:
            ratios.append(self.count / self.max_count)
        return min(1.0, max(ratios)) if ratios else None

    def fill_seconds(self) -> int:
        """Seconds until the oplog is full at the observed write rate (0: full, or unknown)."""
        fill, window = self.fill, self.window_seconds
        if fill is None or fill >= 1.0 or fill <= 0.0 or not window:
            return 0
        return int(window * (1.0 - fill) / fill)

    def covers(self, cluster_time: Timestamp) -> bool | None:
        """Whether a change stream can still start at ``cluster_time`` on this oplog (MongoDB's
        rule, :func:`oplog_covers`; None: unreadable)."""
        if self.oldest is None:
            return None
        return oplog_covers(self.oldest, self.starts_at_initiation, cluster_time)

    def headroom_seconds(self, cluster_time: Timestamp) -> int | None:
        """Seconds until ``cluster_time`` would be purged at the current rate (see the module
        documentation); negative when it already is; None when the oplog is unreadable. A position
        older than a replica set's initiation stays resumable until the initiation entry itself
        is dropped, that is until the oplog is full."""
        if self.oldest is None:
            return None
        behind = cluster_time.time - self.oldest.time
        if behind < 0 and self.starts_at_initiation:
            behind = 0
        return behind + self.fill_seconds()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica_set": self.replica_set,
            "oldest": _ts_json(self.oldest),
            "oldest_time": _iso(timestamp_datetime(self.oldest)),
            "newest": _ts_json(self.newest),
            "newest_time": _iso(timestamp_datetime(self.newest)),
            "window_seconds": self.window_seconds,
            "size_bytes": self.size_bytes,
            "max_size_bytes": self.max_size_bytes,
            "count": self.count,
            "max_count": self.max_count,
            "fill": None if self.fill is None else round(self.fill, 6),
            "starts_at_initiation": self.starts_at_initiation,
            "error": self.error,
        }


def span_from_documents(
    replica_set: str,
    first: Mapping[str, Any] | None,
    last: Mapping[str, Any] | None,
    stats: Mapping[str, Any] | None,
) -> OplogSpan:
    """An :class:`OplogSpan` from the first and last ``local.oplog.rs`` entries (``ts``, and ``op``
    and ``o.msg`` of the first) and its collStats."""
    stats = stats or {}

    def number(name: str) -> int | None:
        value = stats.get(name)
        return int(value) if value is not None else None

    return OplogSpan(
        replica_set,
        oldest=first.get("ts") if first else None,
        newest=last.get("ts") if last else None,
        size_bytes=number("size"),
        max_size_bytes=number("maxSize"),
        count=number("count"),
        max_count=number("max") or None,
        error=None if first else "the oplog is empty",
        starts_at_initiation=is_initiation_entry(first),
    )


# The first entry's op and o.msg tell whether it is the replica set's initiation (o can be large).
_FIRST_PROJECTION = {"ts": 1, "op": 1, "o.msg": 1, "_id": 0}
_OPLOG_PROJECTION = {"ts": 1, "_id": 0}


def read_oplog_span(client: MongoClient, replica_set: str) -> OplogSpan:
    """Read the oplog span of the replica set ``client`` is connected to.

    A refused read (no privilege on ``local``) gives a span with ``error``; connection errors raise.
    """
    oplog = client["local"]["oplog.rs"]
    try:
        first = oplog.find_one({}, _FIRST_PROJECTION, sort=[("$natural", 1)])
        last = oplog.find_one({}, _OPLOG_PROJECTION, sort=[("$natural", -1)])
    except OperationFailure as error:
        return OplogSpan(replica_set, error=f"local.oplog.rs is not readable: {_error_text(error)}")
    try:
        stats = client["local"].command("collStats", "oplog.rs")
    except OperationFailure:
        stats = None
    return span_from_documents(replica_set, first, last, stats)


async def read_oplog_span_async(client, replica_set: str) -> OplogSpan:
    """:func:`read_oplog_span` with an ``AsyncMongoClient``."""
    oplog = client["local"]["oplog.rs"]
    try:
        first = await oplog.find_one({}, _FIRST_PROJECTION, sort=[("$natural", 1)])
        last = await oplog.find_one({}, _OPLOG_PROJECTION, sort=[("$natural", -1)])
    except OperationFailure as error:
        return OplogSpan(replica_set, error=f"local.oplog.rs is not readable: {_error_text(error)}")
    try:
        stats = await client["local"].command("collStats", "oplog.rs")
    except OperationFailure:
        stats = None
    return span_from_documents(replica_set, first, last, stats)


# -- the deployment ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    """What the connection points at: a replica set, or a sharded cluster and its shards."""

    kind: str
    replica_set: str | None = None
    shards: tuple[ShardAddress, ...] = ()
    via: str = "replica_set"  # "replica_set", "mongos" or "config_server"

    def partition_names(self, connection_mode: str) -> list[str]:
        """The connector's offset partitions (as the window and snapshot applications name them)."""
        if self.kind == REPLICA_SET:
            return [self.replica_set]
        if connection_mode == "replica_set":
            return [shard.replica_set for shard in self.shards]
        return [CLUSTER_PARTITION]

    def shard(self, replica_set: str) -> ShardAddress | None:
        return next((shard for shard in self.shards if shard.replica_set == replica_set), None)


def layout_from_hello(
    hello: Mapping[str, Any], shards: Iterable[Mapping[str, Any]] = (), where: str = "the configured MongoDB"
) -> Layout:
    """The layout from a ``hello`` answer (and ``listShards``/``config.shards`` documents)."""
    if hello.get("msg") == "isdbgrid" or (hello.get("setName") and hello.get("configsvr")):
        addresses = tuple(ShardAddress(str(doc["_id"]), str(doc["host"])) for doc in shards)
        if not addresses:
            raise TopologyError(
                f"The sharded cluster behind {where} has no shards",
                fix="add a shard (sh.addShard) before capturing",
            )
        return Layout(
            SHARDED, shards=addresses, via="mongos" if hello.get("msg") == "isdbgrid" else "config_server"
        )
    if hello.get("setName"):
        return Layout(REPLICA_SET, replica_set=str(hello["setName"]))
    raise TopologyError(
        f"{where} is a standalone MongoDB server, which has no oplog",
        cause="a standalone server has no oplog, so there is no resume point to check",
        fix="capture a replica set or a sharded cluster",
    )


def _layout_refused(error: OperationFailure, where: str) -> MongoCdcError:
    if error.code == AUTHENTICATION_FAILED:
        return AuthenticationError(
            f"MongoDB at {where} refused the credentials",
            cause=_error_text(error),
            fix="check the user name and password of the MongoDB connection",
        )
    return TopologyError(
        f"MongoDB at {where} refused to describe the deployment",
        cause=f"error {error.code}: {_error_text(error)}",
        fix="grant the connector's user the clusterMonitor role (listShards, reading local.oplog.rs)",
    )


def read_layout(client: MongoClient, where: str) -> Layout:
    try:
        hello = client.admin.command("hello")
        shards: list[Mapping[str, Any]] = []
        if hello.get("msg") == "isdbgrid":
            shards = client.admin.command("listShards")["shards"]
        elif hello.get("setName") and hello.get("configsvr"):
            shards = list(client["config"]["shards"].find())
    except OperationFailure as error:
        raise _layout_refused(error, where) from None
    return layout_from_hello(hello, shards, where)


async def read_layout_async(client, where: str) -> Layout:
    try:
        hello = await client.admin.command("hello")
        shards: list[Mapping[str, Any]] = []
        if hello.get("msg") == "isdbgrid":
            shards = (await client.admin.command("listShards"))["shards"]
        elif hello.get("setName") and hello.get("configsvr"):
            shards = await client["config"]["shards"].find().to_list()
    except OperationFailure as error:
        raise _layout_refused(error, where) from None
    return layout_from_hello(hello, shards, where)


# -- what to check ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    """The checks one partition needs: a stream check through ``stream_via`` (None: the configured
    deployment; a shard's replica set name: that shard) and the oplogs of ``oplogs`` (replica
    set names; None: the configured replica set)."""

    partition: OffsetPartition
    state: OffsetState | None
    stream_via: str | None
    oplogs: tuple[str | None, ...]

    @property
    def position(self) -> Position | None:
        if self.state is None:
            return None
        if self.state.snapshot.status == SNAPSHOT_IN_PROGRESS:
            return self.state.snapshot.start
        return self.state.position

    @property
    def checks_stream(self) -> bool:
        return (
            self.state is not None
            and self.state.position is not None
            and self.state.snapshot.status != SNAPSHOT_IN_PROGRESS
        )


def connector_states(
    states: Mapping[OffsetPartition, OffsetState], config: ConnectorConfig, connector: str | None = None
) -> dict[OffsetPartition, OffsetState]:
    """The stored states of the connector ``config.topic_prefix`` (Kafka Connect connector name
    ``connector``, default the topic prefix), from everything in an offsets topic."""
    name = connector or config.topic_prefix
    return {
        partition: state
        for partition, state in states.items()
        if partition.server_id == config.topic_prefix and partition.connector_name == name
    }


def plan_probes(
    layout: Layout,
    config: ConnectorConfig,
    states: Mapping[OffsetPartition, OffsetState],
    connector: str | None = None,
) -> list[Probe]:
    """One probe per partition the connector has (from the layout) or has stored."""
    mine = connector_states(states, config, connector)
    by_name = {partition.rs: (partition, state) for partition, state in mine.items()}
    names = list(dict.fromkeys([*layout.partition_names(config.mongodb_connection_mode), *sorted(by_name)]))
    probes = []
    for name in names:
        partition, state = by_name.get(name, (OffsetPartition(config.topic_prefix, name, connector), None))
        if layout.kind == REPLICA_SET:
            stream_via, oplogs = None, (None,)
        elif name == CLUSTER_PARTITION:
            stream_via, oplogs = None, tuple(shard.replica_set for shard in layout.shards)
        elif layout.shard(name) is not None:
            stream_via, oplogs = name, (name,)
        else:  # a stored partition the deployment no longer has (a removed shard)
            stream_via, oplogs = "", ()
        probes.append(Probe(partition, state, stream_via, oplogs))
    return probes


# -- the verdict ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionCheck:
    """What was found for one partition."""

    partition: OffsetPartition
    status: str
    position: Position | None = None
    spans: tuple[OplogSpan, ...] = ()
    stream: str | None = None  # RESUMABLE, HISTORY_LOST, or None when not checked
    stream_error: str | None = None
    lost_seconds: int | None = None
    headroom_seconds: int | None = None
    snapshot_id: str | None = None
    note: str = ""

    @property
    def cluster_time(self) -> Timestamp | None:
        return _cluster_time(self.position)

    @property
    def oldest(self) -> Timestamp | None:
        """The oldest entry still in every oplog this partition needs (the latest of the oldest)."""
        oldest = [span.oldest for span in self.spans if span.oldest is not None]
        return max(oldest) if oldest else None

    @property
    def newest(self) -> Timestamp | None:
        newest = [span.newest for span in self.spans if span.newest is not None]
        return max(newest) if newest else None

    def to_dict(self) -> dict[str, Any]:
        ts = self.cluster_time
        return {
            "partition": self.partition.rs,
            "offset_key": self.partition.to_dict(),
            "status": self.status,
            "stored_cluster_time": _ts_json(ts),
            "stored_time": _iso(timestamp_datetime(ts)),
            "oldest_oplog_time": _iso(timestamp_datetime(self.oldest)),
            "newest_oplog_time": _iso(timestamp_datetime(self.newest)),
            "lost_seconds": self.lost_seconds,
            "headroom_seconds": self.headroom_seconds,
            "stream": self.stream,
            "stream_error": self.stream_error,
            "snapshot_id": self.snapshot_id,
            "oplogs": [span.to_dict() for span in self.spans],
            "note": self.note,
        }

    def describe(self) -> str:
        text = f"{self.partition.rs}: {self.status}"
        if self.note:
            text += f" ({self.note})"
        return text


def _cluster_time(position: Position | None) -> Timestamp | None:
    if position is None:
        return None
    return position.cluster_time or token_cluster_time(position.resume_token)


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return "unknown"
    sign, seconds = ("-" if seconds < 0 else ""), abs(int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{sign}{hours}h{minutes:02d}m"
    if minutes:
        return f"{sign}{minutes}m{secs:02d}s"
    return f"{sign}{secs}s"


def assess(
    probe: Probe, spans: Iterable[OplogSpan], stream: str | None = None, stream_error: str | None = None
) -> PartitionCheck:
    """The verdict for one partition from the evidence gathered for it."""
    spans = tuple(spans)
    state = probe.state
    partition = probe.partition
    if state is None:
        return PartitionCheck(
            partition,
            NO_OFFSET,
            spans=spans,
            note="no offset is stored: nothing can be lost; the first run snapshots per snapshot.mode",
        )
    position = probe.position
    ts = _cluster_time(position)
    readable = [span for span in spans if span.readable]
    headroom = min((span.headroom_seconds(ts) for span in readable), default=None) if ts else None
    purged_spans = [span for span in readable if ts is not None and not span.covers(ts)]
    lost = max((span.oldest.time - ts.time for span in purged_spans), default=None)
    if state.snapshot.status == SNAPSHOT_IN_PROGRESS:
        note = f"snapshot {state.snapshot.snapshot_id} is in progress"
        if purged_spans:
            note += (
                "; its recorded start position is no longer in the oplog, so streaming cannot "
                "continue from it: run a new snapshot when it ends"
            )
        return PartitionCheck(
            partition,
            SNAPSHOT_RUNNING,
            position,
            spans,
            None,
            None,
            max(0, lost) if lost is not None else None,
            headroom,
            state.snapshot.snapshot_id,
            note,
        )
    if position is None:
        return PartitionCheck(
            partition, NO_POSITION, None, spans, note="the offset holds no stream position yet"
        )
    # MongoDB's own check decides when the stream could be opened; the oplog comparison (same rule,
    # see oplog_covers) only where it could not.
    gap = stream == HISTORY_LOST if stream is not None else bool(purged_spans)
    if gap:
        evidence = []
        if stream == HISTORY_LOST:
            evidence.append(f"MongoDB refused to resume the change stream ({stream_error})")
        for span in purged_spans:
            evidence.append(
                f"the oldest entry in the oplog of {span.replica_set} is "
                f"{_iso(timestamp_datetime(span.oldest))}, after the stored position"
            )
        lost_text = (
            f"{_duration(lost)} of history lost"
            if lost is not None
            else "the lost time is unknown (the oplog is not readable)"
        )
        note = f"stored position {position.describe()} is no longer in the oplog: {lost_text}; " + "; ".join(
            evidence
        )
        return PartitionCheck(
            partition,
            GAP,
            position,
            spans,
            stream,
            stream_error,
            max(0, lost) if lost is not None else None,
            None,
            None,
            note,
        )
    if readable:
        note = f"resumable; purged in about {_duration(headroom)} at the current oplog rate"
        if purged_spans:
            note += (
                "; MongoDB resumed the change stream although the oldest entry in the oplog of "
                + ", ".join(span.replica_set for span in purged_spans)
                + " is after the stored position"
            )
    else:
        reasons = "; ".join(span.error or "unreadable" for span in spans) or "no oplog to read"
        note = f"resumable; headroom unknown ({reasons})"
    return PartitionCheck(partition, OK, position, spans, stream, None, None, headroom, None, note)


@dataclass(frozen=True)
class GapReport:
    """The outcome of a check of every partition of one connector."""

    connector: str
    checks: tuple[PartitionCheck, ...]
    detected_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    offsets_topic: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def gap(self) -> bool:
        return any(check.status == GAP for check in self.checks)

    @property
    def gaps(self) -> list[PartitionCheck]:
        return [check for check in self.checks if check.status == GAP]

    @property
    def headroom_seconds(self) -> int | None:
        """The smallest headroom of the partitions whose positions are still in the oplog."""
        values = [
            check.headroom_seconds
            for check in self.checks
            if check.status in (OK, SNAPSHOT_RUNNING) and check.headroom_seconds is not None
        ]
        return min(values) if values else None

    def low_headroom(self, threshold_seconds: float) -> list[PartitionCheck]:
        """Partitions still resumable whose position would be purged within ``threshold_seconds``."""
        return [
            check
            for check in self.checks
            if check.status in (OK, SNAPSHOT_RUNNING)
            and check.headroom_seconds is not None
            and check.headroom_seconds < threshold_seconds
        ]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (for XCom and a DAG run's conf)."""
        return {
            "connector": self.connector,
            "offsets_topic": self.offsets_topic,
            "detected_at": _iso(self.detected_at),
            "gap": self.gap,
            "gap_partitions": [check.partition.rs for check in self.gaps],
            "lost_seconds": max(
                (check.lost_seconds for check in self.gaps if check.lost_seconds is not None), default=None
            ),
            "headroom_seconds": self.headroom_seconds,
            "partitions": [check.to_dict() for check in self.checks],
            "notes": list(self.notes),
        }

    def describe(self) -> str:
        parts = "; ".join(check.describe() for check in self.checks) or "no partitions"
        return f"connector {self.connector}: {parts}"


# -- running the checks -----------------------------------------------------------------------------
def _stream_refused(error: OperationFailure, where: str) -> MongoCdcError:
    return ConnectionFailedError(
        f"MongoDB at {where} refused to open the connector's change stream at the stored position",
        cause=f"error {error.code}: {_error_text(error)}",
        fix="grant the connector's user the changeStream and find privileges on the captured "
        "databases (read role), and check the capture.scope/capture.target properties",
    )


def _stream_failed(
    error: OperationFailure, config: ConnectorConfig, probe: Probe, where: str
) -> tuple[str, str | None]:
    """The stream check's outcome when MongoDB refused the stream: a purged oplog is evidence of a
    gap; an unusable stored position (260, 280) and any other refusal raise (they are not gaps)."""
    if is_history_lost(error):
        return HISTORY_LOST, f"error {error.code}: {_error_text(error)}"
    if is_unusable_position(error):
        raise unusable_position_error(config, probe.partition, probe.position, error) from None
    raise _stream_refused(error, where) from None


def _unreachable(error: PyMongoError, where: str) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"Lost the connection to MongoDB at {where} while checking the stored resume point",
        cause=_error_text(error),
        fix="this is not a gap: check that the servers are reachable; the check runs again",
    )


class GapChecker:
    """Check a connector's partitions with pymongo's synchronous API.

    :param config: the connector configuration.
    :param details: how to reach the captured deployment (its shards are reached with the same
        credentials).
    :param policy: retries of the first contact (default: the connector's ``connect.*``).
    """

    def __init__(
        self,
        config: ConnectorConfig,
        details: MongoConnectionDetails,
        *,
        policy: BackoffPolicy | None = None,
        connector: str | None = None,
        shard_timeout_ms: int = SHARD_PROBE_TIMEOUT_MS,
    ):
        self.config = config
        self.details = details
        self.policy = policy or BackoffPolicy.from_config(config)
        self.connector = connector
        self.shard_timeout_ms = shard_timeout_ms

    def _shard_details(self, shard: ShardAddress) -> MongoConnectionDetails:
        details = self.details.for_replica_set(shard.replica_set, shard.hosts)
        return replace(
            details,
            server_selection_timeout_ms=self.shard_timeout_ms,
            connect_timeout_ms=min(details.connect_timeout_ms, self.shard_timeout_ms),
        )

    def check(
        self, states: Mapping[OffsetPartition, OffsetState], *, offsets_topic: str | None = None
    ) -> GapReport:
        """Check every partition of the connector in ``states`` (all of an offsets topic is fine)."""
        where = self.details.describe()
        notes: list[str] = []
        clients: dict[str, MongoClient] = {}
        try:
            main = connect(self.details, self.policy)
            clients[""] = main
            try:
                layout = read_layout(main, where)
                probes = plan_probes(layout, self.config, states, self.connector)
                spans = self._spans(layout, probes, main, clients, notes)
                checks = []
                for probe in probes:
                    stream = error_text = None
                    if probe.checks_stream:
                        if probe.stream_via == "":
                            raise TopologyError(
                                f"The offsets name replica set {probe.partition.rs!r}, which is not a "
                                f"shard of the cluster behind {where}",
                                fix="reset that partition's offset if the shard was removed",
                            )
                        client = (
                            main
                            if probe.stream_via is None
                            else self._shard(layout, probe.stream_via, clients, required=True)
                        )
                        stream, error_text = self._stream(client, probe, where)
                    checks.append(
                        assess(
                            probe, [spans[name] for name in probe.oplogs if name in spans], stream, error_text
                        )
                    )
            except ConnectionFailure as error:
                raise _unreachable(error, where) from None
        finally:
            for client in clients.values():
                client.close()
        return GapReport(
            self.connector or self.config.topic_prefix,
            tuple(checks),
            offsets_topic=offsets_topic or self.config.offsets_topic,
            notes=tuple(notes),
        )

    def _shard(
        self, layout: Layout, name: str, clients: dict[str, MongoClient], *, required: bool
    ) -> MongoClient | None:
        if name not in clients:
            shard = layout.shard(name)
            policy = (
                self.policy
                if required
                else BackoffPolicy(self.policy.initial_delay_ms, self.policy.max_delay_ms, 0)
            )
            try:
                clients[name] = connect(self._shard_details(shard), policy)
            except ConnectionFailedError:
                if required:
                    raise
                return None
        return clients[name]

    def _spans(
        self,
        layout: Layout,
        probes: list[Probe],
        main: MongoClient,
        clients: dict[str, MongoClient],
        notes: list[str],
    ) -> dict[str | None, OplogSpan]:
        needed = list(
            dict.fromkeys(name for probe in probes if probe.state is not None for name in probe.oplogs)
        )
        spans: dict[str | None, OplogSpan] = {}
        for name in needed:
            if name is None:
                spans[None] = read_oplog_span(main, layout.replica_set)
                continue
            client = self._shard(layout, name, clients, required=False)
            if client is None:
                notes.append(f"shard {name} is not reachable from here: for it only the stream check applies")
                spans[name] = OplogSpan(name, error="the shard is not reachable")
                continue
            try:
                spans[name] = read_oplog_span(client, name)
            except ConnectionFailure as error:
                notes.append(f"shard {name}: {_error_text(error)}; for it only the stream check applies")
                spans[name] = OplogSpan(name, error="the shard is not reachable")
        for span in spans.values():
            if span.error and span.error != "the shard is not reachable":
                notes.append(f"{span.replica_set}: {span.error}; only the stream check applies")
        return spans

    def _stream(self, client: MongoClient, probe: Probe, where: str) -> tuple[str, str | None]:
        try:
            with open_stream(
                client, self.config, probe.position, max_await_time_ms=STREAM_PROBE_AWAIT_MS
            ) as stream:
                stream.try_next()
        except OperationFailure as error:
            return _stream_failed(error, self.config, probe, where)
        return RESUMABLE, None


class AsyncGapChecker:
    """:class:`GapChecker` on pymongo's asyncio API (``AsyncMongoClient``), for triggers.

    The first contact is tried once (bounded by the server selection timeout); the trigger's next
    poll is the retry.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        details: MongoConnectionDetails,
        *,
        connector: str | None = None,
        shard_timeout_ms: int = SHARD_PROBE_TIMEOUT_MS,
    ):
        self.config = config
        self.details = details
        self.connector = connector
        self.shard_timeout_ms = shard_timeout_ms

    @staticmethod
    def _client(details: MongoConnectionDetails):
        from pymongo import AsyncMongoClient

        host, kwargs = details.client_arguments()
        return AsyncMongoClient(host, **kwargs)

    async def check(
        self, states: Mapping[OffsetPartition, OffsetState], *, offsets_topic: str | None = None
    ) -> GapReport:
        where = self.details.describe()
        notes: list[str] = []
        clients: dict[str, Any] = {}
        try:
            main = self._client(self.details)
            clients[""] = main
            try:
                layout = await read_layout_async(main, where)
                probes = plan_probes(layout, self.config, states, self.connector)
                spans = await self._spans(layout, probes, main, clients, notes)
                checks = []
                for probe in probes:
                    stream = error_text = None
                    if probe.checks_stream:
                        if probe.stream_via == "":
                            raise TopologyError(
                                f"The offsets name replica set {probe.partition.rs!r}, which is not a "
                                f"shard of the cluster behind {where}",
                                fix="reset that partition's offset if the shard was removed",
                            )
                        client = (
                            main
                            if probe.stream_via is None
                            else self._shard(layout, probe.stream_via, clients)
                        )
                        stream, error_text = await self._stream(client, probe, where)
                    checks.append(
                        assess(
                            probe, [spans[name] for name in probe.oplogs if name in spans], stream, error_text
                        )
                    )
            except ConnectionFailure as error:
                raise _unreachable(error, where) from None
        finally:
            for client in clients.values():
                await client.close()
        return GapReport(
            self.connector or self.config.topic_prefix,
            tuple(checks),
            offsets_topic=offsets_topic or self.config.offsets_topic,
            notes=tuple(notes),
        )

    def _shard(self, layout: Layout, name: str, clients: dict[str, Any]):
        if name not in clients:
            shard = layout.shard(name)
            details = self.details.for_replica_set(shard.replica_set, shard.hosts)
            details = replace(
                details,
                server_selection_timeout_ms=self.shard_timeout_ms,
                connect_timeout_ms=min(details.connect_timeout_ms, self.shard_timeout_ms),
            )
            clients[name] = self._client(details)
        return clients[name]

    async def _spans(
        self, layout: Layout, probes: list[Probe], main, clients: dict[str, Any], notes: list[str]
    ) -> dict[str | None, OplogSpan]:
        needed = list(
            dict.fromkeys(name for probe in probes if probe.state is not None for name in probe.oplogs)
        )
        spans: dict[str | None, OplogSpan] = {}
        for name in needed:
            if name is None:
                spans[None] = await read_oplog_span_async(main, layout.replica_set)
                continue
            try:
                spans[name] = await read_oplog_span_async(self._shard(layout, name, clients), name)
            except ConnectionFailure as error:
                notes.append(f"shard {name}: {_error_text(error)}; for it only the stream check applies")
                spans[name] = OplogSpan(name, error="the shard is not reachable")
        for span in spans.values():
            if span.error and span.error != "the shard is not reachable":
                notes.append(f"{span.replica_set}: {span.error}; only the stream check applies")
        return spans

    async def _stream(self, client, probe: Probe, where: str) -> tuple[str, str | None]:
        position = probe.position
        filters = Filters(self.config)
        options = filters.change_stream_options()
        options["max_await_time_ms"] = STREAM_PROBE_AWAIT_MS
        if position.resume_token is not None:
            options["start_after"] = dict(position.resume_token)
        else:
            options["start_at_operation_time"] = position.cluster_time
        try:
            stream = await watch_target(client, self.config).watch(
                filters.change_stream_pipeline(), **options
            )
            async with stream:
                await stream.try_next()
        except OperationFailure as error:
            return _stream_failed(error, self.config, probe, where)
        return RESUMABLE, None
