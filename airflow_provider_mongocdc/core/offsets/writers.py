"""The writers of a connector's offsets topic, and reading it as it stands.

Every transactional writer of a connector has a stable ``transactional.id`` (below): a stream's
window writer, a snapshot chunk's and the snapshot's control writer, the lease writer, and the
operator actions' writer of the offsets topic. Several of them share the offsets topic (the
streams of a sharded cluster read one per shard, a snapshot's chunks run side by side), so a
transaction that a killed one left open there hides what the others committed after it from
every ``read_committed`` reader until it ends (:mod:`airflow_provider_mongocdc.core.kafka.open_transactions`).

A run reads where it starts with :class:`TakeOver`: it waits until the transactions open when it
began to read have ended. One still open after :data:`SETTLE_S` that belongs to one of the
connector's own writers is waited for when its writer is alive (its commit or abort is already
under way at its coordinator, or its writer is one of the reader's own run that runs beside it:
a sibling stream), else ended by taking over its ``transactional.id`` (``init_transactions``
aborts it: a writer the run did not start and whose commit is not under way is a killed one); one
of any other writer fails the run with
:class:`~airflow_provider_mongocdc.core.base.errors.OffsetError` naming it, how long it has been
open and how to end it. Readers that only show the offsets (``mongocdc offsets show``, the MongoDB
CDC page, the change watcher, the gap check) use :class:`Observe`: they wait :data:`OBSERVE_S` and
then show what is committed, saying that a transaction is open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.kafka.client import DEFAULT_PRODUCER_CONFIG
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.keys import is_lease_key, lease_key, parse_key, request_owner

log = logging.getLogger("airflow_provider_mongocdc.core.offsets.store")

# How long a run waits for the transactions open on the offsets topic when it began to read to end
# before it settles them (a live writer's transaction there usually lasts milliseconds: its offset
# record is the last it sends before it commits; a slow commit lasts longer, see TakeOver).
SETTLE_S = 15.0
# How long a reader that only shows the offsets waits before it says a transaction is open.
OBSERVE_S = 3.0
# The coordinator states of a transaction whose end is decided (KIP-664 DescribeTransactions): the
# coordinator writes its markers itself, without its writer.
ENDING_STATES = frozenset(
    {"PrepareCommit", "PrepareAbort", "PrepareEpochFence", "CompleteCommit", "CompleteAbort"}
)
# How long past its transaction.timeout.ms a transaction waited for may still be open before it is
# taken over: the coordinator looks for timed-out transactions every 10 s
# (transaction.abort.timed.out.transaction.cleanup.interval.ms), and the reader's clock is not the
# broker's.
EXPIRY_GRACE_S = 30.0


# -- the transactional ids ------------------------------------------------------------------------------
def window_transactional_id(topic_prefix: str, partition: str) -> str:
    """The window writer of a stream (offset partition ``partition``: a replica set, or ``cluster``)."""
    return f"mongocdc-{topic_prefix}-window-{partition}"


def chunk_transactional_id(topic_prefix: str, snapshot_id: str, chunk_id: str) -> str:
    """The writer of one snapshot chunk."""
    return f"mongocdc-{topic_prefix}-snapshot-{snapshot_id}-{chunk_id}"


def control_transactional_id(topic_prefix: str) -> str:
    """The writer of a connector's snapshot offsets (start, plan, completion)."""
    return f"mongocdc-{topic_prefix}-snapshot-control"


def lease_transactional_id(topic_prefix: str) -> str:
    """The writer of a connector's lease."""
    return f"mongocdc-{topic_prefix}-lease"


def offsets_admin_transactional_id(offsets_topic: str) -> str:
    """The writer of the operator actions on an offsets topic (``mongocdc offsets ...``)."""
    return f"mongocdc-offsets-admin-{offsets_topic}"


def is_own(transactional_id: str, topic_prefix: str, offsets_topic: str) -> bool:
    """Whether ``transactional_id`` is one of the writers of connector ``topic_prefix``."""
    return transactional_id.startswith(f"mongocdc-{topic_prefix}-") or transactional_id == (
        offsets_admin_transactional_id(offsets_topic)
    )


def writers_of_record(key: bytes | None, topic_prefix: str, offsets_topic: str) -> list[str]:
    """The connector's writers that write a record with ``key`` to the offsets topic (none when
    the key is not the connector's): who may have left a transaction open that begins with it."""
    if is_lease_key(key):
        return [lease_transactional_id(topic_prefix)] if lease_key(topic_prefix) == key else []
    owner = request_owner(key)
    if owner is not None:  # an incremental snapshot request: written by an operator action
        return [offsets_admin_transactional_id(offsets_topic)] if owner[1] == topic_prefix else []
    parsed = parse_key(key)
    if parsed is None or parsed[0].server_id != topic_prefix:
        return []
    partition, chunk = parsed
    if chunk is not None:
        return [chunk_transactional_id(topic_prefix, *chunk)]
    return [
        window_transactional_id(topic_prefix, partition.rs),
        control_transactional_id(topic_prefix),
        offsets_admin_transactional_id(offsets_topic),
    ]


def take_over(kafka_config: Mapping[str, Any], transactional_ids: Iterable[str], *, workers: int = 8) -> int:
    """Take over each ``transactional_id`` (``init_transactions``): a transaction one of them
    left open is ended (aborted, or completed when its commit was under way), and that writer can
    no longer commit. Returns how many were taken over."""
    ids = sorted(set(transactional_ids))
    if not ids:
        return 0

    def fence(transactional_id: str) -> None:
        TransactionalWriter(kafka_config, transactional_id, log_level=logging.DEBUG).close()

    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(ids)))) as pool:
        list(pool.map(fence, ids))
    return len(ids)


# -- how a reader settles open transactions ------------------------------------------------------------
@dataclass(frozen=True)
class Observe:
    """Show what is committed after :data:`OBSERVE_S`, saying which transactions are open
    (logged at ``log_level``: a reader that polls while the connector's writers commit, such as
    a snapshot's progress, says it at DEBUG)."""

    wait_s: float = OBSERVE_S
    log_level: int = logging.WARNING

    def settle(self, open_ones: list[OpenTransaction], attempt: int, ended: set[tuple[int, int]]) -> bool:
        for open_one in open_ones:
            log.log(
                self.log_level,
                "Offsets topic %s: %s; offsets committed after it are not shown until it ends",
                open_one.topic,
                open_one.describe(),
            )
        return False


@dataclass(frozen=True)
class TakeOver:
    """Wait ``wait_s`` (:data:`SETTLE_S`); then wait on for the connector's open transactions whose
    writers are alive, end the others by taking over their writers, and refuse to read past any
    other writer's (an :class:`OffsetError`).

    How long a transaction has been open does not tell whether its writer is alive: a live writer's
    transaction on the offsets topic lasts from its offset record (the last record it sends) to the
    end of its commit, which first waits until the brokers have every event of the batch, for up to
    the writer's ``transaction.timeout.ms`` (10 minutes, ``core/kafka/writer.py``). Taking such a
    writer over fences it: a sibling stream whose commit is merely slow would fail and be retried.
    So a transaction still open after ``wait_s`` is

    * waited for when its end is decided: its coordinator's state is PrepareCommit, PrepareAbort
      or Complete* (:data:`ENDING_STATES`). The coordinator writes its markers without the writer;
      taking it over would not end it sooner, only fence a writer whose commit is succeeding.
    * waited for when its writer is one of ``running``: the transactional ids of the writers of the
      reader's own run that run beside it, each started after the run took that id over (the
      window writers of a window run's streams: its driver takes all of them over before any
      stream starts, :func:`~airflow_provider_mongocdc.core.window.streams.check_offsets`). A
      transaction of theirs is then that live writer's own, and it ends by itself: when the writer
      commits or aborts, when the writer's retried task starts (``init_transactions``), or when the
      broker aborts it after its ``transaction.timeout.ms``. The wait never depends on a sibling
      that has yet to start (in ``local[2]`` with three shards one waits for a core until another
      ends): its dead predecessor's transaction was ended before any stream of the run started.
      Without the admin requests that name a writer, a transaction whose first record only a
      running writer writes (its key) counts as theirs.
    * taken over otherwise, at once: a writer the reader's run did not start and whose commit is
      not under way is a killed one (an earlier run's, an operator action's, a lease change's);
      its transaction would hide every later commit until the broker's timeout. A transaction
      still open after its writer was taken over fails the read.

    * waited for, with ``holder_runs``, when its writer is any of the connector's but the lease
      writer: the reader knows from the connector's lease that a holder runs whose writers these
      may be (:class:`~airflow_provider_mongocdc.core.offsets.lease.ConnectorLease`'s reads).

    A transaction waited for that is still open :data:`EXPIRY_GRACE_S` past its
    ``transaction.timeout.ms`` is taken over too: by then the broker has aborted it and fenced its
    writer, so no live writer is harmed, and the take-over ends what the broker did not.
    """

    kafka_config: Mapping[str, Any]
    topic_prefix: str
    offsets_topic: str
    wait_s: float = SETTLE_S
    running: frozenset[str] = frozenset()
    holder_runs: bool = False

    def settle(self, open_ones: list[OpenTransaction], attempt: int, ended: set[tuple[int, int]]) -> bool:
        """Wait for the live writers' transactions of ``open_ones`` and take over the other writers
        of the connector (True: wait again), or raise."""
        taking: list[OpenTransaction] = []
        writers: set[str] = set()
        for open_one in open_ones:
            own = self._writers(open_one)
            alive = self._alive(open_one, own, attempt)
            if alive is not None:
                log.info(
                    "Offsets topic %s: %s, %s; waiting for it to end (%s)",
                    open_one.topic,
                    open_one.describe(),
                    alive,
                    open_one.expiry(),
                )
                continue
            if (open_one.partition, open_one.start_offset) in ended:
                raise OffsetError(
                    f"The offsets topic {self.offsets_topic!r} cannot be read to its end: {open_one.describe()}",
                    cause="the transaction stayed open after its writer's transactional.id was taken over",
                    fix=f"check the Kafka brokers' transaction coordinator, or abort it with "
                    f"{open_one.abort_command(self.kafka_config.get('bootstrap.servers'))}; then run again",
                )
            taking.append(open_one)
            writers.update(own)
        for open_one in taking:
            log.warning(
                "Offsets topic %s: %s, left by a writer of connector %r that no longer runs; taking "
                "it over to end the transaction",
                open_one.topic,
                open_one.describe(),
                self.topic_prefix,
            )
        if writers:
            take_over(self.kafka_config, writers)
        ended.update((open_one.partition, open_one.start_offset) for open_one in taking)
        return True

    def _writers(self, open_one: OpenTransaction) -> list[str]:
        """The connector's writers that may hold ``open_one`` open; another writer's raises."""
        if open_one.transactional_id is not None:
            if not is_own(open_one.transactional_id, self.topic_prefix, self.offsets_topic):
                raise foreign_transaction_error(open_one, self.kafka_config, self.topic_prefix)
            return [open_one.transactional_id]
        writers = writers_of_record(open_one.key, self.topic_prefix, self.offsets_topic)
        if not writers:
            raise foreign_transaction_error(open_one, self.kafka_config, self.topic_prefix)
        return writers

    def _alive(self, open_one: OpenTransaction, writers: list[str], attempt: int) -> str | None:
        """Why ``open_one``'s writer is alive and its transaction ends by itself (waited for), or
        None (taken over)."""
        if self._past_timeout(open_one, attempt):
            return None
        if open_one.state in ENDING_STATES:
            return f"whose end is under way (its coordinator's state is {open_one.state})"
        if self.running.intersection(writers):
            return "of a writer of this run that runs beside it (a commit under way)"
        if self.holder_runs and set(writers) - {lease_transactional_id(self.topic_prefix)}:
            return "of a writer of the connector's live lease holder (a commit under way)"
        return None

    def _past_timeout(self, open_one: OpenTransaction, attempt: int) -> bool:
        """Whether ``open_one`` is open :data:`EXPIRY_GRACE_S` past its ``transaction.timeout.ms``
        (the writers' own when Kafka did not tell it; counted from this read's first wait when
        nothing tells since when it is open)."""
        timeout_ms = open_one.timeout_ms
        if timeout_ms is None:
            timeout_ms = int({**DEFAULT_PRODUCER_CONFIG, **self.kafka_config}["transaction.timeout.ms"])
        seconds = open_one.open_seconds()
        if seconds is None:
            seconds = attempt * self.wait_s
        return seconds > timeout_ms / 1000 + EXPIRY_GRACE_S


def foreign_transaction_error(
    open_one: OpenTransaction, kafka_config: Mapping[str, Any], topic_prefix: str
) -> OffsetError:
    """The error of a run that finds another writer's transaction open on its offsets topic."""
    return OffsetError(
        f"The offsets topic {open_one.topic!r} cannot be read to its end: {open_one.describe()}",
        cause=f"it is not a writer of connector {topic_prefix!r}; until that transaction ends, "
        "read_committed readers do not see the offsets committed after it, and a run that started "
        "from what they do see could emit changes again",
        fix=f"wait until it ends ({open_one.expiry()}), or abort it with "
        f"{open_one.abort_command(kafka_config.get('bootstrap.servers'))}; then run again. Give "
        "other applications their own topics",
    )
