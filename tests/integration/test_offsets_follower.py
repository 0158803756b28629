"""The change watcher's kept reader of the offsets topic (``OffsetStore.follower()``): each read
goes on from the last, and what it gives folds to what a fresh read of the whole topic gives, over
new records, tombstones, a transaction left open then committed, and a topic deleted and created
again with fewer records."""

from __future__ import annotations

import time

import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.kafka.reading import wait_stable

pytestmark = pytest.mark.integration


def state(n: int) -> bytes:
    return OffsetState(position=Position(None, Timestamp(1_700_000_000 + n, 1))).to_bytes()


def same_view(store: OffsetStore, follower) -> dict:
    """What the follower shows, checked against a fresh read of the whole topic."""
    wait_stable(store.kafka_config["bootstrap.servers"], store.topic)
    followed = follower.read()
    fresh = store.read_records()
    assert followed.open_transactions == fresh.open_transactions == []
    mine, theirs = store.read_everything(followed.records), store.read_everything(fresh.records)
    assert mine.states == theirs.states and mine.chunks == theirs.chunks
    return {
        partition.rs: stored.position.cluster_time.time - 1_700_000_000
        for partition, stored in mine.states.items()
    }


def test_follower_reads_on_and_agrees_with_a_whole_read(kafka_bootstrap, unique_name):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    store = OffsetStore(kafka, f"{unique_name}.offsets", read_timeout_s=120)
    follower = store.follower()
    try:
        assert follower.read().records == []  # no topic yet: no offsets, as a whole read says
        store.ensure_topic(1)
        producer = Producer(kafka)
        rs = {name: OffsetPartition(unique_name, name) for name in ("rs0", "rs1")}

        for n in range(50):
            producer.produce(store.topic, key=rs["rs0"].key(), value=state(n))
        producer.flush(60)
        assert same_view(store, follower) == {"rs0": 49}

        producer.produce(store.topic, key=rs["rs1"].key(), value=state(100))
        producer.produce(store.topic, key=rs["rs0"].key(), value=None)  # a reset: the tombstone deletes
        producer.flush(60)
        assert same_view(store, follower) == {"rs1": 100}
        assert same_view(store, follower) == {"rs1": 100}  # nothing new: the same

        # A transaction left open: committed records before it are shown, it is named, and what
        # it holds appears once it commits.
        writer = Producer({**kafka, "transactional.id": f"{unique_name}-open"})
        writer.init_transactions(60)
        writer.begin_transaction()
        writer.produce(store.topic, key=rs["rs0"].key(), value=state(200))
        writer.flush(60)
        held = follower.read()
        assert [open_one.transactional_id for open_one in held.open_transactions] == [f"{unique_name}-open"]
        assert {p.rs for p in store.read_everything(held.records).states} == {"rs1"}
        writer.commit_transaction(60)
        assert same_view(store, follower) == {"rs0": 200, "rs1": 100}

        # Deleted and created again, shorter: read again from its start, not from the old position.
        admin = AdminClient(kafka)
        admin.delete_topics([store.topic])[store.topic].result(60)
        deadline = time.monotonic() + 120
        while True:
            try:
                admin.create_topics([NewTopic(store.topic, 1, 1, config={"cleanup.policy": "compact"})])[
                    store.topic
                ].result(60)
                break
            except Exception:  # noqa: BLE001 - the deletion is still under way
                assert time.monotonic() < deadline, "the offsets topic was not created again within 120 s"
                time.sleep(0.5)
        producer.produce(store.topic, key=rs["rs1"].key(), value=state(300))
        producer.flush(60)
        assert same_view(store, follower) == {"rs1": 300}
    finally:
        follower.close()
