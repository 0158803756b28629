"""One replica set's oplog as the gap check sees it: its oldest and newest entries, how full it is,
and MongoDB's rule for whether a change stream can still start at a cluster time on it. Discovery
reports the same span with wall-clock times (:class:`~airflow_provider_mongocdc.core.mongo.topology.OplogWindow`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.offsets.model import timestamp_datetime

INITIATING_SET = "initiating set"  # o.msg of the no-op that starts a new replica set's oplog


def ts_json(ts: Timestamp | None) -> dict[str, int] | None:
    return None if ts is None else {"t": ts.time, "i": ts.inc}


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
    def oldest_time(self) -> datetime | None:
        return timestamp_datetime(self.oldest)

    @property
    def newest_time(self) -> datetime | None:
        return timestamp_datetime(self.newest)

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
        """Seconds until ``cluster_time`` would be purged at the current rate: ``cluster_time -
        oldest``, plus :meth:`fill_seconds` while the oplog is not full (an oplog of unknown size
        counts as full: the smaller estimate); negative when it already is purged; None when the
        oplog is unreadable. A position older than a replica set's initiation stays resumable until
        the initiation entry itself is dropped, that is until the oplog is full."""
        if self.oldest is None:
            return None
        behind = cluster_time.time - self.oldest.time
        if behind < 0 and self.starts_at_initiation:
            behind = 0
        return behind + self.fill_seconds()

    def to_dict(self) -> dict[str, Any]:
        return {
            "replica_set": self.replica_set,
            "oldest": ts_json(self.oldest),
            "oldest_time": iso_z(self.oldest_time),
            "newest": ts_json(self.newest),
            "newest_time": iso_z(self.newest_time),
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
