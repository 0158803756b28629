"""A window's run summary: why each stream stopped (:class:`StopReason`), what it emitted
(:class:`WindowStats`, with lag percentiles from a uniform sample), what a stream's window
counts while it runs (:class:`WindowTally`), the window's summary over all of its streams
(:func:`merge_summaries`), and the task log's line about its incremental snapshot
(:func:`describe_incremental`). Summaries are plain JSON-able dicts.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.window.params import WindowParams


class StopReason(str, Enum):
    """Why a stream's window stopped: the summaries' ``stop_reason``. Its members are their
    values as text (``str()``, formatting, JSON), as an ``enum.StrEnum`` (Python 3.11+) is."""

    END_REACHED = "end_reached"
    ALREADY_PAST_END = "already_past_end"
    IDLE_TIMEOUT = "idle_timeout"
    CLUSTER_TIME_STALLED = "cluster_time_stalled"  # idle while the window end lies in the past
    MAX_DURATION = "max_duration"
    INVALIDATED = "invalidated"
    INITIAL_ONLY = "initial_only"
    # Open windows: no change came for their idle time, or they were open their maximum time.
    IDLE = "idle"
    MAX_OPEN = "max_open"

    def __str__(self) -> str:
        return self.value


LAG_SAMPLES = 10_000


@dataclass
class WindowStats:
    """What a window emitted (committed batches only once merged)."""

    events: int = 0
    events_by_op: dict[str, int] = field(default_factory=dict)
    events_by_collection: dict[str, int] = field(default_factory=dict)
    tombstones: int = 0
    transactions: int = 0
    heartbeats: int = 0
    skipped_oversize: int = 0
    bytes: int = 0
    lags_ms: list[int] = field(default_factory=list)
    lag_count: int = 0
    lag_max_ms: int | None = None

    def count_event(self, op: str, collection: str) -> None:
        """One data event of operation ``op`` (``c``, ``u``, ``d``, ``r``) on ``collection``."""
        self.events += 1
        self.events_by_op[op] = self.events_by_op.get(op, 0) + 1
        self.events_by_collection[collection] = self.events_by_collection.get(collection, 0) + 1

    def add_lag(self, lag_ms: int, rng: random.Random) -> None:
        self.lag_count += 1
        self.lag_max_ms = lag_ms if self.lag_max_ms is None else max(self.lag_max_ms, lag_ms)
        if len(self.lags_ms) < LAG_SAMPLES:
            self.lags_ms.append(lag_ms)
        else:  # reservoir sampling keeps a uniform sample of every lag seen
            slot = rng.randrange(self.lag_count)
            if slot < LAG_SAMPLES:
                self.lags_ms[slot] = lag_ms

    def merge(self, other: WindowStats, rng: random.Random) -> None:
        self.events += other.events
        for target, source in (
            (self.events_by_op, other.events_by_op),
            (self.events_by_collection, other.events_by_collection),
        ):
            for key, count in source.items():
                target[key] = target.get(key, 0) + count
        self.tombstones += other.tombstones
        self.transactions += other.transactions
        self.heartbeats += other.heartbeats
        self.skipped_oversize += other.skipped_oversize
        self.bytes += other.bytes
        for lag in other.lags_ms:
            self.add_lag(lag, rng)
        if other.lag_max_ms is not None:
            self.lag_max_ms = max(self.lag_max_ms or 0, other.lag_max_ms)
        self.lag_count += max(0, other.lag_count - len(other.lags_ms))


class WindowTally:
    """What one stream's window counts as it runs: the batch being built (``pending``, and
    ``pending_changes``: the changes read into it), the committed batches (``totals``,
    ``batches_committed``), and the wall seconds by phase (``phases``, the summary's
    ``phases_s``): setup (offsets topic, lease, offset read), build (events), send (to the
    producer), commit (END, offset, commit), read (the rest of the stream loop: waiting for and
    decoding changes). ``rng`` draws the lag samples."""

    def __init__(self) -> None:
        self.pending = WindowStats()
        self.pending_changes = 0
        self.totals = WindowStats()
        self.batches_committed = 0
        self.phases = {"setup": 0.0, "read": 0.0, "build": 0.0, "send": 0.0, "commit": 0.0}
        self.rng = random.Random(0)
        self.earlier_events = 0  # committed by earlier tries of the window's task instance

    def carry(self, run: Mapping[str, Any]) -> None:
        """Count what the earlier tries of the window's task instance committed (an offset state's
        ``run``, see :meth:`run_record`): a killed try's committed events are delivered, and the
        task instance's summary counts them."""
        self.totals = WindowStats(
            events=_number(run.get("events")),
            events_by_op=_table(run.get("events_by_op")),
            events_by_collection=_table(run.get("events_by_collection")),
            tombstones=_number(run.get("tombstones")),
            skipped_oversize=_number(run.get("skipped_oversize")),
        )
        self.batches_committed = _number(run.get("batches"))
        self.earlier_events = self.totals.events

    def run_record(self, task: str) -> dict[str, Any]:
        """What the tries of task instance ``task`` have committed once the pending batch is: the
        ``run`` its commit stores with the offset (events and their counts, commits)."""
        totals, pending = self.totals, self.pending
        record: dict[str, Any] = {"task": task, "events": totals.events + pending.events}
        for name in ("events_by_op", "events_by_collection"):
            table = dict(getattr(totals, name))
            for key, number in getattr(pending, name).items():
                table[key] = table.get(key, 0) + number
            record[name] = table
        record["tombstones"] = totals.tombstones + pending.tombstones
        record["skipped_oversize"] = totals.skipped_oversize + pending.skipped_oversize
        record["batches"] = self.batches_committed + 1
        return record

    def committed(self, written_bytes: int, transactions: int) -> None:
        """The pending batch is committed: ``written_bytes`` in its Kafka transaction, with
        ``transactions`` MongoDB transactions begun in it."""
        pending = self.pending
        pending.bytes = written_bytes
        pending.transactions = transactions
        self.totals.merge(pending, self.rng)
        self.batches_committed += 1
        self.dropped()

    def dropped(self) -> None:
        """The pending batch is gone: committed (counted in ``totals``) or rolled back."""
        self.pending = WindowStats()
        self.pending_changes = 0

    def summary(self, duration_s: float, reconnects: int) -> dict[str, Any]:
        """A stream summary's counts, from ``events`` to ``phases_s``."""
        totals = self.totals
        return {
            "events": totals.events,
            "events_earlier_tries": self.earlier_events,
            "events_by_op": dict(totals.events_by_op),
            "events_by_collection": dict(totals.events_by_collection),
            "tombstones": totals.tombstones,
            "transactions": totals.transactions,
            "heartbeats": totals.heartbeats,
            "skipped_oversize": totals.skipped_oversize,
            "bytes": totals.bytes,
            "batches_committed": self.batches_committed,
            "reconnects": reconnects,
            "lag_ms": percentiles(totals.lags_ms, totals.lag_max_ms),
            "lag_samples": list(totals.lags_ms),
            "lag_count": totals.lag_count,
            "duration_s": round(duration_s, 3),
            "phases_s": {name: round(value, 3) for name, value in self.phases.items()},
        }


def _number(value: Any) -> int:
    """A stored count, 0 for anything else."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _table(value: Any) -> dict[str, int]:
    """A stored table of counts by name, without entries that are not counts."""
    if not isinstance(value, Mapping):
        return {}
    return {str(key): _number(number) for key, number in value.items()}


def percentiles(samples: list[int], maximum: int | None) -> dict[str, int | None]:
    """``{"p50", "p95", "max"}`` (nearest-rank) of lag samples in milliseconds."""
    if not samples:
        return {"p50": None, "p95": None, "max": maximum}
    ordered = sorted(samples)

    def rank(p: float) -> int:
        return ordered[max(0, math.ceil(p * len(ordered)) - 1)]

    return {"p50": rank(0.50), "p95": rank(0.95), "max": maximum if maximum is not None else ordered[-1]}


def _names(names: list[str], shown: int = 5) -> str:
    if len(names) <= shown:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def describe_incremental(incremental: Mapping[str, Any] | None) -> str | None:
    """The task log's line about a window's incremental snapshot (a summary's
    ``incremental_snapshot``): its id, status, collection, documents so far and what is left.
    None when the window had none, or only one that ended in an earlier window."""
    if not incremental or incremental.get("finished_earlier"):
        return None
    status = incremental.get("status")
    total = incremental.get("total_documents", 0)
    window = f"{incremental.get('documents', 0)} in {incremental.get('chunks', 0)} chunk(s) in this window"
    line = f"Incremental snapshot {incremental.get('id')}: {status}"
    if status == "running":
        left = list(incremental.get("left") or [])
        if left:
            line += f", collection {left[0]}" + (f", then {_names(left[1:])}" if left[1:] else "")
        line += f"; {total} documents so far ({window})"
        if incremental.get("reread"):
            line += f"; {incremental['reread']} document(s) to read again"
    else:
        done = list(incremental.get("done") or [])
        line += f" ({incremental['message']})" if incremental.get("message") else ""
        line += f", {len(done)} collection(s) copied" + (f" ({_names(done)})" if done else "")
        line += f"; {total} documents ({window})"
    if incremental.get("error"):
        line += f"; the next chunk was not read: {incremental['error']}"
    return line


def empty_summary(
    partition: str, params: WindowParams, reason: StopReason = StopReason.INITIAL_ONLY
) -> dict[str, Any]:
    """The summary of a stream that read nothing (e.g. streaming disabled by initial_only)."""
    return {
        "partition": partition,
        "replica_set": partition,
        "stop_reason": str(reason),
        "reached_end": reason != StopReason.INITIAL_ONLY,
        "window_end": iso_z(params.window_end),
        "start_position": None,
        "end_position": None,
        "events": 0,
        "events_earlier_tries": 0,
        "events_by_op": {},
        "events_by_collection": {},
        "tombstones": 0,
        "transactions": 0,
        "heartbeats": 0,
        "skipped_oversize": 0,
        "bytes": 0,
        "batches_committed": 0,
        "reconnects": 0,
        "lag_ms": {"p50": None, "p95": None, "max": None},
        "duration_s": 0.0,
    }


def _stream_stats(summary: Mapping[str, Any]) -> WindowStats:
    """What one stream's summary counts, as :class:`WindowStats` to merge."""
    return WindowStats(
        events=summary["events"],
        events_by_op=summary["events_by_op"],
        events_by_collection=summary["events_by_collection"],
        tombstones=summary["tombstones"],
        transactions=summary["transactions"],
        heartbeats=summary["heartbeats"],
        skipped_oversize=summary["skipped_oversize"],
        bytes=summary["bytes"],
        lags_ms=list(summary.get("lag_samples") or []),
        lag_count=summary.get("lag_count", 0),
        lag_max_ms=summary["lag_ms"].get("max"),
    )


def merge_summaries(
    summaries: list[dict[str, Any]], window_end: datetime, duration_s: float | None = None
) -> dict[str, Any]:
    """The window's summary over all of its streams."""
    rng = random.Random(0)
    totals = WindowStats()
    partitions = []
    for summary in sorted(summaries, key=lambda item: item["partition"]):
        totals.merge(_stream_stats(summary), rng)
        partitions.append(
            {key: value for key, value in summary.items() if key not in ("lag_samples", "lag_count")}
        )
    skipped = bool(partitions) and all(item["stop_reason"] == StopReason.INITIAL_ONLY for item in partitions)
    incremental = next(
        (item["incremental_snapshot"] for item in partitions if item.get("incremental_snapshot")), None
    )
    opened = [item["open_window"] for item in partitions if item.get("open_window")]
    if opened:  # an open window ends where its streams stopped (each stream's window_end)
        ends = [parse_iso(item["window_end"]) for item in partitions if item.get("window_end")]
        window_end = max([window_end, *[end for end in ends if end is not None]])
    summary = {
        "status": "skipped" if skipped else "completed",
        "message": (
            "streaming disabled by snapshot.mode=initial_only: the snapshot completed and "
            "no change stream is read"
        )
        if skipped
        else None,
        "window_end": iso_z(window_end),
        "reached_end": all(item["reached_end"] for item in partitions),
        "events": totals.events,
        "events_earlier_tries": sum(item.get("events_earlier_tries", 0) for item in partitions),
        "events_by_op": dict(sorted(totals.events_by_op.items())),
        "events_by_collection": dict(sorted(totals.events_by_collection.items())),
        "tombstones": totals.tombstones,
        "transactions": totals.transactions,
        "heartbeats": totals.heartbeats,
        "skipped_oversize": totals.skipped_oversize,
        "bytes": totals.bytes,
        "batches_committed": sum(item["batches_committed"] for item in partitions),
        "start_position": {item["partition"]: item["start_position"] for item in partitions},
        "end_position": {item["partition"]: item["end_position"] for item in partitions},
        "lag_ms": percentiles(totals.lags_ms, totals.lag_max_ms),
        "duration_s": round(duration_s, 3)
        if duration_s is not None
        else max((item["duration_s"] for item in partitions), default=0.0),
        "incremental_snapshot": incremental,
        "partitions": partitions,
    }
    if opened:
        summary["open_window"] = merge_open_windows(opened)
    return summary


def merge_open_windows(parts: list[Mapping[str, Any]]) -> dict[str, Any]:
    """An open window over all of its streams: opened at the first opening, closed at the last
    close, the events and commits of all, the largest committed lag, each stream's stop reason."""
    lags = [part["committed_lag_ms"] for part in parts if part.get("committed_lag_ms") is not None]
    return {
        "opened_at": min(part["opened_at"] for part in parts),
        "closed_at": max(part["closed_at"] for part in parts),
        "open_s": max(part["open_s"] for part in parts),
        "events": sum(part["events"] for part in parts),
        "commits": sum(part["commits"] for part in parts),
        "committed_lag_ms": max(lags) if lags else None,
        "stop_reasons": sorted({part["stop_reason"] for part in parts}),
        "idle_s": parts[0]["idle_s"],
        "max_open_s": parts[0]["max_open_s"],
        "commit_interval_s": parts[0]["commit_interval_s"],
    }


def counts_words(table: Mapping[str, Any] | None) -> str:
    """``(c 2, u 1)`` of a table of counts, nothing for an empty one."""
    items = sorted((table or {}).items())
    return f" ({', '.join(f'{key} {count}' for key, count in items)})" if items else ""


def position_words(position: Mapping[str, Any] | None) -> str:
    """A summary's position (``describe_position``) in words: its time and cluster time."""
    if not position:
        return "no stored position"
    if position.get("sec") is None:
        return "a resume token without a cluster time"
    words = f"cluster time {position['sec']}:{position.get('ord', 0)}"
    return f"{position['time']} ({words})" if position.get("time") else words


def describe_window(summary: Mapping[str, Any], connector: str) -> list[str]:
    """The task log's lines about a window's summary of ``connector`` (in words, e.g. ``connector
    default (topic prefix shop)``): what it emitted up to where, its lag, each stream's positions,
    its incremental snapshot and its open span; each a readable line (the summary's JSON is the
    task's XCom)."""
    if summary.get("status") == "skipped":
        return [f"Stream window of {connector} skipped: {summary.get('message')}"]
    events = summary.get("events", 0)
    earlier = summary.get("events_earlier_tries") or 0
    line = (
        f"Stream window of {connector} up to {summary.get('window_end')}: {events} events"
        f"{counts_words(summary.get('events_by_op'))}"
    )
    if earlier:
        line += f", {earlier} of them committed by earlier tries"
    line += (
        f", in {summary.get('transactions', 0)} transactions, {summary.get('bytes', 0)} bytes, "
        f"{summary.get('batches_committed', 0)} commits"
    )
    lag = summary.get("lag_ms") or {}
    if lag.get("p50") is not None:
        line += f"; lag p50 {lag['p50']} ms, p95 {lag.get('p95')} ms, max {lag.get('max')} ms"
    else:
        line += "; no change read, no lag measured"
    line += f"; {float(summary.get('duration_s') or 0.0):.1f} s"
    lines = [line]
    starts = summary.get("start_position") or {}
    for partition, end in sorted((summary.get("end_position") or {}).items()):
        lines.append(
            f"Stream window of {connector}, stream {partition}: from "
            f"{position_words(starts.get(partition))} to {position_words(end)}"
        )
    incremental = describe_incremental(summary.get("incremental_snapshot"))
    if incremental:
        lines.append(incremental)
    opened = describe_open_span(summary.get("open_window"))
    if opened:
        lines.append(opened)
    return lines


def describe_open_span(part: Mapping[str, Any] | None) -> str | None:
    """The task log's line about an open window (a summary's ``open_window``), None without one."""
    if not part:
        return None
    lag = part.get("committed_lag_ms")
    return (
        f"Open window from {part.get('opened_at')} to {part.get('closed_at')} "
        f"({part.get('open_s')} s, closed by {', '.join(part.get('stop_reasons') or [])}): "
        f"{part.get('events')} events in {part.get('commits')} commits, last committed lag "
        f"{'unknown' if lag is None else f'{lag} ms'}"
    )
