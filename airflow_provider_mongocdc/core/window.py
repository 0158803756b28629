"""Bounded change-stream windows: read from the stored offset up to the window end, commit the
events and the new offset together, exactly once.

A window belongs to one *stream*: the whole deployment (through mongos, or the replica set itself;
offset partition ``cluster`` or the replica set's name) or, with
``mongodb.connection.mode=replica_set`` on a sharded cluster, one shard's replica set (offset
partition named after it). :func:`plan_streams` lists a deployment's streams; each runs
:func:`run_window` (in a Spark task of its own, see ``spark_apps/stream_window.py``).

Starting point
    The committed offset of the stream's partition (:class:`~.offsets.OffsetStore`). No offset:
    :class:`OffsetError` telling to run the snapshot first. A snapshot in progress: an error (a
    window and a snapshot of one connector never run at the same time). ``snapshot.mode=
    initial_only`` with a completed snapshot: the window reads nothing and reports
    ``streaming disabled by snapshot.mode=initial_only``. A live snapshot lease of the connector
    (:mod:`.lease`) refuses the window with :class:`LeaseHeldError`.

The end
    ``window_end`` (the Airflow data interval's end, or now) becomes the cluster time
    ``Timestamp(<whole seconds of window_end>, 0)``. The window stops at the first change whose
    ``clusterTime`` is at or past it (that change is not emitted), or when the server's
    ``postBatchResumeToken`` (PBRT) has passed it and no change is left. Events of one MongoDB
    transaction share a cluster time's seconds (their oplog timestamps are reserved together), so
    a transaction is never cut by the end. After ``max_duration_s`` the window stops at the next
    point between transactions, stores its position and reports ``stop_reason=max_duration``
    (``reached_end`` false; the next window continues from there).

Idle servers and the idle timeout
    An idle MongoDB primary writes a no-op to its oplog every ``periodicNoopIntervalSecs`` (10 s
    by default, and at most 10 s), so the PBRT of a healthy replica set (and, through mongos, of
    a cluster) moves at least that often and a window whose end has passed reaches it within
    about 10 s even when nothing is written. ``idle_timeout_s`` (default 30 s) is how long the
    window waits for *any* progress (a change or a newer PBRT) before it concludes that the
    server's cluster time does not move; values below :data:`MIN_IDLE_TIMEOUT_S` (20 s, twice the
    longest no-op interval) are refused with a :class:`ConfigError`, since they would give up
    before the next no-op. When the window goes idle while its end lies in the past by the
    worker's clock, the interval cannot be completed: the window commits what it read (the
    offset stays at the last change or PBRT read, the window is not counted as finished) and
    fails with :class:`WindowEndNotReachedError` (``stop_reason=cluster_time_stalled``), a
    retryable error whose retry continues from the committed offset. It never reports success
    for a past interval it did not cover. (:func:`run_window` raises it; the Spark application
    raises it in the driver once every stream has committed, so the Airflow task fails with the
    message.) An idle stop with an end still in the future (only possible when calling
    :func:`run_window` directly; the operator's end is never in the future) stores the furthest
    position and reports ``stop_reason=idle_timeout``.

The stored position (what the next window resumes from)
    * end reached: ``cluster_time = end`` without a token (``startAtOperationTime``, inclusive).
      Every change before the end was emitted and none at or after it, so the next window starts
      exactly there. This is also what keeps quiet collections moving: the offset follows the
      cluster time even when nothing was captured. A PBRT *past* the end is never stored: it would
      be safe for the same filters (the server scanned everything up to it and found no captured
      change), but a change of a collection that a later configuration captures, made between the
      end and that PBRT, would be skipped. The end position never moves an offset backwards: a
      window whose end is not after the stored position (a re-run of an old data interval) reads
      nothing and keeps the offset.
    * otherwise (idle, max duration, intermediate batches): the token of the last change emitted,
      or the last PBRT seen when it is newer (all changes up to a PBRT have been read).
    * invalidate (collection- or database-scoped streams, after a drop, rename or dropDatabase of
      the target): the invalidate's resume token, used with ``startAfter`` by the next window
      (which then captures the recreated collection). MongoDB puts that token in the PBRT of the
      closing batch even when the ``$match`` stage filters the invalidate event out; the window
      reads the invalidate event itself (an invalidate-only stream from its last position), which
      works the same on servers that do not. An invalidate at or past the end stores the end.
      Whole-deployment streams are never invalidated; drops, renames and dropDatabase produce no
      event (see :mod:`.events`).

Exactly once
    One :class:`~.writer.TransactionalWriter` per stream with a stable ``transactional.id``
    (:func:`transactional_id`); creating it fences any older writer of the same stream (a killed
    run) and aborts its open transaction *before* the offset is read. Events and the new offset
    (:meth:`~.offsets.OffsetStore.offset_record`) are committed in one Kafka transaction every
    ``max.batch.size`` events, at least every ``commit_interval_s`` (60 s, Kafka Connect's
    ``offset.flush.interval.ms`` default, far below the producer's transaction timeout) and at the
    end, so a read_committed consumer sees a batch and its offset together or not at all, and a
    re-run continues from the last commit. A batch boundary never cuts a MongoDB transaction,
    with or without ``provide.transaction.metadata``: whether a change continues the transaction
    of the change read before it is decided from their ``(lsid, txnNumber)``
    (:func:`~.transactions.transaction_id`), and the batch grows (past ``max.batch.size`` if
    need be) until a change outside that transaction arrives or the stream has no change
    pending, so a transaction's events (with BEGIN and END when metadata is on) always share
    one Kafka transaction and no committed offset points inside a transaction. A
    ``max_duration`` stop waits for the same point; when the stream fails after a change of a
    transaction, the window rolls back to its last commit and reads the transaction again whole.

Faults
    pymongo resumes a change stream once by itself after a resumable error (network error,
    stepDown, "not primary"). When that fails too, the window keeps what it read (commits it when
    no MongoDB transaction is open, else rolls back to the last commit) and re-opens the stream
    from its last position, waiting per ``connect.backoff.*`` and giving up after
    ``connect.max.attempts`` failures in a row. A purged resume point (``ChangeStreamHistoryLost``
    286, ``CappedPositionLost`` 136, or "resume point may no longer be in the oplog") fails with
    :class:`ResumePointPurgedError`:
    its fix names the re-snapshot DAG ``mongocdc_resnapshot``; with ``snapshot.mode=when_needed``
    it says that a snapshot must run first, which the hourly DAG's snapshot task does before the
    next window (the window itself only reports it). A stored position MongoDB refuses as invalid
    (``InvalidResumeToken`` 260, ``ChangeStreamFatalError`` 280: a malformed token, or one of
    another deployment) is no purged oplog: it fails with :class:`OffsetError` naming the offset
    and how to inspect and repair it (``mongocdc offsets show|set|reset``), and nothing is
    re-snapshotted or reset. An oversize event fails with
    :class:`OversizeEventError` (nothing past the last commit is visible) or is skipped with a
    logged warning, per ``cursor.oversize.handling.mode`` (alias ``event.oversize.handling.mode``);
    with ``split`` the stream returns changes over 16 MB as whole events, reassembled from their
    ``$changeStreamSplitLargeEvent`` fragments (:class:`~.change_stream.SplitEventStream`), so a
    position is only ever taken at a whole event.

Sharded clusters
    Through mongos (the default) one stream covers every shard, merged by cluster time. Per-shard
    streams (``mongodb.connection.mode=replica_set``) are opened on each shard's replica set.
    Chunk migrations write their copies and deletions to the shards' oplogs with
    ``fromMigrate: true``; MongoDB's change streams leave such entries out (only the internal
    ``showMigrationEvents`` option shows them, and the connector never sets it), so per-shard
    streams see each application write once, on the shard that owned the document.

Heartbeats (``heartbeat.interval.ms`` > 0) are written every interval of *cluster time* seen by
the stream (changes and PBRTs), stamped with that cluster time, in the transaction of the batch
they accompany.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from airflow_provider_mongocdc.core.backoff import BackoffPolicy, format_duration_ms
from airflow_provider_mongocdc.core.change_stream import (
    HISTORY_LOST_CODES,
    is_history_lost,
    is_oversize_change,
    is_unusable_position,
    open_stream,
    oversize_change_error,
    token_cluster_time,
    unusable_position_error,
    watch_target,
)
from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.config_enums import ConnectionMode, OversizeMode, SnapshotMode
from airflow_provider_mongocdc.core.connection import MongoConnectionDetails, connect
from airflow_provider_mongocdc.core.errors import (
    ConfigError,
    ConnectionFailedError,
    MongoCdcError,
    OffsetError,
    ResumePointPurgedError,
    TopologyError,
)
from airflow_provider_mongocdc.core.events import OPERATION_CODES, EventBuilder, is_invalidate
from airflow_provider_mongocdc.core.incremental import (
    Chunk,
    ChunkReader,
    IncrementalProgress,
    IncrementalRequest,
    after_chunk,
    reconcile,
)
from airflow_provider_mongocdc.core.lease import SNAPSHOT, WINDOW, ConnectorLease, held_error
from airflow_provider_mongocdc.core.offsets import (
    SNAPSHOT_COMPLETED,
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    OffsetStore,
    Position,
)
from airflow_provider_mongocdc.core.schema import Record
from airflow_provider_mongocdc.core.snapshot import parse_namespaces, snapshot_collections
from airflow_provider_mongocdc.core.topology import SHARDED, discover
from airflow_provider_mongocdc.core.transactions import transaction_id as change_transaction_id
from airflow_provider_mongocdc.core.writer import TopicSpec, TransactionalWriter, ensure_topics

log = logging.getLogger(__name__)

RESNAPSHOT_DAG = "mongocdc_resnapshot"
DEFAULT_IDLE_TIMEOUT_S = 30.0
# MongoDB's periodicNoopIntervalSecs: an idle primary writes a no-op to its oplog this often (the
# default, and the largest value the server accepts), which moves the cluster time and the PBRT.
MONGODB_NOOP_INTERVAL_S = 10
# The shortest idle timeout accepted: twice the no-op interval, so a quiet but healthy server
# always shows progress before the window gives up.
MIN_IDLE_TIMEOUT_S = 2.0 * MONGODB_NOOP_INTERVAL_S
DEFAULT_MAX_DURATION_S = 3600.0
DEFAULT_POLL_MS = 1000
# Kafka Connect's offset.flush.interval.ms default: a batch is committed at least this often, so
# that no Kafka transaction stays open near the broker's transaction timeout.
DEFAULT_COMMIT_INTERVAL_S = 60.0

# Stop reasons reported in the summary.
END_REACHED = "end_reached"
ALREADY_PAST_END = "already_past_end"
IDLE_TIMEOUT = "idle_timeout"
CLUSTER_TIME_STALLED = "cluster_time_stalled"  # idle while the window end lies in the past
MAX_DURATION = "max_duration"
INVALIDATED = "invalidated"
INITIAL_ONLY = "initial_only"

# Errors after which a change stream can be re-opened from its last token (the change streams
# specification's resumable errors, for servers that do not label them).
_RESUMABLE_CODES = {
    6,
    7,
    43,
    63,
    89,
    91,
    133,
    150,
    189,
    234,
    262,
    9001,
    10107,
    11600,
    11602,
    13388,
    13435,
    13436,
}
LAG_SAMPLES = 10_000


# -- parameters --------------------------------------------------------------------------------------
def parse_time(value: Any) -> datetime:
    """An aware UTC datetime from an ISO-8601 text (``Z`` allowed), a datetime or a cluster time
    (its whole seconds)."""
    if isinstance(value, Timestamp):
        parsed = datetime.fromtimestamp(value.time, timezone.utc)
    elif isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = datetime.fromisoformat(str(value).strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"The window end {value!r} is not an ISO-8601 time",
                fix="pass window_end like 2024-05-01T10:00:00Z",
            ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def end_timestamp(window_end: datetime) -> Timestamp:
    """The cluster time a window ends at: the whole second of ``window_end``, increment 0 (every
    change has an increment of 1 or more, so none sits exactly on it)."""
    return Timestamp(int(math.floor(window_end.timestamp())), 0)


@dataclass(frozen=True)
class WindowParams:
    """How far and how long a window reads.

    ``window_end``: where it stops (see the module documentation); ``idle_timeout_s``: stop after
    this long without a change or PBRT progress (at least :data:`MIN_IDLE_TIMEOUT_S`; with the
    end in the past the window then fails, see the module documentation); ``max_duration_s``:
    stop (at the next point between transactions) after this long; ``poll_ms``: the server's
    wait for new changes per request (``max_await_time_ms``; ``cursor.max.await.time.ms`` when
    set); ``commit_interval_s``: commit the batch at least this often (at a point between
    transactions), even when it holds fewer than ``max.batch.size`` events.
    """

    window_end: datetime
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    poll_ms: int = DEFAULT_POLL_MS
    commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S
    # Whether the window works on a requested incremental snapshot after streaming (only when the
    # connector reads one stream: the chunks are de-duplicated against that stream).
    incremental_snapshots: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_end", parse_time(self.window_end))
        for name in ("idle_timeout_s", "max_duration_s", "commit_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(
                    f"The window parameter {name}={value!r} is invalid",
                    fix=f"give {name} as a number of seconds greater than 0",
                )
        if self.idle_timeout_s < MIN_IDLE_TIMEOUT_S:
            raise ConfigError(
                f"The window parameter idle_timeout_s={self.idle_timeout_s!r} is too short",
                cause="an idle MongoDB replica set moves its cluster time only by the no-op it writes to "
                f"its oplog every {MONGODB_NOOP_INTERVAL_S} s (periodicNoopIntervalSecs), so a window "
                "would give up before the cluster time passes an end that has already passed",
                fix=f"give idle_timeout_s (the operator's idle_timeout) at least {MIN_IDLE_TIMEOUT_S:g} s, "
                f"or leave the default ({DEFAULT_IDLE_TIMEOUT_S:g} s)",
            )
        if isinstance(self.poll_ms, bool) or not isinstance(self.poll_ms, int) or self.poll_ms <= 0:
            raise ConfigError(
                f"The window parameter poll_ms={self.poll_ms!r} is invalid",
                fix="give poll_ms as a whole number of milliseconds greater than 0",
            )

    @property
    def end(self) -> Timestamp:
        return end_timestamp(self.window_end)

    @classmethod
    def from_params(cls, params: Mapping[str, Any], config: ConnectorConfig | None = None) -> WindowParams:
        """From a job spec's ``params`` (``window_end`` required)."""
        if not params.get("window_end"):
            raise ConfigError(
                "The stream window has no end",
                cause="the job parameters lack window_end",
                fix="start the window through MongoStreamWindowOperator, or pass "
                "window_end as an ISO-8601 time",
            )
        poll = params.get("poll_ms")
        if poll is None:
            poll = (
                config.cursor_max_await_time_ms
                if config is not None and config.cursor_max_await_time_ms
                else DEFAULT_POLL_MS
            )
        return cls(
            window_end=parse_time(params["window_end"]),
            idle_timeout_s=float(params.get("idle_timeout_s") or DEFAULT_IDLE_TIMEOUT_S),
            max_duration_s=float(params.get("max_duration_s") or DEFAULT_MAX_DURATION_S),
            poll_ms=int(poll),
            commit_interval_s=float(params.get("commit_interval_s") or DEFAULT_COMMIT_INTERVAL_S),
            incremental_snapshots=bool(params.get("incremental_snapshots", True)),
        )

    def to_params(self) -> dict[str, Any]:
        return {
            "window_end": iso(self.window_end),
            "idle_timeout_s": self.idle_timeout_s,
            "max_duration_s": self.max_duration_s,
            "poll_ms": self.poll_ms,
            "commit_interval_s": self.commit_interval_s,
            "incremental_snapshots": self.incremental_snapshots,
        }


# -- streams -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StreamTarget:
    """One change stream of a window: its offset partition (``rs``), the ``source.rs`` its events
    carry, and how to connect (the fields of :class:`~.connection.MongoConnectionDetails`)."""

    partition: str
    replica_set: str
    mongo: Mapping[str, Any]

    def details(self) -> MongoConnectionDetails:
        return connection_details(self.mongo)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "replica_set": self.replica_set, "mongo": dict(self.mongo)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamTarget:
        return cls(data["partition"], data["replica_set"], dict(data["mongo"]))


def connection_details(mongo: Mapping[str, Any] | MongoConnectionDetails) -> MongoConnectionDetails:
    """Connection details from a job spec's ``mongo`` mapping
    (:meth:`~.connection.MongoConnectionDetails.to_dict`)."""
    if isinstance(mongo, MongoConnectionDetails):
        return mongo
    return MongoConnectionDetails.from_dict(mongo)


def plan_streams(
    details: MongoConnectionDetails, config: ConnectorConfig, *, policy: BackoffPolicy | None = None
) -> list[StreamTarget]:
    """The change streams of a window: one for the deployment, or one per shard replica set
    (``mongodb.connection.mode=replica_set`` on a sharded cluster)."""
    topology = discover(details, policy=policy or BackoffPolicy.from_config(config))
    if topology.kind == SHARDED and config.mongodb_connection_mode == ConnectionMode.REPLICA_SET:
        return [
            StreamTarget(rs.name, rs.name, details.for_replica_set(rs.name, rs.hosts).to_dict())
            for rs in topology.replica_sets
        ]
    if topology.kind == SHARDED and topology.via == "config_server":
        raise TopologyError(
            "The MongoDB connection points at the config server replica set of a sharded cluster",
            cause="with mongodb.connection.mode=sharded the change stream is opened through mongos; "
            "a change stream on the config servers shows no data changes",
            fix="connect to the mongos routers, or set mongodb.connection.mode=replica_set to read "
            "each shard's replica set",
        )
    (partition,) = topology.partitions(config.mongodb_connection_mode)
    return [StreamTarget(partition, partition, details.to_dict())]


def transactional_id(config: ConnectorConfig, partition: str) -> str:
    """The stable ``transactional.id`` of a stream's window writer."""
    return f"mongocdc-{config.topic_prefix}-window-{partition}"


def offset_partition(config: ConnectorConfig, partition: str) -> OffsetPartition:
    return OffsetPartition(config.topic_prefix, partition)


# -- where a window starts ---------------------------------------------------------------------------
def starting_position(
    state: OffsetState | None, config: ConnectorConfig, partition: OffsetPartition, topic: str
) -> Position | None:
    """Where the window of ``partition`` starts, or None when ``snapshot.mode=initial_only``
    disables streaming. Raises :class:`OffsetError` when it cannot start."""
    where = f"{partition.describe()} in the offsets topic {topic!r}"
    if state is not None and state.snapshot.status == SNAPSHOT_IN_PROGRESS:
        started = state.snapshot.started_at
        raise OffsetError(
            f"A snapshot of {partition.describe()} is in progress (snapshot "
            f"{state.snapshot.snapshot_id}{', started ' + iso(started) if started else ''}); the "
            "stream window did not start",
            cause="a window and a snapshot of the same connector never run at the same time: "
            "streaming starts from the position the snapshot hands over when it completes",
            fix="wait for the snapshot to complete, or, if it was interrupted, run the snapshot "
            "again (it skips its finished chunks); then run the window",
        )
    if (
        config.snapshot_mode == SnapshotMode.INITIAL_ONLY
        and state is not None
        and state.snapshot.status == SNAPSHOT_COMPLETED
    ):
        return None
    if state is None or state.position is None:
        raise OffsetError(
            f"No stored offset for {where}; the stream window did not start",
            cause="streaming continues from the position a snapshot records, and no snapshot "
            "has run for this connector and replica set (or its offset was reset)",
            fix="run the snapshot first: MongoSnapshotOperator, or the snapshot task of the "
            "hourly DAG, which runs before the window",
        )
    return state.position


def position_time(position: Position | None) -> Timestamp | None:
    if position is None:
        return None
    return position.cluster_time or token_cluster_time(position.resume_token)


def describe_position(position: Position | None) -> dict[str, Any] | None:
    """A position for summaries: Debezium's offset fields plus the cluster time as ISO text."""
    if position is None:
        return None
    data = position.to_json()
    cluster_time = position_time(position)
    if cluster_time is not None:
        data["time"] = iso(datetime.fromtimestamp(cluster_time.time, timezone.utc))
    return data


# -- errors ------------------------------------------------------------------------------------------
def _error_text(error: PyMongoError) -> str:
    if isinstance(error, OperationFailure) and error.details:
        text = str(error.details.get("errmsg") or error)
    else:
        text = str(error)
    return text.split(", full error:")[0]


def is_transient(error: BaseException) -> bool:
    """Whether the stream can be re-opened from its last token after this error."""
    if isinstance(error, ConnectionFailure):
        return True
    if isinstance(error, OperationFailure):
        if is_history_lost(error):
            return False
        if error.has_error_label("NonResumableChangeStreamError"):
            return False
        return error.has_error_label("ResumableChangeStreamError") or error.code in _RESUMABLE_CODES
    return False


def purged_error(
    config: ConnectorConfig, partition: OffsetPartition, position: Position | None, error: PyMongoError
) -> ResumePointPurgedError:
    code = getattr(error, "code", None)
    name = HISTORY_LOST_CODES.get(code, "error")
    where = describe_position(position)
    cause = (
        f"MongoDB answered {name}"
        + (f" ({code})" if code is not None else "")
        + f": {_error_text(error)}. The oplog no longer holds the position the last window "
        "stored; the changes in between are lost to streaming (the connector was stopped, or "
        "fell behind, for longer than the oplog window)"
    )
    if config.snapshot_mode == SnapshotMode.WHEN_NEEDED:
        fix = (
            "with snapshot.mode=when_needed a new snapshot must run first: the hourly DAG's "
            "snapshot task takes it before the next window (or run MongoSnapshotOperator); "
            "then streaming continues from the snapshot's position"
        )
    else:
        fix = (
            f"re-snapshot: trigger the DAG {RESNAPSHOT_DAG} (it resets the offset of this "
            "replica set and takes a new snapshot); to keep it from happening again, enlarge "
            "the oplog (replSetResizeOplog) or run windows more often than the oplog window"
        )
    return ResumePointPurgedError(
        f"The stored resume point of {partition.describe()} "
        f"({where.get('time') if where else 'unknown'}) is no longer in the oplog; no offset was changed",
        cause=cause,
        fix=fix,
    )


class WindowEndNotReachedError(MongoCdcError):
    """A window went idle before its end although the end lies in the past: the server's cluster
    time did not move for ``idle_timeout_s``. What was read is committed; the task fails so that
    Airflow retries it (the retry continues from the committed offset)."""


def end_not_reached_error(
    summary: Mapping[str, Any], params: WindowParams
) -> WindowEndNotReachedError | None:
    """The error of a window (a stream's summary, or the merged summary of all streams) whose
    streams stalled before a window end in the past, or None when none did."""
    partitions = summary.get("partitions") or [summary]
    stalled = [item for item in partitions if item.get("stop_reason") == CLUSTER_TIME_STALLED]
    if not stalled:
        return None
    where = "; ".join(
        f"stream {item['partition']} stayed at cluster time "
        f"{(item.get('end_position') or {}).get('time', 'unknown')} "
        f"after {item.get('events', 0)} events, read and committed"
        for item in stalled
    )
    return WindowEndNotReachedError(
        f"The stream window did not reach the window end {iso(params.window_end)}, which lies in the "
        f"past: MongoDB's cluster time did not move for {params.idle_timeout_s:g} s (idle_timeout_s) "
        f"before the end: {where}; the interval is not complete",
        cause=f"an idle MongoDB replica set writes a periodic no-op to its oplog every "
        f"{MONGODB_NOOP_INTERVAL_S} s (periodicNoopIntervalSecs), so its cluster time should have "
        "passed the end: the replica set has no primary taking writes or is stalled, its periodic "
        "no-op writer is off, or its clock runs behind the clock of this worker",
        fix="check the replica set (rs.status(): a primary and recent optimes) and that the MongoDB "
        "servers and the Airflow and Spark workers agree on the time (NTP); the task's retry (or the "
        "next run) continues from the committed offset",
    )


# -- statistics --------------------------------------------------------------------------------------
@dataclass
class WindowStats:
    """What a window emitted (committed batches only once merged)."""

    events: int = 0
    events_by_op: dict[str, int] = field(default_factory=dict)
    events_by_collection: dict[str, int] = field(default_factory=dict)
    tombstones: int = 0
    transactions: int = 0
    heartbeats: int = 0
    skipped_oversize: int = 0
    bytes: int = 0
    lags_ms: list[int] = field(default_factory=list)
    lag_count: int = 0
    lag_max_ms: int | None = None

    def add_lag(self, lag_ms: int, rng: random.Random) -> None:
        self.lag_count += 1
        self.lag_max_ms = lag_ms if self.lag_max_ms is None else max(self.lag_max_ms, lag_ms)
        if len(self.lags_ms) < LAG_SAMPLES:
            self.lags_ms.append(lag_ms)
        else:  # reservoir sampling keeps a uniform sample of every lag seen
            slot = rng.randrange(self.lag_count)
            if slot < LAG_SAMPLES:
                self.lags_ms[slot] = lag_ms

    def merge(self, other: WindowStats, rng: random.Random) -> None:
        self.events += other.events
        for target, source in (
            (self.events_by_op, other.events_by_op),
            (self.events_by_collection, other.events_by_collection),
        ):
            for key, count in source.items():
                target[key] = target.get(key, 0) + count
        self.tombstones += other.tombstones
        self.transactions += other.transactions
        self.heartbeats += other.heartbeats
        self.skipped_oversize += other.skipped_oversize
        self.bytes += other.bytes
        for lag in other.lags_ms:
            self.add_lag(lag, rng)
        if other.lag_max_ms is not None:
            self.lag_max_ms = max(self.lag_max_ms or 0, other.lag_max_ms)
        self.lag_count += max(0, other.lag_count - len(other.lags_ms))


def percentiles(samples: list[int], maximum: int | None) -> dict[str, int | None]:
    """``{"p50", "p95", "max"}`` (nearest-rank) of lag samples in milliseconds."""
    if not samples:
        return {"p50": None, "p95": None, "max": maximum}
    ordered = sorted(samples)

    def rank(p: float) -> int:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return {"p50": rank(0.50), "p95": rank(0.95), "max": maximum if maximum is not None else ordered[-1]}


# -- the window --------------------------------------------------------------------------------------
class _Stop(Exception):
    """Internal: the read loop ends with a reason."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StreamWindow:
    """The bounded window of one stream.

    ``client`` reads the stream (a client of the stream's deployment or shard); ``writer`` is the
    stream's transactional writer, created before the offset is read; ``store`` the offsets topic.
    Call :meth:`run` once; it returns the stream's summary.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        client: MongoClient,
        writer: TransactionalWriter,
        store: OffsetStore,
        partition: str,
        params: WindowParams,
        *,
        replica_set: str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        policy: BackoffPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock_ms: Callable[[], int] | None = None,
    ):
        self.config = config
        self.client = client
        self.writer = writer
        self.store = store
        self.partition = offset_partition(config, partition)
        self.replica_set = replica_set or partition
        self.params = params
        self.end = params.end
        self.kafka_config = dict(kafka_config or store.kafka_config)
        self.policy = policy or BackoffPolicy.from_config(config)
        self._sleep = sleep
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._rng = random.Random(0)
        self._known_topics: set[str] = set()
        self._new_builder()
        # committed state
        self.state: OffsetState | None = None
        self.start: Position | None = None
        self.committed_position: Position | None = None
        self.totals = WindowStats()
        self.batches_committed = 0
        self.reconnects = 0
        # the batch being built (an open Kafka transaction once something was sent)
        self.pending = WindowStats()
        self.pending_changes = 0
        self._batch_started: float | None = None
        self.position: Position | None = None  # the furthest position read
        # The transaction id (lsid, txnNumber) of the last change read, None when it was outside
        # a transaction: the next change continues that transaction when it has the same id.
        self._last_transaction: str | None = None
        self._invalidate_position: Position | None = None
        # Changes at or past ``end`` stop the stream; a PBRT at or past ``_pbrt_end`` too (the
        # same point, except while streaming up to an incremental chunk's high watermark).
        self._pbrt_end = self.end
        self._request: IncrementalRequest | None = None
        self._chunk: Chunk | None = None  # the incremental snapshot chunk awaiting its watermark
        self._incremental: dict[str, Any] | None = None  # the summary's incremental_snapshot
        # Wall seconds by phase (summary "phases_s"): setup (offsets topic, lease, offset read),
        # build (events), send (to the producer), commit (END, offset, commit), read (the rest of
        # the stream loop: waiting for and decoding changes).
        self._phases = {"setup": 0.0, "read": 0.0, "build": 0.0, "send": 0.0, "commit": 0.0}

    # -- setup --
    def _new_builder(self) -> None:
        self.builder = EventBuilder(self.config, replica_set=self.replica_set, clock=self._clock_ms)
        self.tracker = self.builder.transactions
        self._transaction_topic = self.tracker.topic if self.tracker is not None else None

    # -- public --
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.store.ensure_topic()
        self._known_topics.add(self.store.topic)
        self._check_lease()
        contents = self.store.read_everything()
        self.state = contents.states.get(self.partition)
        request = contents.requests.get((self.partition.connector, self.partition.server_id))
        self._request = IncrementalRequest.from_json(request) if request else None
        self.start = starting_position(self.state, self.config, self.partition, self.store.topic)
        if self.start is None:
            log.info(
                "Window of %s: streaming disabled by snapshot.mode=initial_only", self.partition.describe()
            )
            return self._summary(INITIAL_ONLY, started)
        self.committed_position = self.position = self.start
        start_time = position_time(self.start)
        if start_time is not None and start_time >= self.end:
            # The window ends where (or before) the stored offset stands: nothing to read, and the
            # offset must not move back.
            log.info(
                "Window of %s: the stored position (%s) is not before the window end %s; nothing to read",
                self.partition.describe(),
                self.start.describe(),
                iso(self.params.window_end),
            )
            return self._summary(ALREADY_PAST_END, started)
        log.info(
            "Window of %s from %s to %s",
            self.partition.describe(),
            self.start.describe(),
            iso(self.params.window_end),
        )
        phases = self._phases
        phases["setup"] = time.monotonic() - started
        try:
            streaming = time.monotonic()
            commit_before = phases["commit"]
            reason, final = self._stream()
            phases["read"] = (
                time.monotonic()
                - streaming
                - phases["build"]
                - phases["send"]
                - (phases["commit"] - commit_before)
            )
            # A stalled window commits what it read but is not a finished window.
            self._commit(final, last=reason != CLUSTER_TIME_STALLED)
            if reason == END_REACHED:
                self._incremental_snapshot(started)
        except BaseException:
            try:
                self._abort()
            except MongoCdcError as error:  # the window's own error is the one to report
                log.warning(
                    "Window of %s: could not abort the open Kafka transaction (%s); it is "
                    "aborted when the next run's writer starts",
                    self.partition.describe(),
                    error,
                )
            raise
        return self._summary(reason, started)

    def _check_lease(self) -> None:
        """Refuse to run while a snapshot of the connector holds its lease (see :mod:`.lease`)."""
        lease = ConnectorLease(self.kafka_config, self.config.topic_prefix, self.store.topic).current()
        if lease is not None and lease.live() and lease.kind == SNAPSHOT:
            raise held_error(self.config.topic_prefix, lease, WINDOW, f"stream window of {self.partition.rs}")

    # -- reading --
    def _stream(self) -> tuple[str, Position]:
        """Read until a stop; returns the reason and the position to store."""
        deadline = time.monotonic() + self.params.max_duration_s
        failures = 0
        while True:
            progressed = [False]
            try:
                with open_stream(
                    self.client, self.config, self.position, max_await_time_ms=self.params.poll_ms
                ) as stream:
                    self._read(stream, deadline, progressed)
            except _Stop as stop:
                return stop.reason, self._final_position(stop.reason)
            except PyMongoError as error:
                if is_history_lost(error):
                    raise purged_error(self.config, self.partition, self.position, error) from None
                if is_unusable_position(error):
                    raise unusable_position_error(
                        self.config, self.partition, self.committed_position or self.start, error
                    ) from None
                if is_oversize_change(error):
                    raise oversize_change_error(self.config, self.partition, error) from None
                if not is_transient(error):
                    raise MongoCdcError(
                        f"The change stream of {self.partition.describe()} failed; the window "
                        "stopped and nothing past the last commit is visible",
                        cause=_error_text(error),
                        fix="check the MongoDB user's roles (changeStream and find on the captured "
                        "databases) and the server's logs, then re-run; the window continues "
                        "from the last committed offset",
                    ) from None
                failures = 0 if progressed[0] else failures
                failures += 1
                if failures > self.policy.max_attempts:
                    raise ConnectionFailedError(
                        f"The change stream of {self.partition.describe()} failed {failures} times "
                        "in a row; the window stopped",
                        cause=_error_text(error),
                        fix="check that the MongoDB servers run and a primary is elected; the next "
                        "run continues from the last committed offset "
                        f"({(self.committed_position or self.start).describe()})",
                    ) from None
                delay = self.policy.delay_ms(failures)
                self.reconnects += 1
                self._recover()
                log.warning(
                    "Change stream of %s interrupted (%s); re-opening from %s in %s (attempt %d of %d)",
                    self.partition.describe(),
                    _error_text(error),
                    self.position.describe(),
                    format_duration_ms(delay),
                    failures,
                    self.policy.max_attempts,
                )
                self._sleep(delay / 1000.0)

    def _read(self, stream, deadline: float, progressed: list[bool]) -> None:
        max_batch = self.config.max_batch_size
        event_format = self.config.event_format
        idle_since = time.monotonic()
        while True:
            change = stream.try_next()
            now = time.monotonic()
            if change is None:
                if not stream.alive:
                    self._invalidated(self._invalidate_token(stream.resume_token))
                token = stream.resume_token
                cluster_time = token_cluster_time(token)
                if cluster_time is not None and cluster_time >= self._pbrt_end:
                    raise _Stop(END_REACHED)
                if (
                    token is not None
                    and cluster_time is not None
                    and dict(token) != dict(self.position.resume_token or {})
                ):
                    # A newer PBRT: every change up to it has been read.
                    self.position = Position(dict(token), cluster_time)
                    self._heartbeat(cluster_time)
                    idle_since = now
                    progressed[0] = True
                if now >= deadline:
                    raise _Stop(MAX_DURATION)
                if now - idle_since >= self.params.idle_timeout_s:
                    raise _Stop(CLUSTER_TIME_STALLED if self._end_passed() else IDLE_TIMEOUT)
                if self._batch_due(now):  # no change pending: any transaction read is complete
                    self._commit(self.position, last=False)
                continue
            if is_invalidate(change):
                self._invalidated(change.get("_id"))
            cluster_time = change.get("clusterTime")
            if cluster_time is not None and cluster_time >= self.end:
                raise _Stop(END_REACHED)
            # Decided from (lsid, txnNumber), with or without transaction metadata: a commit or a
            # stop between two changes of one MongoDB transaction would cut it.
            transaction = change_transaction_id(change, event_format)
            between_transactions = transaction is None or transaction != self._last_transaction
            if between_transactions:
                if now >= deadline:
                    raise _Stop(MAX_DURATION)
                if self.pending_changes >= max_batch or self._batch_due(now):
                    self._commit(self.position, last=False)
            if self._chunk is not None:
                self._dedupe(change)
            self._emit(change, cluster_time)
            self.position = Position(dict(change["_id"]), cluster_time or position_time(self.position))
            self._last_transaction = transaction
            idle_since = now
            progressed[0] = True
            if not stream.alive:
                self._invalidated(self._invalidate_token(stream.resume_token))

    def _end_passed(self) -> bool:
        """Whether the window end lies in the past by this worker's clock."""
        return self._clock_ms() >= self.params.window_end.timestamp() * 1000

    def _batch_due(self, now: float) -> bool:
        return self._batch_started is not None and now - self._batch_started >= self.params.commit_interval_s

    def _invalidate_token(self, reported: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The resume token of the invalidate that closed the stream.

        MongoDB reports it as the closing batch's PBRT even when ``$match`` filtered the
        invalidate out; servers without PBRTs (and some test servers) keep the last event's token
        instead, which would make every later window stop at the same invalidate. So the
        invalidate is read itself, with an invalidate-only stream from the last position read.
        """
        options: dict[str, Any] = {"max_await_time_ms": self.params.poll_ms}
        if self.position.resume_token is not None:
            options["start_after"] = dict(self.position.resume_token)
        else:
            options["start_at_operation_time"] = self.position.cluster_time
        try:
            with watch_target(self.client, self.config).watch(
                [{"$match": {"operationType": "invalidate"}}], **options
            ) as stream:
                for _ in range(3):
                    change = stream.try_next()
                    if change is not None and is_invalidate(change):
                        return change["_id"]
                    if not stream.alive:
                        break
        except PyMongoError as error:
            log.warning(
                "Window of %s: could not read the invalidate event (%s); using the server's resume token",
                self.partition.describe(),
                _error_text(error),
            )
        return reported

    def _invalidated(self, token: Mapping[str, Any] | None) -> None:
        cluster_time = token_cluster_time(token)
        if token is not None and cluster_time is not None and cluster_time < self.end:
            self.position = Position(dict(token), cluster_time)
            self._invalidate_position = self.position
        raise _Stop(INVALIDATED)

    def _final_position(self, reason: str) -> Position:
        if reason == END_REACHED:
            return Position(cluster_time=self.end)
        if reason == INVALIDATED and self._invalidate_position is None:
            # The invalidate lies at or past the end: everything before the end was read.
            return Position(cluster_time=self.end)
        return self.position

    # -- emitting --
    def _emit(self, change: Mapping[str, Any], cluster_time: Timestamp | None) -> None:
        began = time.monotonic()
        records = self.builder.build_change(change)
        built = time.monotonic()
        self._phases["build"] += built - began
        self.pending_changes += 1
        stats = self.pending
        if cluster_time is not None:
            self._heartbeat(cluster_time)
            stats.add_lag(max(0, self._clock_ms() - cluster_time.time * 1000), self._rng)
        operation = change.get("operationType")
        namespace = change.get("ns") or {}
        data_topic = None
        if operation in OPERATION_CODES and namespace.get("coll") is not None:
            data_topic = self.builder.topic_for(namespace["db"], namespace["coll"])
        emitted = False
        for record in records:
            if record.topic == data_topic:
                if record.value is None:
                    stats.tombstones += 1
                else:
                    emitted = True
                    stats.events += 1
                    op = OPERATION_CODES[operation]
                    stats.events_by_op[op] = stats.events_by_op.get(op, 0) + 1
                    collection = f"{namespace['db']}.{namespace['coll']}"
                    stats.events_by_collection[collection] = stats.events_by_collection.get(collection, 0) + 1
            elif (
                record.topic == self._transaction_topic
                and record.value is not None
                and b'"status":"BEGIN"' in record.value
            ):
                stats.transactions += 1
        if (
            not emitted
            and data_topic is not None
            and self.config.event_oversize_handling_mode == OversizeMode.SKIP
            and OPERATION_CODES[operation] not in self.config.skipped_operations
            and self.builder.filters.collection_included(namespace["db"], namespace["coll"])
        ):
            stats.skipped_oversize += 1
        sending = time.monotonic()
        self._send(records)
        self._phases["send"] += time.monotonic() - sending

    def _heartbeat(self, cluster_time: Timestamp) -> None:
        heartbeat = self.builder.heartbeat
        if not heartbeat.enabled:
            return
        record = heartbeat.maybe(cluster_time.time * 1000)
        if record is not None:
            self.pending.heartbeats += 1
            self._send([record])

    def _send(self, records: Iterable[Record]) -> None:
        records = list(records)
        if not records:
            return
        self._ensure_topics(records)
        if not self.writer.in_transaction:
            self.writer.begin()
            self._batch_started = time.monotonic()
        self.writer.send(records)

    def _ensure_topics(self, records: list[Record]) -> None:
        missing = sorted({record.topic for record in records} - self._known_topics)
        if missing:
            ensure_topics(self.kafka_config, [TopicSpec(name) for name in missing])
            self._known_topics.update(missing)

    # -- committing --
    def _commit(
        self,
        position: Position | None,
        *,
        last: bool,
        records: Iterable[Record] = (),
        incremental: IncrementalProgress | None = None,
    ) -> None:
        """Commit the batch with the offset at ``position`` (END of an open transaction first);
        ``records`` (an incremental snapshot chunk's read events) go after the streamed ones, and
        ``incremental`` is the snapshot progress they bring."""
        began = time.monotonic()
        self._send(self.builder.finish())
        self._send(records)
        if last and self.builder.heartbeat.enabled:
            end_ms = (position_time(position) or self.end).time * 1000
            record = self.builder.heartbeat.maybe(end_ms)
            if record is not None:
                self.pending.heartbeats += 1
                self._send([record])
        events = self.pending.events
        base = self.state or OffsetState()
        if last:
            new_state = base.after_window(position, self.params.window_end, events)
        else:
            new_state = dataclasses.replace(
                base, position=position or base.position, events=base.events + events
            )
        if incremental is not None:
            new_state = dataclasses.replace(new_state, incremental=incremental.to_json())
        if not self.writer.in_transaction:
            self.writer.begin()
        stats = self.writer.commit([self.store.offset_record(self.partition, new_state)])
        self.pending.bytes = stats.bytes
        self.state = new_state
        self.committed_position = new_state.position
        self.totals.merge(self.pending, self._rng)
        self.pending = WindowStats()
        self.pending_changes = 0
        self._batch_started = None
        self.batches_committed += 1
        self._phases["commit"] += time.monotonic() - began

    def _recover(self) -> None:
        """After a stream failure: keep what was read when the last change read was outside a
        MongoDB transaction (commit it), else roll back to the last commit so that the transaction
        is read again whole (whether more of its changes follow is unknown)."""
        if self._last_transaction is None:
            if self.pending_changes or self.writer.in_transaction:
                self._commit(self.position, last=False)
            return
        log.info(
            "Window of %s: the stream failed inside MongoDB transaction %s; rolling back to the "
            "last commit (%s) to read it again whole",
            self.partition.describe(),
            self._last_transaction,
            (self.committed_position or self.start).describe(),
        )
        self._abort()
        self.pending = WindowStats()
        self.pending_changes = 0
        self.position = self.committed_position
        self._last_transaction = None  # commits happen between transactions only
        self._new_builder()

    def _abort(self) -> None:
        """Abort the open Kafka transaction (the writer delivers its records first)."""
        self.writer.abort()
        self._batch_started = None

    # -- incremental snapshot (core/incremental.py; the algorithm: docs/design.md) --
    def _incremental_snapshot(self, started: float) -> None:
        """After streaming to the end: copy the next chunks of a requested incremental snapshot,
        each committed with its progress, within the window's budget."""
        stored = IncrementalProgress.from_json(self.state.incremental if self.state else None)
        request = self._request
        if not self.params.incremental_snapshots:
            if (request is not None and not request.stop) or (stored is not None and stored.running):
                log.warning(
                    "Window of %s: the incremental snapshot waits: it needs a connector that reads one "
                    "change stream (mongodb.connection.mode=sharded on a sharded cluster)",
                    self.partition.describe(),
                )
            return
        progress = reconcile(stored, request, self._resolve_collections)
        if progress is None:
            return
        if progress != stored:  # started, or stopped on request: stored before any chunk
            self._commit(self.committed_position, last=False, incremental=progress)
        config = self.config
        budget_s = config.incremental_snapshot_window_budget_ms / 1000.0
        began = time.monotonic()
        deadline = min(began + budget_s, started + self.params.max_duration_s)
        max_documents = config.incremental_snapshot_window_max_documents
        summary = {"id": progress.request_id, "chunks": 0, "documents": 0, "dropped": 0}
        reader = ChunkReader(self.client, config) if progress.running else None
        read = 0
        # The first chunk starts at the budget's start; each next one only while the budget lasts.
        while progress.running and budget_s > 0 and (not max_documents or read < max_documents):
            if summary["chunks"] and time.monotonic() >= deadline:
                break
            size = config.incremental_snapshot_chunk_size
            if max_documents:
                size = min(size, max_documents - read)
            low = self.committed_position.cluster_time
            try:
                moved, chunk = reader.next_chunk(progress, low, size)
            except ConnectionFailedError as error:
                log.warning(
                    "Window of %s: %s; the next window tries again (streaming is not affected)",
                    self.partition.describe(),
                    error,
                )
                summary["error"] = str(error)
                break
            if chunk is None:
                self._commit(self.committed_position, last=False, incremental=moved)
                progress = moved
                break
            read += len(chunk.rows)
            reason, final = self._stream_to(chunk)
            if reason != END_REACHED:  # the chunk is read again by the next window
                self._commit(final, last=False)
                log.warning(
                    "Window of %s: the stream did not reach the high watermark of the incremental "
                    "snapshot chunk of %s (%s); the next window reads it again",
                    self.partition.describe(),
                    chunk.namespace,
                    reason,
                )
                break
            records = self._chunk_records(chunk, final)
            progress = after_chunk(moved, chunk, len(chunk.rows))
            self._commit(final, last=False, records=records, incremental=progress)
            summary["chunks"] += 1
            summary["documents"] += len(chunk.rows)
            summary["dropped"] += chunk.dropped
        summary.update(
            status=progress.status,
            current=progress.current,
            pending=list(progress.pending),
            done=list(progress.done),
            total_documents=progress.documents,
            duration_s=round(time.monotonic() - began, 3),
            message=progress.message,
        )
        self._incremental = summary
        log.info("Window of %s: %s", self.partition.describe(), progress.describe())

    def _resolve_collections(self, names: list[str]) -> list[str]:
        found = snapshot_collections(self.client, self.config, parse_namespaces(names) if names else None)
        return [f"{database}.{collection}" for database, collection in found]

    def _stream_to(self, chunk: Chunk) -> tuple[str, Position]:
        """Stream up to the chunk's high watermark, dropping the rows the stream changes."""
        high = chunk.high_watermark
        self.end, self._pbrt_end, self._chunk = Timestamp(high.time, high.inc + 1), high, chunk
        self._last_transaction = None
        try:
            return self._stream()
        finally:
            self._chunk = None

    def _dedupe(self, change: Mapping[str, Any]) -> None:
        """A streamed change of a chunk's collection supersedes its row (DBLog's de-duplication)."""
        chunk = self._chunk
        namespace = change.get("ns") or {}
        database, _, collection = chunk.namespace.partition(".")
        target = change.get("to") or {}
        if target.get("db") == database and target.get("coll") == collection:
            chunk.clear()  # a rename replaced the collection
        elif namespace.get("db") != database:
            return
        elif namespace.get("coll") == collection:
            key = change.get("documentKey")
            if key is not None and "_id" in key:
                chunk.drop(key["_id"])
            elif change.get("operationType") in ("drop", "rename"):
                chunk.clear()
        elif namespace.get("coll") is None and change.get("operationType") == "dropDatabase":
            chunk.clear()

    def _chunk_records(self, chunk: Chunk, position: Position) -> list[Record]:
        """The chunk's remaining rows as read events at the stream position they follow."""
        database, _, collection = chunk.namespace.partition(".")
        at = position_time(self.position) or chunk.high_watermark
        records: list[Record] = []
        stats = self.pending
        for document in chunk.rows.values():
            built = self.builder.build_snapshot(document, database, collection, position=at, incremental=True)
            if not built:
                stats.skipped_oversize += 1
                continue
            records.extend(built)
            stats.events += 1
            stats.events_by_op["r"] = stats.events_by_op.get("r", 0) + 1
            stats.events_by_collection[chunk.namespace] = (
                stats.events_by_collection.get(chunk.namespace, 0) + 1
            )
        return records

    # -- summary --
    def _summary(self, reason: str, started: float) -> dict[str, Any]:
        totals = self.totals
        return {
            "partition": self.partition.rs,
            "replica_set": self.replica_set,
            "stop_reason": reason,
            "reached_end": reason in (END_REACHED, ALREADY_PAST_END)
            or (reason == INVALIDATED and self._invalidate_position is None),
            "window_end": iso(self.params.window_end),
            "start_position": describe_position(self.start),
            "end_position": describe_position(self.committed_position or self.start),
            "events": totals.events,
            "events_by_op": dict(totals.events_by_op),
            "events_by_collection": dict(totals.events_by_collection),
            "tombstones": totals.tombstones,
            "transactions": totals.transactions,
            "heartbeats": totals.heartbeats,
            "skipped_oversize": totals.skipped_oversize,
            "bytes": totals.bytes,
            "batches_committed": self.batches_committed,
            "reconnects": self.reconnects,
            "lag_ms": percentiles(totals.lags_ms, totals.lag_max_ms),
            "lag_samples": list(totals.lags_ms),
            "lag_count": totals.lag_count,
            "duration_s": round(time.monotonic() - started, 3),
            "phases_s": {name: round(value, 3) for name, value in self._phases.items()},
            "incremental_snapshot": self._incremental,
        }


# -- running a stream --------------------------------------------------------------------------------
def run_window(
    target: StreamTarget,
    config: ConnectorConfig,
    kafka_config: Mapping[str, Any],
    params: WindowParams,
    *,
    sleep: Callable[[float], None] = time.sleep,
    check_end: bool = True,
) -> dict[str, Any]:
    """Run the window of one stream: fence older writers, read the offset, stream, commit.

    Raises :class:`WindowEndNotReachedError` (after committing what was read) when the stream
    stalled before an end in the past; with ``check_end=False`` the summary reports it instead
    (``stop_reason=cluster_time_stalled``) and the caller raises :func:`end_not_reached_error`.
    """
    policy = BackoffPolicy.from_config(config)
    store = OffsetStore(kafka_config, config.offsets_topic)
    with TransactionalWriter(kafka_config, transactional_id(config, target.partition)) as writer:
        client = connect(target.details(), policy, require_primary=True, sleep=sleep)
        try:
            window = StreamWindow(
                config,
                client,
                writer,
                store,
                target.partition,
                params,
                replica_set=target.replica_set,
                kafka_config=kafka_config,
                policy=policy,
                sleep=sleep,
            )
            summary = window.run()
        finally:
            client.close()
    error = end_not_reached_error(summary, params) if check_end else None
    if error is not None:
        raise error
    return summary


def run_stream_tasks(
    targets: Iterable[Mapping[str, Any]],
    *,
    connector: Mapping[str, Any],
    kafka: Mapping[str, Any],
    params: Mapping[str, Any],
) -> Iterator[dict[str, Any]]:
    """A Spark task's work: the windows of its streams (JSON-able targets), one summary each. A
    stalled stream is reported in its summary; the driver raises :func:`end_not_reached_error`
    once every stream has committed."""
    config = ConnectorConfig.from_properties(connector)
    window_params = WindowParams.from_params(params, config)
    for target in targets:
        yield run_window(StreamTarget.from_json(target), config, kafka, window_params, check_end=False)


def check_offsets(
    config: ConnectorConfig, kafka_config: Mapping[str, Any], targets: Iterable[StreamTarget]
) -> dict[str, Position | None]:
    """Check, before any task starts, that every stream can start (same rules as the window)."""
    store = OffsetStore(kafka_config, config.offsets_topic)
    states = store.read_all()
    result: dict[str, Position | None] = {}
    for target in targets:
        partition = offset_partition(config, target.partition)
        result[target.partition] = starting_position(states.get(partition), config, partition, store.topic)
    return result


def empty_summary(partition: str, params: WindowParams, reason: str = INITIAL_ONLY) -> dict[str, Any]:
    """The summary of a stream that read nothing (e.g. streaming disabled by initial_only)."""
    return {
        "partition": partition,
        "replica_set": partition,
        "stop_reason": reason,
        "reached_end": reason != INITIAL_ONLY,
        "window_end": iso(params.window_end),
        "start_position": None,
        "end_position": None,
        "events": 0,
        "events_by_op": {},
        "events_by_collection": {},
        "tombstones": 0,
        "transactions": 0,
        "heartbeats": 0,
        "skipped_oversize": 0,
        "bytes": 0,
        "batches_committed": 0,
        "reconnects": 0,
        "lag_ms": {"p50": None, "p95": None, "max": None},
        "duration_s": 0.0,
    }


def merge_summaries(
    summaries: list[dict[str, Any]], window_end: datetime, duration_s: float | None = None
) -> dict[str, Any]:
    """The window's summary over all of its streams."""
    rng = random.Random(0)
    totals = WindowStats()
    partitions = []
    for summary in sorted(summaries, key=lambda item: item["partition"]):
        stats = WindowStats(
            events=summary["events"],
            events_by_op=summary["events_by_op"],
            events_by_collection=summary["events_by_collection"],
            tombstones=summary["tombstones"],
            transactions=summary["transactions"],
            heartbeats=summary["heartbeats"],
            skipped_oversize=summary["skipped_oversize"],
            bytes=summary["bytes"],
            lags_ms=list(summary.get("lag_samples") or []),
            lag_count=summary.get("lag_count", 0),
            lag_max_ms=summary["lag_ms"].get("max"),
        )
        totals.merge(stats, rng)
        partitions.append(
            {key: value for key, value in summary.items() if key not in ("lag_samples", "lag_count")}
        )
    skipped = bool(partitions) and all(item["stop_reason"] == INITIAL_ONLY for item in partitions)
    incremental = next(
        (item["incremental_snapshot"] for item in partitions if item.get("incremental_snapshot")), None
    )
    return {
        "status": "skipped" if skipped else "completed",
        "message": (
            "streaming disabled by snapshot.mode=initial_only: the snapshot completed and "
            "no change stream is read"
        )
        if skipped
        else None,
        "window_end": iso(window_end),
        "reached_end": all(item["reached_end"] for item in partitions),
        "events": totals.events,
        "events_by_op": dict(sorted(totals.events_by_op.items())),
        "events_by_collection": dict(sorted(totals.events_by_collection.items())),
        "tombstones": totals.tombstones,
        "transactions": totals.transactions,
        "heartbeats": totals.heartbeats,
        "skipped_oversize": totals.skipped_oversize,
        "bytes": totals.bytes,
        "batches_committed": sum(item["batches_committed"] for item in partitions),
        "start_position": {item["partition"]: item["start_position"] for item in partitions},
        "end_position": {item["partition"]: item["end_position"] for item in partitions},
        "lag_ms": percentiles(totals.lags_ms, totals.lag_max_ms),
        "duration_s": round(duration_s, 3)
        if duration_s is not None
        else max((item["duration_s"] for item in partitions), default=0.0),
        "incremental_snapshot": incremental,
        "partitions": partitions,
    }
