"""The lease's reads never fence a live writer of the connector, and still see every lease change.

A lease change (take, renew, release) reads the offsets topic to its end, past the transactions
open there (a lease change committed after one would be hidden from a read_committed reader).
Those may be a live holder's windows or chunks in the middle of a commit slower than the read's
settle time (here shortened): the holder renewing its lease, and a second run refused by it, wait
for them instead of taking their writers over. A transaction that no running holder can own (the
lease is free, or taken anew by the same owner's retry) is taken over at once, as before. The
waits are on conditions (the read has settled once past its settle time), never on fixed times.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import timedelta

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import DeliveryError, LeaseHeldError
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, Lease, _utcnow
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.writers import (
    TakeOver,
    lease_transactional_id,
    window_transactional_id,
)
from tests.settled_offsets import READ_TIMEOUT_S, SettledOffsetStore

pytestmark = pytest.mark.integration

# Far below the product's 15 s, so that a window's commit is "slow" at once.
SHORT_SETTLE_S = 0.5
HOLDER = "mongocdc_hourly/scheduled__1/window"
OTHER = "mongocdc_resnapshot/manual__1/resnapshot"


@pytest.fixture
def settled(monkeypatch) -> threading.Event:
    """Set once a read has waited its settle time for an open transaction and decided what to do
    with it (whatever it decided, and also when it raised)."""
    event = threading.Event()
    settle = TakeOver.settle

    def watched(self, *args, **kwargs):
        try:
            return settle(self, *args, **kwargs)
        finally:
            event.set()

    monkeypatch.setattr(TakeOver, "settle", watched)
    return event


def short_lease(kafka_config, prefix: str) -> ConnectorLease:
    lease = ConnectorLease(kafka_config, prefix, read_timeout_s=READ_TIMEOUT_S)
    lease.store.settling = replace(lease.store.settling, wait_s=SHORT_SETTLE_S)
    return lease


def at(seconds: int) -> OffsetState:
    return OffsetState(position=Position(cluster_time=Timestamp(1_800_000_000 + seconds, 1)))


def open_offset(writer: TransactionalWriter, store, partition: OffsetPartition, state) -> None:
    """A commit under way: ``state``'s offset record sent and on the broker, the transaction open."""
    writer.begin()
    writer.send([store.offset_record(partition, state)])
    writer.flush()


def while_a_window_commits_slowly(kafka_config, prefix: str, settled: threading.Event, action):
    """``action()`` run while the window's commit is under way; the window commits once ``action``'s
    read has settled, then commits again (not fenced). Returns ``action``'s future."""
    store = SettledOffsetStore(kafka_config, f"{prefix}.offsets")
    partition = OffsetPartition(prefix, "rs0")
    with TransactionalWriter(kafka_config, window_transactional_id(prefix, "rs0")) as window:
        open_offset(window, store, partition, at(1))
        settled.clear()
        with ThreadPoolExecutor(1) as pool:
            done = pool.submit(action)
            assert settled.wait(READ_TIMEOUT_S), "the lease's read never found the window's transaction open"
            window.commit()  # the live window's commit, slower than the read's settle time
            done.exception(timeout=READ_TIMEOUT_S)
        window.begin()  # not fenced: it goes on committing
        window.commit([store.offset_record(partition, at(2))])
    assert store.read(partition).position == at(2).position
    return done


def test_the_holder_renews_its_lease_while_its_window_commits_without_fencing_it(
    kafka_config, unique_name, settled
):
    lease = short_lease(kafka_config, unique_name)
    held = lease.acquire(HOLDER, WINDOW, ttl=600)
    renewing = while_a_window_commits_slowly(kafka_config, unique_name, settled, lambda: lease.renew(held))
    renewed = renewing.result()
    assert renewed.same_as(held) and renewed.expires_at >= held.expires_at


def test_a_second_run_is_refused_by_the_lease_without_fencing_the_holders_window(
    kafka_config, unique_name, settled
):
    lease = short_lease(kafka_config, unique_name)
    lease.acquire(HOLDER, WINDOW, ttl=600)
    refusing = while_a_window_commits_slowly(
        kafka_config, unique_name, settled, lambda: lease.acquire(OTHER, SNAPSHOT)
    )
    with pytest.raises(LeaseHeldError, match="cannot start"):
        refusing.result()
    assert lease.current().owner == HOLDER


@pytest.mark.parametrize("before", ["free", "same owner"])
def test_a_transaction_no_running_holder_owns_is_taken_over_when_the_lease_is_taken(
    kafka_config, unique_name, before
):
    """A killed window's transaction (no holder runs, or the same task's retry takes the lease
    anew) is ended by the lease change at once, long before the broker's transaction timeout."""
    lease = short_lease(kafka_config, unique_name)
    if before == "same owner":
        lease.acquire(HOLDER, WINDOW, ttl=600)
    store = SettledOffsetStore(kafka_config, f"{unique_name}.offsets")
    store.ensure_topic()
    killed = TransactionalWriter(kafka_config, window_transactional_id(unique_name, "rs0"))
    try:
        open_offset(killed, store, OffsetPartition(unique_name, "rs0"), at(1))
        with ThreadPoolExecutor(1) as pool:
            taking = pool.submit(lease.acquire, HOLDER, WINDOW, 600)
            assert taking.result(timeout=READ_TIMEOUT_S).owner == HOLDER
        with pytest.raises(DeliveryError, match="fenced"):
            killed.commit()
    finally:
        killed.close()


def test_a_lease_committed_behind_an_open_transaction_is_seen(kafka_config, unique_name):
    """A read that stopped at the open transaction (as one that only shows the offsets does) would
    find the lease free and hand it to a second holder: the lease's read reads past it."""
    lease = short_lease(kafka_config, unique_name)
    store = SettledOffsetStore(kafka_config, f"{unique_name}.offsets")
    store.ensure_topic()
    killed = TransactionalWriter(kafka_config, window_transactional_id(unique_name, "rs0"))
    try:
        open_offset(killed, store, OffsetPartition(unique_name, "rs0"), at(1))
        # Another contender's lease, committed after the window's transaction began.
        now = _utcnow()
        theirs = Lease(HOLDER, WINDOW, now, now + timedelta(minutes=10))
        with TransactionalWriter(kafka_config, lease_transactional_id(unique_name)) as contender:
            contender.begin()
            contender.commit([Record(store.topic, lease.key, json.dumps(theirs.to_json()).encode())])
        with pytest.raises(LeaseHeldError, match="cannot start"):
            lease.acquire(OTHER, SNAPSHOT)
    finally:
        killed.close()
