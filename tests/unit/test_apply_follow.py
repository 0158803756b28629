"""The table follower's passes (core/apply/follow.py): a table is applied when its topic moved,
at most every ``every_s``, and every table once more when the window closed."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.apply.follow import Follower

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_tables_are_applied_when_their_topic_moved_and_all_once_more_at_the_close():
    clock = Clock()
    ends = {"t.a": {0: 5}, "t.b": {0: 3}}
    applied: list[str] = []
    waits: list[float] = []
    moves = iter([{"t.a": {0: 7}}, {}, {"t.b": {0: 9}}])

    def closed(timeout_s: float) -> bool:
        waits.append(timeout_s)
        clock.now += timeout_s
        if len(waits) == 1:
            return False  # the first pass: both topics are new
        try:
            ends.update(next(moves))
        except StopIteration:
            return True
        return False

    def apply(topic: str) -> dict:
        applied.append(topic)
        clock.now += 0.5  # a pass takes time: the next one waits the rest of every_s
        return {"topic": topic, "events": 2, "commits": 1, "events_by_op": {"c": 2}, "behind": 0}

    summary = Follower(lambda: sorted(ends), lambda topics: dict(ends), apply, closed, 5.0, clock).run()

    # First pass: both (new); then a only (it moved), nothing, b only; at the close: both again.
    assert applied == ["t.a", "t.b", "t.a", "t.b", "t.a", "t.b"]
    assert waits[0] == 0.0 and all(0.0 <= wait <= 5.0 for wait in waits)
    assert waits[2] == 4.5  # every_s from the start of the pass before, which took 0.5 s
    by_topic = {table["topic"]: table for table in summary["tables"]}
    assert by_topic["t.a"]["passes"] == 3 and by_topic["t.a"]["events"] == 6
    assert by_topic["t.a"]["events_by_op"] == {"c": 6}
    assert summary["events"] == 12 and summary["commits"] == 6 and summary["behind"] == 0
