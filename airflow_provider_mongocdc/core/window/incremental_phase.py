"""A stream window's incremental snapshot phase: after streaming to its end, the window copies
the next chunks of a requested incremental snapshot (:mod:`airflow_provider_mongocdc.core.window.incremental`), each committed with its
progress in one Kafka transaction, within ``incremental.snapshot.window.budget.ms`` and
``incremental.snapshot.window.max.documents``. The phase works through the steps of its window
(:class:`WindowSteps`). The watermark algorithm: docs/design.md, "Incremental snapshots".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Protocol

from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.offsets.model import Position
from airflow_provider_mongocdc.core.snapshot.incremental import (
    IncrementalProgress,
    IncrementalRequest,
    reconcile,
)
from airflow_provider_mongocdc.core.snapshot.plan import parse_namespaces, snapshot_collections
from airflow_provider_mongocdc.core.window.incremental import ChunkReader, IncrementalChunk, after_chunk
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.summary import StopReason

log = logging.getLogger("airflow_provider_mongocdc.core.window.stream_window")  # logged as the window's lines


class WindowSteps(Protocol):
    """What the phase needs of its stream window (a ``StreamWindow`` is one)."""

    @property
    def committed_position(self) -> Position:
        """The position of the window's last commit."""

    def commit(self, position: Position, incremental: IncrementalProgress | None = None) -> None:
        """Commit the open batch with the offset at ``position`` (and the snapshot's progress)."""

    def commit_chunk(
        self, position: Position, records: list[Record], incremental: IncrementalProgress
    ) -> None:
        """Commit the open batch with a chunk's read events (``records``) after the streamed
        ones, the offset at ``position`` and the progress past the chunk."""

    def stream_to(self, chunk: IncrementalChunk) -> tuple[StopReason, Position]:
        """Stream up to the chunk's high watermark, dropping the rows the stream changes; the stop
        reason and the position to store."""

    def chunk_events(self, chunk: IncrementalChunk) -> list[Record]:
        """The chunk's remaining rows as read events at the stream position they follow."""

    def low_watermark(self) -> Timestamp | None:
        """The cluster time of the furthest position the stream read (a time the server has
        reached: a chunk is read after it, and MongoDB refuses an ``afterClusterTime`` past its
        own cluster time)."""

    def topic_ends(self, namespaces: list[str]) -> dict[str, dict[int, int]]:
        """Where the topics of ``namespaces`` (``<db>.<collection>``) end now, by topic name."""


class IncrementalPhase:
    """The incremental snapshot work of one stream's window, through the window's steps."""

    def __init__(self, scope: StreamScope, client: MongoClient, window: WindowSteps):
        self.scope = scope
        self.client = client
        self.window = window

    def run(
        self, stored_json: Mapping[str, Any] | None, request: IncrementalRequest | None, started: float
    ) -> dict[str, Any] | None:
        """Copy the next chunks of the requested incremental snapshot (``stored_json``: the
        progress in the offset; ``started``: when the window started, for its max duration);
        returns the summary's ``incremental_snapshot``, or None when there is none."""
        stored = IncrementalProgress.from_json(stored_json)
        progress = self._progress(stored, request)
        if progress is None:
            return None
        budget_s = self.scope.config.incremental_snapshot_window_budget_ms / 1000.0
        began = time.monotonic()
        deadline = min(began + budget_s, started + self.scope.params.max_duration_s)
        summary = {"id": progress.request_id, "chunks": 0, "documents": 0, "dropped": 0}
        if budget_s > 0:
            progress = self._copy_chunks(progress, deadline, summary)
        summary.update(
            status=progress.status,
            current=progress.current,
            pending=list(progress.pending),
            done=list(progress.done),
            left=list(progress.collections_left),
            reread=progress.rereads,
            total_documents=progress.documents,
            total_chunks=progress.chunks,
            # Ended in an earlier window: this one had nothing to do for it.
            finished_earlier=stored is not None
            and stored.request_id == progress.request_id
            and not stored.running,
            duration_s=round(time.monotonic() - began, 3),
            message=progress.message,
        )
        # The task log's line is the operator's, from the summary (window_summary.describe_incremental).
        log.debug("Window of %s: %s", self.scope.describe(), progress.describe())
        return summary

    def _progress(
        self, stored: IncrementalProgress | None, request: IncrementalRequest | None
    ) -> IncrementalProgress | None:
        """The snapshot's progress reconciled with the request (committed before any chunk when
        it changed: started, or stopped on request), or None when there is none to work on."""
        if not self.scope.params.incremental_snapshots:
            if (request is not None and not request.stop) or (stored is not None and stored.running):
                log.warning(
                    "Window of %s: the incremental snapshot waits: it needs a connector that reads one "
                    "change stream (mongodb.connection.mode=sharded on a sharded cluster)",
                    self.scope.describe(),
                )
            return None
        progress = reconcile(stored, request, self._resolve_collections)
        if (
            progress is not None
            and progress.running
            and (stored is None or stored.request_id != progress.request_id)
        ):
            # Where its collections' topics end before its first chunk: the tables' sweep begins
            # their generation there (a change that drops a chunk's read comes before the reads).
            progress = progress.started_at_offsets(self.window.topic_ends(list(progress.pending)))
        if progress is not None and progress != stored:
            self.window.commit(self.window.committed_position, incremental=progress)
        return progress

    def _copy_chunks(
        self, progress: IncrementalProgress, deadline: float, summary: dict[str, Any]
    ) -> IncrementalProgress:
        """Copy chunks while the snapshot runs, within the window's budget (the first chunk
        starts at the budget's start; each next one only while the budget lasts) and its
        documents; returns the progress committed last."""
        max_documents = self.scope.config.incremental_snapshot_window_max_documents
        reader = ChunkReader(self.client, self.scope.config) if progress.running else None
        read = 0
        # The documents this window read again: one changed again before its re-read's high
        # watermark (a hot document) waits for the next window.
        tried: set[tuple[str, str]] = set()
        while progress.running and (not max_documents or read < max_documents):
            if summary["chunks"] and time.monotonic() >= deadline:
                break
            size = self.scope.config.incremental_snapshot_chunk_size
            if max_documents:
                size = min(size, max_documents - read)
            low = self.window.low_watermark()
            try:
                moved, chunk = reader.next_chunk(progress, low, size, tried)
            except ConnectionFailedError as error:
                log.warning(
                    "Window of %s: %s; the next window tries again (streaming is not affected)",
                    self.scope.describe(),
                    error,
                )
                summary["error"] = str(error)
                break
            if chunk is None:  # completed, or only documents this window read again are left
                if moved != progress:
                    self.window.commit(self.window.committed_position, incremental=moved)
                return moved
            tried.update((chunk.namespace, key) for key in chunk.rereads)
            read += len(chunk.rows)
            copied = self._copy(chunk, moved, summary)
            if copied is None:
                break
            progress = copied
        return progress

    def _copy(
        self, chunk: IncrementalChunk, moved: IncrementalProgress, summary: dict[str, Any]
    ) -> IncrementalProgress | None:
        """Stream to the chunk's high watermark and commit its remaining rows with the progress
        past it (``moved``: the progress the chunk's read brought); None when the stream stopped
        before the watermark (the chunk is read again by the next window)."""
        reason, final = self.window.stream_to(chunk)
        if reason != StopReason.END_REACHED:
            self.window.commit(final)
            log.warning(
                "Window of %s: the stream did not reach the high watermark of the incremental "
                "snapshot chunk of %s (%s); the next window reads it again",
                self.scope.describe(),
                chunk.namespace,
                reason,
            )
            return None
        records = self.window.chunk_events(chunk)
        progress = after_chunk(moved, chunk, len(chunk.rows))
        self.window.commit_chunk(final, records, progress)
        summary["chunks"] += 1
        summary["documents"] += len(chunk.rows)
        summary["dropped"] += chunk.dropped
        return progress

    def _resolve_collections(self, names: list[str]) -> list[str]:
        found = snapshot_collections(
            self.client, self.scope.config, parse_namespaces(names) if names else None
        )
        return [f"{database}.{collection}" for database, collection in found]
