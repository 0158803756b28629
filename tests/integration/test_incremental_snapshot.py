"""Incremental snapshots: a requested collection is copied in chunks at the end of successive
windows while a writer keeps changing it; the state rebuilt from the topic equals MongoDB, no
key's state goes back in time, and the progress is in the offsets.

Runs the windows in process against the simulator (or MONGOCDC_TEST_MONGODB_URI) and the real
Kafka broker.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest
from bson import json_util
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo import MongoClient
from structlog.testing import capture_logs

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import SUMMARY_MARKER
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    failing_commands,
    seed_offset,
    topic_events,
)

pytestmark = pytest.mark.integration

MAX_WINDOWS = 40


def _ids(count: int) -> list:
    """Mixed _id types, as collections accumulate them: numbers, strings and ObjectIds."""
    ids: list = []
    for number in range(count):
        kind = number % 3
        ids.append(number if kind == 0 else f"k{number:04d}" if kind == 1 else ObjectId())
    return ids


def _requested(uri: str, kafka: dict, props: dict, namespace: str) -> tuple:
    """The stream's current position as the offset, and an incremental snapshot request of
    ``namespace``: ``(store, partition, request)``."""
    store, partition = seed_offset(uri, kafka, props)
    request = IncrementalRequest.new([namespace])
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())
    return store, partition, request


def _passed_end(client: MongoClient, marker_db: str) -> Timestamp:
    """A window end that the server's cluster time has passed."""
    end = end_after_insert(client[marker_db]["markers"], {"at": 0}, marker_db)
    return end


def _window(uri: str, props: dict, kafka: dict, end: Timestamp) -> dict:
    """The window ending at ``end``, run in this process (the code a Spark task runs)."""
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    return run_window(
        target, config, kafka, WindowParams(window_end=datetime.fromtimestamp(end.time, timezone.utc))
    )


def _run_window(uri: str, props: dict, kafka: dict, client: MongoClient, marker_db: str) -> dict:
    return _window(uri, props, kafka, _passed_end(client, marker_db))


def _key(event) -> str:
    """The key's _id in one canonical text (the key holds it as extended JSON)."""
    return json_util.dumps(json_util.loads(event.key["id"]))


def _position(event) -> tuple[int, int]:
    return event.payload["source"]["ts_ms"] // 1000, event.payload["source"]["ord"]


# change_streams: update events carry the change only, so a document whose read row the stream
# dropped reaches the topic whole only through a re-read.
@pytest.mark.parametrize("capture_mode", ["change_streams_update_full", "change_streams"])
def test_incremental_snapshot_over_windows_while_a_writer_changes_the_collection(
    capture_mode, mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = f"{unique_name[:30]}_{unique_name[-8:]}"  # unique_name ends with a random suffix
    marker_db = f"{db_name}_m"
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(
        prefix,
        db_name,
        {
            "capture.mode": capture_mode,
            "incremental.snapshot.chunk.size": 9,
            "incremental.snapshot.window.max.documents": 30,
            "snapshot.fetch.size": 3,
        },
    )
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    items = client[db_name]["items"]
    ids = _ids(150)
    # Existing documents: no event of theirs is on the topic before the snapshot.
    items.insert_many([{"_id": value, "v": 0} for value in ids])
    client[db_name]["other"].insert_one({"_id": 1})
    store, partition = seed_offset(mongodb_uri, kafka, props)

    request = IncrementalRequest.new([f"{db_name}.items"], reason="test")
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())

    # A writer keeps incrementing v (so a key's state only moves forward), deleting and inserting.
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        rng = random.Random(7)
        extra = 0
        try:
            while not stop.is_set():
                target = rng.choice(ids)
                action = rng.random()
                if action < 0.95:
                    items.update_one({"_id": target}, {"$inc": {"v": 1}})
                elif action < 0.97:
                    items.delete_one({"_id": target})
                else:
                    extra += 1
                    # Negative numbers sort first: behind the copy once it passed the numbers, so
                    # the copy does not chase the inserts.
                    items.insert_one({"_id": -extra, "v": 0})
                stop.wait(0.01)
        except BaseException as error:  # reported by the test
            errors.append(error)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    summaries = []
    # The connector's reads (chunk batches among them) are held 300 ms each, so the writer changes
    # rows after a chunk's first batch was read and before its high watermark: without the
    # watermark de-duplication, such rows would go back in time on the topic.
    try:
        with failing_commands(client, "alwaysOn", ["getMore"], blockConnection=True, blockTimeMS=300):
            for _ in range(MAX_WINDOWS):
                summary = _run_window(mongodb_uri, props, kafka, client, marker_db)
                summaries.append(summary)
                if (summary["incremental_snapshot"] or {}).get("status") == "completed":
                    break
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not errors, f"the writer failed: {errors[0]!r}"
    incremental = [summary["incremental_snapshot"] for summary in summaries]
    assert incremental[-1]["status"] == "completed", (
        f"not completed after {MAX_WINDOWS} windows: {incremental}"
    )
    assert len(summaries) >= 3, "the copy should have taken several windows (30 documents per window)"
    assert all(item["documents"] + item["dropped"] <= 30 for item in incremental), incremental
    # One more window streams the writer's last changes.
    _run_window(mongodb_uri, props, kafka, client, marker_db)

    events = [event for event in topic_events(kafka_bootstrap, f"{prefix}.{db_name}.items") if event.payload]
    reads = [event for event in events if event.op == "r"]
    assert reads and {event.payload["source"]["snapshot"] for event in reads} == {"incremental"}
    assert len({_key(event) for event in reads}) == len(reads), "a row was emitted twice"
    assert not [
        event for event in topic_events(kafka_bootstrap, f"{prefix}.{db_name}.other") if event.payload
    ]

    # The state rebuilt from the topic equals MongoDB, no key's state goes back in time, and every
    # document reached the topic whole (a read event, or a change carrying it).
    state: dict[str, dict] = {}
    last_v: dict[str, int] = {}
    last_change: dict[str, tuple[int, int]] = {}
    whole: set[str] = set()
    for event in events:
        key = _key(event)
        if event.op != "r":
            position = _position(event)
            assert position >= last_change.get(key, (0, 0)), f"{key}: stream went back in time"
            last_change[key] = position
        if event.op == "d":
            state.pop(key, None)
            continue
        after = event.payload["after"]
        if after is not None:
            document = json_util.loads(after)
            whole.add(key)
        elif event.op == "u" and key in state:  # an update delta (capture.mode=change_streams)
            changed = json_util.loads(event.payload["updateDescription"]["updatedFields"])
            document = {**state[key], **changed}
        else:  # a delta before any whole document of the key, or a lookup that found it deleted
            continue
        assert document["v"] >= last_v.get(key, -1), f"{key}: state went back in time at {event.op}"
        last_v[key] = document["v"]
        state[key] = document
    expected = {json_util.dumps(document["_id"]): document["v"] for document in items.find()}
    missing = sorted(set(expected) - whole)
    assert not missing, f"{len(missing)} documents never reached the topic whole, e.g. {missing[:5]}"
    rebuilt = {key: document["v"] for key, document in state.items()}
    assert rebuilt == expected

    # The progress is in the offsets, completed.
    stored = IncrementalProgress.from_json(store.read(partition).incremental)
    assert stored.status == "completed" and stored.request_id == request.request_id
    assert stored.done == (f"{db_name}.items",)


def test_a_quiet_window_copies_chunk_after_chunk(mongodb_uri, kafka_bootstrap, unique_name):
    # Nothing is written while the window copies: each chunk's read must still be valid at a
    # cluster time the server has reached (MongoDB refuses an afterClusterTime past it).
    db_name = unique_name[:40]
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, db_name, {"incremental.snapshot.chunk.size": 10})
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    client[db_name]["items"].insert_many([{"_id": number, "v": 0} for number in range(35)])
    store, _, request = _requested(mongodb_uri, kafka, props, f"{db_name}.items")

    summary = _run_window(mongodb_uri, props, kafka, client, f"{db_name}_m")

    incremental = summary["incremental_snapshot"]
    assert "error" not in incremental, incremental["error"]
    assert incremental["status"] == "completed" and incremental["chunks"] == 4, incremental
    reads = [event for event in topic_events(kafka_bootstrap, f"{prefix}.{db_name}.items") if event.op == "r"]
    assert sorted(int(_key(event)) for event in reads) == list(range(35))

    # The progress and the request, as `mongocdc offsets show` prints them.
    shown = subprocess.run(
        [str(Path(sys.executable).parent / "mongocdc"), "offsets", "show"]
        + ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix, "--offsets-topic", store.topic],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    offsets = json.loads(shown.stdout)
    (entry,) = offsets["partitions"]
    assert entry["offset"]["incremental_snapshot"]["status"] == "completed"
    assert entry["offset"]["incremental_snapshot"]["documents"] == 35
    # Done: no longer listed as a request, but as the last one's outcome with its time and counts.
    assert offsets["incremental_snapshot_requests"] == []
    (outcome,) = offsets["incremental_snapshots"]
    assert (outcome["id"], outcome["status"], outcome["documents"], outcome["chunks"]) == (
        request.request_id,
        "completed",
        35,
        4,
    )
    assert outcome["completed_at"]


def test_a_retried_window_past_its_end_copies_the_pending_chunks(
    mongodb_uri, kafka_bootstrap, kafka_config, unique_name
):
    # A window whose chunk phase ended early (here by its document limit; in production a kill -9
    # after a chunk's commit) has committed a position past its end (the chunk's high watermark).
    # Its retry has the same window end (the run's data interval): it has nothing to stream, but
    # the requested incremental snapshot must go on.
    db_name = unique_name[:40]
    marker_db = f"{db_name}_m"
    prefix = unique_name
    props = connector(
        prefix,
        db_name,
        {"incremental.snapshot.chunk.size": 10, "incremental.snapshot.window.max.documents": 10},
    )
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    client[db_name]["items"].insert_many([{"_id": number, "v": 0} for number in range(35)])
    store, partition, _ = _requested(mongodb_uri, kafka_config, props, f"{db_name}.items")
    end = _passed_end(client, marker_db)

    first = _window(mongodb_uri, props, kafka_config, end)
    assert first["incremental_snapshot"]["documents"] == 10, first["incremental_snapshot"]
    assert store.read(partition).position.cluster_time > end, "the chunk's commit is past the window end"

    retry = _window(mongodb_uri, props, kafka_config, end)

    assert retry["stop_reason"] == "already_past_end" and retry["reached_end"] is True, retry
    incremental = retry["incremental_snapshot"]
    assert incremental is not None, f"the retry ran no incremental snapshot phase: {retry}"
    assert incremental["documents"] == 10 and incremental["status"] == "running", incremental
    reads = [event for event in topic_events(kafka_bootstrap, f"{prefix}.{db_name}.items") if event.op == "r"]
    assert sorted(int(_key(event)) for event in reads) == list(range(20))
    stored = IncrementalProgress.from_json(store.read(partition).incremental)
    assert (stored.documents, stored.chunks, stored.status) == (20, 2, "running"), stored


def test_update_deltas_during_a_chunk_leave_no_document_without_a_full_image(
    mongodb_uri, kafka_bootstrap, unique_name
):
    # capture.mode=change_streams: an update event carries the change (updateDescription), not the
    # document. A key the stream updates between a chunk's read and its high watermark loses its
    # read row (DBLog's de-duplication, as in Debezium); its document must still reach the topic
    # whole after the request, as a read event of a later re-read.
    db_name = unique_name[:40]
    marker_db = f"{db_name}_m"
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(
        prefix, db_name, {"capture.mode": "change_streams", "incremental.snapshot.chunk.size": 10}
    )
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    items = client[db_name]["items"]
    items.insert_many([{"_id": number, "v": 0} for number in range(25)])
    store, partition, _ = _requested(mongodb_uri, kafka, props, f"{db_name}.items")
    end = _passed_end(client, marker_db)
    # Updated after the window end, before the window runs: the window streams these updates up to
    # its first chunk's high watermark, so that chunk's row of key 3 is dropped.
    for key in (3, 14, 24):
        items.update_one({"_id": key}, {"$inc": {"v": 1}})

    summary = _window(mongodb_uri, props, kafka, end)

    incremental = summary["incremental_snapshot"]
    assert incremental["status"] == "completed" and incremental["dropped"] >= 1, incremental
    events = [event for event in topic_events(kafka_bootstrap, f"{prefix}.{db_name}.items") if event.payload]
    updates = [event for event in events if event.op == "u"]
    assert updates and all(event.payload["after"] is None for event in updates), "updates carry no document"
    images: dict[int, dict] = {}  # the last full image of each key on the topic
    for event in events:
        if event.payload["after"] is not None:
            images[int(_key(event))] = json_util.loads(event.payload["after"])
    missing = sorted(set(range(25)) - set(images))
    assert not missing, f"documents with no full image on the topic after the request: {missing}"
    assert images == {document["_id"]: document for document in items.find()}
    reads = [int(_key(event)) for event in events if event.op == "r"]
    assert len(reads) == len(set(reads)), f"a document was read twice: {sorted(reads)}"
    stored = IncrementalProgress.from_json(store.read(partition).incremental)
    assert stored.status == "completed" and stored.documents == len(reads), stored


def test_the_window_task_log_says_where_the_incremental_snapshot_stands(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections
):
    # One INFO line of the window's task log (what the operator logs, spark-submit's output
    # included) names the running snapshot, its collection, the documents so far and its status.
    db_name = f"inclog_{unique_name[-8:]}"  # unique_name ends with a random suffix
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, {"incremental.snapshot.chunk.size": 10})
    props["incremental.snapshot.window.max.documents"] = 20
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    client[db_name]["items"].insert_many([{"_id": number} for number in range(35)])
    _, _, request = _requested(mongodb_uri, kafka, props, f"{db_name}.items")
    end = _passed_end(client, f"{db_name}_m")
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        **operator_connections("inc", mongodb_uri, kafka, master="local[1]"),
    )

    with capture_logs() as entries:
        summary = operator.execute({"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)})

    assert summary["incremental_snapshot"]["documents"] == 20, summary["incremental_snapshot"]
    lines = [
        (entry.get("log_level"), line)
        for entry in entries
        for line in str(entry.get("event", "")).splitlines()
    ]
    # (The summary's JSON line, which the operator reads, holds the id too; and, the window's one
    # stream running in the application's driver, so does the window's own "... starts: <collections>"
    # line, logged once, when the snapshot starts.)
    started = [line for _, line in lines if f"Incremental snapshot {request.request_id} starts: " in line]
    assert len(started) <= 1, started
    about = [
        (level, line)
        for level, line in lines
        if request.request_id in line and not line.startswith(SUMMARY_MARKER) and line not in started
    ]
    assert len(about) == 1, "one line about the incremental snapshot, not:\n" + "\n".join(
        line for _, line in about or lines[-40:]
    )
    ((level, line),) = about
    assert level == "info", (level, line)
    for words in (f"{db_name}.items", "20 documents so far", "running"):
        assert words in line, f"{words!r} missing from the task log line: {line}"
