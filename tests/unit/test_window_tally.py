"""What a stream's window counts as it runs (core/window/summary.py's WindowTally): committed
batches reach the summary, a batch rolled back does not."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.window.summary import WindowTally

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
