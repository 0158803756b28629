"""A stream window's batches (core/window/batch.py) against the real Kafka broker: what a commit
puts on the topics and in the offset, the MongoDB transactions a summary counts, and what a
stream failure keeps or rolls back. The changes are change stream documents as MongoDB writes
them; no MongoDB server is needed."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest
from bson import Binary, Int64, Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.transactions import transaction_id
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.window.batch import BatchSender, WindowBatch
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.scope import StreamScope
from tests.integration.window_helpers import topic_events
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration

SESSION = {"id": Binary(uuid.UUID(int=7).bytes, 4), "uid": Binary(b"\x01" * 32, 0)}


def insert(seconds: int, key: int, txn: int | None = None, collection: str = "orders") -> dict:
    """The change stream document of an insert of ``{"_id": key}`` into ``shop.<collection>``
    (in MongoDB transaction ``txn`` of one session)."""
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(seconds, key),
        "wallTime": datetime.fromtimestamp(seconds, timezone.utc),
        "ns": {"db": "shop", "coll": collection},
        "documentKey": {"_id": key},
        "fullDocument": {"_id": key, "total": key * 10},
    }
    if txn is not None:
        change.update(lsid=SESSION, txnNumber=Int64(txn))
    return change


def at(seconds: int) -> Position:
    return Position(cluster_time=Timestamp(seconds, 0))


@contextmanager
def window_batch(kafka_config: dict, prefix: str) -> Iterator[tuple[WindowBatch, SettledOffsetStore]]:
    """The batch of a window over ``shop.orders`` starting at cluster time 100, and its offsets."""
    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": prefix,
            "collection.include.list": "shop[.]orders",
            "provide.transaction.metadata": True,
        }
    )
    store = SettledOffsetStore(kafka_config, config.offsets_topic)
    store.ensure_topic()
    scope = StreamScope(
        config,
        OffsetPartition(config.topic_prefix, "rs0"),
        "rs0",
        WindowParams(datetime(2026, 1, 1, tzinfo=timezone.utc)),
        clock_ms=lambda: 1_000_000,
    )
    with TransactionalWriter(kafka_config, f"{prefix}-window") as writer:
        batch = WindowBatch(scope, BatchSender(writer, kafka_config, {store.topic}), store)
        batch.begin(None, at(100))
        yield batch, store


def add(batch: WindowBatch, *changes: dict) -> None:
    for change in changes:
        batch.add_change(change, change["clusterTime"], transaction_id(change))


def ids(bootstrap: str, topic: str) -> list[int]:
    return [int(event.key["id"]) for event in topic_events(bootstrap, topic)]


def statuses(bootstrap: str, prefix: str) -> list[str]:
    return [event.payload["status"] for event in topic_events(bootstrap, f"{prefix}.transaction")]


def test_a_commit_puts_the_batch_and_its_offset_on_kafka_and_counts_the_transactions_begun(
    kafka_config, kafka_bootstrap, unique_name
):
    with window_batch(kafka_config, unique_name) as (batch, store):
        add(
            batch,
            insert(101, 1),
            insert(102, 2, txn=1),
            insert(102, 3, txn=1),
            insert(103, 1, txn=2, collection="audit"),  # not captured: no event, no BEGIN
            insert(104, 4, txn=3),
            insert(105, 5),
        )
        batch.commit(at(106))
        summary = batch.tally.summary(1.0, reconnects=0)

    assert ids(kafka_bootstrap, f"{unique_name}.shop.orders") == [1, 2, 3, 4, 5]
    assert statuses(kafka_bootstrap, unique_name) == ["BEGIN", "END", "BEGIN", "END"]
    assert summary["transactions"] == 2, summary
    assert (summary["events"], summary["batches_committed"]) == (5, 1), summary
    assert summary["events_by_collection"] == {"shop.orders": 5}
    state = store.read(batch.scope.partition)
    assert (state.position, state.events, state.windows) == (at(106), 5, 0)


def test_a_stream_failure_inside_a_transaction_rolls_the_batch_back_to_the_last_commit(
    kafka_config, kafka_bootstrap, unique_name
):
    with window_batch(kafka_config, unique_name) as (batch, store):
        add(batch, insert(101, 1))
        batch.commit(at(102))
        add(batch, insert(102, 2, txn=1), insert(102, 3, txn=1))

        resume = batch.recover(Position(cluster_time=Timestamp(102, 3)))

        assert resume == at(102), "the stream must read the transaction again from the last commit"
        assert ids(kafka_bootstrap, f"{unique_name}.shop.orders") == [1]
        assert store.read(batch.scope.partition).position == at(102)
        # Read again whole, the transaction is committed once, with one BEGIN and one END.
        add(batch, insert(102, 2, txn=1), insert(102, 3, txn=1), insert(103, 4))
        batch.commit(at(104), last=True)
        summary = batch.tally.summary(1.0, reconnects=1)

    assert ids(kafka_bootstrap, f"{unique_name}.shop.orders") == [1, 2, 3, 4]
    assert statuses(kafka_bootstrap, unique_name) == ["BEGIN", "END"]
    assert (summary["events"], summary["transactions"], summary["batches_committed"]) == (4, 1, 2), summary
    state = store.read(batch.scope.partition)
    assert (state.position, state.events, state.windows) == (at(104), 4, 1)


def test_a_stream_failure_outside_a_transaction_commits_what_was_read(
    kafka_config, kafka_bootstrap, unique_name
):
    with window_batch(kafka_config, unique_name) as (batch, store):
        add(batch, insert(101, 1), insert(102, 2))

        resume = batch.recover(at(103))

        assert resume == at(103), "the stream must go on from where it failed"
        assert ids(kafka_bootstrap, f"{unique_name}.shop.orders") == [1, 2]
        assert store.read(batch.scope.partition).position == at(103)
        assert batch.tally.summary(1.0, reconnects=1)["batches_committed"] == 1
