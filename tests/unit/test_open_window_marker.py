"""The open window's marker in the offsets topic (core/offsets/open_window.py) and what the change
watcher makes of it, without servers: who counts it as open, and for how long after a kill."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, Lease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.open_window import (
    OPEN_GRACE_S,
    killed_window_of,
    open_marker,
    open_window_of,
)
from airflow_provider_mongocdc.core.watch.settings import WatchSettings
from airflow_provider_mongocdc.core.watch.watcher import MAX_DELAY, ChangeWatch

pytestmark = pytest.mark.unit

NOW = datetime(2027, 1, 15, 10, 0, tzinfo=timezone.utc)
PARTITION = OffsetPartition("shop", "rs0")


def marker(**changes) -> dict:
    values = dict(
        since=NOW - timedelta(minutes=5),
        now=NOW,
        events=120,
        commits=40,
        lag_ms=900,
        next_commit_within_s=32,
        closes_by=NOW + timedelta(minutes=45),
    )
    return open_marker(**{**values, **changes})


def lease(kind: str = WINDOW, left_s: float = 600) -> Lease:
    return Lease("dag/run/window", kind, NOW - timedelta(minutes=5), NOW + timedelta(seconds=left_s))


def state(open_window) -> OffsetState:
    return OffsetState(position=Position(cluster_time=Timestamp(1_800_000_000, 1)), open_window=open_window)


def test_the_marker_counts_until_the_next_commit_is_overdue_and_never_past_its_maximum_open_time():
    stored = marker()
    assert stored["until"] == "2027-01-15T10:01:02Z"  # 32 s + the grace of 30 s
    assert stored["since"] == "2027-01-15T09:55:00Z" and stored["events"] == 120 and stored["lag_ms"] == 900
    near_the_end = marker(closes_by=NOW + timedelta(seconds=5))
    assert near_the_end["until"] == f"2027-01-15T10:00:{5 + int(OPEN_GRACE_S):02d}Z"
    # It survives the offset state's JSON (what a reader of the offsets topic gets).
    assert OffsetState.from_bytes(state(stored).to_bytes()).open_window == stored
    assert "open_window" not in state(None).to_json()


def test_an_open_window_counts_with_a_live_window_lease_and_its_marker_before_until():
    states = [(PARTITION, state(marker()))]
    window = open_window_of(states, lease(), NOW)
    assert window["since"] == "2027-01-15T09:55:00Z" and window["events"] == 120
    assert window["commits"] == 40 and window["lag_seconds"] == 0.9
    assert window["held_by"] == "dag/run/window" and set(window["partitions"]) == {"rs0"}
    # A killed window: its marker stays, but counts no longer once its lease expired ...
    assert open_window_of(states, lease(left_s=-1), NOW) is None
    # ... or once its next commit is overdue (before the lease expires) ...
    assert open_window_of(states, lease(), NOW + timedelta(seconds=63)) is None
    # ... and a failed window released its lease at once; a snapshot's lease is no open window.
    assert open_window_of(states, None, NOW) is None
    assert open_window_of(states, lease(SNAPSHOT), NOW) is None
    # A closed window removed its marker.
    assert open_window_of([(PARTITION, state(None))], lease(), NOW) is None


def test_the_watcher_asks_for_no_window_while_one_is_open_and_says_when_it_opens_and_closes():
    w = ChangeWatch("shop", WatchSettings(min_changes=5, max_delay_s=30, min_headroom_s=0, poll_interval_s=1))
    t0 = 1_800_000_000
    w.committed({"rs0": Position(cluster_time=Timestamp(t0, 1))}, t0)
    w.counted("rs0", 10, Timestamp(t0 + 1, 1), Timestamp(t0 + 2, 1), None)
    window = open_window_of([(PARTITION, state(marker()))], lease(), NOW)
    notes = w.window_open(window)
    assert notes == [
        "a window is open since 2027-01-15T09:55:00Z: 120 events so far in 40 commits, committed lag "
        "0.9 s; no event while it is open"
    ]
    assert w.window_open(window) == []  # said once
    assert w.due(t0 + 60) == []
    assert w.report(t0 + 60)["open_window"]["since"] == "2027-01-15T09:55:00Z"
    assert "a window is open since" in w.status(t0 + 60, 12)
    assert w.window_open(None) == ["the open window closed: counting changes for the next window"]
    assert w.report(t0 + 60)["open_window"] is None
    assert w.due(t0 + 60) == ["min_changes", MAX_DELAY]


def test_the_watcher_reads_no_stream_while_a_window_is_open_and_reads_on_from_its_last_commit():
    w = ChangeWatch("shop", WatchSettings(min_changes=5, max_delay_s=30, min_headroom_s=0, poll_interval_s=1))
    t0 = 1_800_000_000
    start = Position(cluster_time=Timestamp(t0, 1))
    w.committed({"rs0": start}, t0)
    assert w.to_open() == {"rs0": start} and w.streaming() == ["rs0"]
    w.opened("rs0")
    read = Position(cluster_time=Timestamp(t0 + 2, 1))
    w.counted("rs0", 10, Timestamp(t0 + 1, 1), Timestamp(t0 + 2, 1), read)
    assert w.to_open() == {}  # the stream stays open while it is read

    window = open_window_of([(PARTITION, state(marker()))], lease(), NOW)
    w.window_open(window)
    # While the window is open the watcher's stream is closed and not opened again ...
    assert w.streaming() == [] and w.to_open() == {}
    # ... also when the window's commits move the committed position on.
    committed = Position(cluster_time=Timestamp(t0 + 40, 1))
    w.committed({"rs0": committed}, t0 + 40)
    assert w.streaming() == [] and w.to_open() == {} and w.pending == 0
    # Closed: the stream is opened again from the window's last commit, counting from there.
    last = Position(cluster_time=Timestamp(t0 + 70, 1))
    w.committed({"rs0": last}, t0 + 70)
    w.window_open(None)
    assert w.streaming() == ["rs0"] and w.to_open() == {"rs0": last} and w.pending == 0


def test_a_window_open_without_a_commit_lets_the_stream_read_on_from_the_last_change_read():
    w = ChangeWatch("shop", WatchSettings(min_changes=5, max_delay_s=30, min_headroom_s=0, poll_interval_s=1))
    t0 = 1_800_000_000
    w.committed({"rs0": Position(cluster_time=Timestamp(t0, 1))}, t0)
    w.opened("rs0")
    read = Position(cluster_time=Timestamp(t0 + 2, 1))
    w.counted("rs0", 3, Timestamp(t0 + 1, 1), Timestamp(t0 + 2, 1), read)
    w.window_open(open_window_of([(PARTITION, state(marker()))], lease(), NOW))
    assert w.to_open() == {}
    w.window_open(None)  # a killed window: its marker no longer counts, nothing was committed
    assert w.to_open() == {"rs0": read} and w.pending == 3


def test_while_a_window_is_open_the_offsets_are_read_again_when_its_next_commit_is_due():
    w = ChangeWatch("shop", WatchSettings(min_changes=5, max_delay_s=30, min_headroom_s=0, poll_interval_s=5))
    now = NOW.timestamp()
    assert not w.offsets_due(now)  # nothing open, nothing asked for: the periodic check reads them
    # A commit at NOW, due again within 32 s (idle, commit interval, a poll): until then the window
    # cannot have closed, and the offsets are not read at every poll ...
    w.window_open(open_window_of([(PARTITION, state(marker()))], lease(), NOW))
    assert not w.offsets_due(now + 5) and not w.offsets_due(now + 31.9)
    # ... but once it is due (a window closed after its idle time has written its last commit).
    assert w.offsets_due(now + 32) and w.offsets_due(now + 40)
    # A window that keeps committing moves that time on.
    later = NOW + timedelta(seconds=30)
    w.window_open(open_window_of([(PARTITION, state(marker(now=later)))], lease(), later))
    assert not w.offsets_due(now + 40) and w.offsets_due(now + 62)
    # Its maximum open time comes first near the end: due then.
    near_the_end = marker(now=later, closes_by=later + timedelta(seconds=10))
    w.window_open(open_window_of([(PARTITION, state(near_the_end))], lease(), later))
    assert not w.offsets_due(now + 39) and w.offsets_due(now + 40)
    # Several streams: the earliest of their markers.
    other = OffsetPartition("shop", "rs1")
    both = [(PARTITION, state(marker(now=later))), (other, state(marker()))]
    w.window_open(open_window_of(both, lease(), NOW + timedelta(seconds=31)))
    assert w.offsets_due(now + 32)
    # While an event waits for its window, at every poll (its commit is noticed at once).
    w.window_open(None)
    w.committed({"rs0": Position(cluster_time=Timestamp(int(now), 1))}, now)
    w.opened("rs0")
    w.counted("rs0", 10, Timestamp(int(now) + 1, 1), Timestamp(int(now) + 2, 1), None)
    w.fire(w.due(now + 3), now + 3)
    assert w.offsets_due(now + 3)


def test_a_window_killed_while_open_leaves_its_marker_and_its_lease_for_the_retry_of_its_task():
    # SIGKILL of the window task's process group: no last commit removes the marker, no release
    # frees the lease; the lease stays live (until its expiry) and Airflow's retry of the same task
    # instance takes it again. Past the marker's until, that is a killed window, not an open one.
    states = [(PARTITION, state(marker()))]
    later = NOW + timedelta(seconds=63)
    assert open_window_of(states, lease(), later) is None
    killed = killed_window_of(states, lease(), later)
    assert killed["killed"] is True and killed["held_by"] == "dag/run/window"
    assert killed["since"] == "2027-01-15T09:55:00Z" and killed["last_commit_at"] == "2027-01-15T10:00:00Z"
    assert killed["events"] == 120 and killed["lease_expires_at"] == "2027-01-15T10:10:00Z"
    # The retry's new lease (same owner, taken anew) before its window's first commit: the same.
    retry = Lease("dag/run/window", WINDOW, later, later + timedelta(minutes=55))
    assert killed_window_of(states, retry, later)["lease_expires_at"] == "2027-01-15T10:56:03Z"
    # An open window is no killed one; nor is anything without a live window lease or a marker.
    assert killed_window_of(states, lease(), NOW) is None
    assert killed_window_of(states, lease(left_s=-1), later) is None
    assert killed_window_of(states, None, later) is None  # a failed window released its lease
    assert killed_window_of(states, lease(SNAPSHOT), later) is None
    assert killed_window_of([(PARTITION, state(None))], lease(), later) is None


def test_no_event_while_a_killed_window_waits_for_its_retry_and_events_again_once_its_lease_is_gone():
    w = ChangeWatch("shop", WatchSettings(min_changes=5, max_delay_s=30, min_headroom_s=0, poll_interval_s=1))
    t0 = int(NOW.timestamp())
    w.committed({"rs0": Position(cluster_time=Timestamp(t0, 1))}, t0)
    w.window_open(open_window_of([(PARTITION, state(marker()))], lease(), NOW))
    # Killed: the changes after its last commit wait for the retry, which carries them.
    later = NOW + timedelta(seconds=63)
    killed = killed_window_of([(PARTITION, state(marker()))], lease(), later)
    assert w.window_open(killed) == [
        "the window open since 2027-01-15T09:55:00Z (120 events in 40 commits) has not committed "
        "since 2027-01-15T10:00:00Z, and its task still holds the connector's lease (dag/run/window, "
        "until 2027-01-15T10:10:00Z): it was killed, and its retry continues from its last commit; no "
        "event meanwhile (without a retry the lease frees itself at its expiry)"
    ]
    assert w.window_open(killed) == []  # said once
    assert w.due(t0 + 600) == [] and w.streaming() == [] and w.to_open() == {}
    assert w.offsets_due(t0 + 63)  # read at every poll: the retry's marker is noticed at once
    assert "it was killed" in w.status(t0 + 63, 12)
    assert w.report(t0 + 63)["open_window"]["killed"] is True
    # Its retry opened the window again (a new marker): open, still no event.
    reopened = NOW + timedelta(seconds=80)
    window = open_window_of([(PARTITION, state(marker(now=reopened)))], lease(), reopened)
    assert w.window_open(window) == [
        "a window is open since 2027-01-15T09:55:00Z: 120 events so far in 40 commits, committed lag "
        "0.9 s; no event while it is open"
    ]
    assert w.due(t0 + 600) == []
    # Without a retry the lease expires (or is released): counting for the next window again.
    w.window_open(killed)
    assert w.window_open(None) == [
        "the killed window holds no event back any more (its retry closed it, or its lease was "
        "released or expired): counting changes for the next window"
    ]
    w.counted("rs0", 10, Timestamp(t0 + 1, 1), Timestamp(t0 + 2, 1), None)
    assert w.due(t0 + 600) == ["min_changes", MAX_DELAY]
