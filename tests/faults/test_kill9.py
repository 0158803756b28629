"""kill -9 of the whole Spark application (the spark-submit process group) at random points of a
snapshot and of a stream window, then a re-run to completion: a read_committed consumer sees every
document / change exactly once and the offsets end where they must.

Each trial is seeded: ``random.Random(seed)`` picks the kill delay over the span measured on an
uninterrupted calibration run of the same application and data, from the last part of Spark's
start to just after the last write to the offsets topic; the span is stratified over the trials
(trial ``i`` of ``n`` draws within the ``i``-th slice), and delays past the first write count from
the trial's own first write (see ``Span.kill_point``). So trials hit Spark's start, the copy or
the stream, the commits and the very end. The default run has two trials per test; the long run
sets ``MONGOCDC_FAULT_TRIALS`` (see README.md).
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import SNAPSHOT_COMPLETED, OffsetPartition
from airflow_provider_mongocdc.core.snapshot.plan import data_chunks_finished
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.faults import support
from tests.integration.snapshot_helpers import mongo_details, seed, snapshot_connector
from tests.integration.snapshot_helpers import write_spec as write_snapshot_spec
from tests.integration.window_helpers import connector as window_connector
from tests.integration.window_helpers import end_after_insert, seed_offset, settled_after_kill
from tests.integration.window_helpers import write_spec as write_window_spec
from tests.settled_offsets import SettledOffsetStore
from tests.topic_records import UUIDS_AS_BINARY

pytestmark = pytest.mark.faults

SNAPSHOT_SIZES = {"customers": 450, "orders": 350, "mixed": 200}


def _canonical(value) -> str:
    return json_util.dumps({"v": value}, json_options=CANONICAL_JSON_OPTIONS)


def _key_value(key_id: str):
    return json_util.loads(key_id, json_options=UUIDS_AS_BINARY)


# -- snapshot --------------------------------------------------------------------------------------
@dataclass
class SnapshotData:
    uri: str
    kafka: dict
    database: str
    rs: str
    ids: dict[str, list]
    span: support.Span
    tmp: Path

    def connector(self, prefix: str) -> dict:
        return snapshot_connector(prefix, self.database, 50, {"snapshot.fetch.size": 25})

    def spec(self, prefix: str):
        return write_snapshot_spec(
            self.tmp / prefix, self.connector(prefix), mongo_details(self.uri), self.kafka
        )


def assert_snapshot_exactly_once(data: SnapshotData, prefix: str, summary: dict) -> None:
    """Per collection one read event per document, one "last" in all; the offset completed at the
    recorded start with a marker per planned chunk."""
    last = 0
    for name, ids in data.ids.items():
        events = support.changes(data.kafka["bootstrap.servers"], f"{prefix}.{data.database}.{name}")
        keys = Counter(_canonical(_key_value(event.key)) for event in events)
        duplicates = {key: n for key, n in keys.items() if n > 1}
        assert not duplicates, f"{name}: documents read more than once: {list(duplicates)[:5]}"
        assert set(keys) == {_canonical(_id) for _id in ids}, (
            f"{name}: {len(keys)} documents read of {len(ids)}"
        )
        for event in events:
            assert event.op == "r" and event.payload["source"]["snapshot"] in (True, "true", "last")
            assert _canonical(event.after["_id"]) == _canonical(_key_value(event.key))
            last += event.payload["source"]["snapshot"] == "last"
    assert last == 1, f"{last} events carry source.snapshot=last"

    store = SettledOffsetStore(data.kafka, f"{prefix}.offsets")
    state = store.read(OffsetPartition(prefix, data.rs))
    assert state is not None and state.snapshot.status == SNAPSHOT_COMPLETED, state
    assert state.position == state.snapshot.start  # streaming starts where the snapshot began
    markers = data_chunks_finished(
        store.chunk_markers(OffsetPartition(prefix, data.rs), state.snapshot.snapshot_id)
    )
    assert len(markers) == state.snapshot.plan_size
    assert sum(marker.stats["docs"] for marker in markers.values()) == sum(SNAPSHOT_SIZES.values())
    if summary.get("action") in ("snapshot", "resume"):
        assert summary["snapshot_id"] == state.snapshot.snapshot_id
        assert summary["start_position"][data.rs] == state.snapshot.start.to_json()


@pytest.fixture(scope="module")
def snapshot_data(mongodb_uri, kafka_bootstrap, spark_submit, tmp_path_factory) -> SnapshotData:
    """The collections to copy, and the span of one uninterrupted snapshot of them."""
    tmp = tmp_path_factory.mktemp("kill-snapshot")
    database = f"fsnap_{uuid.uuid4().hex[:10]}"
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        ids = seed(client, database, SNAPSHOT_SIZES)
        rs = client.admin.command("hello")["setName"]
    data = SnapshotData(
        mongodb_uri, {"bootstrap.servers": kafka_bootstrap}, database, rs, ids, support.Span(0, 0, 0), tmp
    )
    prefix = f"fsnap_calib_{uuid.uuid4().hex[:6]}"
    spec, result = data.spec(prefix)
    watermark = support.Watermark(kafka_bootstrap, f"{prefix}.offsets")
    try:
        data.span, run = support.measure(
            support.Submitted(spark_submit, "snapshot", spec, result, tmp / "calibration.log"), watermark
        )
    finally:
        watermark.close()
    summary = run.summary
    assert summary["action"] == "snapshot" and summary["chunks"] >= 15, summary
    assert_snapshot_exactly_once(data, prefix, summary)  # the uninterrupted run is the reference
    return data


@pytest.mark.parametrize("seed", support.trial_params())
def test_snapshot_killed_at_a_random_point_then_rerun_reads_each_document_once(
    snapshot_data, spark_submit, run_in_jvm, seed
):
    data = snapshot_data
    prefix = f"fsnap{seed}_{uuid.uuid4().hex[:6]}"
    point = data.span.kill_point(seed, support.trial_count())
    spec, result = data.spec(prefix)
    watermark = support.Watermark(data.kafka["bootstrap.servers"], f"{prefix}.offsets")
    try:
        killed = support.Submitted(spark_submit, "snapshot", spec, result, data.tmp / f"{prefix}-killed.log")
        was_running, when = support.kill_at(killed, watermark, point)
    finally:
        watermark.close()
    store = SettledOffsetStore(data.kafka, f"{prefix}.offsets")
    partition = OffsetPartition(prefix, data.rs)
    interrupted = store.read(partition)
    print(
        f"seed {seed}: kill point {point[0]}+{point[1]:.1f} s, killed {when:.1f} s after the launch "
        f"(calibration: writes {data.span.first_write:.1f}-{data.span.last_write:.1f} s, end {data.span.end:.1f} s); "
        f"running={was_running}; offset then: {interrupted.snapshot.status if interrupted else 'none'}"
    )

    # The re-run: the snapshot application again (in this process's Spark JVM).
    outcome = run_in_jvm("snapshot", data.connector(prefix), mongo_details(data.uri), data.kafka)
    assert outcome["status"] == "ok", outcome
    summary = outcome["summary"]
    if interrupted is not None and interrupted.snapshot.status == "in_progress":
        # The re-run resumes the interrupted snapshot: same id, same recorded start.
        assert summary["action"] == "resume" and summary["snapshot_id"] == interrupted.snapshot.snapshot_id
        assert summary["start_position"][data.rs] == interrupted.snapshot.start.to_json()
    elif interrupted is not None and interrupted.snapshot.status == SNAPSHOT_COMPLETED:
        assert summary["action"] == "nothing"
    else:
        assert summary["action"] == "snapshot"
    assert_snapshot_exactly_once(data, prefix, summary)


# -- stream window ---------------------------------------------------------------------------------
@dataclass
class WindowData:
    uri: str
    kafka: dict
    database: str
    end: object  # bson Timestamp
    expected: dict[int, list[tuple[str, int | None]]]
    transactions: list[int]  # events per MongoDB transaction
    prefixes: list[str]
    span: support.Span
    tmp: Path

    def props(self, prefix: str) -> dict:
        return window_connector(prefix, self.database, {"max.batch.size": 3})

    def spec(self, prefix: str):
        return write_window_spec(self.tmp, prefix, self.props(prefix), self.uri, self.kafka, self.end)


def apply_changes(client: MongoClient, database: str, rng: random.Random, operations: int = 1200):
    """Random inserts, updates, replaces and deletes over 50 keys, plus three multi-document
    transactions; returns the expected (op, v) sequence per key and the transactions' sizes."""
    items = client[database]["items"]
    present: set[int] = set()
    expected: dict[int, list[tuple[str, int | None]]] = {}
    counter = iter(range(1, 10**9))

    def one(key: int, session=None) -> None:
        v = next(counter)
        if key not in present:
            items.insert_one({"_id": key, "v": v, "pad": "p" * 40}, session=session)
            present.add(key)
            expected.setdefault(key, []).append(("c", v))
            return
        kind = rng.choice(("update", "update", "replace", "delete"))
        if kind == "update":
            items.update_one({"_id": key}, {"$set": {"v": v}}, session=session)
            expected[key].append(("u", v))
        elif kind == "replace":
            items.replace_one({"_id": key}, {"_id": key, "v": v, "replaced": True}, session=session)
            expected[key].append(("u", v))
        else:
            items.delete_one({"_id": key}, session=session)
            present.discard(key)
            expected[key].append(("d", None))

    transactions = []
    for n in range(operations):
        one(rng.randrange(50))
        if n in (300, 600, 900):
            size = rng.randrange(5, 15)
            with client.start_session() as session, session.start_transaction():
                for _ in range(size):
                    one(rng.randrange(50), session=session)
            transactions.append(size)
    return expected, transactions


def assert_window_exactly_once(data: WindowData, prefix: str) -> None:
    """Per key, the change events equal the applied changes in order (no loss, no duplicate), each
    delete followed by its tombstone; BEGIN/END once per transaction; the offset at the end."""
    bootstrap = data.kafka["bootstrap.servers"]
    seen: dict[int, list[tuple[str, int | None]]] = {}
    events = support.changes(bootstrap, f"{prefix}.{data.database}.items")
    for index, event in enumerate(events):
        key = int(_key_value(event.key))
        if event.payload is None:
            assert seen.get(key, [])[-1:] == [("d", None)], f"tombstone of {key} not after its delete"
            continue
        if event.op == "c":
            value = event.after["v"]
        elif event.op == "u":
            update = event.payload["updateDescription"]
            value = json.loads(update["updatedFields"])["v"] if update else event.after["v"]
        else:
            assert event.op == "d", event.payload
            value = None
            assert (
                index + 1 < len(events)
                and events[index + 1].payload is None
                and events[index + 1].key == event.key
            ), f"delete of {key} without its tombstone"
        seen.setdefault(key, []).append((event.op, value))
    for key in sorted(set(seen) | set(data.expected)):
        assert seen.get(key) == data.expected.get(key), (
            f"key {key}: events {seen.get(key)} but changes {data.expected.get(key)}"
        )

    markers = [event.payload for event in support.changes(bootstrap, f"{prefix}.transaction")]
    statuses = Counter((marker["id"], marker["status"]) for marker in markers)
    assert set(statuses.values()) == {1} and len(statuses) == 2 * len(data.transactions), statuses
    ends = {marker["id"]: marker["event_count"] for marker in markers if marker["status"] == "END"}
    assert {marker["id"] for marker in markers if marker["status"] == "BEGIN"} == set(ends)
    assert sorted(ends.values()) == sorted(data.transactions)

    total = sum(len(ops) for ops in data.expected.values())
    config = ConnectorConfig.from_properties(data.props(prefix))
    state = SettledOffsetStore(data.kafka, config.offsets_topic).read(
        OffsetPartition(prefix, _partition(data.uri, config))
    )
    assert state.cluster_time == data.end and state.events == total and state.windows == 1, state


def _partition(uri: str, config: ConnectorConfig) -> str:
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    return target.partition


@pytest.fixture(scope="module")
def window_data(mongodb_uri, kafka_bootstrap, spark_submit, tmp_path_factory) -> WindowData:
    """Offsets seeded for the calibration run and every trial, then the same changes for all, and
    the span of one uninterrupted window over them."""
    tmp = tmp_path_factory.mktemp("kill-window")
    database = f"fwin_{uuid.uuid4().hex[:10]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    stamp = uuid.uuid4().hex[:6]
    prefixes = [f"fwin_calib_{stamp}"] + [f"fwin{seed.values[0]}_{stamp}" for seed in support.trial_params()]
    data = WindowData(mongodb_uri, kafka, database, None, {}, [], prefixes, support.Span(0, 0, 0), tmp)
    for prefix in prefixes:
        seed_offset(mongodb_uri, kafka, data.props(prefix))
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        data.expected, data.transactions = apply_changes(client, database, random.Random(20240501))
        data.end = end_after_insert(client[f"{database}_m"]["markers"], {"at": time.time()}, f"{database}_m")

    calibration = prefixes[0]
    spec, result = data.spec(calibration)
    watermark = support.Watermark(
        kafka_bootstrap, ConnectorConfig.from_properties(data.props(calibration)).offsets_topic
    )
    try:
        data.span, run = support.measure(
            support.Submitted(spark_submit, "stream_window", spec, result, tmp / "calibration.log"), watermark
        )
    finally:
        watermark.close()
    assert run.summary["reached_end"] is True and run.summary["batches_committed"] > 10, run.summary
    assert_window_exactly_once(data, calibration)  # the uninterrupted run is the reference
    return data


@pytest.mark.parametrize("seed", support.trial_params())
def test_window_killed_at_a_random_point_then_rerun_emits_each_change_once(window_data, spark_submit, seed):
    data = window_data
    prefix = data.prefixes[seed + 1]
    point = data.span.kill_point(seed, support.trial_count())
    spec, result = data.spec(prefix)
    config = ConnectorConfig.from_properties(data.props(prefix))
    watermark = support.Watermark(data.kafka["bootstrap.servers"], config.offsets_topic)
    try:
        killed = support.Submitted(
            spark_submit, "stream_window", spec, result, data.tmp / f"{prefix}-killed.log"
        )
        was_running, when = support.kill_at(killed, watermark, point)
    finally:
        watermark.close()
    store = SettledOffsetStore(data.kafka, config.offsets_topic)
    partition = OffsetPartition(prefix, _partition(data.uri, config))
    # What the killed run committed is visible; its open transaction is not: the topic holds
    # exactly the committed events, a prefix of every key's changes.
    committed, _ = settled_after_kill(
        store,
        partition,
        lambda: sum(
            1
            for event in support.changes(
                data.kafka["bootstrap.servers"], f"{prefix}.{data.database}.items", settle=0
            )
            if event.payload is not None
        ),
    )
    print(
        f"seed {seed}: kill point {point[0]}+{point[1]:.1f} s, killed {when:.1f} s after the launch "
        f"(calibration: writes {data.span.first_write:.1f}-{data.span.last_write:.1f} s, end {data.span.end:.1f} s); "
        f"running={was_running}; {committed.events} events committed"
    )
    total = sum(len(ops) for ops in data.expected.values())
    assert committed.windows == 0 or (committed.windows == 1 and committed.events == total)

    # The re-run (the same code a Spark task runs) continues from the last commit; its writer
    # fences the killed one.
    (target,) = plan_streams(connection_details({"connection_string": data.uri}), config)
    summary = run_window(target, config, data.kafka, WindowParams(data.end, idle_timeout_s=60))
    assert summary["events"] == total - committed.events
    assert_window_exactly_once(data, prefix)
