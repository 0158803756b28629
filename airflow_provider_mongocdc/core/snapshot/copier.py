"""Copying a snapshot's chunks: :class:`ChunkCopier` reads one ``_id`` range and commits its read
events together with the chunk's marker in one Kafka transaction (``transactional.id`` stable per
chunk), so every document's read event is delivered exactly once; :class:`Progress` reports the
markers as they appear. See docs/design.md, "Snapshots".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient
from pymongo.errors import PyMongoError

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError, OffsetError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import ChunkMarker, OffsetPartition, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import chunk_transactional_id, take_over
from airflow_provider_mongocdc.core.snapshot.id_ranges import document_codec_options
from airflow_provider_mongocdc.core.snapshot.plan import Chunk, SnapshotPlan, data_chunks_finished


@dataclass
class ChunkResult:
    """What copying one chunk did: nothing when an earlier run had committed it, else the counts
    that its marker stores (:meth:`stats`), in the marker's order."""

    chunk_id: str
    namespace: str
    already_committed: bool = False
    documents: int = 0
    events: int = 0
    bytes: int = 0  # key + value bytes of the events
    skipped_oversize: int = 0  # documents whose read event was larger than event.max.bytes
    seconds: float = 0.0
    last: bool = False  # the chunk holds the snapshot's last event

    def stats(self) -> dict[str, Any]:
        return {
            "ns": self.namespace,
            "docs": self.documents,
            "events": self.events,
            "bytes": self.bytes,
            "skipped_oversize": self.skipped_oversize,
            "seconds": round(self.seconds, 3),
            "last": self.last,
        }

    def to_dict(self) -> dict[str, Any]:
        return {"chunk": self.chunk_id, **self.stats(), "already_committed": self.already_committed}


def fence_chunks(
    kafka_config: Mapping[str, Any],
    topic_prefix: str,
    snapshot_id: str,
    chunk_ids: Iterable[str],
    *,
    workers: int = 8,
) -> int:
    """Take over the ``transactional.id`` of each chunk (``init_transactions``), so that every
    transaction a killed run left open for them is finished (aborted, or completed when its
    commit was already under way). Until then such a transaction holds back what
    ``read_committed`` readers see of the offsets topic, so a resumed snapshot calls this before
    it reads which chunks committed. Returns how many ids were fenced."""
    ids = {chunk_transactional_id(topic_prefix, snapshot_id, chunk_id) for chunk_id in chunk_ids}
    return take_over(kafka_config, ids, workers=workers)


@dataclass
class ChunkCopier:
    """Copies chunks of one snapshot: reads a range and commits its read events with its marker."""

    config: ConnectorConfig
    kafka_config: Mapping[str, Any]
    snapshot_id: str
    start: Position
    partition: OffsetPartition
    replica_set: str
    batch_size: int = 0  # events per send(); 0: max.batch.size
    run_id: str | None = None  # the snapshot run's id (header __debezium.context.runId); None: a new one
    _builder: EventBuilder | None = field(default=None, init=False, repr=False)
    _filters: Filters | None = field(default=None, init=False, repr=False)

    @property
    def store(self) -> OffsetStore:
        return OffsetStore.for_connector(self.kafka_config, self.config)

    def copy(
        self, client: MongoClient, chunk: Chunk, *, committed: Callable[[str], bool] | None = None
    ) -> ChunkResult:
        """Copy ``chunk`` in one Kafka transaction together with its marker.

        ``committed(chunk_id)``, when given, is asked after the chunk's writer took over its
        ``transactional.id`` (so no earlier writer of the chunk can still commit): a chunk found
        committed then is not copied again (a retried Spark task, or another run that resumed
        the same snapshot).
        """
        started = time.monotonic()
        if self._builder is None:
            self._builder = EventBuilder(self.config, replica_set=self.replica_set, run_id=self.run_id)
            self._filters = Filters(self.config)
        builder, filters = self._builder, self._filters
        result = ChunkResult(chunk.chunk_id, chunk.namespace)
        transactional_id = chunk_transactional_id(self.config.topic_prefix, self.snapshot_id, chunk.chunk_id)
        batch_size = self.batch_size or self.config.max_batch_size
        with TransactionalWriter(self.kafka_config, transactional_id) as writer:
            if committed is not None and committed(chunk.chunk_id):
                result.already_committed = True
                return result
            writer.begin()
            batch: list[Record] = []
            position = self.start.cluster_time
            for document, is_last in self._documents(
                client, chunk, filters.snapshot_filter(chunk.database, chunk.collection)
            ):
                records = builder.build_snapshot(
                    document, chunk.database, chunk.collection, last=is_last, position=position
                )
                result.documents += 1
                if not records:
                    result.skipped_oversize += 1
                    continue
                result.last = result.last or is_last
                for record in records:
                    result.events += 1
                    result.bytes += record.size
                batch.extend(records)
                if len(batch) >= batch_size:
                    writer.send(batch)
                    batch = []
            if batch:
                writer.send(batch)
            result.seconds = time.monotonic() - started
            marker = self.store.chunk_record(self.partition, self.snapshot_id, chunk.chunk_id, result.stats())
            writer.commit([marker])
        result.seconds = time.monotonic() - started
        return result

    def _documents(
        self, client: MongoClient, chunk: Chunk, snapshot_filter: Mapping[str, Any]
    ) -> Iterator[tuple[dict[str, Any], bool]]:
        """The chunk's documents in ``_id`` order, each with "is the snapshot's last event"."""
        collection = client[chunk.database].get_collection(
            chunk.collection, codec_options=document_codec_options(client)
        )
        fetch = self.config.snapshot_fetch_size
        previous = None
        try:
            cursor = collection.find(chunk.query(snapshot_filter), sort=[("_id", 1)])
            if fetch:
                cursor = cursor.batch_size(fetch)
            for document in cursor:
                if previous is not None:
                    yield previous, False
                previous = document
        except PyMongoError as error:
            raise ConnectionFailedError(
                f"Reading snapshot chunk {chunk.chunk_id} ({chunk.describe()}) failed",
                cause=error_text(error, brief=True),
                fix="check that MongoDB is reachable and the user may read the collection, then run "
                "the snapshot again: committed chunks are skipped",
            ) from None
        if previous is not None:
            yield previous, chunk.final


# -- progress ---------------------------------------------------------------------------------------
@dataclass
class Progress:
    """Counts finished chunks as their markers appear and formats one log line per chunk."""

    plan: SnapshotPlan
    started: float = field(default_factory=time.monotonic)
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    skipped: int = 0  # chunks committed before this run
    copied_documents: int = 0

    def preload(self, markers: Mapping[str, ChunkMarker]) -> None:
        """Chunks committed by an earlier run (a resumed snapshot)."""
        for chunk_id, marker in data_chunks_finished(markers).items():
            if chunk_id not in self.seen:
                self.seen[chunk_id] = dict(marker.stats)
                self.skipped += 1

    def update(self, markers: Mapping[str, ChunkMarker]) -> list[str]:
        """Log lines for chunks finished since the last call."""
        lines = []
        for chunk_id, marker in sorted(data_chunks_finished(markers).items()):
            if chunk_id in self.seen:
                continue
            stats = dict(marker.stats)
            self.seen[chunk_id] = stats
            self.copied_documents += int(stats.get("docs", 0))
            elapsed = max(time.monotonic() - self.started, 1e-6)
            done = len(self.seen)
            lines.append(
                f"Snapshot {self.plan.snapshot_id}: chunk {chunk_id} of {stats.get('ns')} committed "
                f"({stats.get('docs', 0)} documents, {_size(stats.get('bytes', 0))}); "
                f"{done}/{self.plan.size} chunks ({100.0 * done / max(1, self.plan.size):.0f}%), "
                f"{self.copied_documents} documents copied in this run, "
                f"{self.copied_documents / elapsed:.0f} docs/s"
            )
        return lines

    def totals(self) -> dict[str, Any]:
        per_collection: dict[str, int] = {}
        total_bytes = events = 0
        for stats in self.seen.values():
            ns = str(stats.get("ns"))
            per_collection[ns] = per_collection.get(ns, 0) + int(stats.get("docs", 0))
            total_bytes += int(stats.get("bytes", 0))
            events += int(stats.get("events", 0))
        return {
            "documents": sum(per_collection.values()),
            "events": events,
            "bytes": total_bytes,
            "collections": dict(sorted(per_collection.items())),
        }


def _size(count: Any) -> str:
    value = float(count or 0)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


def check_complete(plan: SnapshotPlan, markers: Mapping[str, ChunkMarker]) -> None:
    """Raise unless every chunk of ``plan`` has a committed marker."""
    missing = sorted({chunk.chunk_id for chunk in plan.chunks} - set(data_chunks_finished(markers)))
    if missing:
        raise OffsetError(
            f"Snapshot {plan.snapshot_id} is not complete: {len(missing)} of {plan.size} chunks have "
            "no committed marker",
            cause=f"chunks {', '.join(missing[:10])}{' ...' if len(missing) > 10 else ''} did not commit",
            fix="run the snapshot again: it resumes and copies the missing chunks only",
        )
