"""The change watcher's thresholds, its stream and its decisions (core/watch), without servers: when
it asks for a window, what its event says, one event per window, and when it stays quiet."""

from __future__ import annotations

from pathlib import Path

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.durations import parse_duration
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.report import GAP, OK, GapReport, PartitionCheck
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.watch.settings import WatchSettings
from airflow_provider_mongocdc.core.watch.stream import (
    PROJECTION,
    capture_check,
    position_order,
    watch_aggregate,
    watch_pipeline,
)
from airflow_provider_mongocdc.core.watch.watcher import (
    INCREMENTAL_SNAPSHOT,
    MAX_DELAY,
    MIN_CHANGES,
    MIN_HEADROOM,
    ChangeWatch,
)

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
T0 = 1_800_000_000  # a cluster time's seconds (2027-01-15)


def at(seconds: int, inc: int = 1) -> Position:
    return Position(cluster_time=Timestamp(T0 + seconds, inc))


def change(seconds: int, inc: int = 1) -> Position:
    """The position after a change at ``T0 + seconds``: its resume token, as MongoDB writes it."""
    return Position({"_data": f"82{T0 + seconds:08X}{inc:08X}2B0229296E04"}, Timestamp(T0 + seconds, inc))


def watch(**settings) -> ChangeWatch:
    values = {"min_changes": 100, "max_delay_s": 30, "min_headroom_s": 0, "poll_interval_s": 1}
    return ChangeWatch("shop", WatchSettings(**{**values, **settings}), watchdog="mongocdc_watchdog")


def count(w: ChangeWatch, first: int, last: int, n: int, partition: str = "rs0") -> None:
    """``n`` changes of ``partition`` from ``T0 + first`` to ``T0 + last`` seconds."""
    w.counted(partition, n, Timestamp(T0 + first, 1), Timestamp(T0 + last, 1), change(last))


# -- thresholds ---------------------------------------------------------------------------------------
def test_durations_are_seconds_or_a_number_with_a_unit():
    assert [parse_duration(v, "max_delay") for v in (90, 1.5, "90s", "5m", "2h", "1d", " 3 s ")] == [
        90,
        1.5,
        90,
        300,
        7200,
        86400,
        3,
    ]
    for bad in ("soon", "5 minutes", -1, True, None, "1w"):
        with pytest.raises(ConfigError, match="max_delay must be a duration") as error:
            parse_duration(bad, "max_delay")
        assert '"90s", "5m", "2h" or "1d"' in str(error.value)


def test_the_changes_object_of_an_entry():
    settings = WatchSettings.from_entry({"min_changes": 500, "max_delay": "45s", "min_headroom": "2h"})
    assert (settings.min_changes, settings.max_delay_s, settings.min_headroom_s) == (500, 45, 7200)
    assert settings.poll_interval_s == 5 and settings.check_interval_s == 60  # the defaults
    assert WatchSettings.from_entry({}) == WatchSettings()
    with pytest.raises(ConfigError, match="unknown key.*max_wait.*use only min_changes, max_delay"):
        WatchSettings.from_entry({"max_wait": "1m"})
    with pytest.raises(ConfigError, match="min_changes must be a whole number"):
        WatchSettings.from_entry({"min_changes": 0})
    with pytest.raises(ConfigError, match="poll_interval must lie between"):
        WatchSettings.from_entry({"poll_interval": "5m"})
    with pytest.raises(ConfigError, match="max_delay must be longer than 0"):
        WatchSettings.from_entry({"max_delay": 0})
    with pytest.raises(ConfigError, match="'changes' must be a JSON object"):
        WatchSettings.from_entry(["min_changes"])
    # The trigger's arguments give the same settings back.
    assert WatchSettings(**settings.to_kwargs()) == settings


# -- the watcher's stream ----------------------------------------------------------------------------
def test_the_stream_is_the_windows_projected_to_position_time_namespace_and_operation():
    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": "shop",
            "collection.include.list": "shop\\.orders",
            "capture.mode": "change_streams_update_full",
        }
    )
    pipeline, options = watch_aggregate(config, change(5))
    stage = pipeline[0]["$changeStream"]
    assert stage == {
        "fullDocument": "updateLookup",
        "startAfter": change(5).resume_token,
        "allChangesForCluster": True,
    }
    assert pipeline[1:] == watch_pipeline(config) and pipeline[-1] == PROJECTION
    assert "$match" in pipeline[1]  # the connector's filter runs in MongoDB, as for a window
    assert options == {"batchSize": config.max_batch_size}
    # A position with a cluster time only starts at it (inclusive), as a window does.
    pipeline, _ = watch_aggregate(config, at(5))
    assert pipeline[0]["$changeStream"]["startAtOperationTime"] == Timestamp(T0 + 5, 1)

    split = ConnectorConfig.from_properties({"topic.prefix": "shop", "event.oversize.handling.mode": "split"})
    assert watch_pipeline(split)[-2:] == [PROJECTION, {"$changeStreamSplitLargeEvent": {}}]
    scoped = ConnectorConfig.from_properties(
        {"topic.prefix": "shop", "capture.scope": "database", "capture.target": "shop"}
    )
    assert "allChangesForCluster" not in watch_aggregate(scoped, None)[0][0]["$changeStream"]


def test_changes_are_filtered_one_by_one_only_when_the_pipeline_lacks_the_connectors_match():
    assert capture_check(ConnectorConfig.from_properties({"topic.prefix": "shop"})) is None
    user_only = ConnectorConfig.from_properties(
        {
            "topic.prefix": "shop",
            "collection.include.list": "shop\\.orders",
            "cursor.pipeline.order": "user_only",
            "cursor.pipeline": '[{"$match": {"operationType": {"$ne": "drop"}}}]',
            "skipped.operations": "d",
        }
    )
    captured = capture_check(user_only)
    assert captured({"operationType": "insert", "ns": {"db": "shop", "coll": "orders"}})
    assert not captured({"operationType": "insert", "ns": {"db": "shop", "coll": "users"}})
    assert not captured({"operationType": "delete", "ns": {"db": "shop", "coll": "orders"}})
    assert not captured({"operationType": "dropDatabase", "ns": {"db": "shop"}})


def test_positions_sort_as_the_stream_orders_them():
    assert (
        position_order(at(5))
        < position_order(change(5))
        < position_order(change(5, 2))
        < position_order(at(6))
    )


# -- decisions ----------------------------------------------------------------------------------------
def test_quiet_before_the_first_snapshot_then_watching_from_the_committed_position():
    w = watch()
    notes = w.committed({"rs0": "No stored offset for shop/shop/rs0"}, T0)
    assert notes == [
        "not watching rs0: No stored offset for shop/shop/rs0; no event until a window can start from a "
        "committed position"
    ]
    assert w.committed({"rs0": "No stored offset for shop/shop/rs0"}, T0) == []  # said once
    assert w.to_open() == {} and w.due(T0 + 3600) == []
    assert "rs0 not watched (waiting)" in w.status(T0, 12)

    notes = w.committed({"rs0": at(10)}, T0 + 10)
    assert notes == [f"watching rs0 from the committed position {at(10).describe()}"]
    assert w.to_open() == {"rs0": at(10)}
    w.opened("rs0")
    assert w.to_open() == {}


def test_min_changes_and_max_delay_and_what_the_event_says():
    w = watch()
    w.committed({"rs0": at(0)}, T0)
    count(w, 1, 2, 99)
    assert w.due(T0 + 2) == []
    count(w, 3, 4, 1)
    assert w.due(T0 + 4) == [MIN_CHANGES]
    assert w.due(T0 + 31) == [MIN_CHANGES, MAX_DELAY]

    payload = w.fire([MIN_CHANGES, MAX_DELAY], T0 + 31)
    assert payload["reason"] == MIN_CHANGES and payload["reasons"] == [MIN_CHANGES, MAX_DELAY]
    assert payload["pending"] == 100
    assert (
        payload["pending_since"] == "2027-01-15T08:00:01Z"
        and payload["newest_change"] == "2027-01-15T08:00:04Z"
    )
    assert payload["message"] == (
        "100 changes pending since 2027-01-15T08:00:01Z (min_changes 100); 100 change(s) pending since "
        "2027-01-15T08:00:01Z, the oldest 30 s old (max_delay 30 s)"
    )
    assert payload["partitions"]["rs0"]["committed"]["sec"] == T0 and payload["connector"] == "shop"

    # Only the oldest change's age counts for max_delay.
    w2 = watch()
    w2.committed({"rs0": at(0)}, T0)
    count(w2, 10, 10, 1)
    assert w2.due(T0 + 39) == [] and w2.due(T0 + 40) == [MAX_DELAY]


def test_one_event_per_window_and_changes_that_arrive_meanwhile_make_one_next_event():
    w = watch()
    w.committed({"rs0": at(0)}, T0)
    count(w, 1, 5, 100)
    w.fire(w.due(T0 + 5), T0 + 5)
    # More changes while the window runs: counted, but no second event before its commit.
    count(w, 6, 8, 150)
    assert w.pending == 150 and w.due(T0 + 60) == []
    # A commit inside the event's changes (a batch of a long window): still waiting.
    w.committed({"rs0": change(3)}, T0 + 61)
    assert w.outstanding is not None and w.due(T0 + 62) == []
    # The window's end is past the event's changes, before the later ones: they are counted again
    # from the committed position (the stream is reopened there), and one next event is due.
    assert w.committed({"rs0": at(6, 0)}, T0 + 63) == []
    assert w.outstanding is None and w.pending == 0 and w.to_open() == {"rs0": at(6, 0)}
    w.opened("rs0")
    count(w, 6, 8, 150)
    assert w.due(T0 + 63) == [MIN_CHANGES, MAX_DELAY]


def test_a_window_that_carried_everything_leaves_nothing_pending():
    w = watch()
    w.committed({"rs0": at(0)}, T0)
    count(w, 1, 5, 100)
    w.fire(w.due(T0 + 5), T0 + 5)
    count(w, 6, 8, 3)  # before the window's end: the window carries them too
    w.committed({"rs0": at(20, 0)}, T0 + 25)
    assert w.pending == 0 and w.due(T0 + 120) == []


def test_the_event_is_sent_again_when_no_window_commits_within_refire_after():
    w = watch(refire_after_s=600)
    w.committed({"rs0": at(0)}, T0)
    count(w, 1, 5, 100)
    w.fire(w.due(T0 + 5), T0 + 5)
    assert w.due(T0 + 604) == []
    assert w.due(T0 + 605) == []  # the event's changes count again, from the committed position
    assert w.to_open() == {"rs0": at(0)} and w.pending == 0
    w.opened("rs0")
    count(w, 1, 5, 100)
    assert w.due(T0 + 606) == [MIN_CHANGES, MAX_DELAY]


def headroom_report(position: Position, seconds: int, status: str = OK, note: str = "") -> GapReport:
    check = PartitionCheck(
        OffsetPartition("shop", "rs0"), status, position, headroom_seconds=seconds, note=note
    )
    return GapReport("shop", (check,))


def test_min_headroom_asks_for_a_window_before_the_position_leaves_the_oplog():
    w = watch(min_headroom_s=3600)
    w.committed({"rs0": at(0)}, T0)
    assert w.recheck  # a new committed position: its oplog check is due
    w.recheck = False  # (the driver checks)
    assert w.checked(headroom_report(at(0), 4000)) == []
    assert w.due(T0 + 4000) == []  # enough headroom
    w.checked(headroom_report(at(0), 1800))
    # A window would gain less than is left (the position is younger than its headroom): not yet.
    assert w.due(T0 + 1799) == []
    assert w.due(T0 + 1800) == [MIN_HEADROOM]
    payload = w.fire([MIN_HEADROOM], T0 + 1800)
    assert payload["headroom_seconds"] == 1800 and payload["pending"] == 0
    assert payload["message"] == (
        "the stored position of rs0 leaves the oplog in about 30 min at the current rate (min_headroom 1 h 0 min)"
    )
    assert w.due(T0 + 1900) == []  # waiting for the window
    w.committed({"rs0": at(1850, 0)}, T0 + 1900)  # it committed: the old measure no longer applies
    assert w.recheck and w.due(T0 + 1900) == []
    # A check of another position than the committed one is ignored.
    w.checked(headroom_report(at(0), 10))
    assert w.due(T0 + 1901) == []


def test_a_purged_position_is_said_once_and_left_to_the_watchdog():
    w = watch()
    w.committed({"rs0": at(0)}, T0)
    count(w, 1, 5, 500)
    purged = headroom_report(
        at(0), None, GAP, "stored position cluster time ... is no longer in the oplog: 2h of history lost"
    )
    (note,) = w.checked(purged)
    assert note.startswith("not watching rs0: the stored position is no longer in the oplog: stored position")
    assert (
        "no event is sent for it; the oplog gap watchdog (mongocdc_watchdog) triggers the re-snapshot" in note
    )
    assert w.checked(purged) == [] and w.committed({"rs0": at(0)}, T0 + 5) == []  # said once
    assert w.due(T0 + 3600) == [] and w.to_open() == {}
    # The re-snapshot moved the offset: watching again from there.
    assert w.committed({"rs0": at(7200)}, T0 + 7200) == [
        f"watching rs0 from the committed position {at(7200).describe()}"
    ]


def test_per_shard_streams_add_up_and_a_shard_without_offset_keeps_the_watcher_quiet():
    w = watch()
    w.committed({"shard0": at(0), "shard1": at(0)}, T0)
    count(w, 1, 2, 60, "shard0")
    count(w, 3, 4, 40, "shard1")
    assert w.pending == 100 and w.due(T0 + 5) == [MIN_CHANGES]
    payload = w.fire([MIN_CHANGES], T0 + 5)
    assert {name: p["pending"] for name, p in payload["partitions"].items()} == {"shard0": 60, "shard1": 40}
    # Both streams must be committed past the event before another one.
    w.committed({"shard0": at(10, 0), "shard1": at(0)}, T0 + 10)
    assert w.outstanding is not None
    w.committed({"shard0": at(10, 0), "shard1": at(10, 0)}, T0 + 11)
    assert w.outstanding is None
    # A shard added without an offset: a window would fail, so no event.
    w.committed(
        {"shard0": at(10, 0), "shard1": at(10, 0), "shard2": "No stored offset for shop/shop/shard2"}, T0 + 12
    )
    count(w, 12, 13, 500, "shard0")
    assert w.due(T0 + 60) == []


# -- a position moved by hand, incremental snapshots, the next run -------------------------------------
def test_a_committed_position_moved_back_is_counted_from_again():
    # mongocdc offsets set moves the position back: the changes after it are to be read again.
    w = watch()
    w.committed({"rs0": at(100)}, T0 + 100)
    w.opened("rs0")
    count(w, 101, 110, 5)
    notes = w.committed({"rs0": at(10)}, T0 + 111)
    assert notes == [
        f"the committed position of rs0 moved back to {at(10).describe()}: counting from it again"
    ]
    assert w.to_open() == {"rs0": at(10)} and w.pending == 0
    w.opened("rs0")
    count(w, 10, 110, 100)  # what lies after the new position, read again
    assert w.due(T0 + 111) == [MIN_CHANGES, MAX_DELAY]
    # Forward past what was read: counted from there (unchanged).
    w.fire(w.due(T0 + 111), T0 + 111)
    w.committed({"rs0": at(200)}, T0 + 200)
    assert w.to_open() == {"rs0": at(200)} and w.outstanding is None


def test_a_position_moved_back_while_an_event_waits_for_its_window_counts_again():
    w = watch()
    w.committed({"rs0": at(100)}, T0 + 100)
    w.opened("rs0")
    count(w, 101, 110, 100)
    w.fire(w.due(T0 + 110), T0 + 110)
    w.committed({"rs0": at(50)}, T0 + 111)
    assert w.outstanding is None and w.to_open() == {"rs0": at(50)}


def test_windows_are_asked_for_while_an_incremental_snapshot_is_requested_or_running():
    # Quiet collections: no change pending, yet the snapshot moves on only in windows.
    w = watch()
    w.committed({"rs0": at(0)}, T0)
    w.opened("rs0")
    assert w.due(T0 + 1) == []
    notes = w.incremental("requested:r1", "r1, requested", T0 + 1)
    assert notes == [
        "an incremental snapshot is to be copied (r1, requested): asking for windows until it is done"
    ]
    assert w.due(T0 + 1) == [INCREMENTAL_SNAPSHOT]
    payload = w.fire(w.due(T0 + 1), T0 + 1)
    assert payload["reason"] == INCREMENTAL_SNAPSHOT and payload["pending"] == 0
    assert payload["incremental_snapshot"] == "r1, requested"
    assert payload["message"] == "an incremental snapshot is to be copied (r1, requested)"
    # One window at a time: nothing until a window moved it on.
    assert w.incremental("requested:r1", "r1, requested", T0 + 2) == [] and w.due(T0 + 2) == []
    w.incremental("running:r1:1:1024:0", "r1, 1024 documents in 1 chunks so far", T0 + 30)
    assert w.due(T0 + 30) == [INCREMENTAL_SNAPSHOT]
    w.fire([INCREMENTAL_SNAPSHOT], T0 + 30)
    # A window that committed its position (even without a chunk) is the window asked for.
    w.committed({"rs0": at(40, 0)}, T0 + 41)
    assert w.due(T0 + 41) == [INCREMENTAL_SNAPSHOT]
    # Completed (or stopped): no more windows for it.
    assert w.incremental(None, "", T0 + 60) == ["no incremental snapshot to copy"]
    assert w.due(T0 + 60) == []


def test_several_streams_ask_for_no_window_for_an_incremental_snapshot():
    # Windows of several streams do not run incremental snapshots: asking would only spin.
    w = watch()
    w.committed({"shard0": at(0), "shard1": at(0)}, T0)
    w.incremental("requested:r1", "r1, requested", T0)
    assert w.due(T0 + 1) == []


def test_changes_of_a_running_window_start_the_next_run_when_they_reach_a_threshold():
    # What README says of the next run: the changes that arrive while a window runs make at most
    # one next run, asked for once they reach a threshold; at once when the oldest is already
    # max_delay old when the window commits.
    w = watch(max_delay_s=30)
    w.committed({"rs0": at(0)}, T0)
    w.opened("rs0")
    count(w, 1, 5, 100)
    w.fire(w.due(T0 + 5), T0 + 5)
    count(w, 10, 12, 3)  # during the window, after its end
    w.committed({"rs0": at(9, 0)}, T0 + 14)
    w.opened("rs0")
    count(w, 10, 12, 3)
    assert w.due(T0 + 14) == []  # 3 changes, the oldest 4 s old: not yet
    assert w.due(T0 + 40) == [MAX_DELAY]  # its max_delay: the one next run
    readme = (REPO / "README.md").read_text()
    assert "started as soon as that window is done" not in readme
    assert "once they reach a threshold" in " ".join(readme.split())
