"""A stream window's batches: the changes read since the last commit, built into records and sent
in one open Kafka transaction, then committed with the offset that covers them.

:class:`WindowBatch` keeps the books: the MongoDB transaction the last change belongs to (by
``lsid`` and ``txnNumber``, so that a commit never cuts one), the committed offset state, and the
counts (:class:`~airflow_provider_mongocdc.core.window.summary.WindowTally`). :class:`BatchSender`
holds the open Kafka transaction. Exactly once, batch boundaries and faults: docs/design.md,
"Stream windows".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from typing import Any

from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OffsetError
from airflow_provider_mongocdc.core.config.enums import OversizeMode
from airflow_provider_mongocdc.core.events.builder import OPERATION_CODES, EventBuilder
from airflow_provider_mongocdc.core.events.headers import new_run_id
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import (
    OffsetState,
    Position,
    moves_back,
    position_time,
    timestamp_datetime,
)
from airflow_provider_mongocdc.core.offsets.open_window import open_marker
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress
from airflow_provider_mongocdc.core.window.incremental import IncrementalChunk
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.summary import WindowTally

log = logging.getLogger("airflow_provider_mongocdc.core.window.stream_window")  # logged as the window's lines
# An open window logs its progress (events so far, committed lag) at most this often.
OPEN_LOG_EVERY_S = 30.0


class BatchSender:
    """The open Kafka transaction of a batch: begun with its first record (``started`` is then
    when), after creating the topics its records go to (``known_topics``: those that exist)."""

    def __init__(self, writer: TransactionalWriter, kafka_config: Mapping[str, Any], known_topics: set[str]):
        self.writer = writer
        self.kafka_config = kafka_config
        self.known_topics = known_topics
        self.started: float | None = None

    def send(self, records: Iterable[Record]) -> None:
        records = list(records)
        if not records:
            return
        missing = sorted({record.topic for record in records} - self.known_topics)
        if missing:
            ensure_topics(self.kafka_config, [TopicSpec(name) for name in missing])
            self.known_topics.update(missing)
        if not self.writer.in_transaction:
            self.writer.begin()
            self.started = time.monotonic()
        self.writer.send(records)

    @property
    def in_transaction(self) -> bool:
        return self.writer.in_transaction

    def commit(self, offset: Record) -> int:
        """Commit the transaction with the ``offset`` record last; returns the bytes written."""
        if not self.writer.in_transaction:
            self.writer.begin()
        written = self.writer.commit([offset]).bytes
        self.started = None
        return written

    def abort(self) -> None:
        """Abort the open Kafka transaction (the writer delivers its records first)."""
        self.writer.abort()
        self.started = None


class WindowBatch:
    """The batch of one stream's window and its commits.

    ``begin(state, start)`` takes the stored offset state and the position the window starts
    from. :meth:`add_change` builds and sends a change's records; :meth:`commit` commits them with
    the offset; :meth:`recover` keeps or drops the batch after a stream failure.
    ``open_transaction`` is the transaction id (lsid, txnNumber) of the last change added, None
    when it was outside a transaction: the next change continues that transaction when it has
    the same id, and no commit goes between the two. An open window (:meth:`open`) commits its
    marker (:mod:`airflow_provider_mongocdc.core.offsets.open_window`) with each commit until its
    last.
    """

    def __init__(self, scope: StreamScope, sender: BatchSender, store: OffsetStore):
        self.scope = scope
        self.sender = sender
        self.store = store
        self.tally = WindowTally()
        self.state: OffsetState | None = None  # the committed state
        self.committed_position: Position | None = None
        self.open_transaction: str | None = None
        # One run id for every builder of the window (a rolled-back batch gets a new builder).
        self.run_id = scope.params.run_id or new_run_id()
        self._new_builder()
        self.opened_at: datetime | None = None  # an open window: when it opened
        self.is_open = False  # until its last commit
        self.last_lag_ms: int | None = (
            None  # the committed position's lag at the last commit but the final one
        )
        self._open_logged = 0.0

    def _new_builder(self) -> None:
        scope = self.scope
        self.builder = EventBuilder(
            scope.config, replica_set=scope.replica_set, clock=scope.clock_ms, run_id=self.run_id
        )
        self._begun_counted = 0  # the BEGIN records of the builder's tracker already counted

    def begin(self, state: OffsetState | None, start: Position) -> None:
        """The stored ``state`` and the window's ``start``; a retry of the task instance that
        committed ``state`` counts what its earlier tries committed (the state's ``run``)."""
        self.state = state
        self.committed_position = start
        task = self.scope.params.task_run
        if task is not None and state is not None and state.run and state.run.get("task") == task:
            self.tally.carry(state.run)

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.scope.clock_ms() / 1000, timezone.utc)

    def open(self, start: Position) -> None:
        """Open the window: commit its marker at once (the change watcher and the MongoDB CDC page
        learn that it is open), at the start position."""
        self.opened_at, self.is_open = self.now(), True
        self._open_logged = time.monotonic()  # the line below says it
        self.commit(start)
        params = self.scope.params
        log.info(
            "Window of %s open from %s: closes after %g s without a change or %g s open, commits "
            "every %g s while changes come",
            self.scope.describe(),
            start.describe(),
            params.open_idle_s,
            params.max_open_s,
            params.commit_interval_s,
        )

    # -- the changes of the batch --
    def add_change(
        self, change: Mapping[str, Any], cluster_time: Timestamp | None, transaction: str | None
    ) -> None:
        """Build and send the records of ``change`` (of MongoDB transaction ``transaction``)."""
        tally = self.tally
        phases = tally.phases
        began = time.monotonic()
        records = self.builder.build_change(change)
        phases["build"] += time.monotonic() - began
        tally.pending_changes += 1
        stats = tally.pending
        if cluster_time is not None:
            self.heartbeat(cluster_time)
            stats.add_lag(max(0, self.scope.clock_ms() - cluster_time.time * 1000), tally.rng)
        operation = change.get("operationType")
        namespace = change.get("ns") or {}
        data_topic = None
        if operation in OPERATION_CODES and namespace.get("coll") is not None:
            data_topic = self.builder.topic_for(namespace["db"], namespace["coll"])
        emitted = False
        for record in records:
            if record.topic == data_topic:
                if record.value is None:
                    stats.tombstones += 1
                else:
                    emitted = True
                    stats.count_event(OPERATION_CODES[operation], f"{namespace['db']}.{namespace['coll']}")
        if not emitted and data_topic is not None and self._skipped_as_oversize(operation, namespace):
            stats.skipped_oversize += 1
        sending = time.monotonic()
        self.sender.send(records)
        phases["send"] += time.monotonic() - sending
        self.open_transaction = transaction

    def _skipped_as_oversize(self, operation: str, namespace: Mapping[str, Any]) -> bool:
        """Whether a captured change that emitted no event was skipped for its size."""
        config = self.scope.config
        return (
            config.event_oversize_handling_mode == OversizeMode.SKIP
            and OPERATION_CODES[operation] not in config.skipped_operations
            and self.builder.filters.collection_included(namespace["db"], namespace["coll"])
        )

    def heartbeat(self, cluster_time: Timestamp) -> None:
        """A heartbeat when its interval of cluster time has passed."""
        heartbeat = self.builder.heartbeat
        if not heartbeat.enabled:
            return
        record = heartbeat.maybe(cluster_time.time * 1000)
        if record is not None:
            self.tally.pending.heartbeats += 1
            self.sender.send([record])

    def chunk_events(self, chunk: IncrementalChunk, at: Timestamp) -> list[Record]:
        """An incremental snapshot chunk's remaining rows as read events at cluster time ``at``."""
        database, _, collection = chunk.namespace.partition(".")
        records: list[Record] = []
        stats = self.tally.pending
        for document in chunk.rows.values():
            built = self.builder.build_snapshot(document, database, collection, position=at, incremental=True)
            if not built:
                stats.skipped_oversize += 1
                continue
            records.extend(built)
            stats.count_event("r", chunk.namespace)
        return records

    def pending(self) -> bool:
        """Whether a Kafka transaction is open (records sent since the last commit)."""
        return self.sender.started is not None

    def due(self, now: float) -> bool:
        """Whether the open Kafka transaction began ``commit_interval_s`` ago or earlier."""
        started = self.sender.started
        return started is not None and now - started >= self.scope.params.commit_interval_s

    # -- commits --
    def commit(
        self,
        position: Position | None,
        *,
        last: bool = False,
        records: Iterable[Record] = (),
        incremental: IncrementalProgress | None = None,
    ) -> None:
        """Commit the batch with the offset at ``position`` (END of an open transaction first);
        ``last``: the window's final commit, which counts the window as finished; ``records`` (an
        incremental snapshot chunk's read events) go after the streamed ones, and ``incremental``
        is the snapshot progress they bring."""
        began = time.monotonic()
        self.sender.send(self.builder.finish())
        self.sender.send(records)
        if last:  # the heartbeat of the window's end when its interval has passed
            self.heartbeat(position_time(position) or self.scope.params.end)
        new_state = self._next_state(position, last, incremental)
        if moves_back(self.committed_position, new_state.position):
            raise OffsetError(
                f"The window of {self.scope.partition.describe()} did not commit: its new offset "
                f"({new_state.position.describe()}) lies before the committed one "
                f"({self.committed_position.describe()})",
                cause="a window only moves its offset forward; an offset behind the committed one "
                "would make the next window emit changes again",
                fix="run the window again: it starts from the committed offset (report this if it "
                "happens again)",
            )
        record = self.store.offset_record(self.scope.partition, new_state, connector=self.scope.config.name)
        written = self.sender.commit(record)
        self.state = new_state
        self.committed_position = new_state.position
        tracker = self.builder.transactions
        begun = tracker.begun if tracker is not None else 0
        self.tally.committed(written, begun - self._begun_counted)
        self._begun_counted = begun
        self.tally.phases["commit"] += time.monotonic() - began
        if self.is_open:
            self.is_open = not last
            self._log_open(new_state, last)

    def _lag_ms(self, position: Position | None) -> int | None:
        """How far ``position`` is behind the clock (ms), None without a cluster time."""
        ts = position_time(position)
        return None if ts is None else max(0, self.scope.clock_ms() - ts.time * 1000)

    def _log_open(self, state: OffsetState, last: bool) -> None:
        """The task log's line of an open window's progress, at most every :data:`OPEN_LOG_EVERY_S`."""
        now = time.monotonic()
        if last or now - self._open_logged < OPEN_LOG_EVERY_S:
            return
        self._open_logged = now
        marker = state.open_window or {}
        log.info(
            "Window of %s open since %s: %d events so far in %d commits, committed lag %s ms",
            self.scope.describe(),
            marker.get("since"),
            marker.get("events", 0),
            marker.get("commits", 0),
            marker.get("lag_ms"),
        )

    def _next_state(
        self, position: Position | None, last: bool, incremental: IncrementalProgress | None
    ) -> OffsetState:
        base = self.state or OffsetState()
        events = self.tally.pending.events
        if not last:  # (at a close, the lag is the idle time's: the commits while open tell the latency)
            self.last_lag_ms = self._lag_ms(position or base.position)
        if last:
            window_end = self.scope.params.window_end
            if self.opened_at is not None:  # an open window ends where it closed
                ts = position_time(position or base.position)
                window_end = timestamp_datetime(ts) if ts is not None else window_end
            state = base.after_window(position, window_end, events)
        else:
            state = dataclasses.replace(
                base,
                position=position or base.position,
                events=base.events + events,
                open_window=self._marker(events) if self.is_open else None,
            )
        if incremental is not None:
            state = dataclasses.replace(state, incremental=incremental.to_json())
        if self.scope.params.task_run is not None:  # what the task instance's tries committed
            state = dataclasses.replace(state, run=self.tally.run_record(self.scope.params.task_run))
        return state

    def _marker(self, pending_events: int) -> dict[str, Any]:
        """The open window's marker of the commit under way."""
        params = self.scope.params
        poll_s = params.poll_ms / 1000
        return open_marker(
            since=self.opened_at,
            now=self.now(),
            events=self.tally.totals.events + pending_events,
            commits=self.tally.batches_committed + 1,
            lag_ms=self.last_lag_ms,
            next_commit_within_s=params.open_idle_s + params.commit_interval_s + poll_s,
            closes_by=self.opened_at + timedelta(seconds=params.max_open_s),
        )

    def recover(self, position: Position) -> Position:
        """After a stream failure at ``position``: keep what was read when the last change read was
        outside a MongoDB transaction (commit it), else roll back to the last commit so that the
        transaction is read again whole (whether more of its changes follow is unknown). Returns
        the position to read on from."""
        if self.open_transaction is None:
            if self.tally.pending_changes or self.sender.in_transaction:
                self.commit(position)
            return position
        log.info(
            "Window of %s: the stream failed inside MongoDB transaction %s; rolling back to the "
            "last commit (%s) to read it again whole",
            self.scope.describe(),
            self.open_transaction,
            self.committed_position.describe(),
        )
        self.sender.abort()
        self.tally.dropped()
        self.open_transaction = None  # commits happen between transactions only
        self._new_builder()
        return self.committed_position

    def abort_quietly(self) -> None:
        """Abort the open Kafka transaction after a failure; the failure is the error to report."""
        try:
            self.sender.abort()
        except MongoCdcError as error:
            log.warning(
                "Window of %s: could not abort the open Kafka transaction (%s); it is "
                "aborted when the next run's writer starts",
                self.scope.describe(),
                error,
            )
