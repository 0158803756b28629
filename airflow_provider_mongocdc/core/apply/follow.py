"""Tables that follow their topics while a window is open.

An open window streams for up to its maximum open time; the apply after it would leave the tables
that far behind the topics. While the window is open, a follower beside it (a process of the
window's application, :mod:`airflow_provider_mongocdc.spark_apps.delta_follow`) applies each
table again whenever its topic's last stable offset moved, at most every ``every_s`` seconds, and
once more when the window has closed. Each pass is one table's apply as the ``delta_apply`` task
runs it (:class:`~airflow_provider_mongocdc.core.apply.run.TableApply`: from the table's recorded
positions to the topic's last stable offset, in commits that record the positions they reach), so
exactly once and one MongoDB transaction per commit hold as for every apply, and a killed follower
leaves each table at its last commit. The follower is the tables' only writer while the window
runs: the ``delta_apply`` task runs after the window, in the connector's pool, and finds what is
left. docs/design.md, "Tables that follow an open window".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger("airflow_provider_mongocdc.apply")

# Summary fields added up over a table's passes.
_TOTALS = ("events", "rows_written", "rows_deleted", "rows_swept", "commits", "updates_without_document")


@dataclass
class TableFollow:
    """What the follower knows of one table: its last pass's summary and the totals of all."""

    topic: str
    ends: Mapping[int, int] = field(default_factory=dict)  # the stable ends its last pass read to
    passes: int = 0
    summary: dict[str, Any] = field(default_factory=dict)


def merge_pass(follow: TableFollow, summary: Mapping[str, Any]) -> None:
    """A table's pass into what the follower reports of it (the last pass's fields, summed totals)."""
    merged = dict(summary)
    for name in _TOTALS:
        merged[name] = int(follow.summary.get(name) or 0) + int(summary.get(name) or 0)
    ops = dict(follow.summary.get("events_by_op") or {})
    for op, count in (summary.get("events_by_op") or {}).items():
        ops[op] = ops.get(op, 0) + count
    merged["events_by_op"] = ops
    merged["notes"] = list(follow.summary.get("notes") or []) + [
        note for note in summary.get("notes") or [] if note not in (follow.summary.get("notes") or [])
    ]
    follow.summary = merged
    follow.passes += 1


class Follower:
    """Applies the tables whose topics moved, pass after pass, until the window closed.

    ``topics()``: the connector's collection topics the tables follow (read each pass: a collection
    may appear while the window is open); ``stable_ends(topics)``: each topic's last stable offset
    per partition; ``apply(topic)``: one table's apply, its summary; ``closed(timeout_s)``: waits
    up to ``timeout_s`` and says whether the window closed (then one last pass applies every table).
    """

    def __init__(
        self,
        topics: Callable[[], list[str]],
        stable_ends: Callable[[list[str]], Mapping[str, Mapping[int, int]]],
        apply: Callable[[str], Mapping[str, Any]],
        closed: Callable[[float], bool],
        every_s: float,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.topics = topics
        self.stable_ends = stable_ends
        self.apply = apply
        self.closed = closed
        self.every_s = every_s
        self.clock = clock
        self.tables: dict[str, TableFollow] = {}

    def run(self) -> dict[str, Any]:
        """Pass after pass while the window is open, then the last one; the summary of each table."""
        last = self.clock() - self.every_s
        while True:
            wait = max(0.0, last + self.every_s - self.clock())
            if self.closed(wait):
                break
            last = self.clock()
            self.step(every=False)
        self.step(every=True)
        return self.report()

    def step(self, every: bool) -> None:
        """One pass: every table whose topic's last stable offset moved since its last pass (with
        ``every``: each table, once more)."""
        topics = self.topics()
        ends = self.stable_ends(topics) if topics else {}
        for topic in topics:
            follow = self.tables.setdefault(topic, TableFollow(topic))
            current = dict(ends.get(topic) or {})
            if current == dict(follow.ends) and not every:
                continue
            merge_pass(follow, self.apply(topic))
            follow.ends = current

    def report(self) -> dict[str, Any]:
        tables = []
        for follow in sorted(self.tables.values(), key=lambda item: item.topic):
            shown = dict(follow.summary)
            shown["passes"] = follow.passes
            tables.append(shown)
        summary: dict[str, Any] = {"tables": tables}
        for name in _TOTALS:
            summary[name] = sum(int(table.get(name) or 0) for table in tables)
        summary["behind"] = sum(int(table.get("behind") or 0) for table in tables)
        return summary
