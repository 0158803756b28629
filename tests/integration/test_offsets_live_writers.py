"""A run's reader of the offsets topic never fences a live writer of its own run.

The streams of a per-shard window (``mongodb.connection.mode=replica_set`` on a sharded cluster)
run side by side and each reads the offsets topic when it starts; a sibling stream may then be in
the middle of a commit, its offset record sent and its transaction still open. A commit slower than
the reader's settle time (here shortened) is waited for: the sibling is not taken over, its commit
succeeds, it goes on committing, and the reader sees what it committed. The waits are on
conditions (the reader has settled once past its settle time), never on fixed times.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import TakeOver, window_transactional_id
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_stream_tasks
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.window_helpers import connector, end_after_insert, seed_offset
from tests.settled_offsets import READ_TIMEOUT_S, SettledOffsetStore

pytestmark = pytest.mark.integration

# Far below the product's 15 s, so that the sibling's commit is "slow" at once.
SHORT_SETTLE_S = 0.5


def at(seconds: int) -> OffsetState:
    return OffsetState(position=Position(cluster_time=Timestamp(1_800_000_000 + seconds, 1)))


@pytest.fixture
def settled(monkeypatch) -> threading.Event:
    """Set once a run's reader has waited its settle time for an open transaction and decided
    what to do with it (whatever it decided, and also when it raised)."""
    event = threading.Event()
    settle = TakeOver.settle

    def watched(self, *args, **kwargs):
        try:
            return settle(self, *args, **kwargs)
        finally:
            event.set()

    monkeypatch.setattr(TakeOver, "settle", watched)
    return event


def open_offset(writer: TransactionalWriter, store: OffsetStore, partition: OffsetPartition, state) -> None:
    """A commit under way: ``state``'s offset record sent and on the broker, the transaction open."""
    writer.begin()
    writer.send([store.offset_record(partition, state)])
    writer.flush()


def test_a_stream_waits_for_a_sibling_streams_slow_commit_and_does_not_fence_it(
    kafka_config, unique_name, settled
):
    config = ConnectorConfig.from_properties({"topic.prefix": unique_name})
    store = SettledOffsetStore(kafka_config, config.offsets_topic)
    store.ensure_topic()
    shard0, shard1 = OffsetPartition(unique_name, "shard0"), OffsetPartition(unique_name, "shard1")
    store.write(shard0, at(0))
    running = [window_transactional_id(unique_name, rs) for rs in ("shard0", "shard1")]
    with TransactionalWriter(kafka_config, window_transactional_id(unique_name, "shard1")) as sibling:
        open_offset(sibling, store, shard1, at(1))
        reader = OffsetStore.for_connector(
            kafka_config, config, running=running, settle_s=SHORT_SETTLE_S, read_timeout_s=READ_TIMEOUT_S
        )
        with ThreadPoolExecutor(1) as pool:
            read = pool.submit(reader.read_all)
            assert settled.wait(READ_TIMEOUT_S), "the reader never found the sibling's transaction open"
            sibling.commit()  # the live sibling's commit, slower than the reader's settle time
            states = read.result(timeout=READ_TIMEOUT_S)
        sibling.begin()  # not fenced: it goes on committing
        sibling.commit([store.offset_record(shard1, at(2))])
    assert states[shard1].position == at(1).position  # the reader waited for the commit and read it
    assert states[shard0].position == at(0).position
    assert store.read(shard1).position == at(2).position


def test_a_spark_tasks_stream_starts_past_a_sibling_streams_slow_commit_without_fencing_it(
    mongodb_uri, kafka_bootstrap, unique_name, settled, monkeypatch
):
    """The same through a stream's task (``run_stream_tasks``, as the window application's Spark
    tasks run it, told the run's streams): the stream starts once its sibling has committed, and
    the sibling goes on."""
    kafka = {"bootstrap.servers": kafka_bootstrap}
    database = unique_name[:40]
    props = connector(unique_name, database)
    config = ConnectorConfig.from_properties(props)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    sibling_partition = OffsetPartition(unique_name, "sibling")
    store.write(sibling_partition, at(0))
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = end_after_insert(client[database].items, {"_id": 1}, f"{database}_m")
    for_connector = OffsetStore.for_connector.__func__

    def shortly_settled(cls, kafka_config, connector_config, **kwargs):
        return for_connector(cls, kafka_config, connector_config, **{"settle_s": SHORT_SETTLE_S, **kwargs})

    monkeypatch.setattr(OffsetStore, "for_connector", classmethod(shortly_settled))
    with TransactionalWriter(kafka, window_transactional_id(unique_name, "sibling")) as sibling:
        open_offset(sibling, store, sibling_partition, at(1))
        tasks = run_stream_tasks(
            [target.to_json()],
            connector=props,
            kafka=kafka,
            params=WindowParams(end, idle_timeout_s=60).to_params(),
            streams=[target.partition, "sibling"],
        )
        with ThreadPoolExecutor(1) as pool:
            ran = pool.submit(list, tasks)
            assert settled.wait(READ_TIMEOUT_S), "the stream never found its sibling's transaction open"
            sibling.commit()
            (summary,) = ran.result(timeout=READ_TIMEOUT_S)
        sibling.begin()
        sibling.commit([store.offset_record(sibling_partition, at(2))])
    assert summary["reached_end"] is True and summary["events"] == 1, summary
    assert store.read(sibling_partition).position == at(2).position
    assert store.read(partition).windows == 1
