"""Snapshots with spark-submit, the real Kafka broker and MongoDB (simulator or real).

What a user relies on: one read event per document with Debezium's key and source fields, exactly
one "last" event, the offset handed to streaming, resuming after kill -9, and snapshot.mode.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from bson import json_util
from pymongo import MongoClient

from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.offsets.model import SNAPSHOT_COMPLETED, OffsetPartition, Position
from airflow_provider_mongocdc.core.snapshot import run as snapshot_run
from airflow_provider_mongocdc.core.snapshot.plan import data_chunks_finished
from airflow_provider_mongocdc.spark_apps import runtime
from airflow_provider_mongocdc.spark_apps import snapshot as snapshot_app
from devtools.kafka.reading import read_topic
from tests.integration.snapshot_helpers import (
    kill_group,
    mongo_details,
    payloads,
    run_snapshot,
    seed,
    snapshot_connector,
    start_snapshot,
    wait_until,
    write_spec,
)
from tests.settled_offsets import SettledOffsetStore
from tests.spark_jvm import local_spark_jvm
from tests.topic_records import UUIDS_AS_BINARY

pytestmark = pytest.mark.integration


def _bson(value) -> bytes:
    """A type-exact comparable form of a BSON value."""
    return json_util.dumps({"v": value}, json_options=json_util.CANONICAL_JSON_OPTIONS).encode()


def _read_events(bootstrap: str, prefix: str, database: str, names) -> dict[str, list]:
    return {name: payloads(read_topic(bootstrap, f"{prefix}.{database}.{name}")) for name in names}


def _replica_set(uri: str) -> str:
    with MongoClient(uri) as client:
        return client.admin.command("hello")["setName"]


def _assert_snapshot_events(events: dict[str, list], ids: dict[str, list], database: str, rs: str) -> int:
    """Exactly one read event per document, keyed by its _id; returns how many carry "last"."""
    last = 0
    for name, expected_ids in ids.items():
        got = events[name]
        assert len(got) == len(expected_ids), f"{name}: {len(got)} events for {len(expected_ids)} documents"
        keys = []
        for key, value in got:
            assert set(key) == {"id"}
            keys.append(_bson(json_util.loads(key["id"], json_options=UUIDS_AS_BINARY)))
            assert value["op"] == "r" and value["before"] is None
            source = value["source"]
            assert (source["connector"], source["db"], source["collection"]) == ("mongodb", database, name)
            assert "rs" not in source and source["wallTime"] is None  # Debezium 3.x snapshot reads
            assert source["snapshot"] in ("true", "last")
            last += source["snapshot"] == "last"
            after = json_util.loads(value["after"], json_options=UUIDS_AS_BINARY)
            assert _bson(after["_id"]) == keys[-1]
        assert sorted(keys) == sorted(_bson(_id) for _id in expected_ids), f"{name}: keys differ from _ids"
    return last


def test_snapshot_killed_then_resumed_emits_each_document_once(
    mongodb_uri, kafka_bootstrap, unique_name, spark_submit, tmp_path
):
    prefix, database = unique_name, f"{unique_name}_db"
    client = MongoClient(mongodb_uri)
    ids = seed(client, database, {"customers": 1200, "orders": 1000, "mixed": 600})
    client[database]["ignored"].insert_many([{"_id": n} for n in range(50)])
    rs = _replica_set(mongodb_uri)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    connector = snapshot_connector(
        prefix, database, 60, {"collection.exclude.list": rf"{database}\.ignored", "snapshot.fetch.size": 25}
    )
    spec, result = write_spec(tmp_path, connector, mongo_details(mongodb_uri), kafka)
    store = SettledOffsetStore(kafka, f"{prefix}.offsets")
    partition = OffsetPartition(prefix, rs)

    # 1. Start, and kill -9 the whole spark-submit process group once some chunks committed.
    process = start_snapshot(spark_submit, spec, result, tmp_path / "first-run.log")
    seen = {}

    def some_chunks_committed() -> bool:
        try:
            everything = store.read_everything()
        except Exception:  # the topic does not exist yet
            return False
        for (owner, snapshot_id), markers in everything.chunks.items():
            if owner == partition and len(data_chunks_finished(markers)) >= 3:
                seen.update(snapshot_id=snapshot_id, state=everything.states.get(partition))
                return True
        return process.poll() is not None

    try:
        assert wait_until(some_chunks_committed, timeout=180, interval=0.1), "no chunk committed in time"
    finally:
        kill_group(process)
    assert "snapshot_id" in seen, (tmp_path / "first-run.log").read_text()[-4000:]
    snapshot_id = seen["snapshot_id"]
    interrupted = store.read(partition)
    assert interrupted.snapshot.status == "in_progress" and interrupted.snapshot.snapshot_id == snapshot_id
    committed_before = data_chunks_finished(store.chunk_markers(partition, snapshot_id))
    assert 3 <= len(committed_before) < interrupted.snapshot.plan_size, (
        "the kill came too late to test a resume"
    )
    recorded_start = interrupted.snapshot.start

    # 2. Run again: it resumes the same snapshot (same id, plan and start) and completes it.
    run = run_snapshot(spark_submit, spec, result)
    summary = run.summary
    assert summary["action"] == "resume" and summary["resumed"] is True
    assert summary["snapshot_id"] == snapshot_id
    assert summary["chunks"] == interrupted.snapshot.plan_size
    assert summary["chunks_skipped"] >= len(committed_before)
    assert summary["documents"] == 2800
    assert summary["collections"] == {
        f"{database}.customers": 1200,
        f"{database}.mixed": 600,
        f"{database}.orders": 1000,
    }
    progress = re.findall(
        r"chunk \d+ of \S+ committed \((\d+) documents.*?(\d+)/(\d+) chunks \((\d+)%\).*docs/s", run.output
    )
    assert len(progress) == summary["chunks"] - summary["chunks_skipped"]  # one line per copied chunk
    assert progress[-1][1:] == (str(summary["chunks"]), str(summary["chunks"]), "100")

    # Exactly one read event per document for read_committed consumers, exactly one "last".
    events = _read_events(kafka_bootstrap, prefix, database, ids)
    assert _assert_snapshot_events(events, ids, database, rs) == 1
    assert read_topic(kafka_bootstrap, f"{prefix}.{database}.ignored") == []
    # Debezium's key format for an int and a string _id.
    keys = {json.dumps(key) for key, _ in events["mixed"]}
    assert json.dumps({"id": "1"}) in keys and json.dumps({"id": '"key-00002"'}) in keys
    mixed_values = [value for _, value in events["mixed"]]
    sample = json_util.loads(mixed_values[0]["after"], json_options=UUIDS_AS_BINARY)
    assert {"decimal", "uuid", "ts", "re", "code", "min", "max", "nan", "nested"} <= set(sample)

    # The offset: the recorded start, snapshot completed; markers of every chunk.
    state = store.read(partition)
    assert state.snapshot.status == SNAPSHOT_COMPLETED and state.snapshot.snapshot_id == snapshot_id
    assert state.snapshot.start == recorded_start and state.position == recorded_start
    assert summary["start_position"][rs] == recorded_start.to_json()
    markers = data_chunks_finished(store.chunk_markers(partition, snapshot_id))
    assert len(markers) == state.snapshot.plan_size
    assert sum(marker.stats["docs"] for marker in markers.values()) == 2800
    assert sum(marker.stats["last"] for marker in markers.values()) == 1


@pytest.fixture(scope="module")
def spark_jvm():
    """A Spark JVM (local[2]) in this process, so that the mode runs below start Spark in about a
    second each instead of launching spark-submit every time; stopped after the module."""
    with local_spark_jvm("mongocdc-snapshot-modes"):
        yield


@pytest.mark.simulator_only
def test_snapshot_modes(mongosim, kafka_bootstrap, unique_name, spark_jvm, tmp_path):
    """The snapshot application run in this process (the same runtime as under spark-submit)."""
    sim = mongosim()
    database = f"{unique_name}_db"
    client = MongoClient(sim.uri)
    ids = seed(client, database, {"customers": 300, "orders": 250})
    rs = _replica_set(sim.uri)
    kafka = {"bootstrap.servers": kafka_bootstrap}

    def connector(prefix: str, mode: str) -> dict:
        return snapshot_connector(prefix, database, 100, {"snapshot.mode": mode})

    def run(prefix: str, mode: str, **params) -> dict:
        spec, result = write_spec(tmp_path, connector(prefix, mode), mongo_details(sim.uri), kafka, params)
        code = runtime.run("snapshot", snapshot_app.job, ["--job-spec", str(spec), "--result", str(result)])
        outcome = json.loads(result.read_text())
        assert code == 0 and outcome["status"] == "ok", outcome
        return outcome["summary"]

    def counts(prefix: str) -> dict[str, int]:
        return {name: len(read_topic(kafka_bootstrap, f"{prefix}.{database}.{name}")) for name in ids}

    # initial: a snapshot; run again: nothing to do.
    main = f"{unique_name}_main"
    first = run(main, "initial")
    assert first["action"] == "snapshot" and first["documents"] == 550
    assert counts(main) == {"customers": 300, "orders": 250}
    second = run(main, "initial")
    assert second["action"] == "nothing" and "already completed" in second["reason"]
    assert counts(main) == {"customers": 300, "orders": 250}

    # collections subset without moving the streaming offset (a partial re-snapshot).
    store = SettledOffsetStore(kafka, f"{main}.offsets")
    partition = OffsetPartition(main, rs)
    before = store.read(partition)
    client[database]["orders"].insert_one({"_id": 100_000, "late": True})
    partial = run(main, "initial", collections=[f"{database}.orders"], force=True, reset_offset=False)
    assert partial["action"] == "snapshot" and partial["collections"] == {f"{database}.orders": 251}
    assert counts(main) == {"customers": 300, "orders": 250 + 251}
    after = store.read(partition)
    assert (
        after.snapshot.snapshot_id == partial["snapshot_id"] and after.snapshot.status == SNAPSHOT_COMPLETED
    )
    assert after.position == before.position  # streaming goes on from where it was

    # always: a new snapshot on every run; the stored offset (still in the oplog) stays, so that
    # streaming goes on from it without skipping the changes since.
    always = run(main, "always")
    assert always["action"] == "snapshot" and always["snapshot_id"] not in (
        first["snapshot_id"],
        partial["snapshot_id"],
    )
    assert always["reset_offset"] is False and "continues from the stored offset" in always["reason"]
    assert counts(main) == {"customers": 600, "orders": 250 + 251 + 251}
    state = store.read(partition)
    assert state.position == before.position
    assert state.snapshot.snapshot_id == always["snapshot_id"]
    assert store.chunk_markers(partition, first["snapshot_id"]) == {}  # older markers are deleted

    # no_data: the position is recorded, the snapshot marked completed, nothing emitted.
    quiet = f"{unique_name}_quiet"
    no_data = run(quiet, "no_data")
    assert no_data["action"] == "record_position" and no_data["documents"] == 0
    assert counts(quiet) == {"customers": 0, "orders": 0}
    quiet_store = SettledOffsetStore(kafka, f"{quiet}.offsets")
    quiet_partition = OffsetPartition(quiet, rs)
    recorded = quiet_store.read(quiet_partition)
    assert recorded.snapshot.status == SNAPSHOT_COMPLETED and recorded.position is not None

    # when_needed: the stored resume point purged from the oplog -> a snapshot runs.
    client[database]["customers"].insert_many([{"filler": n} for n in range(60)])
    sim.set_oplog_retention(max_entries=5)
    try:
        needed = run(quiet, "when_needed")
    finally:
        sim.set_oplog_retention(max_entries=None)
    assert needed["action"] == "snapshot" and "no longer in the oplog" in needed["reason"]
    assert needed["collections"] == {f"{database}.customers": 360, f"{database}.orders": 251}
    assert counts(quiet) == {"customers": 360, "orders": 251}
    assert quiet_store.read(quiet_partition).position == Position.from_json(needed["start_position"][rs])


class ThreadChunkTasks:
    """The chunk copies as threads of this process: ``ChunkTasks`` without Spark."""

    def __init__(self) -> None:
        self.description = ""
        self.runs: list[tuple[str, int]] = []  # (description, groups) of each run

    def start(self, description: str) -> None:
        self.description = description

    def run(self, copy, groups: list) -> list:
        self.runs.append((self.description, len(groups)))
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(copy, groups))


def test_the_snapshot_run_is_core_code_that_needs_no_spark(mongosim, kafka_bootstrap, unique_name):
    """run_snapshot is the whole snapshot: handed chunk tasks that are threads of this process, it
    copies every document once, the final chunk alone after the others, with one "last" event, and
    hands the recorded position to streaming."""
    sim = mongosim()
    database = f"{unique_name}_db"
    with MongoClient(sim.uri) as client:
        ids = seed(client, database, {"customers": 120, "orders": 80})
    rs = _replica_set(sim.uri)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    spec = JobSpec(
        "snapshot", snapshot_connector(unique_name, database, 40), mongo_details(sim.uri), kafka, {}
    )
    tasks = ThreadChunkTasks()

    summary = snapshot_run.run_snapshot(spec, tasks)

    assert summary["action"] == "snapshot" and summary["documents"] == 200, summary
    assert summary["chunks_copied"] == summary["chunks"] and summary["chunks_skipped"] == 0, summary
    # The chunks on snapshot.max.threads=2 tasks, then the final chunk alone.
    assert [groups for _, groups in tasks.runs] == [2, 1], tasks.runs
    assert all(
        description.startswith(f"mongocdc snapshot {summary['snapshot_id']}: ")
        for description, _ in tasks.runs
    )
    events = _read_events(kafka_bootstrap, unique_name, database, ids)
    assert _assert_snapshot_events(events, ids, database, rs) == 1
    state = SettledOffsetStore(kafka, f"{unique_name}.offsets").read(OffsetPartition(unique_name, rs))
    assert state.snapshot.status == SNAPSHOT_COMPLETED, state
    assert state.snapshot.snapshot_id == summary["snapshot_id"], state
    assert state.position == Position.from_json(summary["start_position"][rs])
