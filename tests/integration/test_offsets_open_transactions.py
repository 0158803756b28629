"""Where a run starts when a transaction is open on the offsets topic, and whose offsets it may
commit over.

1. Per-shard streams share the offsets topic. A stream killed after sending its offset record and
   before its commit leaves that transaction open; a sibling stream commits after it. The retried
   window of both streams starts from their last committed offsets (the killed stream's writer is
   taken over first): nothing is emitted twice, the offsets only move forward.
2. A transaction of a writer that is not the connector's: the window fails with an error naming
   its transactional id, how long it has been open and the command that aborts it; ``mongocdc
   offsets show`` and the MongoDB CDC page's reading say it is open.
3. A window commit whose offset lies behind the committed one is refused before it is written.
4. Two connectors (names) with one topic prefix: the second may neither commit over the first's
   offsets nor take its lease; ``mongocdc offsets adopt`` hands them over. Its snapshot, its window
   and its incremental snapshot request are refused in words as soon as the prefix's positions (of
   any partition) or its lease name the first, and change nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import LeaseHeldError, OffsetError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.probes import read_offsets
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import window_transactional_id
from airflow_provider_mongocdc.core.window.batch import BatchSender, WindowBatch
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import check_offsets, plan_streams
from tests.integration.window_helpers import connector, end_after_insert, seed_offset, topic_events
from tests.killed_writer import killed_writer
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration

MONGOCDC = str(Path(sys.executable).parent / "mongocdc")


def created_ids(bootstrap: str, topic: str) -> Counter:
    return Counter(
        int(event.key["id"])
        for event in topic_events(bootstrap, topic)
        if event.payload and event.payload["op"] == "c"
    )


@pytest.mark.simulator_only
def test_retried_per_shard_window_starts_from_the_committed_offsets_past_a_killed_streams_open_transaction(
    mongosim, kafka_bootstrap, unique_name
):
    sim = mongosim("sharded", shards=2)
    db_name, prefix, kafka = unique_name[:40], unique_name, {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, db_name, {"mongodb.connection.mode": "replica_set"})
    config = ConnectorConfig.from_properties(props)
    store = SettledOffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    targets = plan_streams(connection_details({"connection_string": sim.uri}), config)
    assert [target.partition for target in targets] == ["shard0", "shard1"]
    for target, uri in zip(targets, sim.shard_uris):
        with MongoClient(uri, serverSelectionTimeoutMS=20000) as shard:
            store.write(
                OffsetPartition(prefix, target.partition),
                OffsetState(position=current_position(shard, config)),
            )

    def window(end: Timestamp, streams=targets) -> None:
        """What the window application does: the driver's check, then each stream's window."""
        check_offsets(config, kafka, streams)
        for target in streams:
            run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))

    with MongoClient(sim.uri, serverSelectionTimeoutMS=20000) as client:
        client.admin.command("enableSharding", db_name)
        client.admin.command("shardCollection", f"{db_name}.items", key={"_id": "hashed"})
        items = client[db_name].items
        items.insert_many([{"_id": n} for n in range(30)])
        window(end_after_insert(items, {"_id": 1000}, f"{db_name}_m"))
        before = {rs: store.read(OffsetPartition(prefix, rs)) for rs in ("shard0", "shard1")}

        items.insert_many([{"_id": n} for n in range(100, 130)])
        end_b = end_after_insert(items, {"_id": 1001}, f"{db_name}_m")
        # shard1's stream killed between sending its offset record and committing...
        shard1 = OffsetPartition(prefix, "shard1")
        killed_offset = store.offset_record(
            shard1, before["shard1"].after_window(None, before["shard1"].last_window_end, 0)
        )
        with killed_writer(kafka, window_transactional_id(prefix, "shard1"), [killed_offset[:3]]):
            # ... while shard0's stream committed after it.
            run_window(targets[0], config, kafka, WindowParams(end_b, idle_timeout_s=60))
            # The retry, at once: both streams.
            items.insert_many([{"_id": n} for n in range(200, 230)])
            window(end_after_insert(items, {"_id": 1002}, f"{db_name}_m"))

    created = created_ids(kafka_bootstrap, f"{prefix}.{db_name}.items")
    expected = [*range(30), *range(100, 130), *range(200, 230), 1000, 1001, 1002]
    assert sorted(created) == expected, sorted(set(expected) - set(created))
    assert {n: count for n, count in created.items() if count > 1} == {}, "changes emitted twice"
    after = {rs: store.read(OffsetPartition(prefix, rs)) for rs in ("shard0", "shard1")}
    assert after["shard0"].windows == before["shard0"].windows + 2  # B and the retry: never back
    assert after["shard1"].windows == before["shard1"].windows + 1  # the retry read B and C
    for rs in after:
        assert after[rs].cluster_time > before[rs].cluster_time


def test_a_foreign_writers_open_transaction_fails_the_window_with_its_name_and_readers_say_it_is_open(
    mongodb_uri, kafka_bootstrap, unique_name
):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, unique_name[:40])
    config = ConnectorConfig.from_properties(props)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = end_after_insert(client[unique_name[:40]].items, {"_id": 1}, f"{unique_name[:40]}_m")
    foreign = f"another-application-{uuid.uuid4().hex[:6]}"
    with killed_writer(kafka, foreign, [(store.topic, b'"not-an-offset"', b"{}")]):
        (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
        began = time.monotonic()
        with pytest.raises(OffsetError) as refused:
            run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))
        text = str(refused.value)
        assert f"transactional.id {foreign!r}" in text and "open on topic" in text, text
        assert (
            f"kafka-transactions.sh --bootstrap-server {kafka_bootstrap} abort --topic {store.topic}" in text
        )
        assert "is not a writer of connector" in text and time.monotonic() - began > 0
        assert created_ids(kafka_bootstrap, f"{unique_name}.{unique_name[:40]}.items") == Counter()

        shown = subprocess.run(
            [
                MONGOCDC,
                "offsets",
                "show",
                "--bootstrap-servers",
                kafka_bootstrap,
                "--topic-prefix",
                unique_name,
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert shown.returncode == 0, shown.stderr
        (open_one,) = json.loads(shown.stdout)["open_transactions"]
        assert open_one["transactional_id"] == foreign and open_one["open_seconds"] >= 0
        view = read_offsets(kafka, config, timeout_s=120)
        assert [t.transactional_id for t in view.open_transactions] == [foreign]
        # What is committed is still shown (a reader that only shows waits 3 s, not for the end).
        assert view.states[partition] == OffsetStore(kafka, store.topic).read(partition)


def test_a_window_commit_behind_the_committed_offset_is_refused_before_it_is_written(
    kafka_config, unique_name
):
    config = ConnectorConfig.from_properties({"topic.prefix": unique_name})
    store = SettledOffsetStore(kafka_config, config.offsets_topic)
    store.ensure_topic()
    partition = OffsetPartition(unique_name, "rs0")
    committed = OffsetState(position=Position(cluster_time=Timestamp(1_800_000_000, 5)), windows=2)
    store.write(partition, committed)
    params = WindowParams(Timestamp(1_800_000_100, 0))
    scope = StreamScope(config, partition, "rs0", params, lambda: 0)
    with TransactionalWriter(kafka_config, window_transactional_id(unique_name, "rs0")) as writer:
        batch = WindowBatch(scope, BatchSender(writer, kafka_config, {store.topic}), store)
        batch.begin(store.read(partition), committed.position)
        with pytest.raises(OffsetError, match="lies before the committed one"):
            batch.commit(Position(cluster_time=Timestamp(1_799_999_000, 1)))
    stored = store.read(partition)
    assert stored.position == committed.position and stored.windows == 2


def test_two_connectors_with_one_topic_prefix_cannot_commit_over_each_other_until_adopted(
    mongodb_uri, kafka_bootstrap, unique_name
):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    database = unique_name[:40]
    first = connector(unique_name, database, {"name": "first"})
    second = {**first, "name": "second", "collection.include.list": f"{database}\\.other"}
    store, partition = seed_offset(mongodb_uri, kafka, first)
    (target,) = plan_streams(
        connection_details({"connection_string": mongodb_uri}), ConnectorConfig.from_properties(first)
    )
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = end_after_insert(client[database].items, {"_id": 1}, f"{database}_m")
    run_window(target, ConnectorConfig.from_properties(first), kafka, WindowParams(end, idle_timeout_s=60))
    assert store.read(partition).connector == "first"

    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[database].other.insert_one({"_id": 2})
        end = end_after_insert(client[database].items, {"_id": 3}, f"{database}_m")
    config = ConnectorConfig.from_properties(second)
    with pytest.raises(OffsetError, match="was last written by connector 'first'") as refused:
        run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))
    assert "mongocdc offsets adopt" in str(refused.value)
    with pytest.raises((OffsetError, LeaseHeldError), match="connector 'first'"):
        ConnectorLease.for_config(kafka, config).acquire("mongocdc_second_hourly/run/window", WINDOW, 60)
    assert store.read(partition).connector == "first" and store.read(partition).windows == 1

    adopted = subprocess.run(
        [
            MONGOCDC,
            "offsets",
            "adopt",
            "--bootstrap-servers",
            kafka_bootstrap,
            "--topic-prefix",
            unique_name,
            "--name",
            "second",
            "--yes",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert adopted.returncode == 0, adopted.stderr
    assert json.loads(adopted.stdout)["partitions"][0]["offset"]["connector"] == "second"
    summary = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))
    assert summary["events"] == 1  # the other collection's insert
    assert store.read(partition).connector == "second" and store.read(partition).windows == 2


class ChunksInThreads:
    """The snapshot's chunk copies as threads of this process (``ChunkTasks`` without Spark)."""

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        return [copy(group) for group in groups]


def test_a_run_of_another_connector_is_refused_by_the_prefixs_positions_or_lease_and_changes_nothing(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections
):
    from types import SimpleNamespace

    from airflow_provider_mongocdc.core.jobspec import JobSpec
    from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
    from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator

    kafka = {"bootstrap.servers": kafka_bootstrap}
    database = unique_name[:40]
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[database].items.insert_many([{"_id": n} for n in range(3)])

    # The first connector's positions, of a partition the second never streams (another
    # deployment under the same topic prefix): the second's snapshot copies nothing.
    positions = f"{unique_name}_p"
    second = connector(positions, database, {"name": "second"})
    store = SettledOffsetStore(kafka, f"{positions}.offsets")
    store.ensure_topic()
    elsewhere = OffsetPartition(positions, "rs_elsewhere")
    store.write(
        elsewhere, OffsetState(position=Position(cluster_time=Timestamp(1_800_000_000, 1)), connector="first")
    )
    spec = JobSpec("snapshot", second, {"connection_string": mongodb_uri}, kafka, {})
    with pytest.raises(OffsetError) as refused:
        run_snapshot(spec, ChunksInThreads())
    words = str(refused.value)
    assert "Connector 'second'" in words and "last written by connector 'first'" in words, words
    assert "topic.prefix of its own" in words and "mongocdc offsets adopt" in words, words
    assert set(store.read_all()) == {elsewhere}  # no snapshot of the second started

    # The first connector's lease (its window runs, or was killed), on positions nobody named (set
    # by mongocdc offsets set): the second's window and snapshot are refused, nothing is committed.
    leased = f"{unique_name}_l"
    first = connector(leased, database, {"name": "first"})
    second = {**first, "name": "second"}
    store, partition = seed_offset(mongodb_uri, kafka, second)
    seeded = store.read(partition)
    assert seeded.connector is None
    ConnectorLease.for_config(kafka, ConnectorConfig.from_properties(first)).acquire(
        "mongocdc_first_hourly/scheduled__1/window", WINDOW, 600
    )
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = end_after_insert(client[database].items, {"_id": 10}, f"{database}_m")
    config = ConnectorConfig.from_properties(second)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    with pytest.raises(LeaseHeldError) as refused:
        run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))
    words = str(refused.value)
    assert "Connector 'second'" in words and "last taken by connector 'first'" in words, words
    assert "topic.prefix of its own" in words, words
    with pytest.raises(LeaseHeldError, match="last taken by connector 'first'"):
        run_snapshot(
            JobSpec("snapshot", second, {"connection_string": mongodb_uri}, kafka, {}), ChunksInThreads()
        )
    assert store.read_all() == {partition: seeded}

    # The second's incremental snapshot request would have the first's windows copy: refused too.
    context = {
        "ti": SimpleNamespace(
            dag_id="mongocdc_second_resnapshot", task_id="resnapshot", run_id="manual__1", map_index=-1
        )
    }
    operator = MongoResnapshotOperator(
        task_id="resnapshot",
        connector_config=second,
        mode="incremental",
        reason="test",
        **operator_connections("second", mongodb_uri, kafka),
    )
    with pytest.raises(LeaseHeldError, match="last taken by connector 'first'"):
        operator.execute(context)
    assert store.incremental_request(leased, leased) is None


def test_a_transaction_open_from_the_topics_first_record_is_seen_and_taken_over(kafka_config, unique_name):
    """The first record of the offsets topic in a killed window's open transaction: the last stable
    offset is 0, the topic looks empty; a reader that only shows says it is open, a run takes the
    window's writer over and then sees the topic as it stands."""
    config = ConnectorConfig.from_properties({"topic.prefix": unique_name})
    shown = OffsetStore(kafka_config, config.offsets_topic)
    shown.ensure_topic()
    partition = OffsetPartition(unique_name, "rs0")
    record = shown.offset_record(partition, OffsetState(position=Position(cluster_time=Timestamp(1, 1))))
    with killed_writer(kafka_config, window_transactional_id(unique_name, "rs0"), [record[:3]]):
        contents = shown.read_everything()
        assert contents.states == {} and len(contents.open_transactions) == 1
        (open_one,) = contents.open_transactions
        assert open_one.transactional_id == window_transactional_id(unique_name, "rs0")
        assert open_one.start_offset == 0 and open_one.high_watermark >= 1
        run = OffsetStore.for_connector(kafka_config, config)
        assert run.read_everything().states == {}  # the killed transaction was aborted, not read
        assert shown.read_everything().open_transactions == []
