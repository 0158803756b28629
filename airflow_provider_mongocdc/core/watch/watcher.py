"""The change watcher's decisions, without I/O: what it counts, when it asks for a window, and what
its event says.

:class:`ChangeWatch` is fed what the driver (``triggers/change_watcher.py``) reads: the committed
starting position of each of the connector's streams (:meth:`ChangeWatch.committed`, as a window
would find it), the oplog check of those positions (:meth:`ChangeWatch.checked`) and the changes
each stream returned after its position (:meth:`ChangeWatch.counted`). It says where each stream
must be read from (:meth:`ChangeWatch.to_open`), whether a window is due (:meth:`ChangeWatch.due`)
and builds the event (:meth:`ChangeWatch.fire`).

Counting starts after the committed position, or after the newest change of the last event while
no window has committed past it yet: an event asks for one window, and until that window has
committed (or ``refire_after`` passed without it) no other event is sent, so the changes that arrive
while a window runs make at most one next run, asked for once they reach a threshold (at once when
the oldest of them is already ``max_delay`` old). A committed position that moved back (``mongocdc
offsets set``) is counted from again. While an incremental snapshot is requested or running
(:meth:`ChangeWatch.incremental`), windows are asked for one after the other (reason
``incremental_snapshot``) until it completes or is stopped: it moves on only in windows. While a
window is open (:meth:`ChangeWatch.window_open`: its marker in the offsets topic, see
:mod:`airflow_provider_mongocdc.core.offsets.open_window`) no event is sent and no stream is read
(:meth:`ChangeWatch.streaming`): the open window carries the changes as they come; when it closes
the streams are opened again from its last commit. A window killed while open whose task still holds
the connector's lease (:func:`~airflow_provider_mongocdc.core.offsets.open_window.killed_window_of`)
counts as open until that ends: Airflow's retry of the task takes the lease again and carries the
changes from the last commit, and a run asked for meanwhile would only wait behind it (or fail on
the lease) and carry nothing. The watcher only reads: it never commits an offset and never takes the
connector's lease. Rules and reasons: docs/design.md, "Change-driven windows".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.gap.report import GAP, OK, GapReport
from airflow_provider_mongocdc.core.offsets.model import Position, describe_position, position_time
from airflow_provider_mongocdc.core.offsets.open_window import describe_open_window, next_commit_due
from airflow_provider_mongocdc.core.watch.settings import WatchSettings, describe_seconds
from airflow_provider_mongocdc.core.watch.stream import position_order

# Why a window is asked for: the threshold that was reached, or an incremental snapshot to move on.
MIN_CHANGES, MAX_DELAY, MIN_HEADROOM = "min_changes", "max_delay", "min_headroom"
INCREMENTAL_SNAPSHOT = "incremental_snapshot"
# A partition's state: watched; streaming disabled (snapshot.mode=initial_only); waiting for a
# position a window could start from (no offset yet, a snapshot in progress); blocked until its
# committed position changes (purged from the oplog, or refused by MongoDB).
WATCHED, DISABLED, WAITING, BLOCKED = "watched", "disabled", "waiting", "blocked"
# The connector's window as the offsets topic shows it: open, or killed while open (its retry due).
OPEN, KILLED = "open", "killed"


def _window_kind(window: Mapping | None) -> str | None:
    if window is None:
        return None
    return KILLED if window.get("killed") else OPEN


def _time(ts: Timestamp | None) -> str | None:
    return None if ts is None else iso_z(datetime.fromtimestamp(ts.time, timezone.utc))


@dataclass
class PartitionWatch:
    """One stream of the connector (offset partition ``name``) as the watcher follows it."""

    name: str
    state: str = WAITING
    note: str = ""
    committed: Position | None = None
    counting_from: Position | None = None  # changes after this one are pending
    read_to: Position | None = None  # the last change read (where a reopened stream continues)
    open_at: Position | None = None  # the stream must be (re)opened here
    count: int = 0
    oldest: Timestamp | None = None
    newest: Timestamp | None = None
    announced: Position | None = None  # the newest change of the last event, until committed past
    headroom: tuple[int, Position] | None = None  # seconds, for the committed position checked

    def rebase(self, position: Position) -> None:
        """Count from ``position`` again (the stream is reopened there)."""
        self.counting_from = self.read_to = self.open_at = position
        self.count, self.oldest, self.newest = 0, None, None

    def stop(self, state: str, note: str) -> None:
        self.state, self.note = state, note
        self.counting_from = self.read_to = self.open_at = None
        self.count, self.oldest, self.newest, self.headroom = 0, None, None, None

    def to_dict(self) -> dict:
        return {
            "pending": self.count,
            "since": _time(self.oldest),
            "newest_change": _time(self.newest),
            "committed": describe_position(self.committed),
        }


@dataclass(frozen=True)
class Outstanding:
    """The last event, until a window has committed past its changes (or moved a position)."""

    at: float
    announced: Mapping[str, Position]
    committed: Mapping[str, Position | None]
    incremental: str | None = None  # the incremental snapshot's marker when the event was sent


@dataclass
class ChangeWatch:
    """The watcher of one connector. Times are seconds since the epoch (``time.time()``)."""

    connector: str
    settings: WatchSettings
    watchdog: str | None = None
    partitions: dict[str, PartitionWatch] = field(default_factory=dict)
    outstanding: Outstanding | None = None
    events: int = 0
    last_event_at: float | None = None
    # A committed position moved or began to be watched: its oplog check is due.
    recheck: bool = False
    # The requested or running incremental snapshot (its marker: it changes as windows move it
    # on), None without one; and its words for the event.
    incremental_work: str | None = None
    incremental_note: str = ""
    # The connector's open window (core/offsets/open_window.py: open_window_of), None while none is.
    open_window: dict | None = None

    # -- inputs ------------------------------------------------------------------------------------
    def committed(self, starts: Mapping[str, Position | str | None], now: float) -> list[str]:
        """Each stream's committed starting position as a window would find it: a Position; None
        when streaming is disabled (``snapshot.mode=initial_only``); a text saying why no window
        can start (no offset yet, a snapshot in progress). Returns the lines to log: a stream's
        state when it changes."""
        notes: list[str] = []
        for name, start in starts.items():
            partition = self.partitions.setdefault(name, PartitionWatch(name))
            if not isinstance(start, Position):
                if start is None:
                    state, note = DISABLED, "streaming is disabled by snapshot.mode=initial_only"
                else:
                    state, note = (
                        WAITING,
                        f"{start}; no event until a window can start from a committed position",
                    )
                if (partition.state, partition.note) != (state, note):
                    notes.append(f"not watching {name}: {note}")
                partition.stop(state, note)
                partition.committed = partition.announced = None
                continue
            moved = partition.committed != start
            if not moved and partition.state in (WATCHED, BLOCKED):
                continue
            previous = partition.committed
            partition.committed = start
            self.recheck = True
            if partition.state != WATCHED:
                partition.state, partition.note, partition.announced = WATCHED, "", None
                partition.rebase(start)
                notes.append(f"watching {name} from the committed position {start.describe()}")
                continue
            partition.headroom = None  # it was measured for the previous position
            if previous is not None and position_order(start) < position_order(previous):
                # Moved back (mongocdc offsets set): what lies after it is pending again.
                partition.announced = None
                partition.rebase(start)
                notes.append(
                    f"the committed position of {name} moved back to {start.describe()}: counting from it again"
                )
                continue
            announced = partition.announced
            if announced is not None and position_order(start) >= position_order(announced):
                partition.announced = announced = None  # a window committed past the last event's changes
            base = (
                announced
                if announced is not None and position_order(announced) > position_order(start)
                else start
            )
            if position_order(base) > position_order(partition.counting_from):
                partition.rebase(base)  # a window carried what was counted: count what is left
        notes.extend(self._settle(now))
        return notes

    def incremental(self, marker: str | None, note: str, now: float) -> list[str]:
        """The connector's incremental snapshot: ``marker`` while one is requested or running
        (changing as windows move it on), None without one. Returns the lines to log."""
        notes: list[str] = []
        if marker is not None and len(self.partitions) > 1:
            marker = None  # windows of several streams do not run incremental snapshots
        if (marker is None) != (self.incremental_work is None):
            notes.append(
                f"an incremental snapshot is to be copied ({note}): asking for windows until it is done"
                if marker is not None
                else "no incremental snapshot to copy"
            )
        self.incremental_work, self.incremental_note = marker, note
        notes.extend(self._settle(now))
        return notes

    def window_open(self, window: Mapping | None) -> list[str]:
        """The connector's open window as the offsets topic shows it (None: none is open), or the
        window killed while open whose task still holds the lease (``killed``: its retry is due).
        Returns the lines to log: when one opens, is found killed, and closes."""
        notes: list[str] = []
        was, kind = _window_kind(self.open_window), _window_kind(window)
        if kind != was:
            if kind == OPEN:
                notes.append(f"{describe_open_window(window)}; no event while it is open")
            elif kind == KILLED:
                notes.append(
                    f"{describe_open_window(window)}; no event meanwhile (without a retry the lease "
                    "frees itself at its expiry)"
                )
            elif was == KILLED:
                notes.append(
                    "the killed window holds no event back any more (its retry closed it, or its "
                    "lease was released or expired): counting changes for the next window"
                )
            else:
                notes.append("the open window closed: counting changes for the next window")
        if window is not None and self.open_window is None:
            # The open window reads each change as it comes: the streams rest while it is open and
            # are opened again when it closes, from the position it committed (a commit moves
            # ``open_at`` with the rebase) or else from the last change read.
            for partition in self.partitions.values():
                if partition.state == WATCHED:
                    partition.open_at = partition.read_to
        self.open_window = dict(window) if window is not None else None
        return notes

    def checked(self, report: GapReport) -> list[str]:
        """The oplog check of the committed positions: a purged one blocks its stream (said once,
        in words: the watchdog's re-snapshot repairs it); the others' headroom is kept."""
        notes: list[str] = []
        for check in report.checks:
            partition = self.partitions.get(check.partition.rs)
            if partition is None or partition.state != WATCHED or check.position != partition.committed:
                continue
            if check.status == GAP:
                notes.extend(
                    self.blocked(
                        partition.name, f"the stored position is no longer in the oplog: {check.note}"
                    )
                )
            elif check.status == OK and check.headroom_seconds is not None:
                partition.headroom = (check.headroom_seconds, check.position)
        return notes

    def blocked(self, name: str, cause: str) -> list[str]:
        """A stream that cannot continue from its committed position (purged, or refused): no event
        until that position changes."""
        partition = self.partitions[name]
        if partition.state == BLOCKED:
            return []
        repair = (
            f"the oplog gap watchdog ({self.watchdog}) triggers the re-snapshot"
            if self.watchdog
            else "a re-snapshot (gap mode) repairs it"
        )
        note = f"{cause}. No window can continue from it, so no event is sent for it; {repair}, and watching resumes when the offset changes"
        partition.stop(BLOCKED, note)
        return [f"not watching {name}: {note}"]

    def opened(self, name: str) -> None:
        """The driver opened ``name``'s stream at :attr:`PartitionWatch.open_at`."""
        self.partitions[name].open_at = None

    def reopen(self, name: str) -> None:
        """The stream of ``name`` was interrupted: read on from the last change read."""
        partition = self.partitions[name]
        if partition.state == WATCHED:
            partition.open_at = partition.read_to

    def counted(
        self,
        name: str,
        count: int,
        oldest: Timestamp | None,
        newest: Timestamp | None,
        read_to: Position | None,
    ) -> None:
        """``count`` more pending changes of ``name`` (the first's and last's cluster times), its
        stream now after ``read_to``."""
        partition = self.partitions[name]
        if partition.state != WATCHED:
            return
        partition.count += count
        if partition.oldest is None:
            partition.oldest = oldest
        partition.newest = newest or partition.newest
        partition.read_to = read_to or partition.read_to

    # -- outputs -----------------------------------------------------------------------------------
    def to_open(self) -> dict[str, Position]:
        """The streams to (re)open, and where: none while a window is open."""
        if self.open_window is not None:
            return {}
        return {
            name: p.open_at
            for name, p in self.partitions.items()
            if p.state == WATCHED and p.open_at is not None
        }

    def offsets_due(self, now: float) -> bool:
        """Whether the offsets topic is read at this poll, besides the periodic check: while an
        event waits for its window (to notice the window's commit at once), and while a window is
        open once its next commit is due (:func:`next_commit_due`: it may have closed by then; a
        window that keeps committing moves that time on, so a long open window is read about once
        per idle time, not at every poll); at every poll while a killed window waits for its retry
        (the retry's first commit is noticed at once)."""
        if self.outstanding is not None:
            return True
        if self.open_window is None:
            return False
        if self.open_window.get("killed"):
            return True
        due = next_commit_due(self.open_window)
        return due is None or now >= due.timestamp()

    def watched(self) -> list[str]:
        return [name for name, p in self.partitions.items() if p.state == WATCHED]

    def streaming(self) -> list[str]:
        """The streams to read now: the watched ones, none while a window is open."""
        return [] if self.open_window is not None else self.watched()

    @property
    def pending(self) -> int:
        return sum(p.count for p in self.partitions.values() if p.state == WATCHED)

    @property
    def oldest(self) -> Timestamp | None:
        return min((p.oldest for p in self.partitions.values() if p.oldest is not None), default=None)

    def due(self, now: float) -> list[str]:
        """The thresholds reached (empty: no window is due). Nothing is due while the last event
        waits for its window, while a window is open (it carries the changes as they come), or
        while a stream is waiting or blocked (a window would fail)."""
        self._settle(now)
        if self.outstanding is not None or self.open_window is not None or not self.partitions:
            return []
        if any(p.state in (WAITING, BLOCKED) for p in self.partitions.values()):
            return []
        settings = self.settings
        reasons = []
        if self.pending >= settings.min_changes:
            reasons.append(MIN_CHANGES)
        oldest = self.oldest
        if oldest is not None and now - oldest.time >= settings.max_delay_s:
            reasons.append(MAX_DELAY)
        if self._low_headroom(now) is not None:
            reasons.append(MIN_HEADROOM)
        if self.incremental_work is not None:
            reasons.append(INCREMENTAL_SNAPSHOT)
        return reasons

    def fire(self, reasons: list[str], now: float) -> dict:
        """The event of a window request (``due``'s reasons); counting goes on after its changes."""
        watched = [p for p in self.partitions.values() if p.state == WATCHED]
        payload = {
            "connector": self.connector,
            "reason": reasons[0],
            "reasons": list(reasons),
            "message": self._message(reasons, now),
            "pending": self.pending,
            "pending_since": _time(self.oldest),
            "newest_change": _time(max((p.newest for p in watched if p.newest), default=None)),
            "headroom_seconds": min((p.headroom[0] for p in watched if p.headroom), default=None),
            "incremental_snapshot": self.incremental_note if self.incremental_work is not None else None,
            "partitions": {p.name: p.to_dict() for p in watched},
            "at": iso_z(datetime.fromtimestamp(now, timezone.utc)),
        }
        announced = {}
        for p in watched:
            if p.count:
                p.announced = announced[p.name] = p.read_to
                p.counting_from = p.read_to
                p.count, p.oldest, p.newest = 0, None, None
        self.outstanding = Outstanding(
            now, announced, {p.name: p.committed for p in watched}, self.incremental_work
        )
        self.events += 1
        self.last_event_at = now
        return payload

    def report(self, now: float) -> dict:
        """What the watcher counts now, for readers of the offsets topic (the MongoDB CDC page):
        the pending changes and since when, each stream's state, whether an event waits for its
        window, the last event. ``at``: when it was counted."""
        oldest = self.oldest
        return {
            "connector": self.connector,
            "at": iso_z(datetime.fromtimestamp(now, timezone.utc)),
            "pending": self.pending,
            "pending_since": _time(oldest),
            "partitions": {
                p.name: {"state": p.state, "pending": p.count, "since": _time(p.oldest), "note": p.note}
                for p in self.partitions.values()
            },
            "waiting_for_window": self.outstanding is not None,
            "last_event_at": iso_z(datetime.fromtimestamp(self.last_event_at, timezone.utc))
            if self.last_event_at is not None
            else None,
            "incremental_snapshot": self.incremental_note if self.incremental_work is not None else None,
            "open_window": self._open_window_status(),
        }

    def _open_window_status(self) -> dict | None:
        """The open window as the status and the page show it: since when, events so far, the
        committed lag at its last commit (seconds), who holds it, and whether it was killed (its
        retry due)."""
        window = self.open_window
        if window is None:
            return None
        keys = ("since", "events", "commits", "last_commit_at", "lag_seconds", "held_by")
        return {**{key: window.get(key) for key in keys}, "killed": bool(window.get("killed"))}

    def status(self, now: float, polls: int) -> str:
        """One line for the log: what is pending, what is watched, the last event."""
        parts = [f"{self.pending} change(s) pending"]
        oldest = self.oldest
        if oldest is not None:
            parts[0] += f" since {_time(oldest)} ({describe_seconds(max(0, now - oldest.time))} ago)"
        for p in self.partitions.values():
            if p.state == WATCHED:
                headroom = f", headroom {describe_seconds(p.headroom[0])}" if p.headroom else ""
                parts.append(f"{p.name} counted after {_time(position_time(p.counting_from))}{headroom}")
            else:
                parts.append(f"{p.name} not watched ({p.state})")
        if self.open_window is not None:
            parts.append(describe_open_window(self.open_window))
        if self.outstanding is not None:
            parts.append(
                f"waiting {describe_seconds(now - self.outstanding.at)} for a window to commit past the last event"
            )
        elif self.last_event_at is not None:
            parts.append(f"no event for {describe_seconds(now - self.last_event_at)}")
        else:
            parts.append("no event yet")
        parts.append(f"{polls} polls")
        return "; ".join(parts)

    # -- rules -------------------------------------------------------------------------------------
    def _settle(self, now: float) -> list[str]:
        """Forget the last event once a window has committed past its changes (for an event without
        changes: once a committed position moved); ask again after ``refire_after`` without."""
        outstanding = self.outstanding
        if outstanding is None:
            return []
        if outstanding.announced:
            settled = all(
                self.partitions[name].announced is None or self.partitions[name].state != WATCHED
                for name in outstanding.announced
            )
        else:
            settled = any(
                self.partitions[name].committed != committed
                for name, committed in outstanding.committed.items()
            )
        if outstanding.incremental is not None and self.incremental_work != outstanding.incremental:
            settled = True  # a window moved the incremental snapshot on (or it ended)
        if settled:
            self.outstanding = None
            return []
        if now - outstanding.at < self.settings.refire_after_s:
            return []
        self.outstanding = None
        for name in outstanding.announced:
            partition = self.partitions[name]
            if partition.state == WATCHED and partition.committed is not None:
                partition.announced = None
                partition.rebase(partition.committed)  # the event's changes count again
        return [
            f"no window committed past the last event within {describe_seconds(self.settings.refire_after_s)} "
            "(did its run fail?): counting from the committed positions again"
        ]

    def _low_headroom(self, now: float) -> PartitionWatch | None:
        """A stream whose committed position leaves the oplog within ``min_headroom`` and for which a
        window gains at least as much headroom as is left (the position is at least as old as its
        headroom: with an oplog shorter than ``min_headroom`` windows run every half oplog)."""
        limit = self.settings.min_headroom_s
        if not limit:
            return None
        for p in self.partitions.values():
            if p.state != WATCHED or p.headroom is None or p.headroom[1] != p.committed:
                continue
            seconds, position = p.headroom
            stored = position_time(position)
            if stored is None:
                continue
            if seconds < limit and now - stored.time >= seconds:
                return p
        return None

    def _message(self, reasons: list[str], now: float) -> str:
        settings = self.settings
        texts = []
        oldest = self.oldest
        since = f" since {_time(oldest)}" if oldest is not None else ""
        for reason in reasons:
            if reason == MIN_CHANGES:
                texts.append(f"{self.pending} changes pending{since} (min_changes {settings.min_changes})")
            elif reason == MAX_DELAY:
                age = describe_seconds(max(0, now - oldest.time))
                texts.append(
                    f"{self.pending} change(s) pending{since}, the oldest {age} old "
                    f"(max_delay {describe_seconds(settings.max_delay_s)})"
                )
            elif reason == INCREMENTAL_SNAPSHOT:
                texts.append(f"an incremental snapshot is to be copied ({self.incremental_note})")
            elif reason == MIN_HEADROOM:
                low = self._low_headroom(now)
                texts.append(
                    f"the stored position of {low.name} leaves the oplog in about "
                    f"{describe_seconds(low.headroom[0])} at the current rate "
                    f"(min_headroom {describe_seconds(settings.min_headroom_s)})"
                )
        return "; ".join(texts)
