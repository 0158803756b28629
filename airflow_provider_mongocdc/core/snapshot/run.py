"""One run of the snapshot application after its assessment: the decision carried out.

:func:`run_snapshot` assesses (:class:`~airflow_provider_mongocdc.core.snapshot.assessment.Assessment`:
topology, stored offsets, ``snapshot.mode``) and then does what the decision says: nothing;
``snapshot.mode=no_data`` records the stream position; a new snapshot records the stream position,
plans the chunks and commits "snapshot started" with the plan; an interrupted one resumes with its
own plan. The chunks are copied in parallel tasks (:class:`ChunkTasks`, Spark's in
``spark_apps/snapshot.py``; :func:`copy_chunks` runs in each), ``snapshot.max.threads`` at a time and
the final chunk last; then the completed snapshot is committed. Reasons: docs/design.md, "Snapshots".
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.headers import new_run_id
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.change_stream import current_position, no_data_start_position
from airflow_provider_mongocdc.core.mongo.connection import connect, connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore, OffsetTopicContents
from airflow_provider_mongocdc.core.offsets.writers import (
    Observe,
    chunk_transactional_id,
    control_transactional_id,
)
from airflow_provider_mongocdc.core.snapshot.assessment import (
    Assessment,
    base_summary,
    nothing_summary,
    offsets_summary,
)
from airflow_provider_mongocdc.core.snapshot.copier import (
    ChunkCopier,
    ChunkResult,
    Progress,
    check_complete,
    fence_chunks,
)
from airflow_provider_mongocdc.core.snapshot.decision import NOTHING, RECORD_POSITION, RESUME
from airflow_provider_mongocdc.core.snapshot.incremental import superseded_incremental
from airflow_provider_mongocdc.core.snapshot.plan import (
    Chunk,
    SnapshotPlan,
    data_chunks_finished,
    distribute,
    new_snapshot_id,
    plan_snapshot,
)

log = logging.getLogger("airflow_provider_mongocdc")

PROGRESS_POLL_S = 2.0


class ChunkTasks(Protocol):
    """Runs chunk copies in parallel tasks (the snapshot application's Spark job)."""

    def start(self, description: str) -> None:
        """Be ready to run tasks, described as ``description`` (Spark: the JVM and SparkContext
        start at the first call)."""

    def run(
        self, copy: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], groups: list[Any]
    ) -> list[Any]:
        """``copy(group)`` for every group, each in a task of its own; their results, in order."""


# -- a task -----------------------------------------------------------------------------------------
def copy_chunks(task: dict[str, Any], chunk_documents: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run in a task: copy a group of chunks; returns their results.

    Chunks already committed (by an earlier attempt of this task or an earlier run) are skipped,
    as read from the offsets topic when the task starts. Each chunk is also checked again after
    its writer took over the chunk's ``transactional.id`` (fencing every earlier writer of it):
    another run of the same snapshot (a Spark retry, or a second snapshot task that resumed it)
    may have committed it since the task started, and it must not be copied twice.

    The offsets are read while the sibling tasks commit their chunks (a chunk's transaction on
    the offsets topic stays open from its marker to the end of its commit, which waits for the
    chunk's events, possibly longer than the take-over's settle time): the writers of the run's
    other chunks and its control writer (``task["running"]``, see :meth:`SnapshotRun._task`) are
    waited for, never taken over. This task's own chunks are not among them: a transaction of
    theirs is a killed earlier attempt's, taken over as before.
    """
    config = ConnectorConfig.from_properties(task["connector"])
    partition = OffsetPartition(**task["partition"])
    chunks = [Chunk.from_json(document) for document in chunk_documents]
    own = {
        chunk_transactional_id(config.topic_prefix, task["snapshot_id"], chunk.chunk_id) for chunk in chunks
    }
    running = set(task.get("running", ())) - own
    store = OffsetStore.for_connector(task["kafka"], config, running=running)
    finished = store.finished_chunks(partition, task["snapshot_id"])

    def committed(chunk_id: str) -> bool:
        # Asked once the chunk's writer fenced the earlier ones: committed by another run since?
        return chunk_id in store.finished_chunks(partition, task["snapshot_id"])

    start = Position.from_json(task["start"])
    copier = ChunkCopier(
        config,
        task["kafka"],
        task["snapshot_id"],
        start,
        partition,
        task["replica_set"],
        run_id=task.get("run_id"),
    )
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


# -- the run ----------------------------------------------------------------------------------------
def run_snapshot(spec: JobSpec, tasks: ChunkTasks) -> dict[str, Any]:
    """Assess, then snapshot as decided; returns the run's summary."""
    config = ConnectorConfig.from_properties(spec.connector)
    assessment = Assessment(
        spec,
        before_read=lambda: TransactionalWriter(spec.kafka, control_transactional_id(config.topic_prefix)),
    )
    control = assessment.extra
    try:
        return SnapshotRun(assessment, control, tasks).execute()
    finally:
        control.close()
        assessment.close()


class SnapshotRun:
    """One run after the decision: what the assessment found, the writer of the control
    transactions (``control``: start, plan, completion) and the tasks that copy."""

    def __init__(self, assessment: Assessment, control: TransactionalWriter, tasks: ChunkTasks):
        self.found = assessment
        self.config = assessment.config
        self.store = assessment.store
        self.partitions = assessment.partitions
        self.control = control
        # The progress of the copy is read while the chunks commit: it only shows, never takes a
        # writer over (a chunk whose commit is slow would be fenced and fail).
        progress_store = OffsetStore(
            self.store.kafka_config,
            self.store.topic,
            read_timeout_s=self.store.read_timeout_s,
            settling=Observe(log_level=logging.DEBUG),
        )
        self.copying = ParallelCopy(tasks, progress_store, self.plan_partition)
        # The run's id in the read events' __debezium.context.runId header (core/events/headers.py).
        self.run_id = new_run_id()

    @property
    def plan_partition(self) -> OffsetPartition:
        """The partition that holds the plan and the chunk markers."""
        return self.partitions[0]

    # -- outcomes --
    def execute(self) -> dict[str, Any]:
        decision = self.found.decision
        if decision.action == NOTHING:
            log.info("Nothing to snapshot: %s", decision.reason)
            return nothing_summary(self.config, decision, self.partitions, self.found.states)
        base = base_summary(self.config, decision, self.partitions)
        if decision.action == RECORD_POSITION:
            return base | self._record_position()
        if decision.action == RESUME:
            return base | self._resume(decision.snapshot_id)
        # snapshot.mode=always decides reset_offset itself, from the offsets.
        reset_offset = self.found.reset_offset if decision.reset_offset is None else decision.reset_offset
        return base | self._new_snapshot(reset_offset)

    def _record_position(self) -> dict[str, Any]:
        """snapshot.mode=no_data without an offset: the current position (or capture.start.op.time),
        snapshot completed."""
        snapshot_id = new_snapshot_id()
        records, after = [], {}
        for partition in self.partitions:
            state = self.found.states[partition]
            if state is not None and state.position is not None:
                after[partition] = state  # this partition already has an offset: kept as it is
                continue
            start = no_data_start_position(self.found.client_for(partition.rs), self.config)
            state = (state or OffsetState()).snapshot_started(snapshot_id, start, 0).snapshot_completed()
            after[partition] = state
            records.append(self.store.offset_record(partition, state, connector=self.config.name))
        self._control_commit(records)
        log.info(
            "snapshot.mode=no_data: recorded the stream position without copying data (%s)",
            "; ".join(f"{p.rs}: {s.position.describe()}" for p, s in after.items()),
        )
        return {
            "snapshot_id": snapshot_id,
            "documents": 0,
            "chunks": 0,
            "duration_s": round(time.monotonic() - self.found.started, 3),
            "offsets": offsets_summary(after),
        }

    def _new_snapshot(self, reset_offset: bool) -> dict[str, Any]:
        snapshot_id = new_snapshot_id()
        # 1. The stream position, recorded BEFORE anything is read.
        starts = {
            partition: current_position(self.found.client_for(partition.rs), self.config)
            for partition in self.partitions
        }
        for partition, start in starts.items():
            log.info(
                "Snapshot %s: stream position of %s recorded: %s", snapshot_id, partition.rs, start.describe()
            )
        # 2. The plan.
        plan = self._plan(snapshot_id, reset_offset)
        # 3. Topics, then "snapshot started" with the plan, on their own in one transaction.
        self._ensure_data_topics(plan)
        records = [
            self.store.offset_record(
                partition,
                (self.found.states[partition] or OffsetState()).snapshot_started(
                    snapshot_id, starts[partition], plan.size
                ),
                connector=self.config.name,
            )
            for partition in self.partitions
        ]
        records.extend(plan.records(self.store, self.plan_partition))
        self._control_commit(records)
        return self._copy(plan, starts, markers={}, resumed=False)

    def _plan(self, snapshot_id: str, reset_offset: bool) -> SnapshotPlan:
        plan = plan_snapshot(
            self.found.client_for(None),
            self.config,
            snapshot_id,
            self.found.collections,
            reset_offset=reset_offset,
        )
        log.info(
            "Snapshot %s: %d collections in %d chunks (about %d documents; snapshot.chunk.size=%d, "
            "snapshot.max.threads=%d)",
            snapshot_id,
            len(plan.collections),
            plan.size,
            sum(chunk.estimated for chunk in plan.chunks),
            self.config.snapshot_chunk_size,
            self.config.snapshot_max_threads,
        )
        return plan

    def _resume(self, snapshot_id: str) -> dict[str, Any]:
        plan, markers = self._stored_plan(snapshot_id)
        requested = self.found.collections
        if requested is not None and [f"{db}.{coll}" for db, coll in requested] != list(plan.collections):
            log.warning(
                "Snapshot %s was interrupted; it resumes with its own collections (%s), not the "
                "requested ones (%s). Run again after it completed for the requested ones.",
                snapshot_id,
                ", ".join(plan.collections),
                ", ".join(f"{db}.{coll}" for db, coll in requested),
            )
        starts = self._recorded_starts(snapshot_id)
        log.info(
            "Snapshot %s resumes: %d of %d chunks already committed; recorded start %s",
            snapshot_id,
            len(data_chunks_finished(markers)),
            plan.size,
            "; ".join(f"{p.rs}: {s.describe()}" for p, s in starts.items()),
        )
        self._ensure_data_topics(plan)
        return self._copy(plan, starts, markers=markers, resumed=True)

    def _stored_plan(self, snapshot_id: str) -> tuple[SnapshotPlan, dict[str, Any]]:
        """The interrupted snapshot's plan, and its chunk markers once the transactions the
        interrupted run left open are finished (they hide later commits from read_committed
        readers)."""
        markers = dict(self.found.everything.chunks.get((self.plan_partition, snapshot_id), {}))
        plan = SnapshotPlan.from_markers(snapshot_id, markers)
        if plan is None:
            raise OffsetError(
                f"Snapshot {snapshot_id} is in progress but its plan is not in the offsets topic",
                cause="the plan records were deleted (the topic was compacted with tombstones or edited)",
                fix="reset the connector's offsets (mongocdc offsets reset) and run the snapshot again",
            )
        finished = data_chunks_finished(markers)
        unfinished = [chunk.chunk_id for chunk in plan.chunks if chunk.chunk_id not in finished]
        fenced = fence_chunks(self.found.spec.kafka, self.config.topic_prefix, snapshot_id, unfinished)
        log.info("Snapshot %s: took over the transactions of %d unfinished chunks", snapshot_id, fenced)
        everything = self.store.read_everything()
        return plan, dict(everything.chunks.get((self.plan_partition, snapshot_id), {}))

    def _recorded_starts(self, snapshot_id: str) -> dict[OffsetPartition, Position]:
        """The stream position each partition recorded when the snapshot started."""
        starts = {}
        for partition in self.partitions:
            state = self.found.states[partition]
            if state is None or state.snapshot.snapshot_id != snapshot_id or state.snapshot.start is None:
                raise OffsetError(
                    f"Snapshot {snapshot_id} is not in progress for partition {partition.describe()}",
                    cause="the partitions of the connector changed since the snapshot started "
                    "(mongodb.connection.mode or the shards)",
                    fix="reset the connector's offsets and run the snapshot again",
                )
            starts[partition] = state.snapshot.start
        return starts

    # -- copying and completing --
    def _copy(self, plan: SnapshotPlan, starts, *, markers, resumed: bool) -> dict[str, Any]:
        phases = self.copying.phases
        phases["plan"] = round(time.monotonic() - self.found.started, 3)
        progress = Progress(plan)
        progress.preload(markers)
        finished = set(data_chunks_finished(markers))
        pending = [chunk for chunk in plan.chunks if chunk.chunk_id not in finished]
        final = plan.final_chunk
        regular = [chunk for chunk in pending if final is None or chunk.chunk_id != final.chunk_id]
        task = self._task(plan, starts, pending)
        if regular:
            self.copying.run(task, regular, self.config.snapshot_max_threads, progress)
        if final is not None and final.chunk_id not in finished:
            self.copying.run(task, [final], 1, progress)
        completing = time.monotonic()
        summary = self._complete(plan, progress, starts, resumed)
        phases["complete"] = round(time.monotonic() - completing, 3)
        return summary | {"phases_s": dict(phases)}

    def _task(
        self, plan: SnapshotPlan, starts: Mapping[OffsetPartition, Position], pending: list[Chunk]
    ) -> dict[str, Any]:
        """What every task of the plan needs (the argument of :func:`copy_chunks`).

        ``running``: the writers of this run that commit beside its tasks, whose transactions the
        tasks' reads wait for instead of taking them over: the writers of the chunks it copies
        (``pending``) and its control writer. None of them can be a killed earlier writer's: a new
        snapshot's chunk ids are new, a resumed one's unfinished chunks were taken over before any
        task started (:meth:`_stored_plan`), and the control writer was taken over by this run
        before it read (``run_snapshot``)."""
        partition = self.plan_partition
        spec = self.found.spec
        prefix = self.config.topic_prefix
        running = [chunk_transactional_id(prefix, plan.snapshot_id, chunk.chunk_id) for chunk in pending]
        running.append(control_transactional_id(prefix))
        return {
            "connector": spec.connector,
            "mongo": spec.mongo,
            "kafka": spec.kafka,
            "snapshot_id": plan.snapshot_id,
            "start": starts[partition].to_json(),
            "partition": {
                "server_id": partition.server_id,
                "rs": partition.rs,
                "connector": partition.connector_name,
            },
            "replica_set": self.found.replica_set,
            # One run id for every chunk this run copies (Debezium's runId header: one per task start).
            "run_id": self.run_id,
            "running": running,
        }

    def _complete(self, plan: SnapshotPlan, progress: Progress, starts, resumed: bool) -> dict[str, Any]:
        """All chunks committed: the recorded start becomes the streaming offset."""
        everything = self.store.read_everything()
        markers = everything.chunks.get((self.plan_partition, plan.snapshot_id), {})
        check_complete(plan, markers)
        for line in progress.update(markers):
            log.info("%s", line)
        totals = progress.totals()
        after = completed_states(everything, self.partitions, plan, totals["events"])
        records = [
            self.store.offset_record(partition, state, connector=self.config.name)
            for partition, state in after.items()
        ]
        # Markers of earlier snapshots are no longer needed: delete them (compaction drops them).
        for (owner, snapshot_id), old in everything.chunks.items():
            if owner in after and snapshot_id != plan.snapshot_id and old:
                records.extend(self.store.chunk_tombstones(owner, snapshot_id, old))
        self._control_commit(records)
        completed = CompletedSnapshot(
            plan, progress, totals, starts, after, resumed, time.monotonic() - self.found.started
        )
        completed.log()
        return completed.summary()

    # -- helpers --
    def _ensure_data_topics(self, plan: SnapshotPlan) -> None:
        namer = TopicNamer(self.config)
        names = sorted({namer.data_topic(chunk.database, chunk.collection) for chunk in plan.chunks})
        if names:
            created = ensure_topics(self.found.spec.kafka, [TopicSpec(name) for name in names])
            made = [name for name, outcome in created.items() if outcome == "created"]
            if made:
                log.info("Created topics %s", ", ".join(made))

    def _control_commit(self, records) -> None:
        self.control.begin()
        self.control.commit(records)


class ParallelCopy:
    """Copies chunks in parallel tasks and logs their progress, read from the offsets topic, while
    they run. ``phases``: wall seconds by phase (the summary's ``phases_s``): plan (assessment,
    plan, topics), spark_start (the JVM and SparkContext), copy (the chunk tasks), complete
    (offsets and markers)."""

    def __init__(self, tasks: ChunkTasks, store: OffsetStore, plan_partition: OffsetPartition):
        self.tasks = tasks
        self.store = store
        self.plan_partition = plan_partition
        self.phases = {"plan": 0.0, "spark_start": 0.0, "copy": 0.0, "complete": 0.0}

    def run(self, task: dict[str, Any], chunks: list[Chunk], threads: int, progress: Progress) -> None:
        """Copy ``chunks`` in at most ``threads`` parallel tasks; log progress meanwhile."""
        groups = [[chunk.to_json() for chunk in group] for group in distribute(chunks, threads)]
        began = time.monotonic()
        self.tasks.start(f"mongocdc snapshot {task['snapshot_id']}: {len(chunks)} chunks")
        copying = time.monotonic()
        self.phases["spark_start"] = round(self.phases["spark_start"] + copying - began, 3)
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["results"] = self.tasks.run(functools.partial(copy_chunks, task), groups)
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

    def _log_progress(self, progress: Progress, snapshot_id: str) -> None:
        try:
            markers = self.store.chunk_markers(self.plan_partition, snapshot_id)
        except Exception as error:  # progress is informative only; the copy goes on
            log.warning("Snapshot %s: could not read progress from the offsets topic: %s", snapshot_id, error)
            return
        for line in progress.update(markers):
            log.info("%s", line)


def completed_states(
    everything: OffsetTopicContents, partitions: list[OffsetPartition], plan: SnapshotPlan, events: int
) -> dict[OffsetPartition, OffsetState]:
    """Each partition's offset once the snapshot completed: at the snapshot's recorded start when
    the plan resets the offset (ending a running incremental snapshot), else where it was."""
    after = {}
    for partition in partitions:
        state = everything.states.get(partition)
        if state is None:
            raise OffsetError(
                f"The offset of {partition.describe()} disappeared during snapshot {plan.snapshot_id}",
                cause="it was reset while the snapshot ran",
                fix="run the snapshot again",
            )
        previous = state.position
        completed = state.snapshot_completed(events=events)
        if not plan.reset_offset and previous is not None:
            completed = completed.with_position(previous)
        elif plan.reset_offset:
            completed = superseded_incremental(completed, plan.snapshot_id)
        after[partition] = completed
    return after


@dataclass
class CompletedSnapshot:
    """A snapshot whose chunks all committed: the run's summary and its last log line."""

    plan: SnapshotPlan
    progress: Progress
    totals: dict[str, Any]
    starts: Mapping[OffsetPartition, Position]
    after: Mapping[OffsetPartition, OffsetState]
    resumed: bool
    duration: float

    def summary(self) -> dict[str, Any]:
        plan, progress, totals = self.plan, self.progress, self.totals
        return {
            "snapshot_id": plan.snapshot_id,
            "resumed": self.resumed,
            "reset_offset": plan.reset_offset,
            "start_position": {partition.rs: start.to_json() for partition, start in self.starts.items()},
            "collections": totals["collections"],
            "documents": totals["documents"],
            "events": totals["events"],
            "bytes": totals["bytes"],
            "chunks": plan.size,
            "chunks_copied": plan.size - progress.skipped,
            "chunks_skipped": progress.skipped,
            "documents_copied": progress.copied_documents,
            "duration_s": round(self.duration, 3),
            "docs_per_s": round(progress.copied_documents / max(self.duration, 1e-6), 1),
            "offsets": offsets_summary(self.after),
        }

    def log(self) -> None:
        totals = self.totals
        log.info(
            "Snapshot %s completed in %.1f s: %d documents (%s) in %d chunks (%d skipped as "
            "already committed), %d bytes; streaming continues from %s",
            self.plan.snapshot_id,
            self.duration,
            totals["documents"],
            ", ".join(f"{ns}: {count}" for ns, count in totals["collections"].items()) or "none",
            self.plan.size,
            self.progress.skipped,
            totals["bytes"],
            "; ".join(f"{p.rs}: {s.position.describe()}" for p, s in self.after.items() if s.position),
        )
