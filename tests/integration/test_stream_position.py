"""The position a snapshot records before copying (``current_position``) never lies inside a
transaction: a window started from it streams every change of a transaction committed while the
position was taken (MongoDB simulator or MONGOCDC_TEST_MONGODB_URI, and the real Kafka broker)."""

from __future__ import annotations

import collections
import json
import threading
import time
from datetime import datetime, timezone

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo import change_stream
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.window_helpers import connector, next_second, pass_second, topic_events, write_time

pytestmark = pytest.mark.integration


def commit_transaction(client: MongoClient, operations) -> Timestamp:
    """Commit ``operations(session)`` as one multi-document transaction; returns its cluster time."""
    with client.start_session() as session:
        with session.start_transaction():
            operations(session)
        return session.operation_time


def run_window_from(uri: str, props, kafka, position: Position, end: Timestamp, marker_db: str) -> dict:
    """Store ``position`` as the offset and run the window to ``end``."""
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    store = OffsetStore(kafka, config.offsets_topic, read_timeout_s=30)
    store.write(OffsetPartition(config.topic_prefix, target.partition), OffsetState(position=position))
    with MongoClient(uri) as client:
        pass_second(client, end, marker_db)
    params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60)
    return run_window(target, config, kafka, params)


def three_changes(collection):
    def operations(session):
        collection.insert_one({"_id": 1}, session=session)
        collection.update_one({"_id": 0}, {"$set": {"v": 1}}, session=session)
        collection.insert_one({"_id": 2}, session=session)

    return operations


@pytest.mark.parametrize("metadata", [True, False], ids=["transaction_metadata", "no_metadata"])
@pytest.mark.parametrize("first_batch", ["empty", "with_changes"])
def test_a_transaction_committed_while_the_position_is_taken_is_streamed_whole(
    mongodb_uri, kafka_bootstrap, unique_name, monkeypatch, metadata, first_batch
):
    database = f"db_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, database, {"provide.transaction.metadata": metadata})
    config = ConnectorConfig.from_properties(props)
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    orders = client[database].orders
    before = write_time(client, lambda s: orders.insert_one({"_id": 0, "v": 0}, session=s))

    committed: list[Timestamp] = []
    real_open = change_stream.open_stream

    def open_stream(client_, config_, position=None, **kwargs):
        if first_batch == "empty":
            # The transaction commits after the stream's aggregate, before its first getMore.
            stream = real_open(client_, config_, position, **kwargs)
            committed.append(commit_transaction(client, three_changes(orders)))
            return stream
        # The transaction commits while the stream opens: its aggregate's first batch holds it.
        committed.append(commit_transaction(client, three_changes(orders)))
        return real_open(
            client_, config_, Position(cluster_time=Timestamp(before.time, before.inc + 1)), **kwargs
        )

    monkeypatch.setattr(change_stream, "open_stream", open_stream)
    position = change_stream.current_position(client, config)
    monkeypatch.undo()
    assert len(committed) == 1, "the position was taken without opening the connector's stream"

    summary = run_window_from(mongodb_uri, props, kafka, position, next_second(committed[0]), f"{database}_m")
    assert summary["reached_end"], summary
    events = topic_events(kafka_bootstrap, f"{unique_name}.{database}.orders")
    changes = [(e.op, e.key["id"]) for e in events if e.payload is not None]
    assert changes == [("c", "1"), ("u", "0"), ("c", "2")], (
        f"the window from {position.describe()} streamed {changes} of the 3-change transaction"
    )
    if first_batch == "with_changes":  # the start is inclusive, at the transaction, without a token
        assert position == Position(cluster_time=committed[0])
    if metadata:
        ids = {e.payload["transaction"]["id"] for e in events if e.payload is not None}
        assert len(ids) == 1
        markers = [
            json.loads(r.value)["payload"] for r in read_topic(kafka_bootstrap, f"{unique_name}.transaction")
        ]
        assert [(m["status"], m["event_count"]) for m in markers] == [("BEGIN", None), ("END", 3)]
    else:
        assert all(e.payload.get("transaction") is None for e in events if e.payload is not None)


class TransactionWriter(threading.Thread):
    """Commits transactions of 2 to 4 inserts, one after the other, until stopped."""

    def __init__(self, uri: str, database: str):
        super().__init__(daemon=True, name="transaction-writer")
        self.uri, self.database = uri, database
        self.stop = threading.Event()
        self.committed = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            with MongoClient(self.uri, serverSelectionTimeoutMS=20000) as client:
                collection = client[self.database].txns
                number = 0
                while not self.stop.is_set():
                    number += 1
                    size = 2 + number % 3
                    docs = [{"_id": number * 10 + i, "txn": number, "size": size} for i in range(size)]

                    def operations(session, docs=docs):
                        for doc in docs:
                            collection.insert_one(doc, session=session)

                    commit_transaction(client, operations)
                    self.committed = number
        except BaseException as error:  # reported by the test
            self.error = error


@pytest.mark.slow
def test_no_start_position_splits_a_transaction_under_a_steady_stream_of_transactions(
    mongodb_uri, kafka_bootstrap, unique_name
):
    database = f"db_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    client[database].txns.insert_one({"_id": 0, "txn": 0, "size": 1})
    writer = TransactionWriter(mongodb_uri, database)
    writer.start()
    seen = 0
    try:
        deadline = time.monotonic() + 120
        while writer.committed < 5:
            assert writer.error is None, writer.error
            assert time.monotonic() < deadline, "the writer committed no transaction within 120 s"
            time.sleep(0.05)
        for run in range(20):
            props = connector(f"{unique_name}_{run}", database)
            position = change_stream.current_position(client, ConnectorConfig.from_properties(props))
            end = next_second(position.cluster_time)
            summary = run_window_from(mongodb_uri, props, kafka, position, end, f"{database}_m")
            assert summary["reached_end"], summary
            assert writer.error is None, writer.error
            sizes, counts = {}, collections.Counter()
            for event in topic_events(kafka_bootstrap, f"{unique_name}_{run}.{database}.txns"):
                if event.op == "c":
                    sizes[event.after["txn"]] = event.after["size"]
                    counts[event.after["txn"]] += 1
            split = {txn: (counts[txn], size) for txn, size in sizes.items() if counts[txn] != size}
            assert not split, (
                f"run {run}: the window from {position.describe()} streamed part of transactions "
                f"(transaction: (changes streamed, size)) {split}"
            )
            seen += len(sizes)
    finally:
        writer.stop.set()
        writer.join(timeout=120)
    assert writer.error is None, writer.error
    assert seen >= 20, f"only {seen} transactions fell inside the 20 windows: the race was not exercised"
