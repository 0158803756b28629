"""kill -9 of a per-shard window (``mongodb.connection.mode=replica_set`` on a sharded cluster: one
Spark task per shard, both committing to one offsets topic), with one stream's offset record left
in an open transaction, then a retry at once: a read_committed consumer sees every change exactly
once and each stream's offset only moves forward.

The kill falls at a seeded point after the application's first commit. Killing the process group
leaves the streams' transactions open where the kill found them; the worst case — one stream killed
after sending its offset record and before committing it, while the other stream commits after it
— is then made certain: a writer with the first stream's ``transactional.id`` (which fences the
killed one) sends that stream's offset record and dies before committing, and the other stream
commits a window of new changes. The retry runs the window application again at once (its
driver's checks, then a Spark task per shard), long before the broker would abort the open
transaction.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import window_transactional_id
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.faults import support
from tests.integration.window_helpers import connector, end_after_insert
from tests.integration.window_helpers import write_spec as write_window_spec
from tests.killed_writer import killed_writer
from tests.settled_offsets import SettledOffsetStore

pytestmark = [pytest.mark.faults, pytest.mark.simulator_only]

SHARDS = ("shard0", "shard1")
DOCUMENTS = 600


def plain_store(cls, kafka_config, config, *, running=(), settle_s=None, **kwargs) -> OffsetStore:
    """The offsets store of a stream that started before the transaction was left open (it settles
    nothing, so ``for_connector``'s settling arguments do not apply)."""
    return cls(kafka_config, config.offsets_topic, **kwargs)


@pytest.mark.parametrize("seed", support.trial_params())
def test_per_shard_window_killed_with_an_offset_record_in_an_open_transaction_then_retried_at_once(
    mongosim, kafka_bootstrap, spark_submit, run_in_jvm, tmp_path, seed, monkeypatch
):
    sim = mongosim("sharded", shards=2)
    prefix = f"kshard_{uuid.uuid4().hex[:8]}"
    database = f"{prefix}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    # Small batches and commits: many commits per stream, so the kill falls among them.
    props = connector(prefix, database, {"mongodb.connection.mode": "replica_set", "max.batch.size": 50})
    config = ConnectorConfig.from_properties(props)
    store = SettledOffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    for name, uri in zip(SHARDS, sim.shard_uris):
        with MongoClient(uri, serverSelectionTimeoutMS=20000) as shard:
            store.write(OffsetPartition(prefix, name), OffsetState(position=current_position(shard, config)))
    with MongoClient(sim.uri, serverSelectionTimeoutMS=20000) as client:
        client.admin.command("enableSharding", database)
        client.admin.command("shardCollection", f"{database}.items", key={"_id": "hashed"})
        items = client[database].items
        for start in range(0, DOCUMENTS, 100):
            items.insert_many([{"_id": n, "v": n} for n in range(start, start + 100)])
        end = end_after_insert(items, {"_id": DOCUMENTS}, f"{database}_m")

    spec, result = write_window_spec(tmp_path, "killed", props, sim.uri, kafka, end, commit_interval_s=0.2)
    watermark = support.Watermark(kafka_bootstrap, config.offsets_topic)
    try:
        killed = support.Submitted(spark_submit, "stream_window", spec, result, tmp_path / "killed.log")
        was_running, when = support.kill_at(
            killed, watermark, ("write", random.Random(seed).uniform(0.0, 1.5))
        )
    finally:
        watermark.close()
    committed = {name: store.read(OffsetPartition(prefix, name)) for name in SHARDS}
    victim, sibling = (SHARDS[seed % 2], SHARDS[1 - seed % 2])
    print(
        f"seed {seed}: killed {when:.1f} s after the launch (running={was_running}); committed "
        + ", ".join(f"{name}: {state.events} events" for name, state in committed.items())
        + f"; {victim}'s offset record left in an open transaction, {sibling} commits after it"
    )
    stale = store.offset_record(OffsetPartition(prefix, victim), committed[victim])
    with killed_writer(kafka, window_transactional_id(prefix, victim), [stale[:3]]):
        # The sibling stream commits after the open transaction (as it did in the killed run)...
        with MongoClient(sim.uri, serverSelectionTimeoutMS=20000) as client:
            items = client[database].items
            items.insert_many([{"_id": n, "v": n} for n in range(DOCUMENTS + 1, 2 * DOCUMENTS)])
            end = end_after_insert(items, {"_id": 2 * DOCUMENTS}, f"{database}_m")
        (target,) = [
            t
            for t in plan_streams(connection_details({"connection_string": sim.uri}), config)
            if t.partition == sibling
        ]
        with monkeypatch.context() as killed_run:  # its stream had read its offset before the kill
            killed_run.setattr(OffsetStore, "for_connector", classmethod(plain_store))
            moved = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=60))
        # ... and the retry of the whole window runs at once.
        outcome = run_in_jvm(
            "stream_window",
            props,
            {"connection_string": sim.uri},
            kafka,
            window_end=datetime.fromtimestamp(end.time, timezone.utc).isoformat(),
            idle_timeout_s=60,
        )
    assert outcome["status"] == "ok", outcome
    assert outcome["summary"]["reached_end"] is True, outcome["summary"]

    created = Counter(
        int(change.key)
        for change in support.changes(kafka_bootstrap, f"{prefix}.{database}.items")
        if change.payload is not None and change.payload["op"] == "c"
    )
    assert {n: count for n, count in created.items() if count > 1} == {}, "changes emitted twice"
    assert sorted(created) == list(range(2 * DOCUMENTS + 1)), "changes lost"
    after = {name: store.read(OffsetPartition(prefix, name)) for name in SHARDS}
    for name in SHARDS:  # offsets only move forward
        assert after[name].cluster_time >= committed[name].cluster_time, name
        assert after[name].events >= committed[name].events and after[name].windows > committed[name].windows
    # The sibling's retried stream found its offset already at the end (it committed up to there).
    assert after[sibling].cluster_time == end and after[sibling].windows == committed[sibling].windows + 1
    assert moved["events"] > 0
    assert sum(state.events for state in after.values()) == 2 * DOCUMENTS + 1
