"""One connector's health record: what the MongoDB CDC page shows in a row and its JSON API returns.

Built without I/O from what was read elsewhere (:mod:`airflow_provider_mongocdc.core.health.probes`
reads Kafka and MongoDB, the Airflow plugin reads runs and pools): the committed positions and the
lag behind now, an open window (since when, events so far, committed lag), the oplog headroom of each position (low below the watchdog's threshold), the last
window and snapshot, a running incremental snapshot, the lease, the pool, the events per window of
the last day. Each value read elsewhere comes as a :class:`Reading` (value or error, and when it
was read), so the record says how old it is, and an unreachable MongoDB or Kafka becomes words in
the record instead of an error.

What is left out: connection strings, passwords and the connector's properties never enter a
record (only connection ids, the topic prefix and the offsets topic); resume tokens are cut to
:data:`TOKEN_SHOWN` characters (their cluster time; the full token: ``mongocdc offsets show``);
error texts pass through :func:`~airflow_provider_mongocdc.core.base.redaction.redact_uri`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Any, Generic, TypeVar

from airflow_provider_mongocdc.core.base.redaction import redact_uri
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.gap.report import GAP, OK, SNAPSHOT_RUNNING, GapReport, PartitionCheck
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.mongo.oplog_span import ts_json
from airflow_provider_mongocdc.core.offsets.lease import NOUNS, Lease
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
    position_time,
    timestamp_datetime,
)
from airflow_provider_mongocdc.core.offsets.open_window import open_window_of
from airflow_provider_mongocdc.core.offsets.store import OffsetTopicContents, other_owner
from airflow_provider_mongocdc.core.snapshot.incremental import (
    REQUESTED,
    IncrementalProgress,
    incremental_standing,
)

T = TypeVar("T")

# Characters of a resume token's _data shown: the type byte and the cluster time (seconds and
# increment), which is what tells where the connector stands; the rest stays in the offsets topic.
TOKEN_SHOWN = 18
# Longest error text shown for one value.
ERROR_SHOWN = 600
OK_STATUS, WARNING_STATUS, ERROR_STATUS = "ok", "warning", "error"
_RANK = {OK_STATUS: 0, WARNING_STATUS: 1, ERROR_STATUS: 2}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def shown_error(error: BaseException | str) -> str:
    """An error as the page shows it: one line, credentials hidden, bounded length."""
    text = " ".join(redact_uri(str(error)).split())
    return text if len(text) <= ERROR_SHOWN else text[: ERROR_SHOWN - 1] + "…"


def headline(error: str) -> str:
    """The first sentence of an error (its problem, without cause and fix), for a list of problems."""
    first = error.split(". Cause: ")[0].rstrip(".")
    return first if len(first) <= 200 else first[:199] + "…"


@dataclass(frozen=True)
class Reading(Generic[T]):
    """A value read from MongoDB, Kafka or Airflow at ``as_of``, or the error that reading gave."""

    value: T | None
    as_of: datetime
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None:  # whoever wrote it, an error is shown without credentials
            object.__setattr__(self, "error", shown_error(self.error))

    @classmethod
    def of(cls, read: Callable[[], T], now: Callable[[], datetime] = utcnow) -> Reading[T]:
        """Call ``read``; its value, or its error in words (never raised)."""
        as_of = now()
        try:
            return cls(read(), as_of)
        except Exception as error:  # shown on the page instead of breaking it
            return cls(None, as_of, str(error))

    def age_seconds(self, now: datetime) -> int:
        return max(0, int((now - self.as_of).total_seconds()))

    def meta(self, now: datetime) -> dict[str, Any]:
        return {"as_of": iso_z(self.as_of), "age_seconds": self.age_seconds(now), "error": self.error}


@dataclass(frozen=True)
class ConnectorIdentity:
    """What the connector list says about a connector, resolved at run time (connections may be
    overridden by Variables for the connector ``default``)."""

    name: str
    dag_ids: Mapping[str, str]
    conn_ids: Mapping[str, str]
    pool: str
    topic_prefix: str | None = None  # None: the configuration could not be read
    offsets_topic: str | None = None
    config_error: str | None = None
    chunk_size: int = 1024  # incremental.snapshot.chunk.size
    change_driven: bool = False  # its windows are asked for by a change watcher


@dataclass(frozen=True)
class OffsetsView:
    """One read of the connector's offsets topic: its partitions' states, incremental snapshot
    request and lease."""

    states: Mapping[OffsetPartition, OffsetState] = field(default_factory=dict)
    request: Mapping[str, Any] | None = None
    lease: Lease | None = None
    # Transactions open on the topic after what was read: later commits are not in this view.
    open_transactions: tuple[OpenTransaction, ...] = ()
    # What the connector's change watcher last counted (its status record), as stored JSON.
    watcher: Mapping[str, Any] | None = None

    @classmethod
    def of(cls, contents: OffsetTopicContents, lease: Lease | None, topic_prefix: str) -> OffsetsView:
        """The connector's part of everything in its offsets topic."""
        states = {
            partition: state
            for partition, state in contents.states.items()
            if partition.server_id == topic_prefix and partition.connector_name == topic_prefix
        }
        return cls(
            states,
            contents.requests.get((topic_prefix, topic_prefix)),
            lease,
            tuple(contents.open_transactions),
            contents.watchers.get((topic_prefix, topic_prefix)),
        )


@dataclass(frozen=True)
class Sources:
    """Everything read for one connector."""

    offsets: Reading[OffsetsView] | None = None  # None: no configuration, nothing to read
    oplog: Reading[GapReport] | None = None  # None: not probed (no configuration or offsets)
    documents_left: Reading[Mapping[str, int]] | None = None  # of a running incremental snapshot
    runs: Reading[Mapping[str, Any]] | None = None  # last_window, last_snapshot, windows (day)
    pool: Reading[Mapping[str, Any]] | None = None
    registered_dags: frozenset[str] | None = None  # the connector's DAG ids known to Airflow


# -- the parts of a record --------------------------------------------------------------------------
def lag_seconds(position: Position | None, now: datetime) -> int | None:
    """How far the committed position is behind ``now``: now minus its cluster time, in seconds."""
    ts = position_time(position)
    if ts is None:
        return None
    return max(0, int((now - timestamp_datetime(ts)).total_seconds()))


def short_token(position: Position | None) -> str | None:
    """A resume token's ``_data`` cut to :data:`TOKEN_SHOWN` characters (the full one is not shown)."""
    token = position.resume_token if position else None
    if not token:
        return None
    data = token.get("_data")
    if isinstance(data, str):
        return data if len(data) <= TOKEN_SHOWN else data[:TOKEN_SHOWN] + "…"
    return "(binary token)"


def position_row(partition: OffsetPartition, state: OffsetState, now: datetime) -> dict[str, Any]:
    """One partition's committed position and lag."""
    position = state.position
    ts = position_time(position)
    snapshot = state.snapshot
    return {
        "partition": partition.rs,
        "cluster_time": iso_z(timestamp_datetime(ts)),
        "cluster_time_ts": ts_json(ts),
        "lag_seconds": lag_seconds(position, now),
        "resume_token": short_token(position),
        "last_window_end": iso_z(state.last_window_end),
        "updated_at": iso_z(state.updated_at),
        "snapshot": {
            "status": snapshot.status,
            "id": snapshot.snapshot_id,
            "started_at": iso_z(snapshot.started_at),
            "completed_at": iso_z(snapshot.completed_at),
        },
        "counters": {"events": state.events, "windows": state.windows, "snapshots": state.snapshots},
    }


def headroom_row(check: PartitionCheck, threshold_seconds: float) -> dict[str, Any]:
    """One partition's oplog headroom: how long until the oplog rolls past its stored position,
    ``low`` below ``threshold_seconds`` (the watchdog's warning)."""
    headroom = check.headroom_seconds
    return {
        "partition": check.partition.rs,
        "status": check.status,
        "headroom_seconds": headroom,
        "low": check.status == GAP
        or (check.status in (OK, SNAPSHOT_RUNNING) and headroom is not None and headroom < threshold_seconds),
        "oldest_oplog_time": iso_z(timestamp_datetime(check.oldest)),
        "lost_seconds": check.lost_seconds,
        "note": shown_error(check.note) if check.note else "",
    }


def lease_part(lease: Lease | None, now: datetime) -> dict[str, Any]:
    """Free, or held by whom (an Airflow task instance ``<dag>/<run>/<task>``, or an offsets
    command), for what, since and until when. An expired lease is free."""
    if lease is None:
        return {"state": "free"}
    part = {
        "state": "held" if lease.live(now) else "expired",
        "owner": lease.owner,
        "kind": NOUNS.get(lease.kind, lease.kind),
        "host": lease.host,
        "acquired_at": iso_z(lease.acquired_at),
        "expires_at": iso_z(lease.expires_at),
    }
    dag_id, _, rest = lease.owner.partition("/")
    run_id, _, task_id = rest.rpartition("/")
    if dag_id and run_id and task_id and " " not in dag_id:
        part["task_instance"] = {"dag_id": dag_id, "run_id": run_id, "task_id": task_id}
    return part


def incremental_part(
    view: OffsetsView, documents_left: Reading[Mapping[str, int]] | None, chunk_size: int, now: datetime
) -> dict[str, Any] | None:
    """A running incremental snapshot (or one requested, or the last one's outcome with its time
    and counts): the collection being copied, documents so far, chunks done and left (from the
    documents left, when they could be counted)."""
    standing = incremental_standing(view.request, [state.incremental for state in view.states.values()])
    if standing is None:
        return None
    progress = standing.progress
    if standing.status == REQUESTED:
        request = standing.request
        return {
            "status": "requested",
            "request_id": request.request_id,
            "collections": list(request.collections) or None,
            "requested_at": iso_z(request.requested_at),
            "note": "waiting for the next window to start copying",
        }
    if not standing.open:
        return {
            "status": progress.status,
            "request_id": progress.request_id,
            "documents": progress.documents,
            "chunks_done": progress.chunks,
            "collections_done": list(progress.done),
            "started_at": iso_z(progress.started_at),
            "completed_at": iso_z(progress.completed_at),
            "note": progress.message or "",
        }
    part: dict[str, Any] = {
        "status": progress.status,
        "request_id": progress.request_id,
        "collection": progress.current or (progress.pending[0] if progress.pending else None),
        "collections_left": ([progress.current] if progress.current else []) + list(progress.pending),
        "collections_done": list(progress.done),
        "documents": progress.documents,
        "chunks_done": progress.chunks,
        "chunks_left": None,
        "documents_left": None,
        "started_at": iso_z(progress.started_at),
        "counted": None,
    }
    if documents_left is not None:
        part["counted"] = documents_left.meta(now)
        if documents_left.value is not None:
            left = dict(documents_left.value)
            part["documents_left"] = sum(left.values())
            part["chunks_left"] = sum(math.ceil(count / max(1, chunk_size)) for count in left.values())
    return part


def running_incremental(view: OffsetsView) -> IncrementalProgress | None:
    """The running incremental snapshot's progress of any partition, or None."""
    for state in view.states.values():
        progress = IncrementalProgress.from_json(state.incremental)
        if progress is not None and progress.running:
            return progress
    return None


def watcher_part(
    status: Mapping[str, Any] | None,
    identity: ConnectorIdentity,
    has_offsets: bool,
    found: _Findings,
    open_window: Mapping[str, Any] | None = None,
) -> dict[str, Any] | None:
    """What the change watcher last counted, and what it makes of the lag: ``quiet`` (nothing
    pending: the committed position is old because nothing captured changed, windows run when
    changes come), ``behind`` (changes pending since ``pending_since``: the real delay is the
    oldest pending change's age) or ``waiting`` (a stream has no position a window could start
    from, or is blocked); ``open`` while a window is open (``open_window``, from its marker in the
    offsets topic: the watcher rests then, and its last count is from before the window opened).
    A watcher that stopped reporting is a problem of its own."""
    if not identity.change_driven:
        return None
    part = _watcher_count(status, has_offsets, found)
    if open_window is not None:
        events, commits = open_window.get("events"), open_window.get("commits")
        part.update(
            state="open",
            open_since=open_window.get("since"),
            events=events,
            commits=commits,
            note=f"window open since {open_window.get('since')}: {events} changes committed in {commits} commits",
        )
    return part


def _watcher_count(status: Mapping[str, Any] | None, has_offsets: bool, found: _Findings) -> dict[str, Any]:
    """What the watcher's status record says (:func:`watcher_part`), without an open window."""
    now = found.now
    if not isinstance(status, Mapping):
        if not has_offsets:  # it waits for the first snapshot's position (and writes nothing until then)
            return {
                "state": "waiting",
                "note": "no offsets yet: the change watcher waits for the first snapshot",
            }
        found.add(WARNING_STATUS, f"the change watcher has not reported yet: {WATCHER_CHECK}")
        return {"state": "unknown", "note": f"not reported yet: {WATCHER_CHECK}"}
    reported = _moment(status.get("at"))
    age = max(0, int((now - reported).total_seconds())) if reported else None
    pending = status.get("pending") if isinstance(status.get("pending"), int) else None
    since = _moment(status.get("pending_since"))
    states = [
        item.get("state") for item in (status.get("partitions") or {}).values() if isinstance(item, Mapping)
    ]
    part: dict[str, Any] = {
        "pending": pending,
        "pending_since": iso_z(since),
        "oldest_pending_seconds": max(0, int((now - since).total_seconds())) if since else None,
        "reported_at": iso_z(reported),
        "age_seconds": age,
        "waiting_for_window": bool(status.get("waiting_for_window")),
        "incremental_snapshot": status.get("incremental_snapshot"),
    }
    if any(state not in ("watched", "disabled") for state in states):
        notes = [
            f"{name}: {item.get('note')}"
            for name, item in (status.get("partitions") or {}).items()
            if isinstance(item, Mapping) and item.get("state") not in ("watched", "disabled")
        ]
        part.update(state="waiting", note="; ".join(notes) or "a stream is not watched")
    elif pending:
        part.update(state="behind", note=f"{pending} change(s) pending")
    else:
        part.update(
            state="quiet", note="no change pending: nothing captured changed since the committed position"
        )
    if age is None or age > WATCHER_STALE_S:
        found.add(
            WARNING_STATUS,
            f"the change watcher last reported {_ago(age)}: {WATCHER_CHECK}",
        )
        part["stale"] = True
    return part


# The change watcher reports at least every 10 minutes; older than this, it is not running.
WATCHER_STALE_S = 1800
WATCHER_CHECK = (
    "is Airflow's triggerer running and the window DAG switched on? The triggerer's log says why the "
    "watcher stopped"
)


def _moment(value: Any) -> datetime | None:
    """An ISO time of the watcher's status, None for anything else (the status is a hint)."""
    try:
        return parse_iso(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _ago(seconds: int | None) -> str:
    if seconds is None:
        return "at an unknown time"
    minutes = seconds // 60
    return f"{minutes} min ago" if minutes < 120 else f"{minutes // 60} h ago"


def window_chart(points: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Events per window, oldest first: ``{"end", "events", "state"}``."""
    return sorted(
        (
            {"end": point.get("end"), "events": point.get("events"), "state": point.get("state")}
            for point in points
        ),
        key=lambda point: point["end"] or "",
    )


# -- the record -------------------------------------------------------------------------------------
class _Findings:
    """The problems found while one record is built, each ``(status, words)``, in the order found."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.problems: list[tuple[str, str]] = []

    def add(self, status: str, words: str) -> None:
        self.problems.append((status, words))

    def read(self, part: dict[str, Any], reading: Reading | None, status: str, words: str) -> Any:
        """``reading``'s value (None without one); its age and error into ``part``, the error
        into the problems."""
        if reading is None:
            return None
        part.update(reading.meta(self.now))
        if reading.error:
            self.add(status, f"{words}: {headline(reading.error)}")
        return reading.value

    def status(self) -> str:
        return max((status for status, _ in self.problems), key=_RANK.__getitem__, default=OK_STATUS)

    def words(self) -> list[str]:
        """The problems, the worst first (found order within a status)."""
        return [words for _, words in sorted(self.problems, key=lambda item: -_RANK[item[0]])]


def connector_record(
    identity: ConnectorIdentity, sources: Sources, *, now: datetime, headroom_threshold_seconds: float
) -> dict[str, Any]:
    """The health record of one connector (JSON-serialisable)."""
    found = _Findings(now)
    record: dict[str, Any] = {
        "name": identity.name,
        "dag_ids": dict(identity.dag_ids),
        "conn_ids": dict(identity.conn_ids),
        "topic_prefix": identity.topic_prefix,
        "offsets_topic": identity.offsets_topic,
        "generated_at": iso_z(now),
    }
    if identity.config_error:
        found.add(ERROR_STATUS, f"configuration: {headline(identity.config_error)}")
    if sources.registered_dags is not None:
        missing = sorted(set(identity.dag_ids.values()) - set(sources.registered_dags))
        record["dags_registered"] = not missing
        if missing:
            found.add(
                WARNING_STATUS,
                f"DAGs not registered in Airflow yet: {', '.join(missing)} (see DAG import errors)",
            )
    record.update(_offsets_parts(identity, sources, found))
    if record["offsets"].get("belongs_to") is not None:  # another connector's positions: not probed
        sources = replace(sources, oplog=None, documents_left=None)
    record["oplog"] = _oplog_part(identity, sources, headroom_threshold_seconds, found)
    record.update(_airflow_parts(identity, sources, found))
    record["status"] = found.status()
    record["problems"] = found.words()
    return record


def _offsets_parts(identity: ConnectorIdentity, sources: Sources, found: _Findings) -> dict[str, Any]:
    """``offsets`` (positions and lag), ``lease`` and ``incremental_snapshot`` of a record."""
    now = found.now
    offsets: dict[str, Any] = {"partitions": [], "lag_seconds": None}
    view: OffsetsView | None = found.read(
        offsets, sources.offsets, ERROR_STATUS, "Kafka: the offsets could not be read"
    )
    owner = other_owner_of(view, identity) if view is not None else None
    if owner is not None:  # one topic prefix belongs to one connector: not shown as this one's
        other, partition = owner
        offsets["belongs_to"] = other
        found.add(ERROR_STATUS, foreign_words(identity, other, partition))
        lease = view.lease if partition is None else None
        return {
            "offsets": offsets,
            "lease": (lease_part(lease, now) | {"connector": other} if lease else {"state": "free"})
            | (sources.offsets.meta(now) if sources.offsets is not None else {}),
            "incremental_snapshot": None,
        }
    if view is not None:
        rows = [
            position_row(partition, state, now)
            for partition, state in sorted(view.states.items(), key=lambda item: item[0].rs)
        ]
        offsets["partitions"] = rows
        lags = [row["lag_seconds"] for row in rows if row["lag_seconds"] is not None]
        offsets["lag_seconds"] = max(lags) if lags else None
        # A window open now (core/offsets/open_window.py): since when, events so far, committed lag.
        offsets["open_window"] = open_window_of(view.states.items(), view.lease, now)
        if view.open_transactions:
            offsets["open_transactions"] = [open_one.to_json(now) for open_one in view.open_transactions]
            found.add(
                WARNING_STATUS,
                "Kafka: "
                + "; ".join(open_one.describe(now) for open_one in view.open_transactions)
                + ": the positions shown may be older than those committed after it "
                "(a window of the connector ends it when it starts, else "
                + view.open_transactions[0].expiry()
                + ")",
            )
        offsets["watcher"] = watcher_part(view.watcher, identity, bool(rows), found, offsets["open_window"])
        if not rows:
            found.add(WARNING_STATUS, "no offsets yet: the connector has not run (or its offsets were reset)")
        elif any(state.snapshot.status == SNAPSHOT_IN_PROGRESS for state in view.states.values()):
            found.add(WARNING_STATUS, "a snapshot is in progress")
    return {
        "offsets": offsets,
        "lease": lease_part(view.lease if view else None, now)
        | (sources.offsets.meta(now) if sources.offsets is not None else {}),
        "incremental_snapshot": (
            incremental_part(view, sources.documents_left, identity.chunk_size, now) if view else None
        ),
    }


def other_owner_of(
    view: OffsetsView, identity: ConnectorIdentity
) -> tuple[str, OffsetPartition | None] | None:
    """Another connector that last wrote the view's positions (its name and the partition) or took
    its lease (its name and None); None when they are the connector's own or written without a
    name. Its runs are refused (:func:`~airflow_provider_mongocdc.core.offsets.store.check_prefix_owner`)."""
    lease_connector = view.lease.connector if view.lease is not None else None
    return other_owner(view.states, lease_connector, identity.topic_prefix or "", identity.name)


def foreign_words(identity: ConnectorIdentity, other: str, partition: OffsetPartition | None) -> str:
    """The problem of a connector whose topic prefix holds another connector's offsets or lease."""
    what = (
        f"its lease was last taken by connector {other!r}"
        if partition is None
        else f"its offsets were last written by connector {other!r}"
    )
    return (
        f"offsets: the topic prefix {identity.topic_prefix!r} belongs to connector {other!r} ({what}), "
        f"so they are not shown as connector {identity.name!r}'s and its runs are refused: give "
        f"connector {identity.name!r} a topic.prefix of its own (if it replaces {other!r}: mongocdc "
        f"offsets adopt --topic-prefix {identity.topic_prefix} --name {identity.name} --yes)"
    )


def _oplog_part(
    identity: ConnectorIdentity, sources: Sources, threshold_seconds: float, found: _Findings
) -> dict[str, Any]:
    """``oplog`` of a record: each position's headroom, a gap or a low headroom as a problem."""
    oplog: dict[str, Any] = {
        "threshold_seconds": int(threshold_seconds),
        "partitions": [],
        "headroom_seconds": None,
    }
    report: GapReport | None = found.read(
        oplog, sources.oplog, WARNING_STATUS, "MongoDB: the oplog headroom is unknown"
    )
    if report is not None:
        oplog["partitions"] = [headroom_row(check, threshold_seconds) for check in report.checks]
        oplog["headroom_seconds"] = report.headroom_seconds
        oplog["notes"] = [shown_error(note) for note in report.notes]
        if report.gap:
            lost = ", ".join(check.partition.rs for check in report.gaps)
            found.add(
                ERROR_STATUS,
                f"oplog gap: the stored position of {lost} is no longer in the oplog; re-snapshot "
                f"({identity.dag_ids.get('resnapshot')})",
            )
        elif any(row["low"] for row in oplog["partitions"]):
            found.add(
                WARNING_STATUS,
                f"oplog headroom below {_hours(threshold_seconds)}: run the window "
                "(or size the oplog) before the position is purged",
            )
    return oplog


def _airflow_parts(identity: ConnectorIdentity, sources: Sources, found: _Findings) -> dict[str, Any]:
    """What Airflow tells of a record: ``runs`` (its reading), the last window and snapshot, the
    windows of the last day and the ``pool``."""
    parts: dict[str, Any] = {"runs": {}}
    runs = found.read(parts["runs"], sources.runs, WARNING_STATUS, "Airflow runs could not be read") or {}
    parts["last_window"] = runs.get("last_window")
    parts["last_snapshot"] = runs.get("last_snapshot")
    parts["windows_last_day"] = window_chart(runs.get("windows") or [])
    if (parts["last_window"] or {}).get("state") in ("failed", "upstream_failed"):
        found.add(WARNING_STATUS, f"the last window failed (run {parts['last_window'].get('run_id')})")
    pool_read: dict[str, Any] = {}
    pool = found.read(pool_read, sources.pool, WARNING_STATUS, "the pool could not be read") or {}
    parts["pool"] = {"name": identity.pool, **pool, "read": pool_read}
    return parts


def _hours(seconds: float) -> str:
    hours = seconds / 3600
    return f"{hours:g} h"
