"""Which open transactions on the offsets topic a run's reader waits for and which it takes over
(:class:`~airflow_provider_mongocdc.core.offsets.writers.TakeOver`): a live writer is never taken
over: one whose end is under way at its coordinator, or one of the reader's own run; a killed
writer is, at once; a transaction still open after its take-over, or another application's, is
an error."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction
from airflow_provider_mongocdc.core.offsets import writers
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.writers import (
    EXPIRY_GRACE_S,
    TakeOver,
    chunk_transactional_id,
    control_transactional_id,
    lease_transactional_id,
    offsets_admin_transactional_id,
    window_transactional_id,
)

pytestmark = pytest.mark.unit

PREFIX = "shop"
TOPIC = "shop.offsets"
SIBLING = window_transactional_id(PREFIX, "shard1")
RUN = frozenset({window_transactional_id(PREFIX, "shard0"), SIBLING})


@pytest.fixture
def taken(monkeypatch) -> list[set[str]]:
    """The transactional ids each take-over was asked for (no Kafka)."""
    calls: list[set[str]] = []
    monkeypatch.setattr(writers, "take_over", lambda _kafka, ids, **_: calls.append(set(ids)) or len(calls))
    return calls


def open_for(seconds: float, **fields) -> OpenTransaction:
    started = datetime.now(timezone.utc) - timedelta(seconds=seconds)
    return OpenTransaction(TOPIC, 0, 40, 42, started_at=started, timeout_ms=600_000, **fields)


def settle(reader: TakeOver, open_one: OpenTransaction, ended: set | None = None, attempt: int = 1) -> set:
    ended = set() if ended is None else ended
    assert reader.settle([open_one], attempt, ended) is True
    return ended


def test_a_sibling_streams_transaction_is_waited_for_however_long_within_its_timeout(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, running=RUN)
    slow = open_for(300, transactional_id=SIBLING, state="Ongoing")
    ended = set()
    for attempt in (1, 2, 3):
        settle(reader, slow, ended, attempt)
    assert taken == [] and ended == set()


def test_a_sibling_transaction_open_past_its_timeout_is_taken_over(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, running=RUN)
    expired = open_for(600 + EXPIRY_GRACE_S + 5, transactional_id=SIBLING, state="Ongoing")
    assert settle(reader, expired) == {(0, 40)}
    assert taken == [{SIBLING}]


def test_a_writer_the_run_did_not_start_is_taken_over_and_must_then_be_gone(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, running=RUN)
    killed = open_for(20, transactional_id=window_transactional_id(PREFIX, "rs_gone"), state="Ongoing")
    ended = settle(reader, killed)
    assert taken == [{window_transactional_id(PREFIX, "rs_gone")}]
    with pytest.raises(OffsetError, match="stayed open after its writer's transactional.id was taken over"):
        reader.settle([killed], 2, ended)
    # Without the run's writers given (a direct run, an operator action), a sibling id is a killed one.
    alone = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC)
    settle(alone, open_for(20, transactional_id=SIBLING, state="Ongoing"))
    assert taken[-1] == {SIBLING}


@pytest.mark.parametrize("state", ["PrepareCommit", "PrepareAbort", "CompleteCommit"])
def test_a_transaction_whose_end_is_under_way_is_waited_for_by_any_reader(taken, state):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC)
    ending = open_for(40, transactional_id=control_transactional_id(PREFIX), state=state)
    settle(reader, ending)
    settle(reader, ending, attempt=2)
    assert taken == []


def test_without_the_admin_requests_a_record_only_a_running_writer_writes_counts_as_theirs(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, running=RUN)
    key = OffsetPartition(PREFIX, "shard1").key()
    unnamed = OpenTransaction(TOPIC, 0, 40, 42, key=key, written_at=datetime.now(timezone.utc))
    settle(reader, unnamed)
    assert taken == []
    # Nothing tells since when: the waits of this read count, up to the writers' timeout.
    blind = OpenTransaction(TOPIC, 0, 40, 42, key=key)
    reader = TakeOver(
        {"bootstrap.servers": "k:9092", "transaction.timeout.ms": 60_000}, PREFIX, TOPIC, 15.0, RUN
    )
    settle(reader, blind, attempt=4)
    assert taken == []
    settle(reader, blind, attempt=7)  # 105 s waited > 60 s + the grace
    assert taken == [{SIBLING, control_transactional_id(PREFIX), offsets_admin_transactional_id(TOPIC)}]


def test_another_applications_transaction_is_an_error_even_while_waiting_for_a_sibling(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, running=RUN)
    foreign = open_for(20, transactional_id="another-application", state="Ongoing")
    with pytest.raises(OffsetError, match="is not a writer of connector 'shop'"):
        reader.settle([foreign], 1, set())
    assert taken == []


def test_with_a_running_lease_holder_its_writers_are_waited_for_but_not_the_lease_writer(taken):
    reader = TakeOver({"bootstrap.servers": "k:9092"}, PREFIX, TOPIC, holder_runs=True)
    chunk = chunk_transactional_id(PREFIX, "20260101T000000Z-abc", "0001")
    for transactional_id in (window_transactional_id(PREFIX, "rs0"), chunk, control_transactional_id(PREFIX)):
        settle(reader, open_for(300, transactional_id=transactional_id, state="Ongoing"))
    assert taken == []
    # A contender's lease change is taken over (each lease change takes the lease writer over).
    settle(reader, open_for(20, transactional_id=lease_transactional_id(PREFIX), state="Ongoing"))
    assert taken == [{lease_transactional_id(PREFIX)}]
