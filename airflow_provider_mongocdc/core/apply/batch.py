"""A batch: the events of a range of a topic folded into the rows one Delta commit writes.

The last event per key wins, in Kafka order (a key's events are all in one partition, in order); a
delete or a tombstone removes the row (marks it deleted with soft deletes); an update without a
document is applied to the document the batch or the table holds (:mod:`~airflow_provider_mongocdc.core.apply.patch`).
The snapshot tracker sees every event in order (:mod:`~airflow_provider_mongocdc.core.apply.snapshots`):
a completed snapshot marks the batch's own rows of older generations deleted and leaves a ``sweep``
for the table's other rows. :meth:`Batch.commit` is what the table adapter writes in one commit:
the rows as columns, the sweep, and the application transactions (the next offset per partition,
the generation, the snapshot under way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from airflow_provider_mongocdc.core.apply.events import ChangeEvent, Changes
from airflow_provider_mongocdc.core.apply.layout import (
    APPLIED_AT,
    DELETED,
    DOCUMENT,
    GENERATION,
    ID,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    OP,
    SOURCE_ORD,
    SOURCE_TS,
    TXN,
    TableLayout,
)
from airflow_provider_mongocdc.core.apply.patch import Patcher
from airflow_provider_mongocdc.core.apply.snapshots import SnapshotStatus, SnapshotTracker
from airflow_provider_mongocdc.core.apply.state import TableState
from airflow_provider_mongocdc.core.apply.values import Misfits, column_values


class Row(NamedTuple):
    """A key's state after the batch's last event of it (a tuple: the fold makes one per event, and
    the commit turns them into columns in one ``zip``)."""

    op: str
    document: str | None
    partition: int
    offset: int
    ts_us: int | None
    ord: int | None
    txn: str | None
    generation: int
    deleted: bool


@dataclass
class Commit:
    """What one Delta commit writes: rows (columns by name, ``_deleted`` included), the sweep
    generation (None: none), the application transactions and the commit's metadata."""

    columns: dict[str, list[Any]]
    sweep: int | None
    versions: dict[str, int]
    metadata: dict[str, Any]
    rows: int
    deletes: int

    @property
    def empty(self) -> bool:
        return self.rows == 0 and self.sweep is None


@dataclass
class Batch:
    """Events folded into rows, with the positions they reach and the snapshot tracker."""

    state: TableState
    tracker: SnapshotTracker
    patcher: Patcher
    bases: Callable[[list[str]], Mapping[str, str]]  # documents the table holds, by key
    previous: Mapping[str, Row] = field(default_factory=dict)  # rows of the batch committed before
    rows: dict[str, Row] = field(default_factory=dict)
    events: int = 0
    ops: dict = field(default_factory=dict)
    unknown_updates: int = 0
    last_txn: str | None = None
    positions: dict[int, int] = field(default_factory=dict)
    # Runs of plain changes folded after ``rows`` (each with the snapshot generation it was folded
    # in), kept as columns until the commit or until an event must be folded one by one.
    runs: list[tuple[Changes, int]] = field(default_factory=list)
    _loaded: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.positions = dict(self.state.positions)

    def takes_changes(self, changes: Changes) -> bool:
        """Whether :meth:`add_changes` may fold ``changes`` as a run: no snapshot under way (the
        tracker sees only snapshot reads then, and a run holds none), and none of its events at or
        past where an incremental snapshot the tracker waits for began."""
        tracker = self.tracker
        if tracker.pending:
            return False
        armed = tracker.armed
        return armed is None or not changes.offsets or changes.offsets[-1] < armed.get(changes.partition, 0)

    def add_changes(self, changes: Changes) -> None:
        """Fold a run of plain changes (in Kafka order, after everything folded so far)."""
        if not len(changes):
            return
        if changes.tombstones:
            self._tombstones_of_deletes(changes)
        self.runs.append((changes, self.tracker.generation))
        self.events += len(changes)
        ops = self.ops
        for op, count in Counter(changes.ops).items():
            ops[op] = ops.get(op, 0) + count
        self.positions[changes.partition] = changes.offsets[-1] + 1
        self.last_txn = changes.last_txn(self.last_txn)

    def _tombstones_of_deletes(self, changes: Changes) -> None:
        """A tombstone keeps the source time and transaction of the delete before it (its row is
        the delete's, at the tombstone's offset), as :meth:`add_all` folds it."""
        keys, ops = changes.keys, changes.ops
        tombstones = set(changes.tombstones)
        for index in changes.tombstones:
            key = keys[index]
            if index > 0:
                if keys[index - 1] != key or ops[index - 1] != "d" or index - 1 in tombstones:
                    continue
                source = (changes.ts_us[index - 1], changes.ords[index - 1], changes.txns[index - 1])
            else:
                row = self._last_row(key)
                if row is None or row.op != "d":
                    continue
                source = (row.ts_us, row.ord, row.txn)
            changes.ts_us[index], changes.ords[index], changes.txns[index] = source

    def _last_row(self, key: str) -> Row | None:
        """The row of ``key`` after everything folded so far (the last run's last record of it only
        when it is that run's last record: the one a run's first tombstone follows)."""
        if self.runs:
            changes, generation = self.runs[-1]
            if changes.keys[-1] == key:
                return Row(
                    changes.ops[-1],
                    changes.documents[-1],
                    changes.partition,
                    changes.offsets[-1],
                    changes.ts_us[-1],
                    changes.ords[-1],
                    changes.txns[-1],
                    generation,
                    changes.ops[-1] == "d",
                )
            return None
        return self.rows.get(key)

    def all_rows(self) -> dict[str, Row]:
        """Every key's row after the events folded so far."""
        self._unfold_runs()
        return self.rows

    def _unfold_runs(self) -> None:
        """The runs' rows into ``rows``, in order (before an event is folded one by one)."""
        rows, new = self.rows, tuple.__new__
        for changes, generation in self.runs:
            partition = changes.partition
            for key, op, document, ts_us, ord_, txn, offset in zip(
                changes.keys,
                changes.ops,
                changes.documents,
                changes.ts_us,
                changes.ords,
                changes.txns,
                changes.offsets,
            ):
                rows[key] = new(
                    Row, (op, document, partition, offset, ts_us, ord_, txn, generation, op == "d")
                )
        self.runs.clear()

    def prepare(self, events: list[ChangeEvent]) -> None:
        """Load from the table the documents that updates without one need (once per chunk)."""
        self._unfold_runs()
        if not [event for event in events if event.update is not None]:
            return  # the common chunk: every event carries its document (or deletes)
        needed: list[str] = []
        seen: set[str] = set()
        for event in events:
            if event.key in seen:
                continue
            seen.add(event.key)
            if event.update is not None and event.key not in self.rows and event.key not in self.previous:
                needed.append(event.key)
        missing = [key for key in needed if key not in self._loaded]
        if missing:
            self._loaded.update(self.bases(missing))

    def add(self, event: ChangeEvent) -> None:
        """Fold one event (in Kafka order)."""
        self.add_all((event,))

    def add_all(self, events: Iterable[ChangeEvent]) -> None:
        """Fold events (in Kafka order): one loop over many, as the apply reads them."""
        if self.runs:
            self._unfold_runs()
        tracker = self.tracker
        rows, ops, positions = self.rows, self.ops, self.positions
        new = tuple.__new__
        count = 0
        txn = self.last_txn
        # What the snapshot tracker holds moves only when it sees an event.
        generation, pending, armed = tracker.generation, tracker.pending, tracker.armed is not None
        for event in events:
            op = event.op
            watch = pending or armed or op == "r"  # the snapshot tracker has something to see
            if watch:
                self._watch(tracker.before, event)
                generation, pending, armed = tracker.generation, tracker.pending, tracker.armed is not None
            count += 1
            ops[op] = ops.get(op, 0) + 1
            positions[event.partition] = event.offset + 1
            if op == "d":
                ts_us, ord_, row_txn = event.ts_us, event.ord, event.txn
                if event.tombstone:  # the delete's row (its time and transaction), at the tombstone
                    deleted = rows.get(event.key)
                    if deleted is not None and deleted.op == "d":
                        ts_us, ord_, row_txn = deleted.ts_us, deleted.ord, deleted.txn
                else:
                    txn = row_txn
                rows[event.key] = new(
                    Row,
                    ("d", None, event.partition, event.offset, ts_us, ord_, row_txn, generation, True),
                )
                continue
            txn = event.txn
            document = event.document
            if document is None:
                base = self._base(event.key)
                if base is None or event.update is None:
                    self.unknown_updates += 1
                    continue
                document = self.patcher.apply(base, event.update)
            rows[event.key] = new(
                Row,
                (op, document, event.partition, event.offset, event.ts_us, event.ord, txn, generation, False),
            )
            if watch:
                self._watch(tracker.after, event)
                generation, pending = tracker.generation, tracker.pending
        self.events += count
        self.last_txn = txn

    def _watch(self, step: Callable[[ChangeEvent, Mapping[int, int]], None], event: ChangeEvent) -> None:
        """The snapshot tracker sees ``event`` (and the positions before it); a snapshot it sees
        complete sweeps the batch's rows."""
        swept = self.tracker.sweep
        step(event, self.positions)
        if self.tracker.sweep != swept:
            self._sweep_rows(self.tracker.sweep)

    def complete_at_end(self, before: SnapshotStatus | None, after: SnapshotStatus | None) -> None:
        """At the end of the range: a snapshot the offsets topic shows completed sweeps the batch's
        own rows of older generations too, as one completed by an event does."""
        swept = self.tracker.sweep
        self.tracker.at_range_end(before, after)
        if self.tracker.sweep != swept:
            self._unfold_runs()
            self._sweep_rows(self.tracker.sweep)

    def _base(self, key: str) -> str | None:
        row = self.rows.get(key) or self.previous.get(key)
        if row is not None:
            return None if row.deleted else row.document
        return self._loaded.get(key)

    def _sweep_rows(self, generation: int | None) -> None:
        """A snapshot completed: the batch's rows written before it began are deleted too."""
        if generation is None:
            return
        rows = self.rows
        for key, row in rows.items():
            if row.generation < generation and not row.deleted:
                rows[key] = row._replace(op="d", deleted=True)

    def at_boundary(self, following: ChangeEvent) -> bool:
        """Whether a commit may end after the last event added, before ``following``: not inside
        a MongoDB transaction (``following`` is not of the last event's transaction), and never
        between a delete and its tombstone (which carries no transaction of its own)."""
        if following.tombstone:
            return False
        return self.last_txn is None or following.txn != self.last_txn

    def moved(self) -> bool:
        """Whether a commit would change the table: rows, a sweep, the snapshot state, or the
        positions (a range of commit markers and aborted records only)."""
        state = self.state
        tracker = self.tracker
        return (
            bool(self.rows)
            or bool(self.runs)
            or tracker.sweep is not None
            or ((tracker.generation, tracker.pending) != (state.generation, state.pending))
            or self.positions != state.positions
        )

    def commit(self, layout: TableLayout, applied_us: int, misfits: Misfits) -> Commit:
        """The commit of this batch: its rows as columns and the state it reaches."""
        keys = list(self.rows)
        # The rows' fields as columns, in Row's order, in one pass; then the runs' columns after them.
        fields: list[list[Any]] = [list(values) for values in zip(*self.rows.values())] or [
            [] for _ in Row._fields
        ]
        ops, documents, partitions, offsets, ts_us, ords, txns, generations, deleted = fields
        for changes, generation in self.runs:
            count = len(changes)
            keys += changes.keys
            ops += changes.ops
            documents += changes.documents
            partitions += [changes.partition] * count
            offsets += changes.offsets
            ts_us += changes.ts_us
            ords += changes.ords
            txns += changes.txns
            generations += [generation] * count
            deleted += [op == "d" for op in changes.ops]
        if self.runs:  # the last row of each key, in the order keys first came
            last = dict(zip(keys, range(len(keys))))
            if len(last) < len(keys):
                picked = list(last.values())
                keys, ops, documents, partitions, offsets, ts_us, ords, txns, generations, deleted = (
                    list(map(column.__getitem__, picked))
                    for column in (
                        keys,
                        ops,
                        documents,
                        partitions,
                        offsets,
                        ts_us,
                        ords,
                        txns,
                        generations,
                        deleted,
                    )
                )
        columns: dict[str, list[Any]] = {
            ID: keys,
            DOCUMENT: documents,
            OP: ops,
            SOURCE_TS: ts_us,
            SOURCE_ORD: ords,
            TXN: txns,
            KAFKA_PARTITION: partitions,
            KAFKA_OFFSET: offsets,
            APPLIED_AT: [applied_us] * len(keys),
            GENERATION: generations,
            DELETED: deleted,
        }
        if layout.declared:
            values = [
                column_values(layout, key, None if gone else document, misfits)
                for key, document, gone in zip(keys, documents, deleted)
            ]
            for index, column in enumerate(layout.declared):
                columns[column.name] = [row_values[index] for row_values in values]
        after = self.next_state()
        metadata = {
            "mongocdc.topic": self.state.topic,
            "mongocdc.from": {str(p): o for p, o in sorted(self.state.positions.items())},
            "mongocdc.positions": {str(p): o for p, o in sorted(after.positions.items())},
            "mongocdc.events": self.events,
            "mongocdc.snapshot_generation": after.generation,
        }
        if self.tracker.sweep is not None:
            metadata["mongocdc.sweep_below_generation"] = self.tracker.sweep
        return Commit(columns, self.tracker.sweep, after.versions(), metadata, len(keys), sum(deleted))

    def next_state(self) -> TableState:
        """The table's state once this batch is committed."""
        return TableState(
            self.state.topic,
            self.state.version,
            dict(self.positions),
            self.tracker.generation,
            self.tracker.pending,
            self.state.compacted_at,
            self.state.vacuumed_at,
            dict(self.tracker.began),
            self.state.topic_id,
            self.state.undeclared,
        )
