"""What a stream's window counts as it runs (core/window/summary.py's WindowTally): committed
batches reach the summary, a batch rolled back does not."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.summary import (
    WindowTally,
    describe_window,
    empty_summary,
    merge_summaries,
)

pytestmark = pytest.mark.unit


def read_batch(tally: WindowTally, changes: int, lags_ms: list[int]) -> None:
    """``changes`` inserts into shop.orders read into the pending batch, with these lags."""
    tally.pending_changes += changes
    for _ in range(changes):
        tally.pending.count_event("c", "shop.orders")
    for lag in lags_ms:
        tally.pending.add_lag(lag, tally.rng)


def test_committed_batches_reach_the_summary_and_a_rolled_back_one_does_not():
    tally = WindowTally()
    read_batch(tally, 3, [10, 20, 30])
    tally.committed(written_bytes=300, transactions=1)
    read_batch(tally, 2, [1000])
    tally.dropped()  # rolled back: the stream reads these changes again
    read_batch(tally, 2, [40])
    tally.committed(written_bytes=200, transactions=0)

    summary = tally.summary(2.5, reconnects=1)

    assert (summary["events"], summary["events_by_op"], summary["events_by_collection"]) == (
        5,
        {"c": 5},
        {"shop.orders": 5},
    )
    assert (summary["transactions"], summary["bytes"], summary["batches_committed"]) == (1, 500, 2)
    assert summary["lag_ms"] == {"p50": 20, "p95": 40, "max": 40}, "a rolled-back lag was counted"
    assert (summary["lag_samples"], summary["lag_count"]) == ([10, 20, 30, 40], 4)
    assert (summary["reconnects"], summary["duration_s"]) == (1, 2.5)
    assert (tally.pending.events, tally.pending_changes) == (0, 0)


def test_the_summary_gives_the_counts_of_a_stream_summary_in_order():
    summary = WindowTally().summary(0.0, reconnects=0)
    assert list(summary) == [
        "events",
        "events_earlier_tries",
        "events_by_op",
        "events_by_collection",
        "tombstones",
        "transactions",
        "heartbeats",
        "skipped_oversize",
        "bytes",
        "batches_committed",
        "reconnects",
        "lag_ms",
        "lag_samples",
        "lag_count",
        "duration_s",
        "phases_s",
    ]
    assert summary["phases_s"] == {"setup": 0.0, "read": 0.0, "build": 0.0, "send": 0.0, "commit": 0.0}


def test_a_retry_of_the_task_instance_counts_what_its_killed_try_committed():
    killed = WindowTally()
    read_batch(killed, 3, [10])
    run = killed.run_record("mongocdc_hourly/r1/window")  # stored with the commit's offset
    killed.committed(written_bytes=300, transactions=0)
    read_batch(killed, 4, [10])  # sent, never committed: the try was killed

    retry = WindowTally()
    retry.carry(run)
    read_batch(retry, 2, [5])
    retry.committed(written_bytes=200, transactions=0)
    summary = retry.summary(1.0, reconnects=0)
    assert (summary["events"], summary["events_earlier_tries"]) == (5, 3)
    assert summary["events_by_collection"] == {"shop.orders": 5} and summary["batches_committed"] == 2
    assert retry.run_record("mongocdc_hourly/r1/window")["events"] == 5


def stream(end: str, **changes) -> dict:
    """A stream's summary of a window opened at 03:58:35 that ended at ``end``."""
    opened_at = datetime(2026, 11, 28, 3, 58, 35, tzinfo=timezone.utc)
    return {**empty_summary("rs0", WindowParams(opened_at), "idle"), "window_end": end, **changes}


def test_an_open_window_ends_where_it_stopped_and_its_lines_are_readable():
    opened = {
        "opened_at": "2026-11-28T03:58:35Z",
        "closed_at": "2026-11-28T04:04:15Z",
        "open_s": 340.0,
        "stop_reason": "idle",
        "events": 2201,
        "commits": 300,
        "committed_lag_ms": None,
        "idle_s": 30.0,
        "max_open_s": 3000.0,
        "commit_interval_s": 1.0,
    }
    position = {"sec": 1795838625, "ord": 4, "resume_token": "82", "time": "2026-11-28T04:03:45Z"}
    summary = merge_summaries(
        [stream("2026-11-28T04:03:45Z", events=2201, end_position=position, open_window=opened)],
        datetime(2026, 11, 28, 3, 58, 35, tzinfo=timezone.utc),
    )
    assert summary["window_end"] == "2026-11-28T04:03:45Z"
    lines = describe_window(summary, "connector default (topic prefix shop)")
    assert lines[0].startswith(
        "Stream window of connector default (topic prefix shop) up to 2026-11-28T04:03:45Z: "
    )
    assert (
        "stream rs0: from no stored position to 2026-11-28T04:03:45Z (cluster time 1795838625:4)" in lines[1]
    )
    assert "last committed lag unknown" in lines[2]

    empty = merge_summaries(
        [empty_summary("rs0", WindowParams(datetime(2026, 11, 28, 4, tzinfo=timezone.utc)), "end_reached")],
        datetime(2026, 11, 28, 4, tzinfo=timezone.utc),
    )
    lines = describe_window(empty, "connector default (topic prefix shop)")
    assert "0 events, in 0 transactions" in lines[0] and "no change read" in lines[0]
    assert not [line for line in lines if "None" in line or "{" in line], lines
