"""A stream window's incremental snapshot phase: after streaming to its end, the window copies
the next chunks of a requested incremental snapshot (:mod:`airflow_provider_mongocdc.core.window.incremental`), each committed with its
progress in one Kafka transaction, within ``incremental.snapshot.window.budget.ms`` and
``incremental.snapshot.window.max.documents``. The watermark algorithm: docs/design.md,
"Incremental snapshots".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.snapshot.incremental import (
    IncrementalProgress,
    IncrementalRequest,
    reconcile,
)
from airflow_provider_mongocdc.core.snapshot.plan import parse_namespaces, snapshot_collections
from airflow_provider_mongocdc.core.window.incremental import ChunkReader, IncrementalChunk, after_chunk
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.summary import StopReason

log = logging.getLogger("airflow_provider_mongocdc.core.window.stream_window")  # logged as the window's lines


class IncrementalPhase:
    """The incremental snapshot work of one stream's window.

    The window lends its steps: ``commit(position, last=False, records=, incremental=)`` commits
    the open batch with the offset at ``position`` (plus a chunk's read events and the progress
    they bring); ``stream_to(chunk)`` streams up to the chunk's high watermark, dropping the rows
    the stream changes, and returns the stop reason and the position to store;
    ``read_events(chunk, position)`` builds the chunk's remaining rows as read events;
    ``committed()`` is the window's committed position; ``low_watermark()`` the cluster time of
    the furthest position the stream read (a time the server has reached: a chunk is read after it,
    and MongoDB refuses an ``afterClusterTime`` past its own cluster time).
    """

    def __init__(
        self,
        config: ConnectorConfig,
        client: MongoClient,
        partition: OffsetPartition,
        params: WindowParams,
        *,
        commit: Callable[..., None],
        stream_to: Callable[[IncrementalChunk], tuple[StopReason, Position]],
        read_events: Callable[[IncrementalChunk, Position], list[Record]],
        committed: Callable[[], Position],
        low_watermark: Callable[[], Timestamp],
    ):
        self.config = config
        self.client = client
        self.partition = partition
        self.params = params
        self.commit = commit
        self.stream_to = stream_to
        self.read_events = read_events
        self.committed = committed
        self.low_watermark = low_watermark

    def run(
        self, stored_json: Mapping[str, Any] | None, request: IncrementalRequest | None, started: float
    ) -> dict[str, Any] | None:
        """Copy the next chunks of the requested incremental snapshot (``stored_json``: the
        progress in the offset; ``started``: when the window started, for its max duration);
        returns the summary's ``incremental_snapshot``, or None when there is none."""
        stored = IncrementalProgress.from_json(stored_json)
        if not self.params.incremental_snapshots:
            if (request is not None and not request.stop) or (stored is not None and stored.running):
                log.warning(
                    "Window of %s: the incremental snapshot waits: it needs a connector that reads one "
                    "change stream (mongodb.connection.mode=sharded on a sharded cluster)",
                    self.partition.describe(),
                )
            return None
        progress = reconcile(stored, request, self._resolve_collections)
        if progress is None:
            return None
        if progress != stored:  # started, or stopped on request: stored before any chunk
            self.commit(self.committed(), last=False, incremental=progress)
        config = self.config
        budget_s = config.incremental_snapshot_window_budget_ms / 1000.0
        began = time.monotonic()
        deadline = min(began + budget_s, started + self.params.max_duration_s)
        max_documents = config.incremental_snapshot_window_max_documents
        summary = {"id": progress.request_id, "chunks": 0, "documents": 0, "dropped": 0}
        reader = ChunkReader(self.client, config) if progress.running else None
        read = 0
        # The first chunk starts at the budget's start; each next one only while the budget lasts.
        while progress.running and budget_s > 0 and (not max_documents or read < max_documents):
            if summary["chunks"] and time.monotonic() >= deadline:
                break
            size = config.incremental_snapshot_chunk_size
            if max_documents:
                size = min(size, max_documents - read)
            low = self.low_watermark()
            try:
                moved, chunk = reader.next_chunk(progress, low, size)
            except ConnectionFailedError as error:
                log.warning(
                    "Window of %s: %s; the next window tries again (streaming is not affected)",
                    self.partition.describe(),
                    error,
                )
                summary["error"] = str(error)
                break
            if chunk is None:
                self.commit(self.committed(), last=False, incremental=moved)
                progress = moved
                break
            read += len(chunk.rows)
            reason, final = self.stream_to(chunk)
            if reason != StopReason.END_REACHED:  # the chunk is read again by the next window
                self.commit(final, last=False)
                log.warning(
                    "Window of %s: the stream did not reach the high watermark of the incremental "
                    "snapshot chunk of %s (%s); the next window reads it again",
                    self.partition.describe(),
                    chunk.namespace,
                    reason,
                )
                break
            records = self.read_events(chunk, final)
            progress = after_chunk(moved, chunk, len(chunk.rows))
            self.commit(final, last=False, records=records, incremental=progress)
            summary["chunks"] += 1
            summary["documents"] += len(chunk.rows)
            summary["dropped"] += chunk.dropped
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
        log.debug("Window of %s: %s", self.partition.describe(), progress.describe())
        return summary

    def _resolve_collections(self, names: list[str]) -> list[str]:
        found = snapshot_collections(self.client, self.config, parse_namespaces(names) if names else None)
        return [f"{database}.{collection}" for database, collection in found]
