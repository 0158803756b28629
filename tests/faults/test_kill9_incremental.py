"""kill -9 of the whole Spark application (the spark-submit process group) at seeded points of a
stream window that copies the chunks of a requested incremental snapshot while a writer keeps
changing the collection, then windows until the snapshot is completed: a read_committed consumer
sees each document's read event at most once (a chunk is committed once, with its progress), the
state rebuilt from the topic equals MongoDB, no key's ``v`` goes back in time, and the offsets hold
the completed progress of the request.

The window's end is passed before the writer starts, so the streaming part of the window is short
and the window's work is the chunks (each streams to its high watermark through the writer's
changes). The connector's reads are held by the simulator's ``failCommand`` fail point (``getMore``
only, the connector's appName), so each chunk takes a while and the kill points spread over the
chunk reading (see the calibration's check). Trials: ``MONGOCDC_FAULT_TRIALS`` (see support.py).
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import pytest
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.objectid import ObjectId
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.faults import support
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    failing_commands,
    seed_offset,
    settled_after_kill,
)
from tests.integration.window_helpers import write_spec as write_window_spec
from tests.settled_offsets import SettledOffsetStore
from tests.topic_records import UUIDS_AS_BINARY

pytestmark = pytest.mark.faults

DOCUMENTS = 300
CHUNK_SIZE = 25
MAX_RERUNS = 10
BLOCK_MS = 150  # each getMore of the connector held this long


def _canonical(value) -> str:
    return json_util.dumps({"v": value}, json_options=CANONICAL_JSON_OPTIONS)


def _ids(count: int) -> list:
    """Mixed _id types: integers, doubles (ordered among the integers), strings and ObjectIds."""
    kinds = (
        lambda n: n,
        lambda n: f"k{n:04d}",
        lambda n: ObjectId(),
        lambda n: n + 0.5,
    )
    return [kinds[n % 4](n) for n in range(count)]


class Writer:
    """A thread that ``$inc``-s ``v`` of random documents (so a key's state only moves forward) and
    now and then deletes one."""

    def __init__(self, collection, ids: list, seed: int):
        self.collection, self.ids, self.rng = collection, ids, random.Random(seed)
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.writes = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            while not self.stop.is_set():
                target = self.rng.choice(self.ids)
                if self.rng.random() < 0.97:
                    self.collection.update_one({"_id": target}, {"$inc": {"v": 1}})
                else:
                    self.collection.delete_one({"_id": target})
                self.writes += 1
                self.stop.wait(0.01)
        except BaseException as error:  # reported by the test
            self.errors.append(error)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(timeout=60)
        assert not self.thread.is_alive(), "the writer did not stop"
        assert not self.errors, f"the writer failed: {self.errors[0]!r}"


def held_reads(client: MongoClient):
    """The simulator's failCommand fail point holding each getMore of the connector (within the block)."""
    return failing_commands(client, "alwaysOn", ["getMore"], blockConnection=True, blockTimeMS=BLOCK_MS)


@dataclass
class Case:
    """One connector (its own topics) over its own collection, with a recorded request."""

    uri: str
    kafka: dict
    prefix: str
    database: str
    ids: list
    request: IncrementalRequest
    partition: OffsetPartition
    tmp: Path

    @property
    def props(self) -> dict:
        return connector(
            self.prefix,
            self.database,
            {"incremental.snapshot.chunk.size": CHUNK_SIZE, "snapshot.fetch.size": 5},
        )

    @property
    def config(self) -> ConnectorConfig:
        return ConnectorConfig.from_properties(self.props)

    @property
    def topic(self) -> str:
        return f"{self.prefix}.{self.database}.items"

    @property
    def marker_db(self) -> str:
        return f"{self.database}_m"

    def store(self) -> SettledOffsetStore:
        return SettledOffsetStore(self.kafka, self.config.offsets_topic)

    def window_end(self, client: MongoClient):
        end = end_after_insert(client[self.marker_db]["markers"], {"at": time.time()}, self.marker_db)
        return end

    def spec(self, name: str, end) -> tuple[Path, Path]:
        return write_window_spec(self.tmp, name, self.props, self.uri, self.kafka, end)

    def run_window(self, client: MongoClient, end=None) -> dict:
        """A window in this process (the code a Spark task runs), ending at ``end``, else after
        the current time."""
        (target,) = plan_streams(connection_details({"connection_string": self.uri}), self.config)
        end = end or self.window_end(client)
        params = WindowParams(window_end=datetime.fromtimestamp(end.time, timezone.utc))
        return run_window(target, self.config, self.kafka, params)


def new_case(uri: str, kafka: dict, client: MongoClient, name: str, tmp: Path) -> Case:
    """Documents already in the collection (no event of theirs on the topic), the stream position
    as the offset, and an incremental snapshot request for the collection."""
    database = f"finc_{name}_{uuid.uuid4().hex[:8]}"
    ids = _ids(DOCUMENTS)
    client[database]["items"].insert_many([{"_id": value, "v": 0, "pad": "p" * 30} for value in ids])
    prefix = f"finc_{name}_{uuid.uuid4().hex[:6]}"
    props = connector(prefix, database)
    store, partition = seed_offset(uri, kafka, props)
    request = IncrementalRequest.new([f"{database}.items"], reason="kill -9 test")
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())
    return Case(uri, kafka, prefix, database, ids, request, partition, tmp)


def read_events(case: Case, settle: float | None = None) -> list:
    bootstrap = case.kafka["bootstrap.servers"]
    events = (
        support.changes(bootstrap, case.topic)
        if settle is None
        else support.changes(bootstrap, case.topic, settle)
    )
    return [event for event in events if event.payload is not None]


def assert_consistent(case: Case, client: MongoClient) -> None:
    """No read event twice; the rebuilt state equals MongoDB; ``v`` never goes back per key; the
    offsets hold the completed progress of the request."""
    events = read_events(case)
    reads = [event for event in events if event.op == "r"]
    assert reads, "no read event of the incremental snapshot on the topic"
    markers = Counter(str(event.payload["source"]["snapshot"]) for event in reads)
    assert set(markers) == {"incremental"}, markers
    twice = {key: n for key, n in Counter(_canonical(_key(e)) for e in reads).items() if n > 1}
    assert not twice, f"{len(twice)} documents have two read events, e.g. {list(twice)[:3]}"

    state: dict[str, int] = {}
    last_v: dict[str, int] = {}
    for event in events:
        key = _canonical(_key(event))
        if event.op == "d":
            state.pop(key, None)
            continue
        after = event.after
        if after is None:  # an update whose lookup found the document deleted
            continue
        assert after["v"] >= last_v.get(key, -1), (
            f"{key}: v went back from {last_v.get(key)} to {after['v']} at an {event.op!r} event"
        )
        last_v[key] = state[key] = after["v"]
    expected = {
        _canonical(document["_id"]): document["v"] for document in client[case.database]["items"].find()
    }
    missing = set(expected) - set(state)
    extra = set(state) - set(expected)
    differ = {key for key in set(expected) & set(state) if expected[key] != state[key]}
    assert not (missing or extra or differ), (
        f"rebuilt state differs from MongoDB: {len(missing)} missing (e.g. {sorted(missing)[:3]}), "
        f"{len(extra)} extra, {len(differ)} with another v (e.g. "
        f"{[(key, state[key], expected[key]) for key in sorted(differ)[:3]]})"
    )

    stored = IncrementalProgress.from_json(case.store().read(case.partition).incremental)
    assert stored is not None, "no incremental snapshot progress in the offsets"
    assert stored.request_id == case.request.request_id and stored.status == "completed", stored
    assert stored.done == (f"{case.database}.items",), stored
    assert stored.documents == len(reads), (stored.documents, len(reads))


def _key(event):
    return json_util.loads(event.key, json_options=UUIDS_AS_BINARY)


@dataclass
class Calibration:
    span: support.Span
    chunk_phase_s: float  # the calibration window's time on chunks


@pytest.fixture(scope="module")
def calibration(mongodb_uri, kafka_bootstrap, spark_submit, tmp_path_factory) -> Calibration:
    """One uninterrupted spark-submit window over the same layout: it copies every chunk; its span
    of writes to the offsets topic places the trials' kill points."""
    tmp = tmp_path_factory.mktemp("kill-incremental")
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        case = new_case(mongodb_uri, kafka, client, "calib", tmp)
        end = case.window_end(client)
        writer = Writer(client[case.database]["items"], case.ids, seed=99)
        watermark = support.Watermark(kafka_bootstrap, case.config.offsets_topic)
        try:
            with held_reads(client):
                spec, result = case.spec("calibration", end)
                span, run = support.measure(
                    support.Submitted(spark_submit, "stream_window", spec, result, tmp / "calibration.log"),
                    watermark,
                )
        finally:
            watermark.close()
            writer.finish()
        summary = run.summary
        incremental = summary["incremental_snapshot"]
        print(f"calibration: span {span}, incremental snapshot {incremental}")
        assert incremental and incremental["status"] == "completed", summary
        # Every chunk but the last is full of documents read or dropped (deletes shorten the copy).
        assert incremental["chunks"] >= DOCUMENTS // CHUNK_SIZE // 2, incremental
        case.run_window(client)  # streams the writer's last changes
        assert_consistent(case, client)  # the uninterrupted run is the reference
    result = Calibration(span, incremental["duration_s"])
    print(
        f"calibration: offsets written {span.first_write:.1f}-{span.last_write:.1f} s after the launch, "
        f"end {span.end:.1f} s; chunks for {result.chunk_phase_s:.1f} s ({incremental['chunks']} chunks, "
        f"{incremental['documents']} documents, {incremental['dropped']} dropped)"
    )
    # The window's first write is its streaming commit (the stream up to the end is short); the
    # chunks follow. The last trial's kill point must fall after that write and within the chunks.
    trials = support.trial_count()
    anchor, delay = span.kill_point(trials - 1, trials)
    assert anchor == "write" and delay < result.chunk_phase_s, (
        f"the last trial's kill point {anchor}+{delay:.1f} s is not within the chunks "
        f"({result.chunk_phase_s:.1f} s after the streaming commit)"
    )
    return result


@pytest.mark.parametrize("seed", support.trial_params())
def test_incremental_window_killed_at_a_random_point_then_windows_complete_it_once(
    calibration, mongodb_uri, kafka_bootstrap, spark_submit, tmp_path, seed
):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    point = calibration.span.kill_point(seed, support.trial_count())
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        case = new_case(mongodb_uri, kafka, client, f"s{seed}", tmp_path)
        end = case.window_end(client)
        writer = Writer(client[case.database]["items"], case.ids, seed=seed)
        try:
            with held_reads(client):
                watermark = support.Watermark(kafka_bootstrap, case.config.offsets_topic)
                try:
                    spec, result = case.spec("killed", end)
                    killed = support.Submitted(
                        spark_submit, "stream_window", spec, result, tmp_path / "killed.log"
                    )
                    was_running, when = support.kill_at(killed, watermark, point)
                finally:
                    watermark.close()
                # What the killed run committed is visible, its open transaction is not: the
                # committed offset counts exactly the events on the topic.
                committed, _ = settled_after_kill(
                    case.store(), case.partition, lambda: len(read_events(case, settle=0))
                )
                interrupted = IncrementalProgress.from_json(committed.incremental)
                reads = [event for event in read_events(case, settle=0) if event.op == "r"]
                print(
                    f"seed {seed}: kill point {point[0]}+{point[1]:.1f} s, killed {when:.1f} s after the "
                    f"launch (calibration: writes {calibration.span.first_write:.1f}-"
                    f"{calibration.span.last_write:.1f} s, chunks {calibration.chunk_phase_s:.1f} s); "
                    f"running={was_running}; committed: {interrupted.describe() if interrupted else 'no progress'}"
                    f", {len(reads)} read events"
                )
                # Read events on the topic are exactly the committed chunks' documents.
                assert len(reads) == (interrupted.documents if interrupted else 0), (
                    len(reads),
                    interrupted,
                )

                # Airflow's retry of the killed task: the same window end. Its stored position may
                # lie past that end (a chunk was committed); the snapshot goes on all the same.
                retry = case.run_window(client, end)["incremental_snapshot"]
                assert retry is not None and (retry["chunks"] > 0 or retry["status"] == "completed"), (
                    f"the retry of the killed window copied no chunk: {retry}"
                )
                # Windows (each fencing the killed run's writer) until the snapshot is completed.
                outcomes = [retry]
                while (outcomes[-1] or {}).get("status") != "completed" and len(outcomes) <= MAX_RERUNS:
                    outcomes.append(case.run_window(client)["incremental_snapshot"])
                assert outcomes[-1] and outcomes[-1]["status"] == "completed", (
                    f"not completed after {MAX_RERUNS} windows: {outcomes}"
                )
        finally:
            writer.finish()
        assert writer.writes > 0
        case.run_window(client)  # streams the writer's last changes
        assert_consistent(case, client)
