"""Bounded change-stream windows: read one stream from its stored offset up to the window end,
commit the events and the new offset together, exactly once.

:func:`run_window` runs the window of one stream (in a Spark task of its own, see
``spark_apps/stream_window.py``) with a :class:`StreamWindow`: the window's setup (offsets topic,
lease, stored offset), its read loop (:mod:`airflow_provider_mongocdc.core.window.read_loop`:
the change stream up to the end, and why it stopped), its batches and commits
(:mod:`airflow_provider_mongocdc.core.window.batch`) and, after streaming to its end (or finding
its stored position already past it, or an open window's idle close), a requested incremental snapshot
(:mod:`airflow_provider_mongocdc.core.window.incremental_phase`). A stall before an end in the
past fails with :class:`~airflow_provider_mongocdc.core.window.errors.WindowEndNotReachedError`
after committing what was read. The streams: :mod:`airflow_provider_mongocdc.core.window.streams`;
the parameters: :mod:`airflow_provider_mongocdc.core.window.params`; the summaries:
:mod:`airflow_provider_mongocdc.core.window.summary`. Starting point, end, idle servers, the stored
position, exactly once, faults and sharded clusters: docs/design.md, "Stream windows".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.kafka.admin import end_offsets
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.connection import connect
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, Lease, held_error
from airflow_provider_mongocdc.core.offsets.model import (
    Position,
    describe_position,
    position_time,
    timestamp_datetime,
)
from airflow_provider_mongocdc.core.offsets.store import OffsetStore, check_prefix_owner
from airflow_provider_mongocdc.core.offsets.writers import window_transactional_id
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest
from airflow_provider_mongocdc.core.window.batch import BatchSender, WindowBatch
from airflow_provider_mongocdc.core.window.errors import end_not_reached_error
from airflow_provider_mongocdc.core.window.incremental import IncrementalChunk
from airflow_provider_mongocdc.core.window.incremental_phase import IncrementalPhase
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.read_loop import ReadLoop
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.streams import (
    StreamTarget,
    offset_partition,
    starting_position,
)
from airflow_provider_mongocdc.core.window.summary import StopReason

log = logging.getLogger(__name__)


class StreamWindow:
    """The bounded window of one stream.

    ``client`` reads the stream (a client of the stream's deployment or shard); ``writer`` is the
    stream's transactional writer, created before the offset is read; ``store`` the offsets topic.
    Call :meth:`run` once; it returns the stream's summary. The window is the
    :class:`~airflow_provider_mongocdc.core.window.incremental_phase.WindowSteps` of its
    incremental snapshot phase.
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
        self.scope = StreamScope(
            config,
            offset_partition(config, partition),
            replica_set or partition,
            params,
            clock_ms or (lambda: time.time_ns() // 1_000_000),
        )
        self.client = client
        self.store = store
        self.kafka_config = dict(kafka_config or store.kafka_config)
        sender = BatchSender(writer, self.kafka_config, known_topics={store.topic})
        self.batch = WindowBatch(self.scope, sender, store)
        policy = policy or BackoffPolicy.from_config(config)
        self.reader = ReadLoop(self.scope, client, self.batch, policy=policy, sleep=sleep)
        self.start: Position | None = None

    def run(self) -> dict[str, Any]:
        started = time.monotonic()
        request = self._setup()
        window_end = self.scope.params.window_end
        if self.start is None:
            log.info("Window of %s: streaming disabled by snapshot.mode=initial_only", self.scope.describe())
            return self._summary(StopReason.INITIAL_ONLY, started)
        start_time = position_time(self.start)
        params = self.scope.params
        if not params.open and start_time is not None and start_time >= params.end:
            # The window ends where (or before) the stored offset stands: nothing to stream, and
            # the offset must not move back. A retried window whose first run committed an
            # incremental snapshot chunk (its high watermark lies past the end) stands here too:
            # the requested snapshot goes on from the stored position.
            log.info(
                "Window of %s: the stored position (%s) is not before the window end %s; nothing to stream",
                self.scope.describe(),
                self.start.describe(),
                iso_z(window_end),
            )
            return self._summary(StopReason.ALREADY_PAST_END, started, self._incremental(request, started))
        if params.open:
            self.batch.open(self.start)
        else:
            log.info(
                "Window of %s from %s to %s", self.scope.describe(), self.start.describe(), iso_z(window_end)
            )
        self.batch.tally.phases["setup"] = time.monotonic() - started
        try:
            reason = self._stream()
        except BaseException:
            self.batch.abort_quietly()
            raise
        streamed_all = reason == StopReason.END_REACHED or (params.open and reason == StopReason.IDLE)
        incremental = self._incremental(request, started) if streamed_all else None
        return self._summary(reason, started, incremental)

    def _setup(self) -> IncrementalRequest | None:
        """Make sure of the offsets topic, check the lease, read the stored offset and where the
        window starts (``start``); returns the connector's incremental snapshot request."""
        config, partition = self.scope.config, self.scope.partition
        self.store.ensure_topic()
        records = self.store.read_committed_records()
        contents = self.store.read_everything(records)
        lease = ConnectorLease(self.kafka_config, config.topic_prefix, self.store.topic).current(records)
        # Another connector's positions (of any partition of the prefix) or lease: refused.
        check_prefix_owner(
            contents.states,
            lease.connector if lease else None,
            partition.server_id,
            config.name,
            self.store.topic,
        )
        self._check_lease(lease)
        state = contents.states.get(partition)
        request = contents.requests.get((partition.connector, partition.server_id))
        request = IncrementalRequest.from_json(request) if request else None
        self.start = starting_position(state, config, partition, self.store.topic)
        if self.start is not None:
            self.batch.begin(state, self.start)
            self.reader.position = self.start
        return request

    def _check_lease(self, lease: Lease | None) -> None:
        """Refuse to run while a snapshot of the connector holds its lease (see
        :mod:`airflow_provider_mongocdc.core.offsets.lease`); ``lease``: the stored one."""
        prefix = self.scope.config.topic_prefix
        if lease is not None and lease.live() and lease.kind == SNAPSHOT:
            raise held_error(prefix, lease, WINDOW, f"stream window of {self.scope.partition.rs}")

    def _stream(self) -> StopReason:
        """Stream up to the end and commit (a stalled window commits what it read but is not a
        finished window); the phases' read time is the loop's own."""
        phases = self.batch.tally.phases
        streaming = time.monotonic()
        commit_before = phases["commit"]
        reason, final = self.reader.read()
        phases["read"] = (
            time.monotonic()
            - streaming
            - phases["build"]
            - phases["send"]
            - (phases["commit"] - commit_before)
        )
        if reason == StopReason.CLUSTER_TIME_STALLED:
            self.batch.is_open = False  # it fails now: no longer open (its commit removes the marker)
        self.batch.commit(final, last=reason != StopReason.CLUSTER_TIME_STALLED)
        if self.scope.params.open:
            log.info(
                "Window of %s closed (%s) at %s: %d events in %d commits",
                self.scope.describe(),
                f"no change for {self.scope.params.open_idle_s:g} s"
                if reason == StopReason.IDLE
                else str(reason),
                final.describe(),
                self.batch.tally.totals.events,
                self.batch.tally.batches_committed,
            )
        return reason

    def _incremental(self, request: IncrementalRequest | None, started: float) -> dict[str, Any] | None:
        """The requested incremental snapshot's work after the stream part (see
        :mod:`airflow_provider_mongocdc.core.window.incremental_phase`)."""
        state = self.batch.state
        try:
            phase = IncrementalPhase(self.scope, self.client, self)
            return phase.run(state.incremental if state else None, request, started)
        except BaseException:
            self.batch.abort_quietly()
            raise

    # -- the steps of the incremental phase (WindowSteps) --
    @property
    def committed_position(self) -> Position:
        return self.batch.committed_position

    def commit(self, position: Position, incremental: IncrementalProgress | None = None) -> None:
        self.batch.commit(position, incremental=incremental)

    def commit_chunk(
        self, position: Position, records: list[Record], incremental: IncrementalProgress
    ) -> None:
        self.batch.commit(position, records=records, incremental=incremental)

    def stream_to(self, chunk: IncrementalChunk) -> tuple[StopReason, Position]:
        return self.reader.stream_to(chunk)

    def chunk_events(self, chunk: IncrementalChunk) -> list[Record]:
        return self.batch.chunk_events(chunk, position_time(self.reader.position) or chunk.high_watermark)

    def low_watermark(self) -> Timestamp | None:
        return self.reader.low_watermark()

    def topic_ends(self, namespaces: list[str]) -> dict[str, dict[int, int]]:
        namer = TopicNamer(self.scope.config)
        topics = [namer.data_topic(*namespace.split(".", 1)) for namespace in namespaces]
        return end_offsets(self.kafka_config, topics)

    # -- summary --
    def _summary(
        self, reason: StopReason, started: float, incremental: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        summary = {
            "partition": self.scope.partition.rs,
            "replica_set": self.scope.replica_set,
            "stop_reason": str(reason),
            "reached_end": reason
            in (StopReason.END_REACHED, StopReason.ALREADY_PAST_END, StopReason.IDLE, StopReason.MAX_OPEN)
            or (reason == StopReason.INVALIDATED and self.reader.invalidated_at is None),
            "window_end": iso_z(self._window_end()),
            "start_position": describe_position(self.start),
            "end_position": describe_position(self.batch.committed_position or self.start),
            **self.batch.tally.summary(time.monotonic() - started, reconnects=self.reader.reconnects),
            "incremental_snapshot": incremental,
        }
        if self.batch.opened_at is not None:
            summary["open_window"] = self._open_summary(reason)
        return summary

    def _window_end(self) -> datetime:
        """Where the window ends: its end, or for an open window where it stopped (the cluster
        time of its committed position, as the offset's ``last_window_end``)."""
        if self.batch.opened_at is not None:
            stopped = position_time(self.batch.committed_position)
            if stopped is not None:
                return timestamp_datetime(stopped)
        return self.scope.params.window_end

    def _open_summary(self, reason: StopReason) -> dict[str, Any]:
        """An open window's part of its summary: when it opened and closed, why, what it committed."""
        batch, params = self.batch, self.scope.params
        closed = batch.now()
        return {
            "opened_at": iso_z(batch.opened_at),
            "closed_at": iso_z(closed),
            "open_s": round((closed - batch.opened_at).total_seconds(), 3),
            "stop_reason": str(reason),
            "events": batch.tally.totals.events,
            "commits": batch.tally.batches_committed,
            "committed_lag_ms": batch.last_lag_ms,
            "idle_s": params.open_idle_s,
            "max_open_s": params.max_open_s,
            "commit_interval_s": params.commit_interval_s,
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
    streams: Iterable[str] = (),
) -> dict[str, Any]:
    """Run the window of one stream: fence older writers, read the offset, stream, commit.

    Raises :class:`WindowEndNotReachedError` (after committing what was read) when the stream
    stalled before an end in the past; with ``check_end=False`` the summary reports it instead
    (``stop_reason=cluster_time_stalled``) and the caller raises :func:`end_not_reached_error`.
    ``streams``: the partitions of the streams of the same run (this one's and its siblings'),
    whose window writers the run took over before it started any of them
    (:func:`~airflow_provider_mongocdc.core.window.streams.check_offsets`): a sibling's transaction
    open on the offsets topic when this stream reads it is a live stream's commit under way, waited
    for and never taken over (:class:`~airflow_provider_mongocdc.core.offsets.writers.TakeOver`).
    """
    policy = BackoffPolicy.from_config(config)
    running = [window_transactional_id(config.topic_prefix, partition) for partition in streams]
    store = OffsetStore.for_connector(kafka_config, config, running=running)
    with TransactionalWriter(
        kafka_config, window_transactional_id(config.topic_prefix, target.partition)
    ) as writer:
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
    streams: Iterable[str] = (),
) -> Iterator[dict[str, Any]]:
    """A Spark task's work: the windows of its streams (JSON-able targets), one summary each. A
    stalled stream is reported in its summary; the driver raises :func:`end_not_reached_error`
    once every stream has committed. ``streams``: the partitions of every stream of the run, whose
    writers the driver took over before the tasks started (see :func:`run_window`)."""
    config = ConnectorConfig.from_properties(connector)
    window_params = WindowParams.from_params(params, config)
    streams = list(streams)
    for target in targets:
        yield run_window(
            StreamTarget.from_json(target), config, kafka, window_params, check_end=False, streams=streams
        )
