"""The marker of an open window in the offsets topic: who else learns that a window is open, since
when, how many events it committed so far and how far behind its committed position is.

An open window (docs/design.md, "Open windows") writes the marker into its partition's offset
state with every commit (:func:`open_marker`, the state's ``open_window``) and removes it with its
last commit. A marker is only a hint, and it must not outlive a killed window for long: it counts
(:func:`open_window_of`) while its ``until`` lies ahead (the latest time the window's next commit
is due: its idle time and commit interval from the commit, plus :data:`OPEN_GRACE_S`, never past
its maximum open time) and while the connector's lease is held by a window, so a window killed
with SIGKILL stops counting as open at its marker's ``until`` or when its lease expires, whichever
comes first (a failed window releases its lease at once).

A window killed with SIGKILL while open (its task's process group: spark-submit stays in it) runs
neither its last commit nor its task's release: its marker stays past ``until`` and its task
instance's lease stays live. That is what :func:`killed_window_of` finds. Airflow's retry of that
task instance takes the same owner's lease again and continues from the last commit, and no other
run's window can take the lease before it expires, so the change watcher asks for no window
meanwhile; the retry's opening commit writes a marker of its own, its last one removes it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.offsets.lease import WINDOW, Lease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState

# How much later than its next commit is due a marker still counts (a slow machine, a commit that
# waits for the end of a MongoDB transaction, clocks of two machines).
OPEN_GRACE_S = 30.0


def open_marker(
    *,
    since: datetime,
    now: datetime,
    events: int,
    commits: int,
    lag_ms: int | None,
    next_commit_within_s: float,
    closes_by: datetime,
) -> dict[str, Any]:
    """The marker an open window commits with its offset: open ``since``, ``events`` committed in
    it so far over ``commits`` commits (this one included), its committed position ``lag_ms``
    behind the clock at ``now``; it counts ``until`` its next commit is overdue (``now`` +
    ``next_commit_within_s`` + :data:`OPEN_GRACE_S`), at most until ``closes_by`` (its maximum
    open time) + :data:`OPEN_GRACE_S`."""
    grace = timedelta(seconds=OPEN_GRACE_S)
    until = min(now + timedelta(seconds=next_commit_within_s) + grace, closes_by + grace)
    return {
        "since": iso_z(since),
        "events": int(events),
        "commits": int(commits),
        "committed_at": iso_z(now),
        "lag_ms": lag_ms,
        "until": iso_z(until),
    }


def _moment(value: Any) -> datetime | None:
    try:
        return parse_iso(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _count(value: Any) -> int:
    """A count of a stored marker; 0 for anything else (a marker is a hint)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def live_marker(marker: Mapping[str, Any] | None, now: datetime) -> bool:
    """Whether a stored marker still counts by its own bound (``until`` ahead of ``now``)."""
    if not isinstance(marker, Mapping):
        return False
    until = _moment(marker.get("until"))
    return until is not None and now < until


def open_window_of(
    states: Iterable[tuple[OffsetPartition, OffsetState]], lease: Lease | None, now: datetime
) -> dict[str, Any] | None:
    """The open window of a connector, from its partitions' committed states and its lease; None
    when no window is open (no live marker, or no live window lease). ``since`` is the earliest
    opening, ``events`` and ``commits`` add up over the streams, ``lag_seconds`` is the largest
    committed lag at its commit, ``partitions`` each stream's marker."""
    if lease is None or lease.kind != WINDOW or not lease.live(now):
        return None
    markers = {
        partition.rs: dict(state.open_window)
        for partition, state in states
        if live_marker(state.open_window, now)
    }
    if not markers:
        return None
    return _window(markers, lease)


def killed_window_of(
    states: Iterable[tuple[OffsetPartition, OffsetState]], lease: Lease | None, now: datetime
) -> dict[str, Any] | None:
    """The connector's window killed while open, whose task instance still holds the lease: the
    markers it left count no longer (none is live: :func:`open_window_of` is None) while the lease
    is live and held by a window (the killed task's, renewed until it died, or its retry's, taken
    anew under the same owner). As :func:`open_window_of` gives an open window, with ``killed``
    True and ``lease_expires_at``; None otherwise (no marker left, a live one, no live window
    lease). Without a retry it ends at the lease's expiry, before which no other window could start."""
    if lease is None or lease.kind != WINDOW or not lease.live(now):
        return None
    markers = {
        partition.rs: dict(state.open_window)
        for partition, state in states
        if isinstance(state.open_window, Mapping)
    }
    if not markers or any(live_marker(marker, now) for marker in markers.values()):
        return None
    return {**_window(markers, lease), "killed": True, "lease_expires_at": iso_z(lease.expires_at)}


def _window(markers: Mapping[str, Mapping[str, Any]], lease: Lease) -> dict[str, Any]:
    """The window of ``markers`` (one per stream) held under ``lease``."""
    lags = [item["lag_ms"] for item in markers.values() if _count(item.get("lag_ms")) == item.get("lag_ms")]
    openings = [moment for moment in (_moment(item.get("since")) for item in markers.values()) if moment]
    commits = [
        moment for moment in (_moment(item.get("committed_at")) for item in markers.values()) if moment
    ]
    return {
        "since": iso_z(min(openings)) if openings else None,
        "events": sum(_count(item.get("events")) for item in markers.values()),
        "commits": sum(_count(item.get("commits")) for item in markers.values()),
        "last_commit_at": iso_z(max(commits)) if commits else None,
        "lag_seconds": round(max(lags) / 1000, 1) if lags else None,
        "held_by": lease.owner,
        "partitions": markers,
    }


def next_commit_due(window: Mapping[str, Any]) -> datetime | None:
    """When the next commit of an open window (as :func:`open_window_of` gives it) is due at the
    latest: its earliest marker's ``until`` less :data:`OPEN_GRACE_S`. A window that closes after
    its idle time or at its maximum open time has written its last commit by then; one that keeps
    committing moves the time on. None when no marker says (read the offsets again at once)."""
    partitions = window.get("partitions")
    markers = partitions.values() if isinstance(partitions, Mapping) else ()
    until = [moment for moment in (_moment(marker.get("until")) for marker in markers) if moment]
    return min(until) - timedelta(seconds=OPEN_GRACE_S) if until else None


def describe_open_window(window: Mapping[str, Any]) -> str:
    """An open window in words, for logs: since when, events so far, committed lag (a killed one:
    since when, its last commit, the lease its task holds)."""
    if window.get("killed"):
        return (
            f"the window open since {window.get('since')} ({window.get('events', 0)} events in "
            f"{window.get('commits', 0)} commits) has not committed since {window.get('last_commit_at')}, "
            f"and its task still holds the connector's lease ({window.get('held_by')}, until "
            f"{window.get('lease_expires_at')}): it was killed, and its retry continues from its last commit"
        )
    lag = window.get("lag_seconds")
    lag_text = f"{lag:g} s" if isinstance(lag, (int, float)) else "unknown"
    return (
        f"a window is open since {window.get('since')}: {window.get('events', 0)} events so far in "
        f"{window.get('commits', 0)} commits, committed lag {lag_text}"
    )
