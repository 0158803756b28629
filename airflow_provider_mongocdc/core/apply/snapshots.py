"""The re-snapshot sweep: when a snapshot of a collection completes, the rows whose keys it did not
read and that did not change after it began are removed, so documents deleted while the oplog had
a gap (no delete event) leave no ghost rows.

How it is known, from the topic alone: every table has a *snapshot generation*. The first read
event of a snapshot (``op: r``) after anything else begins a new generation; every row written from
then on (read or change) carries it (column ``_snapshot_gen``). When the snapshot completes, every
row of an older generation is removed (or marked deleted, with soft deletes): it was neither read by
the snapshot nor changed since it began. Nothing needs the snapshot's keys in memory, and a
snapshot spread over several applies works the same way (the generation and whether a snapshot is
under way are recorded in the table, with its positions).

When a snapshot completes:

- a *blocking* one (initial, gap, manual: ``source.snapshot`` ``true``/``last``): at its ``last``
  read; or at the first change event after its reads (a connector streams only after a blocking
  snapshot ended); or at the end of what an apply read, when the connector's offsets topic shows no
  snapshot in progress, unchanged from before that apply read its topic to after (so every read of a
  completed snapshot was in what it read);
- an *incremental* one (``source.snapshot`` ``incremental``; changes interleave with its reads): at
  the end of an apply's read, when the offsets topic shows the collection done, again unchanged over
  the read. A filtered incremental snapshot (it reads only some documents) and a stopped one sweep
  nothing; a blocking snapshot that begins meanwhile takes over.

Edge cases (docs/delta.md): a collection the snapshot found empty writes no read, so nothing begins
and nothing is swept; Debezium's topics have no offsets topic here, so their incremental snapshots
are never swept and a blocking one completes at its ``last`` read or at the next change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from airflow_provider_mongocdc.core.apply.events import LAST, ChangeEvent
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.kafka.committed_records import CommittedFollower
from airflow_provider_mongocdc.core.offsets.model import SNAPSHOT_IN_PROGRESS, OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore, OffsetTopicContents
from airflow_provider_mongocdc.core.offsets.writers import Observe
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress

NONE, BLOCKING, INCREMENTAL = 0, 1, 2
KIND_WORDS = {NONE: "none", BLOCKING: "blocking", INCREMENTAL: "incremental"}
# What the offsets topic says of a table's incremental snapshot.
INC_RUNNING, INC_DONE, INC_CANCELLED, INC_UNKNOWN = "running", "done", "cancelled", "unknown"


@dataclass(frozen=True)
class SnapshotStatus:
    """What the connector's offsets topic says of the snapshots of one table's collection."""

    blocking_running: bool
    incremental: str  # INC_RUNNING, INC_DONE, INC_CANCELLED or INC_UNKNOWN
    fingerprint: tuple[Any, ...]  # equal in two reads: no snapshot moved in between
    # Where the table's topic ended (next offset per partition) when the table's incremental
    # snapshot started: every event of the snapshot, and every change after it began, lies at or
    # past it. None: not recorded (a request started before it was recorded).
    incremental_start: Mapping[int, int] | None = None
    # False: a transaction was open on the offsets topic after what was read; what it commits is
    # not known, so nothing is completed by this status (a start it shows still holds).
    settled: bool = True

    @classmethod
    def of(
        cls, states: Mapping[OffsetPartition, OffsetState], namespace_topic: Callable[[str], str], topic: str
    ) -> SnapshotStatus:
        """From the offsets topic's states; ``namespace_topic`` names the topic of a
        ``<db>.<collection>`` (an incremental snapshot's progress names collections)."""
        running = False
        incremental = INC_UNKNOWN
        start: Mapping[int, int] | None = None
        parts: list[Any] = []
        for partition, state in sorted(states.items(), key=lambda item: item[0].rs):
            snapshot = state.snapshot
            running = running or snapshot.status == SNAPSHOT_IN_PROGRESS
            parts.append((partition.rs, snapshot.status, snapshot.snapshot_id, state.snapshots))
            progress = IncrementalProgress.from_json(state.incremental)
            if progress is None:
                continue
            mine = [name for name in _named(progress) if namespace_topic(name) == topic]
            parts.append((progress.request_id, progress.status, progress.chunks, tuple(mine)))
            if mine and incremental != INC_RUNNING:  # the running one's start, else the last one's
                start = _start_of(progress, topic)
            incremental = _incremental_word(progress, namespace_topic, topic, incremental)
        return cls(running, incremental, tuple(parts), start if incremental != INC_UNKNOWN else None)


def read_status(
    kafka_config: Mapping[str, Any], config: ConnectorConfig, topic: str
) -> SnapshotStatus | None:
    """The snapshot status of ``topic``'s collection in the connector's offsets topic; None when the
    topic holds no offsets of the connector (Debezium's topics). A transaction open there after what
    was read: the status is not ``settled`` (what it commits is not known yet)."""
    store = OffsetStore(kafka_config, config.offsets_topic, read_timeout_s=30.0)
    return _status_of(store.read_everything(), config, topic)


class StatusReader:
    """:func:`read_status` again and again from one kept reader of the offsets topic, which fetches
    only what was committed since its last read (a table follower reads it twice per pass)."""

    def __init__(self, kafka_config: Mapping[str, Any], config: ConnectorConfig):
        self.config = config
        self.store = OffsetStore(kafka_config, config.offsets_topic, read_timeout_s=30.0)
        self.follower = CommittedFollower(kafka_config, config.offsets_topic, 30.0, Observe())

    def __call__(self, topic: str) -> SnapshotStatus | None:
        read = self.follower.read()
        contents = self.store.read_everything(read.records)
        contents.open_transactions = read.open_transactions
        return _status_of(contents, self.config, topic)

    def close(self) -> None:
        self.follower.close()


def _status_of(contents: OffsetTopicContents, config: ConnectorConfig, topic: str) -> SnapshotStatus | None:
    states = {
        partition: state
        for partition, state in contents.states.items()
        if partition.server_id == config.topic_prefix
    }
    if not states:
        return None
    namer = TopicNamer(config)

    def namespace_topic(namespace: str) -> str:
        database, _, collection = namespace.partition(".")
        return namer.data_topic(database, collection)

    status = SnapshotStatus.of(states, namespace_topic, topic)
    return replace(status, settled=False) if contents.open_transactions else status


def _start_of(progress: IncrementalProgress, topic: str) -> dict[int, int] | None:
    """Where ``topic`` ended when ``progress``'s snapshot started (a topic not there yet: nothing
    before it, so every partition from offset 0); None when the window did not record it."""
    if progress.topic_offsets is None:
        return None
    return {
        int(partition): int(offset) for partition, offset in (progress.topic_offsets.get(topic) or {}).items()
    }


def _named(progress: IncrementalProgress) -> Iterable[str]:
    return (*progress.collections_left, *progress.done, *progress.filters)


def _incremental_word(
    progress: IncrementalProgress, namespace_topic: Callable[[str], str], topic: str, before: str
) -> str:
    """What ``progress`` says of the collection of ``topic`` (``before``: what another partition said)."""
    left = any(namespace_topic(name) == topic for name in progress.collections_left)
    done = any(namespace_topic(name) == topic for name in progress.done)
    filtered = any(namespace_topic(name) == topic for name in progress.filters)
    if progress.running and left:
        return INC_RUNNING
    if before == INC_RUNNING:
        return before
    if done and not filtered:
        return INC_DONE  # read whole (a stop or the end of other collections came after)
    if done or left or filtered:
        return INC_CANCELLED  # filtered, or stopped before it read everything
    return before


@dataclass
class SnapshotTracker:
    """The table's snapshot generation and the snapshot under way, moved by each event in Kafka
    order; ``sweep`` is the generation below which rows go (the latest completion seen).

    ``began``: the positions (next offset per partition) at which the generation under way began.
    An incremental snapshot's reads interleave with changes, and a change that dropped a chunk's
    read (DBLog's rule) comes before the chunk's reads in the topic: the generation must begin
    where the snapshot started, not at its first read. The window records that place, the topic's
    end when the snapshot started (:attr:`SnapshotStatus.incremental_start`); the apply waits for
    it (:meth:`arm`) and begins the generation at the first event at or past it. A completion
    sweeps only when the generation began there or before (:meth:`at_range_end`), so no row whose
    last change came after the snapshot started is ever swept, however the start was learnt.
    """

    generation: int = 0
    pending: int = NONE
    began: dict[int, int] = field(default_factory=dict)
    sweep: int | None = None
    armed: Mapping[int, int] | None = None  # where the awaited incremental snapshot started
    began_runs: int = 0  # snapshots begun (this run)
    completed: int = 0  # snapshots completed with a sweep (this run)
    notes: list[str] = field(default_factory=list)

    def arm(self, status: SnapshotStatus | None, positions: Mapping[int, int]) -> None:
        """Before a range is read from ``positions``: an incremental snapshot of the table's
        collection runs (or completed) that the table has not reached the start of, and the
        generation under way is not one: begin one at the snapshot's start."""
        if status is None or status.incremental not in (INC_RUNNING, INC_DONE) or self.pending == INCREMENTAL:
            return
        start = status.incremental_start
        if start is not None and all(offset <= start.get(p, 0) for p, offset in positions.items()):
            self.armed = start

    def before(self, event: ChangeEvent, positions: Mapping[int, int]) -> None:
        """Called before ``event`` is applied (``positions``: the next offset per partition before
        it): the start of an awaited incremental snapshot, or a read, begins a generation (or
        switches from one kind to the other); a change ends a blocking snapshot."""
        armed = self.armed
        if armed is not None and event.offset >= armed.get(event.partition, 0):
            self.armed = None
            if self.pending == BLOCKING:
                self.complete("an incremental snapshot started after its reads")
            if self.pending != INCREMENTAL:
                self.begin(INCREMENTAL, positions)
        if event.is_read:
            kind = INCREMENTAL if event.incremental else BLOCKING
            if self.pending == kind:
                return
            if self.pending == BLOCKING and kind == INCREMENTAL:
                self.complete("its reads were followed by an incremental snapshot's")
            elif self.pending == INCREMENTAL:
                self.notes.append("an incremental snapshot was taken over by a blocking one")
            self.begin(kind, positions)
        elif self.pending == BLOCKING:
            self.complete("a change followed its reads")

    def after(self, event: ChangeEvent, positions: Mapping[int, int]) -> None:
        """Called after ``event`` was applied: the ``last`` read ends a blocking snapshot."""
        if event.is_read and event.snapshot == LAST and self.pending == BLOCKING:
            self.complete("its last read")

    def begin(self, kind: int, positions: Mapping[int, int]) -> None:
        self.generation += 1
        self.pending = kind
        self.began = dict(positions)
        self.began_runs += 1

    def complete(self, why: str) -> None:
        self.sweep = self.generation
        self.notes.append(f"a {KIND_WORDS[self.pending]} snapshot completed ({why})")
        self.pending = NONE
        self.completed += 1

    def _began_in_time(self, start: Mapping[int, int]) -> bool:
        """Whether the generation under way began at or before ``start`` in every partition (not
        known: no)."""
        return bool(self.began) and all(
            offset <= start.get(partition, 0) for partition, offset in self.began.items()
        )

    def at_range_end(self, before: SnapshotStatus | None, after: SnapshotStatus | None) -> None:
        """At the end of what a run read: complete (or cancel) by what the offsets topic said,
        read before the topic's end was taken and again after it was taken; only when both agree
        and no transaction was open there."""
        if self.pending == NONE or before is None or after is None:
            return
        if not (before.settled and after.settled):
            self.notes.append(
                "a transaction was open on the connector's offsets topic: the snapshot's completion "
                "waits for the next run"
            )
            return
        if before.fingerprint != after.fingerprint:
            self.notes.append(
                "a snapshot moved while the topic was read: its completion waits for the next run"
            )
            return
        if self.pending == BLOCKING and not after.blocking_running:
            self.complete("the offsets topic shows it completed")
        elif self.pending == INCREMENTAL and after.incremental == INC_DONE:
            start = after.incremental_start
            if start is not None and self._began_in_time(start):
                self.complete("the offsets topic shows the collection done")
                return
            self.notes.append(
                "an incremental snapshot completed, but the table's generation began after the "
                f"snapshot started (at {_offsets_text(self.began)}, the snapshot at "
                f"{_offsets_text(start) if start is not None else 'a place it did not record'}): "
                "nothing swept, so that no row changed since the snapshot started is removed; "
                "ghost rows of documents deleted before it stay until the next re-snapshot"
            )
            self.pending = NONE
        elif self.pending == INCREMENTAL and after.incremental == INC_CANCELLED:
            self.notes.append("an incremental snapshot was filtered or stopped: nothing swept")
            self.pending = NONE


def _offsets_text(offsets: Mapping[int, int]) -> str:
    return ", ".join(f"partition {p} offset {o}" for p, o in sorted(offsets.items())) or "offset 0"
