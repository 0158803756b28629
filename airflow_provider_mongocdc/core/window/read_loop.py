"""A stream window's read loop: the change stream from the window's position up to its end, each
change handed to the window's batch (:class:`~airflow_provider_mongocdc.core.window.batch.WindowBatch`),
until a stop, returned as a :class:`~airflow_provider_mongocdc.core.window.summary.StopReason`
with the position to store.

The loop stops at the first change at or past the end's cluster time, when the server's
``postBatchResumeToken`` (PBRT) passes it, at an invalidate, after ``max_duration_s`` (between
MongoDB transactions only), or when nothing moved for ``idle_timeout_s``. An open window reads on
past its end: it stops when no change came for ``open_idle_s`` or after ``max_open_s`` (between
transactions). It re-opens the stream after transient errors and raises the connector's error for
the others. The end, idle servers, the stored position and faults: docs/design.md, "Stream
windows" and "Open windows".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import PyMongoError

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy, format_duration_ms
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.events.builder import is_invalidate
from airflow_provider_mongocdc.core.events.transactions import transaction_id
from airflow_provider_mongocdc.core.mongo.change_stream import (
    buffered_changes,
    open_stream,
    read_invalidate_token,
)
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
from airflow_provider_mongocdc.core.offsets.model import (
    Position,
    position_time,
    token_cluster_time,
)
from airflow_provider_mongocdc.core.window.batch import WindowBatch
from airflow_provider_mongocdc.core.window.incremental import IncrementalChunk
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.summary import StopReason

log = logging.getLogger("airflow_provider_mongocdc.core.window.stream_window")  # logged as the window's lines
# An open window has no end: the largest cluster time.
OPEN_END = Timestamp(0xFFFFFFFF, 0)


class ReadLoop:
    """The change stream of one stream's window, read into its ``batch``.

    ``position`` is the furthest position read (set it to the start before :meth:`read`).
    Changes at or past ``end`` stop the stream; a PBRT at or past ``pbrt_end`` too (the same
    point, except while streaming up to an incremental chunk's high watermark, see
    :meth:`stream_to`). ``invalidated_at`` is the invalidate's position when the stream was
    invalidated before the end; ``reconnects`` counts the stream's re-opens.
    """

    def __init__(
        self,
        scope: StreamScope,
        client: MongoClient,
        batch: WindowBatch,
        *,
        policy: BackoffPolicy,
        sleep: Callable[[float], None],
    ):
        self.scope = scope
        self.client = client
        self.batch = batch
        self.policy = policy
        self.sleep = sleep
        self.position: Position | None = None
        self.open = scope.params.open  # an open window (not while streaming to a chunk's watermark)
        self.end = self.pbrt_end = OPEN_END if self.open else scope.params.end
        self.chunk: IncrementalChunk | None = None  # the incremental snapshot chunk awaiting its watermark
        self.invalidated_at: Position | None = None
        self.reconnects = 0
        self._idle_since = 0.0  # when the stream last moved (a change or a newer PBRT)
        self._changed_at = 0.0  # an open window's last change (or its opening)
        self._fetched_at = 0.0  # when the stream last asked the server for changes (a getMore)
        self._fetched = 0  # the changes that reply brought

    def read(self) -> tuple[StopReason, Position]:
        """Read until a stop; returns the reason and the position to store."""
        config, params = self.scope.config, self.scope.params
        longest = min(params.max_duration_s, params.max_open_s) if self.open else params.max_duration_s
        deadline = time.monotonic() + longest
        # An open window polls at least every commit interval, so that a batch is committed on time.
        poll_ms = (
            min(params.poll_ms, max(100, int(params.commit_interval_s * 1000)))
            if self.open
            else params.poll_ms
        )
        self._changed_at = time.monotonic()  # an open window's last change (or its opening)
        failures = 0
        while True:
            opened_at = self.position
            try:
                with open_stream(self.client, config, self.position, max_await_time_ms=poll_ms) as stream:
                    reason = self._read(stream, deadline)
            except PyMongoError as error:
                # Failures in a row: a stream that moved since it opened (a change or a newer
                # PBRT gave it a new position) counts from 1 again.
                failures = 1 if self.position is not opened_at else failures + 1
                self._reopen_after(error, failures)
                continue
            return reason, self._final_position(reason)

    def stream_to(self, chunk: IncrementalChunk) -> tuple[StopReason, Position]:
        """Stream up to the chunk's high watermark, dropping the rows the stream changes."""
        high = chunk.high_watermark
        self.end, self.pbrt_end, self.chunk = Timestamp(high.time, high.inc + 1), high, chunk
        self.batch.open_transaction = None  # the stream so far is committed: between transactions
        self.open = False  # up to the watermark, as a bounded window
        try:
            return self.read()
        finally:
            self.chunk = None

    def _read(self, stream, deadline: float) -> StopReason:
        """Read the open ``stream`` until a stop (a stream error propagates)."""
        batch = self.batch
        tally = batch.tally
        max_batch = self.scope.config.max_batch_size
        event_format = self.scope.config.event_format
        self._idle_since = time.monotonic()
        if self._opened_past_end(stream):
            return StopReason.END_REACHED
        # An open window that has caught up asks the server at most once per commit interval.
        pace_s = self.scope.params.commit_interval_s if self.open else 0.0
        while True:
            fetching = buffered_changes(stream) == 0  # this try_next asks the server
            if fetching:
                if pace_s:
                    self._pace(pace_s, max_batch)
                self._fetched_at = time.monotonic()
            change = stream.try_next()
            now = time.monotonic()
            if fetching:
                self._fetched = (buffered_changes(stream) or 0) + (change is not None)
            if change is None:
                stop = self._no_change(stream, now, deadline)
                if stop is not None:
                    return stop
                continue
            if is_invalidate(change):
                return self._invalidated(change.get("_id"))
            cluster_time = change.get("clusterTime")
            if cluster_time is not None and cluster_time >= self.end:
                return StopReason.END_REACHED
            # Decided from (lsid, txnNumber), with or without transaction metadata: a commit or a
            # stop between two changes of one MongoDB transaction would cut it.
            transaction = transaction_id(change, event_format)
            if transaction is None or transaction != batch.open_transaction:
                if now >= deadline:
                    return StopReason.MAX_OPEN if self.open else StopReason.MAX_DURATION
                if tally.pending_changes >= max_batch or batch.due(now):
                    batch.commit(self.position)
            if self.chunk is not None:
                self.chunk.apply(change, batch.builder.omits_document(change))
            batch.add_change(change, cluster_time, transaction)
            self.position = Position(dict(change["_id"]), cluster_time or position_time(self.position))
            self._idle_since = self._changed_at = now
            if not stream.alive:
                return self._invalidated(self._invalidate_token(stream.resume_token))

    def _pace(self, pace_s: float, max_batch: int) -> None:
        """Before an open window asks the server again. When the last reply brought changes but
        not a full batch, the stream had caught up: commit what was read (unless a MongoDB
        transaction may go on in the next reply), then wait until ``pace_s`` after that reply was
        asked for, so that the changes arriving meanwhile come in one reply. Without it a trickle
        of changes costs a ``getMore`` round trip each (the server answers as soon as it has one);
        the latency stays that of the commit interval, which the changes waited for anyway."""
        if not 0 < self._fetched < max_batch or self.batch.open_transaction is not None:
            return
        if self.batch.pending():
            self.batch.commit(self.position)
        wait = self._fetched_at + pace_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)

    def _opened_past_end(self, stream) -> bool:
        """Whether the stream's first reply (the aggregate, no change in its batch) already carries
        a PBRT at or past the end: then no change before the end is left, and the first
        ``try_next`` would only hold a getMore for ``poll_ms`` to say so again. (With changes in
        the first batch, pymongo's ``resume_token`` is still the start position, before the end.)"""
        cluster_time = token_cluster_time(stream.resume_token)
        return cluster_time is not None and cluster_time >= self.pbrt_end

    def _no_change(self, stream, now: float, deadline: float) -> StopReason | None:
        """An empty poll: the stop it brings (end passed by the PBRT, max duration, idle), if any;
        a newer PBRT moves the position, and a batch due is committed."""
        if not stream.alive:
            return self._invalidated(self._invalidate_token(stream.resume_token))
        token = stream.resume_token
        cluster_time = token_cluster_time(token)
        if cluster_time is not None and cluster_time >= self.pbrt_end:
            return StopReason.END_REACHED
        if (
            token is not None
            and cluster_time is not None
            and dict(token) != dict(self.position.resume_token or {})
        ):
            # A newer PBRT: every change up to it has been read.
            self.position = Position(dict(token), cluster_time)
            self.batch.heartbeat(cluster_time)
            self._idle_since = now
        if now >= deadline:
            return StopReason.MAX_OPEN if self.open else StopReason.MAX_DURATION
        stalled = now - self._idle_since >= self.scope.params.idle_timeout_s
        if self.open:
            # Stalled before the window end (the run's time) lies in the past: as a bounded window.
            # Else it closes when no change came for its idle time.
            read_to = position_time(self.position)
            if stalled and self._end_passed() and (read_to is None or read_to < self.scope.params.end):
                return StopReason.CLUSTER_TIME_STALLED
            if now - self._changed_at >= self.scope.params.open_idle_s:
                return StopReason.IDLE
        elif stalled:
            return StopReason.CLUSTER_TIME_STALLED if self._end_passed() else StopReason.IDLE_TIMEOUT
        if self.batch.due(now):  # no change pending: any transaction read is complete
            self.batch.commit(self.position)
        return None

    def _reopen_after(self, error: PyMongoError, failures: int) -> None:
        """After the stream failed (``failures`` times in a row): raise the connector's error for
        ``error``, or keep or roll back the batch and wait before the stream is opened again."""
        config, partition, committed = self.scope.config, self.scope.partition, self.batch.committed_position
        if is_history_lost(error):
            raise purged_error(config, partition, self.position, error) from None
        if is_unusable_position(error):
            raise unusable_position_error(config, partition, committed, error) from None
        if is_oversize_change(error):
            raise oversize_change_error(config, partition, error) from None
        if not is_transient(error):
            raise stream_failed_error(partition, error) from None
        if failures > self.policy.max_attempts:
            raise retries_exhausted_error(partition, failures, error, committed) from None
        delay = self.policy.delay_ms(failures)
        self.reconnects += 1
        self.position = self.batch.recover(self.position)
        log.warning(
            "Change stream of %s interrupted (%s); re-opening from %s in %s (attempt %d of %d)",
            self.scope.describe(),
            error_text(error),
            self.position.describe(),
            format_duration_ms(delay),
            failures,
            self.policy.max_attempts,
        )
        self.sleep(delay / 1000.0)

    def _end_passed(self) -> bool:
        """Whether the window end lies in the past by this worker's clock."""
        return self.scope.clock_ms() >= self.scope.params.window_end.timestamp() * 1000

    def _invalidate_token(self, reported: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
        """The resume token of the invalidate that closed the stream: read itself, from the last
        position read (see :func:`~airflow_provider_mongocdc.core.mongo.change_stream.read_invalidate_token`),
        else ``reported``."""
        try:
            token = read_invalidate_token(
                self.client, self.scope.config, self.position, max_await_time_ms=self.scope.params.poll_ms
            )
        except PyMongoError as error:
            log.warning(
                "Window of %s: could not read the invalidate event (%s); using the server's resume token",
                self.scope.describe(),
                error_text(error),
            )
            return reported
        return token if token is not None else reported

    def _invalidated(self, token: Mapping[str, Any] | None) -> StopReason:
        cluster_time = token_cluster_time(token)
        if token is not None and cluster_time is not None and cluster_time < self.end:
            self.position = Position(dict(token), cluster_time)
            self.invalidated_at = self.position
        return StopReason.INVALIDATED

    def _final_position(self, reason: StopReason) -> Position:
        if reason == StopReason.END_REACHED:
            return Position(cluster_time=self.end)
        if reason == StopReason.INVALIDATED and self.invalidated_at is None and self.end != OPEN_END:
            # The invalidate lies at or past the end: everything before the end was read.
            return Position(cluster_time=self.end)
        return self.position

    def low_watermark(self) -> Timestamp | None:
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
