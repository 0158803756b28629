"""Bounded change-stream windows: read one stream from its stored offset up to the window end,
commit the events and the new offset together, exactly once.

:func:`plan_streams` lists a deployment's streams; each runs :func:`run_window` (in a Spark task
of its own, see ``spark_apps/stream_window.py``), which drives a :class:`StreamWindow`. The window
stops at the first change at or past its end's cluster time, or when the server's
``postBatchResumeToken`` passes it; batches never cut a MongoDB transaction; a stall before an end
in the past fails with :class:`WindowEndNotReachedError` after committing what was read. After
streaming to its end (or finding its stored position already past it) the window works on a
requested incremental snapshot (:mod:`airflow_provider_mongocdc.core.window.incremental_phase`). The parameters live in
:mod:`airflow_provider_mongocdc.core.window.params`, the streams in :mod:`airflow_provider_mongocdc.core.window.streams`, the errors in
:mod:`airflow_provider_mongocdc.core.mongo.stream_errors`, the summaries in :mod:`airflow_provider_mongocdc.core.window.summary`; their names are importable from
here too. Starting point, end, idle servers, the stored position, exactly once, faults and sharded
clusters: docs/design.md, "Stream windows".
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy, format_duration_ms
from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import OversizeMode
from airflow_provider_mongocdc.core.events.builder import OPERATION_CODES, EventBuilder, is_invalidate
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.events.transactions import transaction_id as change_transaction_id
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.change_stream import open_stream, read_invalidate_token
from airflow_provider_mongocdc.core.mongo.connection import connect
from airflow_provider_mongocdc.core.mongo.stream_errors import (
    is_history_lost,
    is_oversize_change,
    is_transient,
    is_unusable_position,
    oversize_change_error,
    purged_error,
    retries_exhausted_error,
    stream_failed_error,
    unusable_position_error,
)
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, held_error
from airflow_provider_mongocdc.core.offsets.model import (
    OffsetState,
    Position,
    describe_position,
    position_time,
    token_cluster_time,
)
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest
from airflow_provider_mongocdc.core.window.errors import end_not_reached_error
from airflow_provider_mongocdc.core.window.incremental import IncrementalChunk
from airflow_provider_mongocdc.core.window.incremental_phase import IncrementalPhase
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.streams import (
    StreamTarget,
    offset_partition,
    starting_position,
    transactional_id,
)
from airflow_provider_mongocdc.core.window.summary import StopReason, WindowStats, percentiles

log = logging.getLogger(__name__)


class _Stop(Exception):
    """Internal: the read loop ends with a reason."""

    def __init__(self, reason: StopReason):
        super().__init__(reason)
        self.reason = reason


class StreamWindow:
    """The bounded window of one stream.

    ``client`` reads the stream (a client of the stream's deployment or shard); ``writer`` is the
    stream's transactional writer, created before the offset is read; ``store`` the offsets topic.
    Call :meth:`run` once; it returns the stream's summary.
    """

    def __init__(
        self,
        config: ConnectorConfig,
        client: MongoClient,
        writer: TransactionalWriter,
        store: OffsetStore,
        partition: str,
        params: WindowParams,
        *,
        replica_set: str | None = None,
        kafka_config: Mapping[str, Any] | None = None,
        policy: BackoffPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock_ms: Callable[[], int] | None = None,
    ):
        self.config = config
        self.client = client
        self.writer = writer
        self.store = store
        self.partition = offset_partition(config, partition)
        self.replica_set = replica_set or partition
        self.params = params
        self.end = params.end
        self.kafka_config = dict(kafka_config or store.kafka_config)
        self.policy = policy or BackoffPolicy.from_config(config)
        self._sleep = sleep
        self._clock_ms = clock_ms or (lambda: time.time_ns() // 1_000_000)
        self._rng = random.Random(0)
        self._known_topics: set[str] = set()
        self._new_builder()
        # committed state
        self.state: OffsetState | None = None
        self.start: Position | None = None
        self.committed_position: Position | None = None
        self.totals = WindowStats()
        self.batches_committed = 0
        self.reconnects = 0
        # the batch being built (an open Kafka transaction once something was sent)
        self.pending = WindowStats()
        self.pending_changes = 0
        self._batch_started: float | None = None
        self.position: Position | None = None  # the furthest position read
        # The transaction id (lsid, txnNumber) of the last change read, None when it was outside
        # a transaction: the next change continues that transaction when it has the same id.
        self._last_transaction: str | None = None
        self._invalidate_position: Position | None = None
        # Changes at or past ``end`` stop the stream; a PBRT at or past ``_pbrt_end`` too (the
        # same point, except while streaming up to an incremental chunk's high watermark).
        self._pbrt_end = self.end
        self._request: IncrementalRequest | None = None
        self._chunk: IncrementalChunk | None = None  # the incremental snapshot chunk awaiting its watermark
        self._incremental: dict[str, Any] | None = None  # the summary's incremental_snapshot
        # Wall seconds by phase (summary "phases_s"): setup (offsets topic, lease, offset read),
        # build (events), send (to the producer), commit (END, offset, commit), read (the rest of
        # the stream loop: waiting for and decoding changes).
        self._phases = {"setup": 0.0, "read": 0.0, "build": 0.0, "send": 0.0, "commit": 0.0}

    # -- setup --
    def _new_builder(self) -> None:
        self.builder = EventBuilder(self.config, replica_set=self.replica_set, clock=self._clock_ms)
        self.tracker = self.builder.transactions
        self._transaction_topic = self.tracker.topic if self.tracker is not None else None

    # -- public --
    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        self.store.ensure_topic()
        self._known_topics.add(self.store.topic)
        self._check_lease()
        contents = self.store.read_everything()
        self.state = contents.states.get(self.partition)
        request = contents.requests.get((self.partition.connector, self.partition.server_id))
        self._request = IncrementalRequest.from_json(request) if request else None
        self.start = starting_position(self.state, self.config, self.partition, self.store.topic)
        if self.start is None:
            log.info(
                "Window of %s: streaming disabled by snapshot.mode=initial_only", self.partition.describe()
            )
            return self._summary(StopReason.INITIAL_ONLY, started)
        self.committed_position = self.position = self.start
        start_time = position_time(self.start)
        if start_time is not None and start_time >= self.end:
            # The window ends where (or before) the stored offset stands: nothing to stream, and
            # the offset must not move back. A retried window whose first run committed an
            # incremental snapshot chunk (its high watermark lies past the end) stands here too:
            # the requested snapshot goes on from the stored position.
            log.info(
                "Window of %s: the stored position (%s) is not before the window end %s; nothing to stream",
                self.partition.describe(),
                self.start.describe(),
                iso_z(self.params.window_end),
            )
            try:
                self._incremental = self._incremental_phase().run(
                    self.state.incremental if self.state else None, self._request, started
                )
            except BaseException:
                self._abort_quietly()
                raise
            return self._summary(StopReason.ALREADY_PAST_END, started)
        log.info(
            "Window of %s from %s to %s",
            self.partition.describe(),
            self.start.describe(),
            iso_z(self.params.window_end),
        )
        phases = self._phases
        phases["setup"] = time.monotonic() - started
        try:
            streaming = time.monotonic()
            commit_before = phases["commit"]
            reason, final = self._stream()
            phases["read"] = (
                time.monotonic()
                - streaming
                - phases["build"]
                - phases["send"]
                - (phases["commit"] - commit_before)
            )
            # A stalled window commits what it read but is not a finished window.
            self._commit(final, last=reason != StopReason.CLUSTER_TIME_STALLED)
            if reason == StopReason.END_REACHED:
                self._incremental = self._incremental_phase().run(
                    self.state.incremental if self.state else None, self._request, started
                )
        except BaseException:
            self._abort_quietly()
            raise
        return self._summary(reason, started)

    def _incremental_phase(self) -> IncrementalPhase:
        """The requested incremental snapshot's work after the stream part (see
        :mod:`airflow_provider_mongocdc.core.window.incremental_phase`), with this window's steps."""
        return IncrementalPhase(
            self.config,
            self.client,
            self.partition,
            self.params,
            commit=self._commit,
            stream_to=self._stream_to,
            read_events=self._chunk_records,
            committed=lambda: self.committed_position,
            low_watermark=self._low_watermark,
        )

    def _low_watermark(self) -> Timestamp | None:
        """The cluster time of the furthest position read: every change emitted so far is at or
        before it, and the server has reached it. A position without a resume token (a window
        that read nothing stands at its stored one) may lie one increment past anything the
        server has reached (a committed chunk's high watermark + 1) when no change came since:
        then the server's own cluster time, which is at least that high watermark (MongoDB
        refuses an afterClusterTime past its cluster time)."""
        time_read = position_time(self.position)
        if self.position.resume_token:
            return time_read
        try:
            with self.client.start_session(causal_consistency=False) as session:
                self.client.admin.command("ping", session=session)
                server = (session.cluster_time or {}).get("clusterTime")
        except PyMongoError:  # the chunk's read reports an unreachable server in words
            return time_read
        if not isinstance(server, Timestamp) or time_read is None:
            return time_read or server
        return min(time_read, server)

    def _abort_quietly(self) -> None:
        """Abort the open Kafka transaction after a failure; the failure is the error to report."""
        try:
            self._abort()
        except MongoCdcError as error:
            log.warning(
                "Window of %s: could not abort the open Kafka transaction (%s); it is "
                "aborted when the next run's writer starts",
                self.partition.describe(),
                error,
            )

    def _check_lease(self) -> None:
        """Refuse to run while a snapshot of the connector holds its lease (see :mod:`airflow_provider_mongocdc.core.offsets.lease`)."""
        lease = ConnectorLease(self.kafka_config, self.config.topic_prefix, self.store.topic).current()
        if lease is not None and lease.live() and lease.kind == SNAPSHOT:
            raise held_error(self.config.topic_prefix, lease, WINDOW, f"stream window of {self.partition.rs}")

    # -- reading --
    def _stream(self) -> tuple[StopReason, Position]:
        """Read until a stop; returns the reason and the position to store."""
        deadline = time.monotonic() + self.params.max_duration_s
        failures = 0
        while True:
            progressed = [False]
            try:
                with open_stream(
                    self.client, self.config, self.position, max_await_time_ms=self.params.poll_ms
                ) as stream:
                    self._read(stream, deadline, progressed)
            except _Stop as stop:
                return stop.reason, self._final_position(stop.reason)
            except PyMongoError as error:
                if is_history_lost(error):
                    raise purged_error(self.config, self.partition, self.position, error) from None
                if is_unusable_position(error):
                    raise unusable_position_error(
                        self.config, self.partition, self.committed_position or self.start, error
                    ) from None
                if is_oversize_change(error):
                    raise oversize_change_error(self.config, self.partition, error) from None
                if not is_transient(error):
                    raise stream_failed_error(self.partition, error) from None
                failures = 0 if progressed[0] else failures
                failures += 1
                if failures > self.policy.max_attempts:
                    raise retries_exhausted_error(
                        self.partition, failures, error, self.committed_position or self.start
                    ) from None
                delay = self.policy.delay_ms(failures)
                self.reconnects += 1
                self._recover()
                log.warning(
                    "Change stream of %s interrupted (%s); re-opening from %s in %s (attempt %d of %d)",
                    self.partition.describe(),
                    error_text(error),
                    self.position.describe(),
                    format_duration_ms(delay),
                    failures,
                    self.policy.max_attempts,
                )
                self._sleep(delay / 1000.0)

    def _read(self, stream, deadline: float, progressed: list[bool]) -> None:
        max_batch = self.config.max_batch_size
        event_format = self.config.event_format
        idle_since = time.monotonic()
        while True:
            change = stream.try_next()
            now = time.monotonic()
            if change is None:
                if not stream.alive:
                    self._invalidated(self._invalidate_token(stream.resume_token))
                token = stream.resume_token
                cluster_time = token_cluster_time(token)
                if cluster_time is not None and cluster_time >= self._pbrt_end:
                    raise _Stop(StopReason.END_REACHED)
                if (
                    token is not None
                    and cluster_time is not None
                    and dict(token) != dict(self.position.resume_token or {})
                ):
                    # A newer PBRT: every change up to it has been read.
                    self.position = Position(dict(token), cluster_time)
                    self._heartbeat(cluster_time)
                    idle_since = now
                    progressed[0] = True
                if now >= deadline:
                    raise _Stop(StopReason.MAX_DURATION)
                if now - idle_since >= self.params.idle_timeout_s:
                    raise _Stop(
                        StopReason.CLUSTER_TIME_STALLED if self._end_passed() else StopReason.IDLE_TIMEOUT
                    )
                if self._batch_due(now):  # no change pending: any transaction read is complete
                    self._commit(self.position, last=False)
                continue
            if is_invalidate(change):
                self._invalidated(change.get("_id"))
            cluster_time = change.get("clusterTime")
            if cluster_time is not None and cluster_time >= self.end:
                raise _Stop(StopReason.END_REACHED)
            # Decided from (lsid, txnNumber), with or without transaction metadata: a commit or a
            # stop between two changes of one MongoDB transaction would cut it.
            transaction = change_transaction_id(change, event_format)
            between_transactions = transaction is None or transaction != self._last_transaction
            if between_transactions:
                if now >= deadline:
                    raise _Stop(StopReason.MAX_DURATION)
                if self.pending_changes >= max_batch or self._batch_due(now):
                    self._commit(self.position, last=False)
            if self._chunk is not None:
                self._chunk.apply(change, self.builder.omits_document(change))
            self._emit(change, cluster_time)
            self.position = Position(dict(change["_id"]), cluster_time or position_time(self.position))
            self._last_transaction = transaction
            idle_since = now
            progressed[0] = True
            if not stream.alive:
                self._invalidated(self._invalidate_token(stream.resume_token))

    def _end_passed(self) -> bool:
        """Whether the window end lies in the past by this worker's clock."""
        return self._clock_ms() >= self.params.window_end.timestamp() * 1000

    def _batch_due(self, now: float) -> bool:
        return self._batch_started is not None and now - self._batch_started >= self.params.commit_interval_s

    def _invalidate_token(self, reported: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The resume token of the invalidate that closed the stream: read itself, from the last
        position read (see :func:`~airflow_provider_mongocdc.core.mongo.change_stream.read_invalidate_token`), else ``reported``."""
        try:
            token = read_invalidate_token(
                self.client, self.config, self.position, max_await_time_ms=self.params.poll_ms
            )
        except PyMongoError as error:
            log.warning(
                "Window of %s: could not read the invalidate event (%s); using the server's resume token",
                self.partition.describe(),
                error_text(error),
            )
            return reported
        return token if token is not None else reported

    def _invalidated(self, token: Mapping[str, Any] | None) -> None:
        cluster_time = token_cluster_time(token)
        if token is not None and cluster_time is not None and cluster_time < self.end:
            self.position = Position(dict(token), cluster_time)
            self._invalidate_position = self.position
        raise _Stop(StopReason.INVALIDATED)

    def _final_position(self, reason: StopReason) -> Position:
        if reason == StopReason.END_REACHED:
            return Position(cluster_time=self.end)
        if reason == StopReason.INVALIDATED and self._invalidate_position is None:
            # The invalidate lies at or past the end: everything before the end was read.
            return Position(cluster_time=self.end)
        return self.position

    # -- emitting --
    def _emit(self, change: Mapping[str, Any], cluster_time: Timestamp | None) -> None:
        began = time.monotonic()
        records = self.builder.build_change(change)
        built = time.monotonic()
        self._phases["build"] += built - began
        self.pending_changes += 1
        stats = self.pending
        if cluster_time is not None:
            self._heartbeat(cluster_time)
            stats.add_lag(max(0, self._clock_ms() - cluster_time.time * 1000), self._rng)
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
            elif (
                record.topic == self._transaction_topic
                and record.value is not None
                and b'"status":"BEGIN"' in record.value
            ):
                stats.transactions += 1
        if (
            not emitted
            and data_topic is not None
            and self.config.event_oversize_handling_mode == OversizeMode.SKIP
            and OPERATION_CODES[operation] not in self.config.skipped_operations
            and self.builder.filters.collection_included(namespace["db"], namespace["coll"])
        ):
            stats.skipped_oversize += 1
        sending = time.monotonic()
        self._send(records)
        self._phases["send"] += time.monotonic() - sending

    def _heartbeat(self, cluster_time: Timestamp) -> None:
        heartbeat = self.builder.heartbeat
        if not heartbeat.enabled:
            return
        record = heartbeat.maybe(cluster_time.time * 1000)
        if record is not None:
            self.pending.heartbeats += 1
            self._send([record])

    def _send(self, records: Iterable[Record]) -> None:
        records = list(records)
        if not records:
            return
        self._ensure_topics(records)
        if not self.writer.in_transaction:
            self.writer.begin()
            self._batch_started = time.monotonic()
        self.writer.send(records)

    def _ensure_topics(self, records: list[Record]) -> None:
        missing = sorted({record.topic for record in records} - self._known_topics)
        if missing:
            ensure_topics(self.kafka_config, [TopicSpec(name) for name in missing])
            self._known_topics.update(missing)

    # -- committing --
    def _commit(
        self,
        position: Position | None,
        *,
        last: bool,
        records: Iterable[Record] = (),
        incremental: IncrementalProgress | None = None,
    ) -> None:
        """Commit the batch with the offset at ``position`` (END of an open transaction first);
        ``records`` (an incremental snapshot chunk's read events) go after the streamed ones, and
        ``incremental`` is the snapshot progress they bring."""
        began = time.monotonic()
        self._send(self.builder.finish())
        self._send(records)
        if last and self.builder.heartbeat.enabled:
            end_ms = (position_time(position) or self.end).time * 1000
            record = self.builder.heartbeat.maybe(end_ms)
            if record is not None:
                self.pending.heartbeats += 1
                self._send([record])
        events = self.pending.events
        base = self.state or OffsetState()
        if last:
            new_state = base.after_window(position, self.params.window_end, events)
        else:
            new_state = dataclasses.replace(
                base, position=position or base.position, events=base.events + events
            )
        if incremental is not None:
            new_state = dataclasses.replace(new_state, incremental=incremental.to_json())
        if not self.writer.in_transaction:
            self.writer.begin()
        stats = self.writer.commit([self.store.offset_record(self.partition, new_state)])
        self.pending.bytes = stats.bytes
        self.state = new_state
        self.committed_position = new_state.position
        self.totals.merge(self.pending, self._rng)
        self.pending = WindowStats()
        self.pending_changes = 0
        self._batch_started = None
        self.batches_committed += 1
        self._phases["commit"] += time.monotonic() - began

    def _recover(self) -> None:
        """After a stream failure: keep what was read when the last change read was outside a
        MongoDB transaction (commit it), else roll back to the last commit so that the transaction
        is read again whole (whether more of its changes follow is unknown)."""
        if self._last_transaction is None:
            if self.pending_changes or self.writer.in_transaction:
                self._commit(self.position, last=False)
            return
        log.info(
            "Window of %s: the stream failed inside MongoDB transaction %s; rolling back to the "
            "last commit (%s) to read it again whole",
            self.partition.describe(),
            self._last_transaction,
            (self.committed_position or self.start).describe(),
        )
        self._abort()
        self.pending = WindowStats()
        self.pending_changes = 0
        self.position = self.committed_position
        self._last_transaction = None  # commits happen between transactions only
        self._new_builder()

    def _abort(self) -> None:
        """Abort the open Kafka transaction (the writer delivers its records first)."""
        self.writer.abort()
        self._batch_started = None

    # -- incremental snapshot chunks (the steps IncrementalPhase uses) --
    def _stream_to(self, chunk: IncrementalChunk) -> tuple[StopReason, Position]:
        """Stream up to the chunk's high watermark, dropping the rows the stream changes."""
        high = chunk.high_watermark
        self.end, self._pbrt_end, self._chunk = Timestamp(high.time, high.inc + 1), high, chunk
        self._last_transaction = None
        try:
            return self._stream()
        finally:
            self._chunk = None

    def _chunk_records(self, chunk: IncrementalChunk, position: Position) -> list[Record]:
        """The chunk's remaining rows as read events at the stream position they follow."""
        database, _, collection = chunk.namespace.partition(".")
        at = position_time(self.position) or chunk.high_watermark
        records: list[Record] = []
        stats = self.pending
        for document in chunk.rows.values():
            built = self.builder.build_snapshot(document, database, collection, position=at, incremental=True)
            if not built:
                stats.skipped_oversize += 1
                continue
            records.extend(built)
            stats.count_event("r", chunk.namespace)
        return records

    # -- summary --
    def _summary(self, reason: StopReason, started: float) -> dict[str, Any]:
        totals = self.totals
        return {
            "partition": self.partition.rs,
            "replica_set": self.replica_set,
            "stop_reason": str(reason),
            "reached_end": reason in (StopReason.END_REACHED, StopReason.ALREADY_PAST_END)
            or (reason == StopReason.INVALIDATED and self._invalidate_position is None),
            "window_end": iso_z(self.params.window_end),
            "start_position": describe_position(self.start),
            "end_position": describe_position(self.committed_position or self.start),
            "events": totals.events,
            "events_by_op": dict(totals.events_by_op),
            "events_by_collection": dict(totals.events_by_collection),
            "tombstones": totals.tombstones,
            "transactions": totals.transactions,
            "heartbeats": totals.heartbeats,
            "skipped_oversize": totals.skipped_oversize,
            "bytes": totals.bytes,
            "batches_committed": self.batches_committed,
            "reconnects": self.reconnects,
            "lag_ms": percentiles(totals.lags_ms, totals.lag_max_ms),
            "lag_samples": list(totals.lags_ms),
            "lag_count": totals.lag_count,
            "duration_s": round(time.monotonic() - started, 3),
            "phases_s": {name: round(value, 3) for name, value in self._phases.items()},
            "incremental_snapshot": self._incremental,
        }


# -- running a stream --------------------------------------------------------------------------------
def run_window(
    target: StreamTarget,
    config: ConnectorConfig,
    kafka_config: Mapping[str, Any],
    params: WindowParams,
    *,
    sleep: Callable[[float], None] = time.sleep,
    check_end: bool = True,
) -> dict[str, Any]:
    """Run the window of one stream: fence older writers, read the offset, stream, commit.

    Raises :class:`WindowEndNotReachedError` (after committing what was read) when the stream
    stalled before an end in the past; with ``check_end=False`` the summary reports it instead
    (``stop_reason=cluster_time_stalled``) and the caller raises :func:`end_not_reached_error`.
    """
    policy = BackoffPolicy.from_config(config)
    store = OffsetStore(kafka_config, config.offsets_topic)
    with TransactionalWriter(kafka_config, transactional_id(config, target.partition)) as writer:
        client = connect(target.details(), policy, require_primary=True, sleep=sleep)
        try:
            window = StreamWindow(
                config,
                client,
                writer,
                store,
                target.partition,
                params,
                replica_set=target.replica_set,
                kafka_config=kafka_config,
                policy=policy,
                sleep=sleep,
            )
            summary = window.run()
        finally:
            client.close()
    error = end_not_reached_error(summary, params) if check_end else None
    if error is not None:
        raise error
    return summary


def run_stream_tasks(
    targets: Iterable[Mapping[str, Any]],
    *,
    connector: Mapping[str, Any],
    kafka: Mapping[str, Any],
    params: Mapping[str, Any],
) -> Iterator[dict[str, Any]]:
    """A Spark task's work: the windows of its streams (JSON-able targets), one summary each. A
    stalled stream is reported in its summary; the driver raises :func:`end_not_reached_error`
    once every stream has committed."""
    config = ConnectorConfig.from_properties(connector)
    window_params = WindowParams.from_params(params, config)
    for target in targets:
        yield run_window(StreamTarget.from_json(target), config, kafka, window_params, check_end=False)
