"""spark-submit entry point of the snapshot: ``snapshot.py --job-spec PATH [--result PATH]``.

The job spec (written by ``MongoSnapshotOperator``) holds the connector configuration, the MongoDB
connection details, the Kafka configuration and the operator's parameters: ``collections``
(``"<db>.<collection>"`` to copy; default every captured collection), ``force`` (snapshot even when
``snapshot.mode`` finds nothing to do; a snapshot in progress is resumed in any case) and
``reset_offset`` (whether completion moves the streaming offset to the position recorded before
copying; default true; ``snapshot.mode=always`` decides it itself without ``force``). Steps
(``core.snapshot_assessment``, then ``core.snapshot_plan`` and ``core.snapshot_copy``): decide per
``snapshot.mode``; record the stream position, plan the chunks and commit "snapshot started" with
the plan; copy the chunks in Spark tasks (``snapshot.max.threads`` at a time), the final chunk
last; commit the completed snapshot. Reasons: docs/design.md, "Snapshots".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.snapshot.assessment import (
    Assessment,
    base_summary,
    nothing_summary,
    offsets_summary,
)
from airflow_provider_mongocdc.core.snapshot.incremental import superseded_incremental
from airflow_provider_mongocdc.spark_apps.runtime import main

if TYPE_CHECKING:
    from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
    from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore, OffsetTopicContents

log = logging.getLogger("airflow_provider_mongocdc")

PROGRESS_POLL_S = 2.0


# -- the tasks ----------------------------------------------------------------------------------------
def copy_chunks(task: dict[str, Any], chunk_documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run in a Spark task: copy a group of chunks; returns their results.

    Chunks already committed (by an earlier attempt of this task or an earlier run) are skipped,
    as read from the offsets topic when the task starts. Each chunk is also checked again after
    its writer took over the chunk's ``transactional.id`` (fencing every earlier writer of it):
    another run of the same snapshot (a Spark retry, or a second snapshot task that resumed it)
    may have committed it since the task started, and it must not be copied twice.
    """
    from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
    from airflow_provider_mongocdc.core.mongo.connection import connect, connection_details
    from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore
    from airflow_provider_mongocdc.core.snapshot.copier import ChunkCopier, ChunkResult
    from airflow_provider_mongocdc.core.snapshot.plan import Chunk

    config = ConnectorConfig.from_properties(task["connector"])
    partition = OffsetPartition(**task["partition"])
    store = OffsetStore(task["kafka"], config.offsets_topic)
    finished = store.finished_chunks(partition, task["snapshot_id"])

    def committed(chunk_id: str) -> bool:
        # Asked once the chunk's writer fenced the earlier ones: committed by another run since?
        return chunk_id in store.finished_chunks(partition, task["snapshot_id"])

    copier = ChunkCopier(
        config,
        task["kafka"],
        task["snapshot_id"],
        Position.from_json(task["start"]),
        partition,
        task["replica_set"],
    )
    chunks = [Chunk.from_json(document) for document in chunk_documents]
    results = []
    client = None
    try:
        for chunk in chunks:
            if chunk.chunk_id in finished:
                results.append(ChunkResult(chunk.chunk_id, chunk.namespace, already_committed=True).to_dict())
                continue
            if client is None:
                client = connect(connection_details(task["mongo"], config), BackoffPolicy.from_config(config))
            results.append(copier.copy(client, chunk, committed=committed).to_dict())
    finally:
        if client is not None:
            client.close()
    return results


# -- the job ------------------------------------------------------------------------------------------
def job(spark, spec: JobSpec) -> dict[str, Any]:
    from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
    from airflow_provider_mongocdc.core.snapshot.copier import control_transactional_id

    config = ConnectorConfig.from_properties(spec.connector)
    assessment = Assessment(
        spec,
        before_read=lambda: TransactionalWriter(spec.kafka, control_transactional_id(config.topic_prefix)),
    )
    control = assessment.extra
    try:
        run = SnapshotRun(
            spark,
            spec,
            assessment.config,
            assessment.store,
            control,
            assessment.partitions,
            assessment.states,
            assessment.everything,
            assessment.replica_set,
            assessment.client_for,
            assessment.collections,
            assessment.reset_offset,
            assessment.started,
        )
        return run.execute(assessment.decision)
    finally:
        control.close()
        assessment.close()


@dataclass
class SnapshotRun:
    """One run of the snapshot application after the decision: what the assessment found, the
    Spark session and the writer of the control transactions (``control``)."""

    spark: Any
    spec: JobSpec
    config: ConnectorConfig
    store: OffsetStore
    control: TransactionalWriter
    partitions: list[OffsetPartition]
    states: dict[OffsetPartition, OffsetState | None]
    everything: OffsetTopicContents
    replica_set: str
    client_for: Callable[[str | None], Any]
    collections: list[tuple[str, str]] | None
    reset_offset: bool
    started: float  # time.monotonic() at the job's start
    # Wall seconds by phase (summary "phases_s"): plan (assessment, plan, topics), spark_start
    # (the JVM and SparkContext), copy (the chunk tasks), complete (offsets and markers).
    phases: dict[str, float] = field(
        default_factory=lambda: {"plan": 0.0, "spark_start": 0.0, "copy": 0.0, "complete": 0.0}
    )

    @property
    def plan_partition(self) -> OffsetPartition:
        """The partition that holds the plan and the chunk markers."""
        return self.partitions[0]

    # -- outcomes --
    def execute(self, decision) -> dict[str, Any]:
        from airflow_provider_mongocdc.core.snapshot.decision import NOTHING, RECORD_POSITION, RESUME

        if decision.action == NOTHING:
            log.info("Nothing to snapshot: %s", decision.reason)
            return nothing_summary(self.config, decision, self.partitions, self.states)
        base = base_summary(self.config, decision, self.partitions)
        if decision.action == RECORD_POSITION:
            return base | self._record_position()
        if decision.action == RESUME:
            return base | self._resume(decision.snapshot_id)
        if decision.reset_offset is not None:  # snapshot.mode=always decides it from the offsets
            self.reset_offset = decision.reset_offset
        return base | self._new_snapshot()

    def _record_position(self) -> dict[str, Any]:
        """snapshot.mode=no_data without an offset: the current position (or capture.start.op.time),
        snapshot completed."""
        from airflow_provider_mongocdc.core.mongo.change_stream import no_data_start_position
        from airflow_provider_mongocdc.core.offsets.model import OffsetState
        from airflow_provider_mongocdc.core.snapshot.plan import new_snapshot_id

        snapshot_id = new_snapshot_id()
        records, after = [], {}
        for partition in self.partitions:
            state = self.states[partition]
            if state is not None and state.position is not None:
                after[partition] = state  # this partition already has an offset: kept as it is
                continue
            start = no_data_start_position(self.client_for(partition.rs), self.config)
            state = (state or OffsetState()).snapshot_started(snapshot_id, start, 0).snapshot_completed()
            after[partition] = state
            records.append(self.store.offset_record(partition, state))
        self._control_commit(records)
        log.info(
            "snapshot.mode=no_data: recorded the stream position without copying data (%s)",
            "; ".join(f"{p.rs}: {s.position.describe()}" for p, s in after.items()),
        )
        return {
            "snapshot_id": snapshot_id,
            "documents": 0,
            "chunks": 0,
            "duration_s": round(time.monotonic() - self.started, 3),
            "offsets": offsets_summary(after),
        }

    def _new_snapshot(self) -> dict[str, Any]:
        from airflow_provider_mongocdc.core.events.filters import Filters
        from airflow_provider_mongocdc.core.mongo.change_stream import current_position
        from airflow_provider_mongocdc.core.offsets.model import OffsetState
        from airflow_provider_mongocdc.core.snapshot.plan import (
            build_plan,
            new_snapshot_id,
            plan_collection,
            snapshot_collections,
        )

        snapshot_id = new_snapshot_id()
        # 1. The stream position, recorded BEFORE anything is read.
        starts = {
            partition: current_position(self.client_for(partition.rs), self.config)
            for partition in self.partitions
        }
        for partition, start in starts.items():
            log.info(
                "Snapshot %s: stream position of %s recorded: %s", snapshot_id, partition.rs, start.describe()
            )
        # 2. The plan.
        client = self.client_for(None)
        namespaces = snapshot_collections(client, self.config, self.collections)
        filters = Filters(self.config)
        ranges = {}
        for database, collection in namespaces:
            ranges[(database, collection)] = plan_collection(
                client,
                database,
                collection,
                self.config.snapshot_chunk_size,
                snapshot_filter=filters.snapshot_filter(database, collection),
            )
        plan = build_plan(
            snapshot_id,
            ranges,
            mode=self.config.snapshot_mode,
            reset_offset=self.reset_offset,
            collections=[f"{db}.{coll}" for db, coll in namespaces],
        )
        log.info(
            "Snapshot %s: %d collections in %d chunks (about %d documents; snapshot.chunk.size=%d, "
            "snapshot.max.threads=%d)",
            snapshot_id,
            len(namespaces),
            plan.size,
            sum(chunk.estimated for chunk in plan.chunks),
            self.config.snapshot_chunk_size,
            self.config.snapshot_max_threads,
        )
        # 3. Topics, then "snapshot started" with the plan, on their own in one transaction.
        self._ensure_data_topics(plan)
        records = []
        for partition in self.partitions:
            state = (self.states[partition] or OffsetState()).snapshot_started(
                snapshot_id, starts[partition], plan.size
            )
            records.append(self.store.offset_record(partition, state))
        records.extend(plan.records(self.store, self.plan_partition))
        self._control_commit(records)
        return self._copy(plan, starts, markers={}, resumed=False)

    def _resume(self, snapshot_id: str) -> dict[str, Any]:
        from airflow_provider_mongocdc.core.base.errors import OffsetError
        from airflow_provider_mongocdc.core.snapshot.copier import fence_chunks
        from airflow_provider_mongocdc.core.snapshot.plan import SnapshotPlan, data_chunks_finished

        markers = dict(self.everything.chunks.get((self.plan_partition, snapshot_id), {}))
        plan = SnapshotPlan.from_markers(snapshot_id, markers)
        if plan is not None:
            # Finish the transactions the interrupted run left open (they hide later commits
            # from read_committed readers), then read again which chunks committed.
            unfinished = [
                chunk.chunk_id for chunk in plan.chunks if chunk.chunk_id not in data_chunks_finished(markers)
            ]
            fenced = fence_chunks(self.spec.kafka, self.config.topic_prefix, snapshot_id, unfinished)
            log.info("Snapshot %s: took over the transactions of %d unfinished chunks", snapshot_id, fenced)
            self.everything = self.store.read_everything()
            markers = dict(self.everything.chunks.get((self.plan_partition, snapshot_id), {}))
        if plan is None:
            raise OffsetError(
                f"Snapshot {snapshot_id} is in progress but its plan is not in the offsets topic",
                cause="the plan records were deleted (the topic was compacted with tombstones or edited)",
                fix="reset the connector's offsets (mongocdc offsets reset) and run the snapshot again",
            )
        self.reset_offset = plan.reset_offset
        if self.collections is not None and [f"{db}.{coll}" for db, coll in self.collections] != list(
            plan.collections
        ):
            log.warning(
                "Snapshot %s was interrupted; it resumes with its own collections (%s), not the "
                "requested ones (%s). Run again after it completed for the requested ones.",
                snapshot_id,
                ", ".join(plan.collections),
                ", ".join(f"{db}.{coll}" for db, coll in self.collections),
            )
        starts = {}
        for partition in self.partitions:
            state = self.states[partition]
            if state is None or state.snapshot.snapshot_id != snapshot_id or state.snapshot.start is None:
                raise OffsetError(
                    f"Snapshot {snapshot_id} is not in progress for partition {partition.describe()}",
                    cause="the partitions of the connector changed since the snapshot started "
                    "(mongodb.connection.mode or the shards)",
                    fix="reset the connector's offsets and run the snapshot again",
                )
            starts[partition] = state.snapshot.start
        log.info(
            "Snapshot %s resumes: %d of %d chunks already committed; recorded start %s",
            snapshot_id,
            len(data_chunks_finished(markers)),
            plan.size,
            "; ".join(f"{p.rs}: {s.describe()}" for p, s in starts.items()),
        )
        self._ensure_data_topics(plan)
        return self._copy(plan, starts, markers=markers, resumed=True)

    # -- copying --
    def _copy(self, plan, starts, *, markers, resumed: bool) -> dict[str, Any]:
        from airflow_provider_mongocdc.core.snapshot.copier import Progress
        from airflow_provider_mongocdc.core.snapshot.plan import data_chunks_finished

        self.phases["plan"] = round(time.monotonic() - self.started, 3)
        progress = Progress(plan)
        progress.preload(markers)
        finished = set(data_chunks_finished(markers))
        pending = [chunk for chunk in plan.chunks if chunk.chunk_id not in finished]
        final = plan.final_chunk
        regular = [chunk for chunk in pending if final is None or chunk.chunk_id != final.chunk_id]
        task = {
            "connector": self.spec.connector,
            "mongo": self.spec.mongo,
            "kafka": self.spec.kafka,
            "snapshot_id": plan.snapshot_id,
            "start": starts[self.plan_partition].to_json(),
            "partition": {
                "server_id": self.plan_partition.server_id,
                "rs": self.plan_partition.rs,
                "connector": self.plan_partition.connector_name,
            },
            "replica_set": self.replica_set,
        }
        if regular:
            self._run_tasks(task, regular, self.config.snapshot_max_threads, progress)
        if final is not None and final.chunk_id not in finished:
            self._run_tasks(task, [final], 1, progress)
        completing = time.monotonic()
        summary = self._complete(plan, progress, starts, resumed)
        self.phases["complete"] = round(time.monotonic() - completing, 3)
        return summary | {"phases_s": dict(self.phases)}

    def _run_tasks(self, task, chunks, threads: int, progress) -> None:
        """Copy ``chunks`` in at most ``threads`` parallel Spark tasks; log progress meanwhile."""
        from airflow_provider_mongocdc.core.snapshot.plan import distribute

        groups = [[chunk.to_json() for chunk in group] for group in distribute(chunks, threads)]
        began = time.monotonic()
        context = self.spark.sparkContext  # the JVM and SparkContext start at the first use
        copying = time.monotonic()
        self.phases["spark_start"] = round(self.phases["spark_start"] + copying - began, 3)
        context.setJobDescription(f"mongocdc snapshot {task['snapshot_id']}: {len(chunks)} chunks")
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                rdd = context.parallelize(groups, len(groups))
                outcome["results"] = rdd.map(lambda group: copy_chunks(task, group)).collect()
            except BaseException as error:  # handed to the driver thread below
                outcome["error"] = error

        worker = threading.Thread(target=run, name="mongocdc-snapshot-job", daemon=True)
        worker.start()
        while worker.is_alive():
            worker.join(PROGRESS_POLL_S)
            self._log_progress(progress, task["snapshot_id"])
        self._log_progress(progress, task["snapshot_id"])
        self.phases["copy"] = round(self.phases["copy"] + time.monotonic() - copying, 3)
        if "error" in outcome:
            raise outcome["error"]

    def _log_progress(self, progress, snapshot_id: str) -> None:
        try:
            markers = self.store.chunk_markers(self.plan_partition, snapshot_id)
        except Exception as error:  # progress is informative only; the copy goes on
            log.warning("Snapshot %s: could not read progress from the offsets topic: %s", snapshot_id, error)
            return
        for line in progress.update(markers):
            log.info("%s", line)

    def _complete(self, plan, progress, starts, resumed: bool) -> dict[str, Any]:
        """All chunks committed: the recorded start becomes the streaming offset."""
        from airflow_provider_mongocdc.core.snapshot.copier import check_complete

        everything = self.store.read_everything()
        markers = everything.chunks.get((self.plan_partition, plan.snapshot_id), {})
        check_complete(plan, markers)
        for line in progress.update(markers):
            log.info("%s", line)
        totals = progress.totals()
        records, after = [], {}
        for partition in self.partitions:
            state = everything.states.get(partition)
            if state is None:
                from airflow_provider_mongocdc.core.base.errors import OffsetError

                raise OffsetError(
                    f"The offset of {partition.describe()} disappeared during snapshot {plan.snapshot_id}",
                    cause="it was reset while the snapshot ran",
                    fix="run the snapshot again",
                )
            previous = state.position
            completed = state.snapshot_completed(events=totals["events"])
            if not plan.reset_offset and previous is not None:
                completed = completed.with_position(previous)
            elif plan.reset_offset:
                completed = superseded_incremental(completed, plan.snapshot_id)
            after[partition] = completed
            records.append(self.store.offset_record(partition, completed))
        # Markers of earlier snapshots are no longer needed: delete them (compaction drops them).
        for (owner, snapshot_id), old in everything.chunks.items():
            if owner in after and snapshot_id != plan.snapshot_id and old:
                records.extend(self.store.chunk_tombstones(owner, snapshot_id, old))
        self._control_commit(records)
        duration = time.monotonic() - self.started
        copied_chunks = plan.size - progress.skipped
        summary = {
            "snapshot_id": plan.snapshot_id,
            "resumed": resumed,
            "reset_offset": plan.reset_offset,
            "start_position": {p.rs: starts[p].to_json() for p in self.partitions},
            "collections": totals["collections"],
            "documents": totals["documents"],
            "events": totals["events"],
            "bytes": totals["bytes"],
            "chunks": plan.size,
            "chunks_copied": copied_chunks,
            "chunks_skipped": progress.skipped,
            "documents_copied": progress.copied_documents,
            "duration_s": round(duration, 3),
            "docs_per_s": round(progress.copied_documents / max(duration, 1e-6), 1),
            "offsets": offsets_summary(after),
        }
        log.info(
            "Snapshot %s completed in %.1f s: %d documents (%s) in %d chunks (%d skipped as "
            "already committed), %d bytes; streaming continues from %s",
            plan.snapshot_id,
            duration,
            totals["documents"],
            ", ".join(f"{ns}: {count}" for ns, count in totals["collections"].items()) or "none",
            plan.size,
            progress.skipped,
            totals["bytes"],
            "; ".join(f"{p.rs}: {s.position.describe()}" for p, s in after.items() if s.position),
        )
        return summary

    # -- helpers --
    def _ensure_data_topics(self, plan) -> None:
        from airflow_provider_mongocdc.core.events.topics import TopicNamer
        from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics

        namer = TopicNamer(self.config)
        names = sorted({namer.data_topic(chunk.database, chunk.collection) for chunk in plan.chunks})
        if names:
            created = ensure_topics(self.spec.kafka, [TopicSpec(name) for name in names])
            made = [name for name, outcome in created.items() if outcome == "created"]
            if made:
                log.info("Created topics %s", ", ".join(made))

    def _control_commit(self, records) -> None:
        self.control.begin()
        self.control.commit(records)


if __name__ == "__main__":
    main("snapshot", job)
