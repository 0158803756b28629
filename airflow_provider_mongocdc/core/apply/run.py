"""One table's apply: from the position the table records to the topic's end, in commits that each
hold the rows they change and the positions they reach.

1. The table's state (:class:`~airflow_provider_mongocdc.core.apply.state.TableState`): who wrote
   it (:func:`~airflow_provider_mongocdc.core.apply.state.check_owner`), its positions, generation
   and snapshot under way; its columns against the layout (a declared type that changed is refused).
   Nothing has changed yet when any of this fails.
2. The connector's snapshot status (offsets topic), then the topic's ends, then the events in
   batches of ``max_batch_events`` (more to finish a MongoDB transaction; a topic of several
   partitions in one batch), each committed with its positions: a killed apply leaves the table at
   its last commit, and the next run starts exactly there. Records before the table's position are
   never read again, so a range is never applied twice.
3. The status again: a snapshot completed over the read sweeps (:mod:`~airflow_provider_mongocdc.core.apply.snapshots`).
4. Maintenance when due: compaction of small files, vacuum of files older than the retention.

The table itself is behind :class:`TableStore` (the delta-rs adapter, next to the application that
runs this), so that this module imports no delta-rs.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from airflow_provider_mongocdc.core.apply.batch import Batch, Commit, Row
from airflow_provider_mongocdc.core.apply.events import ChangeEvent, Changes
from airflow_provider_mongocdc.core.apply.layout import TableLayout
from airflow_provider_mongocdc.core.apply.patch import Patcher
from airflow_provider_mongocdc.core.apply.snapshots import KIND_WORDS, SnapshotStatus, SnapshotTracker
from airflow_provider_mongocdc.core.apply.state import (
    TableState,
    check_owner,
    last_misfits_app_id,
    misfits_app_id,
    undeclared_app_id,
)
from airflow_provider_mongocdc.core.apply.topics import (
    check_same_topic,
    first_records,
    partitions_of,
    read_range,
    topic_ends,
    topic_facts,
)
from airflow_provider_mongocdc.core.apply.values import Misfits
from airflow_provider_mongocdc.core.base.errors import TableError

log = logging.getLogger("airflow_provider_mongocdc.apply")


def reset_fix(uri: str, topic: str) -> str:
    """What to do with a table whose topic was created again."""
    return (
        "move the table away (the next run builds it again from the topic), or keep its rows and apply "
        f"the topic from its first record on: pause the connector's DAGs and run 'mongocdc tables "
        f"reset-positions --table {uri} --topic {topic} --bootstrap-servers ... --yes' (it records the "
        "topic's identity and its first offsets as the table's positions, in one commit that changes no "
        "row; re-applied records change only rows they hold, and a re-snapshot sweeps the rows of "
        "documents MongoDB no longer has)"
    )


class TableStore(Protocol):
    """A table as the apply uses it, in one table format (:mod:`airflow_provider_mongocdc.tables`:
    ``delta`` with delta-rs, ``iceberg`` with pyiceberg). What each method of a format must do is its
    docstring; the adapters record the table's apply state (``app_version``) with the rows of each
    commit, atomically: Delta application transactions, Iceberg snapshot summary properties."""

    uri: str

    def version(self) -> int | None:
        """The table's version, None when there is no table yet."""

    def app_version(self, app_id: str) -> int | None:
        """The version of an application transaction recorded in the table."""

    def description(self) -> str:
        """What the table's metadata says of it (for the error about a foreign table)."""

    def check_layout(self, layout: TableLayout) -> list[str]:
        """Refuse a layout the table cannot take (a declared column's type changed); returns notes."""

    def stale_columns(self) -> list[str]:
        """The table's columns that the layout :meth:`check_layout` saw no longer declares."""

    def evolve(self, layout: TableLayout, refill: list[str], versions: Mapping[str, int]) -> list[str]:
        """Add the declared columns the table lacks and fill them, and the ``refill`` ones, from
        ``_doc``, in one commit that records ``versions``; returns notes."""

    def documents(self, keys: list[str]) -> Mapping[str, str]:
        """The documents the table holds of ``keys`` (for updates without one)."""

    def commit(self, commit: Commit, layout: TableLayout, name: str, description: str) -> dict[str, Any]:
        """Write ``commit`` in one Delta commit (creating the table when there is none); returns
        the new version and the row counts."""

    def maintain(
        self, state: TableState, compact: bool, vacuum_retention_s: float | None, now_s: int
    ) -> dict[str, Any]:
        """Compact small files and/or vacuum old ones, recording when in the table."""


@dataclass(frozen=True)
class TableJob:
    """One table's apply: its topic and collection, layout and settings."""

    topic: str
    namespace: str
    layout: TableLayout
    max_batch_events: int
    json_mode: str = "strict"
    quiet_wait_s: float = 60.0
    compact_every_s: float | None = None
    vacuum_every_s: float | None = None
    vacuum_retention_s: float = 7 * 86400.0
    fail_on_misfit: bool = False


def _due(last: int | None, every: float | None, now_s: int) -> bool:
    return every is not None and (last is None or now_s - last >= every)


class TableApply:
    """The apply of one topic to one table."""

    def __init__(
        self,
        job: TableJob,
        store: TableStore,
        kafka_config: Mapping[str, Any],
        snapshot_status: Callable[[], SnapshotStatus | None] = lambda: None,
        clock: Callable[[], float] = time.time,
    ):
        self.job = job
        self.store = store
        self.kafka_config = kafka_config
        self.snapshot_status = snapshot_status
        self.clock = clock
        self.misfits = Misfits(refuse=job.fail_on_misfit, table=store.uri)
        self.misfit_totals: dict[str, int] = {}  # per declared column, since the table was created
        self.summary: dict[str, Any] = {
            "topic": job.topic,
            "collection": job.namespace,
            "table": store.uri,
            "events": 0,
            "events_by_op": {},
            "rows_written": 0,
            "rows_deleted": 0,
            "rows_swept": 0,
            "commits": 0,
            "updates_without_document": 0,
            "notes": [],
        }

    # -- the steps --------------------------------------------------------------------------------------
    def check(self, partitions: list[int], records: bool = False) -> TableState:
        """Step 1: the table's state, its owner and its columns; with ``records``, the first record
        to apply of each partition too (nothing changes here)."""
        store, topic = self.store, self.job.topic
        version = store.version()
        check_owner(
            store.uri, topic, version, store.app_version, store.description() if version is not None else ""
        )
        state = TableState.read(topic, version, store.app_version, partitions)
        if partitions:
            facts = topic_facts(self.kafka_config, topic, partitions)
            check_same_topic(
                store.uri, topic, state.topic_id, state.positions, facts, reset_fix(store.uri, topic)
            )
            if state.topic_id is None:
                state.topic_id = facts.identity  # recorded from the next commit on
        self.summary["notes"].extend(store.check_layout(self.job.layout))
        state.undeclared = tuple(store.stale_columns())
        self.misfit_totals = {
            column.name: store.app_version(misfits_app_id(topic, column.name)) or 0
            for column in self.job.layout.declared
        }
        if records:
            ends = topic_ends(self.kafka_config, topic, partitions, 0.0)
            starts = {p: max(first, state.positions.get(p, first)) for p, first in ends.earliest.items()}
            first_records(self.kafka_config, topic, starts, ends.ends)
        return state

    def run(self) -> dict[str, Any]:
        began = time.monotonic()
        job = self.job
        partitions = partitions_of(self.kafka_config, job.topic)
        state = self.check(partitions)
        self.summary["version_before"] = state.version
        if state.exists:
            self.summary["notes"].extend(self._evolve(state))
        before = self.snapshot_status()
        ends = topic_ends(self.kafka_config, job.topic, partitions, job.quiet_wait_s)
        # Read again once the range's end is taken: an incremental snapshot whose events lie in the
        # range shows here (its start is committed before any of them), and a completion shown both
        # times covers every read before the end.
        after = self.snapshot_status()
        starts = self._starts(state, ends.earliest)
        if not ends.quiet:
            self.summary["notes"].append(
                f"no moment without an open transaction on the {len(partitions)} partitions of the topic "
                f"within {job.quiet_wait_s:g} s: nothing applied this run"
            )
            stop = dict(starts)
        else:
            stop = dict(ends.ends)
        tracker = SnapshotTracker(state.generation, state.pending, dict(state.began))
        tracker.arm(after, starts)
        # The read, the fold and the commits make hundreds of thousands of objects that hold no
        # cycles: the cyclic garbage collector would only walk them again and again (a tenth of
        # their CPU). It runs again once they are gone.
        collecting = gc.isenabled()
        gc.disable()
        chunks = self.chunks(starts, stop, partitions)
        try:
            state, batch = self._apply_range(state, tracker, starts, stop, chunks)
            # A snapshot the offsets topic shows completed over the range sweeps in the last
            # commit, the batch's own older rows too.
            batch.complete_at_end(before, after)
            if batch.events or batch.moved():
                state = self._commit(batch, state)
            del batch
        finally:
            # A commit that failed mid-range leaves the read suspended: its consumers close now, not
            # whenever the error's traceback is dropped.
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
            if collecting:
                gc.enable()
        self.summary["notes"].extend(tracker.notes)
        self.summary["snapshot"] = {
            "generation": tracker.generation,
            "under_way": KIND_WORDS[tracker.pending],
            "begun": tracker.began_runs,
            "completed": tracker.completed,
        }
        self.summary["maintenance"] = self._maintain(state)
        self.summary["positions"] = {str(p): o for p, o in sorted(state.positions.items())}
        self.summary["ends"] = {str(p): o for p, o in sorted(stop.items())}
        self.summary["behind"] = sum(
            max(0, ends.ends.get(p, 0) - state.positions.get(p, 0)) for p in partitions
        )
        self.summary["version"] = self.store.version()
        self.summary["misfits"] = self.misfits.to_json(self._totals())
        self.summary["misfit_lines"] = self.misfits.describe(job.layout.declared)
        self.summary["duration_s"] = round(time.monotonic() - began, 3)
        return self.summary

    def _totals(self) -> dict[str, int]:
        """Per declared column, the values that did not fit it since the table was created."""
        return {
            column.name: self.misfit_totals.get(column.name, 0) + self.misfits.counts.get(column.name, 0)
            for column in self.job.layout.declared
        }

    def _evolve(self, state: TableState) -> list[str]:
        """Declared columns new to the table added and filled from ``_doc``; those declared again
        after rows were written without them (null there) filled again, so that no row keeps a null
        its document has a value for."""
        again = [
            column.name
            for column in self.job.layout.declared
            if self.store.app_version(undeclared_app_id(self.job.topic, column.name)) == 1
        ]
        versions = {undeclared_app_id(self.job.topic, name): 0 for name in again}
        return self.store.evolve(self.job.layout, again, versions)

    def _starts(self, state: TableState, earliest: Mapping[int, int]) -> dict[int, int]:
        """Where each partition's read starts: the table's position, or the topic's earliest record
        for a new table. A position before the earliest record means records were deleted from the
        topic before they were applied: said in the log and the summary (a re-snapshot repairs it)."""
        starts = {}
        for partition, first in earliest.items():
            position = state.positions.get(partition)
            if position is not None and position < first:
                note = (
                    f"partition {partition}: records {position} to {first - 1} were deleted from the topic "
                    "(retention) before they were applied; the table misses them until a re-snapshot of "
                    f"{self.job.namespace} is applied"
                )
                log.warning("%s: %s", self.job.topic, note)
                self.summary["notes"].append(note)
            starts[partition] = max(first, position if position is not None else first)
        return starts

    def _batch(
        self, state: TableState, tracker: SnapshotTracker, previous: Mapping[str, Row] | None = None
    ) -> Batch:
        return Batch(state, tracker, Patcher(self.job.json_mode), self.store.documents, dict(previous or {}))

    def chunks(
        self, starts: Mapping[int, int], stop: Mapping[int, int], partitions: list[int]
    ) -> Iterable[list[ChangeEvent] | Changes]:
        """The range's events as the topic's fetches give them (a fetch of one partition's plain
        changes as columns, unless several partitions are read: they are merged event by event)."""
        several = len([p for p in partitions if starts.get(p, 0) < stop.get(p, 0)]) > 1
        return read_range(self.kafka_config, self.job.topic, starts, stop, changes=not several)

    def _apply_range(
        self,
        state: TableState,
        tracker: SnapshotTracker,
        starts: Mapping[int, int],
        stop: Mapping[int, int],
        chunks: Iterable[list[ChangeEvent] | Changes],
    ) -> tuple[TableState, Batch]:
        """Step 2: read and commit batch after batch; returns the last batch, not committed yet.

        A batch is committed once it holds ``max_batch_events`` and only before an event that may
        begin a commit (:meth:`Batch.at_boundary`: not of the last event's MongoDB transaction, not
        a tombstone), wherever the fetches of the topic end: a transaction is never split over two
        commits. A range of several partitions is one commit (see core/apply/topics.py)."""
        state.positions.update({p: o for p, o in starts.items() if p not in state.positions})
        batch = self._batch(state, tracker)
        limit = self.job.max_batch_events
        several = len([p for p in stop if starts.get(p, 0) < stop.get(p, 0)]) > 1
        for chunk in chunks:
            if isinstance(chunk, Changes):  # a fetch of plain changes, as columns
                if batch.events + len(chunk) < limit and batch.takes_changes(chunk):  # no commit inside
                    batch.add_changes(chunk)
                    continue
                chunk = chunk.events()
            batch.prepare(chunk)
            if several or batch.events + len(chunk) < limit:  # no commit inside this chunk
                batch.add_all(chunk)
                continue
            for index, event in enumerate(chunk):
                if batch.events >= limit and batch.at_boundary(event):
                    state = self._commit(batch, state)
                    batch = self._batch(state, tracker, batch.all_rows())
                    batch.prepare(chunk[index:])
                batch.add(event)
        for partition, end in stop.items():  # read to its end: past commit markers and aborted records
            if starts.get(partition, 0) < end:
                batch.positions[partition] = max(batch.positions.get(partition, 0), end)
        return state, batch

    def _commit(self, batch: Batch, state: TableState) -> TableState:
        """One Delta commit of ``batch`` (rows, sweep, positions); the state it reaches."""
        applied_us = int(self.clock() * 1_000_000)
        commit = batch.commit(self.job.layout, applied_us, self.misfits)
        for column, total in self._totals().items():  # the table's misfit counts, with this commit's
            if total:
                commit.versions[misfits_app_id(self.job.topic, column)] = total
                commit.versions[last_misfits_app_id(self.job.topic, column)] = self.misfits.counts.get(
                    column, 0
                )
        name = self.job.namespace
        description = (
            f"MongoDB collection {self.job.namespace} applied from the Kafka topic {self.job.topic} by "
            "airflow-provider-mongocdc"
        )
        result = self.store.commit(commit, self.job.layout, name, description)
        summary = self.summary
        summary["commits"] += 1
        summary["events"] += batch.events
        for op, count in batch.ops.items():
            summary["events_by_op"][op] = summary["events_by_op"].get(op, 0) + count
        summary["rows_written"] += commit.rows - commit.deletes
        summary["rows_deleted"] += int(result.get("deleted", commit.deletes))
        summary["rows_swept"] += int(result.get("swept", 0))
        summary["updates_without_document"] += batch.unknown_updates
        log.info(
            "%s -> %s: version %s, %d events (%s), %d rows written, %d deleted%s; positions %s",
            self.job.topic,
            self.store.uri,
            result.get("version"),
            batch.events,
            dict(batch.ops),
            commit.rows - commit.deletes,
            commit.deletes,
            f", swept {result.get('swept', 0)} rows older than snapshot generation {commit.sweep}"
            if commit.sweep is not None
            else "",
            commit.metadata["mongocdc.positions"],
        )
        batch.tracker.sweep = None
        after = batch.next_state()
        after.version = result.get("version")
        return after

    def _maintain(self, state: TableState) -> dict[str, Any]:
        """Step 4: compaction and vacuum when their time has come."""
        job = self.job
        if state.version is None:
            return {}
        now_s = int(self.clock())
        compact = _due(state.compacted_at, job.compact_every_s, now_s)
        vacuum = _due(state.vacuumed_at, job.vacuum_every_s, now_s)
        if not compact and not vacuum:
            return {}
        return self.store.maintain(state, compact, job.vacuum_retention_s if vacuum else None, now_s)


def reset_positions(
    store: TableStore, kafka_config: Mapping[str, Any], topic: str, clock: Callable[[], float] = time.time
) -> dict[str, Any]:
    """``mongocdc tables reset-positions``: the table's positions set to the first record of each
    partition of ``topic`` as it is now, with its identity, in one commit that changes no row (for a
    topic deleted and created again; see :func:`~airflow_provider_mongocdc.core.apply.topics.check_same_topic`).
    The snapshot generation stays; the table's rows stay."""
    version = store.version()
    if version is None:
        raise TableError(
            f"There is no table at {store.uri}",
            fix="give the table's location (<location>/<database>/<collection>) as --table",
        )
    check_owner(store.uri, topic, version, store.app_version, store.description())
    partitions = partitions_of(kafka_config, topic)
    if not partitions:
        raise TableError(
            f"The topic {topic!r} does not exist",
            fix="reset a table's positions once its topic exists again (the connector's next snapshot or "
            "window creates it)",
        )
    before = TableState.read(topic, version, store.app_version, partitions)
    facts = topic_facts(kafka_config, topic, partitions)
    ends = topic_ends(kafka_config, topic, partitions, 0.0)
    after = TableState(
        topic,
        version,
        dict(ends.earliest),
        before.generation,
        before.pending,
        before.compacted_at,
        before.vacuumed_at,
        dict(before.began),
        facts.identity,
    )
    metadata = {
        "mongocdc.topic": topic,
        "mongocdc.from": {str(p): o for p, o in sorted(before.positions.items())},
        "mongocdc.positions": {str(p): o for p, o in sorted(after.positions.items())},
        "mongocdc.events": 0,
        "mongocdc.snapshot_generation": after.generation,
        "mongocdc.reset_positions": int(clock()),
    }
    commit = Commit({}, None, after.versions(), metadata, 0, 0)
    result = store.commit(commit, TableLayout(), topic, "")
    log.info(
        "%s: positions reset from %s to %s",
        store.uri,
        metadata["mongocdc.from"],
        metadata["mongocdc.positions"],
    )
    return {
        "action": "reset-positions",
        "table": store.uri,
        "topic": topic,
        "version": result.get("version"),
        "positions_before": metadata["mongocdc.from"],
        "positions": metadata["mongocdc.positions"],
    }
