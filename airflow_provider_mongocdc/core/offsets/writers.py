"""The writers of a connector's offsets topic, and reading it as it stands.

Every transactional writer of a connector has a stable ``transactional.id`` (below): a stream's
window writer, a snapshot chunk's and the snapshot's control writer, the lease writer, and the
operator actions' writer of the offsets topic. Several of them share the offsets topic (the
streams of a sharded cluster read one per shard, a snapshot's chunks run side by side), so a
transaction that a killed one left open there hides what the others committed after it from
every ``read_committed`` reader until it ends (:mod:`airflow_provider_mongocdc.core.kafka.open_transactions`).

A run reads where it starts with :class:`TakeOver`: it waits until the transactions open when it
began to read have ended; one still open after :data:`SETTLE_S` that belongs to one of the
connector's own writers is ended by taking over its ``transactional.id`` (``init_transactions``
aborts it: its writer is dead, or it would have committed within seconds); one of any other writer
fails the run with :class:`~airflow_provider_mongocdc.core.base.errors.OffsetError` naming it, how
long it has been open and how to end it. Readers that only show the offsets (``mongocdc offsets
show``, the MongoDB CDC page, the change watcher, the gap check) use :class:`Observe`: they wait
:data:`OBSERVE_S` and then show what is committed, saying that a transaction is open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.keys import is_lease_key, lease_key, parse_key, request_owner

log = logging.getLogger("airflow_provider_mongocdc.core.offsets.store")

# How long a run waits for the transactions open on the offsets topic when it began to read to end
# before it takes over its own writers' (a live writer's transaction there lasts milliseconds: its
# offset record is the last it sends before it commits).
SETTLE_S = 15.0
# How long a reader that only shows the offsets waits before it says a transaction is open.
OBSERVE_S = 3.0


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
    """Show what is committed after :data:`OBSERVE_S`, saying which transactions are open."""

    wait_s: float = OBSERVE_S

    def settle(self, open_ones: list[OpenTransaction], attempt: int) -> bool:
        for open_one in open_ones:
            log.warning(
                "Offsets topic %s: %s; offsets committed after it are not shown until it ends",
                open_one.topic,
                open_one.describe(),
            )
        return False


@dataclass(frozen=True)
class TakeOver:
    """Wait :data:`SETTLE_S`; then end the connector's own open transactions by taking over their
    writers, and refuse to read past any other writer's (an :class:`OffsetError`)."""

    kafka_config: Mapping[str, Any]
    topic_prefix: str
    offsets_topic: str
    wait_s: float = SETTLE_S

    def settle(self, open_ones: list[OpenTransaction], attempt: int) -> bool:
        """Take over the connector's writers of ``open_ones`` (True: wait again), or raise."""
        if attempt > 1:
            raise OffsetError(
                f"The offsets topic {self.offsets_topic!r} cannot be read to its end: "
                + "; ".join(open_one.describe() for open_one in open_ones),
                cause="the transaction stayed open after its writer's transactional.id was taken over",
                fix=f"check the Kafka brokers' transaction coordinator, or abort it with "
                f"{open_ones[0].abort_command(self.kafka_config.get('bootstrap.servers'))}; then run again",
            )
        own: set[str] = set()
        for open_one in open_ones:
            if open_one.transactional_id is not None:
                if not is_own(open_one.transactional_id, self.topic_prefix, self.offsets_topic):
                    raise foreign_transaction_error(open_one, self.kafka_config, self.topic_prefix)
                own.add(open_one.transactional_id)
                continue
            writers = writers_of_record(open_one.key, self.topic_prefix, self.offsets_topic)
            if not writers:
                raise foreign_transaction_error(open_one, self.kafka_config, self.topic_prefix)
            own.update(writers)
        for open_one in open_ones:
            log.warning(
                "Offsets topic %s: %s, left by a writer of connector %r that no longer runs; taking "
                "it over to end the transaction",
                open_one.topic,
                open_one.describe(),
                self.topic_prefix,
            )
        take_over(self.kafka_config, own)
        return True


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
