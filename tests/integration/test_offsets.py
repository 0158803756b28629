"""The offset store against the real broker: committed state only, compaction, chunk markers."""

from __future__ import annotations

import json
import subprocess
import sys
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import NamedTuple

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, describe_topic, ensure_topics
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration

T1 = datetime(2024, 5, 1, 10, tzinfo=timezone.utc)
T2 = datetime(2024, 5, 1, 11, tzinfo=timezone.utc)


class Rec(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None


@pytest.fixture
def store(new_offsets_store):
    return new_offsets_store(SettledOffsetStore)


@pytest.fixture
def partition(unique_name):
    return OffsetPartition(unique_name, "rs0")


def window_state(seconds: int, events: int = 1) -> OffsetState:
    return OffsetState().after_window(
        Position({"_data": f"82{seconds:08X}"}, Timestamp(seconds, 1)), T1, events
    )


def test_offsets_topic_is_created_compacted_and_reused(kafka_config, unique_name):
    store = OffsetStore(kafka_config, f"{unique_name}.offsets")
    assert store.read_all() == {}  # no topic yet: no offsets
    assert store.ensure_topic() == "created"
    partitions, configs = describe_topic(kafka_config, store.topic)
    assert configs["cleanup.policy"] == "compact"
    assert partitions == 1
    assert store.ensure_topic() == "exists"


def test_existing_topic_without_compaction_is_refused(kafka_config, unique_name):
    topic = f"{unique_name}.offsets"
    ensure_topics(kafka_config, [TopicSpec(topic, 1, config={"cleanup.policy": "delete"})])
    with pytest.raises(OffsetError) as info:
        OffsetStore(kafka_config, topic).ensure_topic()
    message = str(info.value)
    assert "not compacted" in message and "cleanup.policy=compact" in message and topic in message


def test_offsets_round_trip_and_last_value_wins(store, partition):
    assert store.read(partition) is None
    store.write(partition, window_state(100))
    other = OffsetPartition(partition.server_id, "shard02")
    store.write(other, window_state(50, events=7))
    latest = window_state(200, events=3).snapshot_started(
        "snap-9", Position(cluster_time=Timestamp(150, 2)), 4
    )
    store.write(partition, latest)

    state = store.read(partition)
    assert state.resume_token == {"_data": "82000000C8"}
    assert state.cluster_time == Timestamp(200, 1)
    assert state.events == 3 and state.windows == 1 and state.last_window_end == T1
    assert state.snapshot.status == "in_progress" and state.snapshot.snapshot_id == "snap-9"
    assert state.snapshot.start.cluster_time == Timestamp(150, 2) and state.snapshot.plan_size == 4
    assert state.updated_at is not None
    assert set(store.read_all()) == {partition, other}
    assert store.read(other).events == 7


def test_offset_of_an_aborted_transaction_is_never_read_back(store, partition, unique_name):
    store.write(partition, window_state(100))
    events_topic = f"{unique_name}.db.coll"
    with TransactionalWriter(store.kafka_config, f"{unique_name}-window") as writer:
        writer.begin()
        writer.send([Rec(events_topic, b"k", b"event")])
        writer.send([store.offset_record(partition, window_state(999))])
        writer.flush()  # the offset record is in the log; only the abort marker hides it
        writer.abort()
        assert store.read(partition).cluster_time == Timestamp(100, 1)

        # An open (not yet committed) transaction is not visible either, and does not block reads
        # (of the product's store: the test's store would wait for the transaction to end).
        writer.begin()
        writer.send([store.offset_record(partition, window_state(555))])
        writer.flush()
        plain = OffsetStore(store.kafka_config, store.topic, read_timeout_s=120)
        assert plain.read(partition).cluster_time == Timestamp(100, 1)
        writer.commit()
    assert store.read(partition).cluster_time == Timestamp(555, 1)


def test_chunk_markers_of_committed_transactions_only(store, partition, unique_name):
    events_topic = f"{unique_name}.db.coll"
    snapshot = "snap-1"
    # Several Spark tasks, each committing its chunk and the chunk's marker in its own transaction.
    for chunk in ("c0", "c1", "c2"):
        with TransactionalWriter(store.kafka_config, f"{unique_name}-{snapshot}-{chunk}") as writer:
            with writer.transaction():
                writer.send([Rec(events_topic, chunk.encode(), b"doc")])
                writer.send([store.chunk_record(partition, snapshot, chunk, {"documents": 1})])
    with TransactionalWriter(store.kafka_config, f"{unique_name}-{snapshot}-c3") as failing:
        failing.begin()
        failing.send([Rec(events_topic, b"c3", b"doc"), store.chunk_record(partition, snapshot, "c3")])
        failing.flush()
        failing.abort()
    # Another snapshot's markers do not mix in.
    with TransactionalWriter(store.kafka_config, f"{unique_name}-other") as writer:
        with writer.transaction():
            writer.send([store.chunk_record(partition, "snap-0", "c9")])

    assert store.finished_chunks(partition, snapshot) == {"c0", "c1", "c2"}
    assert store.chunk_markers(partition, snapshot)["c1"].stats == {"documents": 1}
    assert store.finished_chunks(partition, "snap-0") == {"c9"}
    assert store.finished_chunks(OffsetPartition(partition.server_id, "rs1"), snapshot) == set()
    assert store.read(partition) is None  # markers are not the partition's offset

    # Completing the snapshot can remove its markers in the same transaction as the offset.
    with TransactionalWriter(store.kafka_config, f"{unique_name}-{snapshot}-complete") as writer:
        with writer.transaction():
            writer.send(store.chunk_tombstones(partition, snapshot, ["c0", "c1", "c2"]))
            writer.send(
                [
                    store.offset_record(
                        partition,
                        OffsetState()
                        .snapshot_started(snapshot, Position(cluster_time=Timestamp(10, 1)), 3)
                        .snapshot_completed(),
                    )
                ]
            )
    assert store.finished_chunks(partition, snapshot) == set()
    assert store.read(partition).position == Position(cluster_time=Timestamp(10, 1))


def test_reset_deletes_the_offset_and_its_markers(store, partition):
    store.write(partition, window_state(300, events=9))
    with TransactionalWriter(store.kafka_config, f"{partition.server_id}-chunk") as writer:
        with writer.transaction():
            writer.send([store.chunk_record(partition, "s", "c1")])
    keep = OffsetPartition(partition.server_id, "rs-keep")
    store.write(keep, window_state(1))

    before = store.reset(partition)
    assert before.cluster_time == Timestamp(300, 1) and before.events == 9
    assert store.read(partition) is None
    assert store.finished_chunks(partition, "s") == set()
    assert store.read(keep).cluster_time == Timestamp(1, 1)
    assert store.reset(partition) is None  # resetting again changes nothing


def test_set_position_keeps_counters(store, partition):
    store.write(partition, window_state(300, events=9))
    before, after = store.set_position(partition, Timestamp(1714557600, 0))
    assert before.cluster_time == Timestamp(300, 1)
    assert after.cluster_time == Timestamp(1714557600, 0) and after.resume_token is None
    assert after.events == 9 and after.windows == 1
    assert store.read(partition) == after

    _, after = store.set_position(partition, {"_data": "8299"})
    assert store.read(partition).resume_token == {"_data": "8299"}
    assert after.cluster_time is None

    fresh = OffsetPartition(partition.server_id, "new-rs")
    before, after = store.set_position(fresh, Position({"_data": "8201"}, Timestamp(5, 5)))
    assert before is None and store.read(fresh).cluster_time == Timestamp(5, 5)


# An operator action (``mongocdc offsets set``, ``reset``, ...) killed between sending its record and
# committing: its transaction stays open under the actions' transactional.id until the next writer
# with that id fences it (or the broker times it out after transaction.timeout.ms, 10 minutes).
_KILLED_CHANGE = """
import json, sys
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
kafka, topic, server_id = json.loads(sys.argv[1])
store = OffsetStore(kafka, topic)
writer = TransactionalWriter(kafka, store.admin_transactional_id)
writer.begin()
writer.send([store.offset_record(OffsetPartition(server_id, "rs-other"), OffsetState())])
writer.flush()
print("open", flush=True)
sys.stdin.read()  # until killed (or the test's end closes stdin)
"""


@contextmanager
def killed_offsets_change(store: OffsetStore, server_id: str):
    """An earlier offsets change whose process was killed (SIGKILL) with its transaction open."""
    args = json.dumps([store.kafka_config, store.topic, server_id])
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_CHANGE, args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "open", "the earlier change did not open its transaction"
        process.kill()
        process.wait(timeout=60)
        yield
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)


def commit_as_a_window(store: OffsetStore, transactional_id: str, records: list) -> None:
    with TransactionalWriter(store.kafka_config, transactional_id) as writer:
        with writer.transaction():
            writer.send(records)


def test_set_position_and_reset_read_what_was_committed_after_a_killed_change(
    kafka_config, unique_name, partition
):
    # The product's store (a test store would wait for the open transaction to end).
    store = OffsetStore(kafka_config, f"{unique_name}.offsets", read_timeout_s=120)
    store.ensure_topic()
    store.write(partition, window_state(100, events=1))
    with killed_offsets_change(store, partition.server_id):
        # Windows ran and committed after the killed change (its lease expired): their offset,
        # and a snapshot chunk's marker, come after the open transaction in the topic.
        later = window_state(200, events=5).after_window(
            Position({"_data": "82000000C9"}, Timestamp(201, 1)), T2, 2
        )
        commit_as_a_window(store, f"{unique_name}-window", [store.offset_record(partition, later)])
        commit_as_a_window(store, f"{unique_name}-chunk", [store.chunk_record(partition, "s", "c1")])

        before, after = store.set_position(partition, Timestamp(1714557600, 0))
        assert (before.events, before.windows) == (7, 2), "set read the offset as it was before the windows"
        assert (after.events, after.windows) == (7, 2) and after.cluster_time == Timestamp(1714557600, 0)
        assert OffsetStore(kafka_config, store.topic).read(partition) == after

    with killed_offsets_change(store, partition.server_id):
        commit_as_a_window(store, f"{unique_name}-chunk", [store.chunk_record(partition, "s", "c2")])
        before = store.reset(partition)
        assert before == after
        remaining = OffsetStore(kafka_config, store.topic).finished_chunks(partition, "s")
        assert remaining == set(), (
            f"reset left the chunk markers {remaining} committed after the killed change"
        )
        assert OffsetStore(kafka_config, store.topic).read(partition) is None


def test_export_debezium_exports_what_was_committed_after_a_killed_change(
    kafka_config, unique_name, partition
):
    store = OffsetStore(kafka_config, f"{unique_name}.offsets", read_timeout_s=120)
    store.ensure_topic()
    store.write(partition, window_state(100, events=1))
    connect_topic = f"{unique_name}.connect-offsets"
    ensure_topics(kafka_config, [TopicSpec(connect_topic, 1, config={"cleanup.policy": "compact"})])
    with killed_offsets_change(store, partition.server_id):
        later = window_state(200, events=5)
        commit_as_a_window(store, f"{unique_name}-window", [store.offset_record(partition, later)])

        state, _key, value = store.export_debezium(partition, connect_topic, "inventory-connector")
    exported = json.loads(value)
    assert (exported["sec"], exported["ord"]) == (200, 1), (
        f"exported the position before the window: {exported}"
    )
    assert state.events == 5


def test_unreachable_brokers_give_a_clear_error(unique_name):
    store = OffsetStore(
        {"bootstrap.servers": "127.0.0.1:1", "socket.connection.setup.timeout.ms": 1000},
        f"{unique_name}.offsets",
        read_timeout_s=3,
    )
    with pytest.raises(OffsetError) as info:
        store.read_all()
    assert "127.0.0.1:1" in str(info.value) and "Fix:" in str(info.value)
