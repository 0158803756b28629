"""The gap check's verdict: per partition (:func:`assess`, from the evidence gathered for it) and
for a whole connector (:class:`GapReport`, the sensor's XCom and the trigger's event).

A partition has a *gap* when MongoDB refused to resume its change stream at the stored position
(``ChangeStreamHistoryLost``); the oplog comparison decides only where no stream check ran.
Partitions without an offset, whose snapshot is in progress, or without a stream position are
reported, never gaps. See docs/design.md, "Oplog gap detection".
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.gap.headroom import HEADROOM_WARNING as HEADROOM_WARNING
from airflow_provider_mongocdc.core.gap.plan import Probe
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.mongo.oplog_span import OplogSpan, ts_json
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    Position,
    timestamp_datetime,
    token_cluster_time,
)

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
# HEADROOM_WARNING (imported above) lives in core/gap/headroom.py and stays importable from here.


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
            "stored_cluster_time": ts_json(ts),
            "stored_time": iso_z(timestamp_datetime(ts)),
            "oldest_oplog_time": iso_z(timestamp_datetime(self.oldest)),
            "newest_oplog_time": iso_z(timestamp_datetime(self.newest)),
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


@dataclass(frozen=True)
class _Evidence:
    """What the oplogs say about a stored position: the smallest headroom of the readable ones,
    those that no longer cover it, and how much history they lost (the largest loss)."""

    headroom: int | None
    purged: tuple[OplogSpan, ...]
    lost: int | None

    @classmethod
    def of(cls, spans: tuple[OplogSpan, ...], ts: Timestamp | None) -> _Evidence:
        readable = [span for span in spans if span.readable]
        headroom = min((span.headroom_seconds(ts) for span in readable), default=None) if ts else None
        purged = tuple(span for span in readable if ts is not None and not span.covers(ts))
        lost = max((span.oldest.time - ts.time for span in purged), default=None)
        return cls(headroom, purged, lost)

    @property
    def lost_seconds(self) -> int | None:
        return max(0, self.lost) if self.lost is not None else None


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
    evidence = _Evidence.of(spans, _cluster_time(position))
    if state.snapshot.status == SNAPSHOT_IN_PROGRESS:
        return _snapshot_running(probe, spans, evidence)
    if position is None:
        return PartitionCheck(
            partition, NO_POSITION, None, spans, note="the offset holds no stream position yet"
        )
    # MongoDB's own check decides when the stream could be opened; the oplog comparison (same rule,
    # see oplog_covers) only where it could not.
    gap = stream == HISTORY_LOST if stream is not None else bool(evidence.purged)
    if gap:
        return _gap(probe, spans, evidence, stream, stream_error)
    return _resumable(probe, spans, evidence, stream)


def _snapshot_running(probe: Probe, spans: tuple[OplogSpan, ...], evidence: _Evidence) -> PartitionCheck:
    snapshot_id = probe.state.snapshot.snapshot_id
    note = f"snapshot {snapshot_id} is in progress"
    if evidence.purged:
        note += (
            "; its recorded start position is no longer in the oplog, so streaming cannot "
            "continue from it: run a new snapshot when it ends"
        )
    return PartitionCheck(
        probe.partition,
        SNAPSHOT_RUNNING,
        probe.position,
        spans,
        None,
        None,
        evidence.lost_seconds,
        evidence.headroom,
        snapshot_id,
        note,
    )


def _gap(
    probe: Probe,
    spans: tuple[OplogSpan, ...],
    evidence: _Evidence,
    stream: str | None,
    stream_error: str | None,
) -> PartitionCheck:
    reasons = []
    if stream == HISTORY_LOST:
        reasons.append(f"MongoDB refused to resume the change stream ({stream_error})")
    for span in evidence.purged:
        reasons.append(
            f"the oldest entry in the oplog of {span.replica_set} is "
            f"{iso_z(timestamp_datetime(span.oldest))}, after the stored position"
        )
    lost_text = (
        f"{_duration(evidence.lost)} of history lost"
        if evidence.lost is not None
        else "the lost time is unknown (the oplog is not readable)"
    )
    note = (
        f"stored position {probe.position.describe()} is no longer in the oplog: {lost_text}; "
        + "; ".join(reasons)
    )
    return PartitionCheck(
        probe.partition,
        GAP,
        probe.position,
        spans,
        stream,
        stream_error,
        evidence.lost_seconds,
        None,
        None,
        note,
    )


def _resumable(
    probe: Probe, spans: tuple[OplogSpan, ...], evidence: _Evidence, stream: str | None
) -> PartitionCheck:
    if any(span.readable for span in spans):
        note = f"resumable; purged in about {_duration(evidence.headroom)} at the current oplog rate"
        if evidence.purged:
            note += (
                "; MongoDB resumed the change stream although the oldest entry in the oplog of "
                + ", ".join(span.replica_set for span in evidence.purged)
                + " is after the stored position"
            )
    else:
        reasons = "; ".join(span.error or "unreadable" for span in spans) or "no oplog to read"
        note = f"resumable; headroom unknown ({reasons})"
    return PartitionCheck(
        probe.partition, OK, probe.position, spans, stream, None, None, evidence.headroom, None, note
    )


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
            "detected_at": iso_z(self.detected_at),
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


def unsure_gap(connector: str, open_transactions: Iterable[OpenTransaction]) -> str:
    """Why a gap found while a transaction is open on the offsets topic is not reported yet: the
    stored positions read may be older than those committed after that transaction."""
    return (
        f"Connector {connector}: a stored position looks purged from the oplog, but "
        + "; ".join(open_one.describe() for open_one in open_transactions)
        + ", so a newer position may be committed after it: not reported as a gap; checked again at "
        "the next poke (a window of the connector ends the transaction when it starts)"
    )
