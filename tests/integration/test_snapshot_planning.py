"""Snapshot planning without Spark: chunk ranges over mixed _id types read every document exactly
once (MongoDB or the simulator), the stored plan reads back identically (real Kafka), and
snapshot.mode decisions."""

from __future__ import annotations

import datetime
import uuid

import pytest
from bson import Binary, Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from bson.timestamp import Timestamp as BsonTimestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.snapshot.decision import (
    NOTHING,
    RECORD_POSITION,
    RESUME,
    SNAPSHOT,
    decide,
)
from airflow_provider_mongocdc.core.snapshot.plan import Chunk, SnapshotPlan, build_plan, plan_collection
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration


def _all_kinds_of_ids() -> list:
    ids = [
        MinKey(),
        None,
        float("nan"),
        float("-inf"),
        -5,
        0,
        Int64(7),
        7.5,
        Decimal128("8.25"),
        2**40,
        "",
        "a",
        "b$",
        "$starts-with-dollar",
        {"a": 1},
        {"a": 1, "b": 2},
        {"b": 0},
        {"z": "x"},
        Binary(b"", 0),
        Binary(b"\x01", 0),
        Binary(uuid.UUID(int=1).bytes, 4),
        Binary(uuid.UUID(int=2).bytes, 4),
        ObjectId("000000000000000000000001"),
        ObjectId(),
        False,
        True,
        datetime.datetime(1970, 1, 1),
        datetime.datetime(2030, 1, 1),
        Timestamp(1, 1),
        Timestamp(2, 0),
        MaxKey(),
    ]
    ids += [ObjectId() for _ in range(40)] + list(range(100, 140)) + [f"key-{n:03d}" for n in range(40)]
    ids += [{"region": f"r{n % 3}", "seq": n} for n in range(20)]
    ids += [Binary(uuid.uuid4().bytes, 4) for _ in range(20)]
    return ids


def test_chunks_read_every_document_exactly_once(mongodb_uri, unique_name):
    client = MongoClient(mongodb_uri)
    collection = client[f"{unique_name}_db"]["mixed"]
    ids = _all_kinds_of_ids()
    collection.insert_many([{"_id": _id, "n": n, "even": n % 2 == 0} for n, _id in enumerate(ids)])

    for chunk_size, snapshot_filter in ((7, None), (25, None), (1000, None), (10, {"even": True})):
        ranges = plan_collection(
            client, collection.database.name, collection.name, chunk_size, snapshot_filter=snapshot_filter
        )
        expected = len(ids) if snapshot_filter is None else (len(ids) + 1) // 2
        assert (len(ranges) == 1) == (chunk_size >= expected), "a collection larger than a chunk is split"
        plan = build_plan(
            "s1", {(collection.database.name, collection.name): ranges}, mode="initial", reset_offset=True
        )
        seen: list[int] = []
        for chunk in plan.chunks:
            # Stored and read back (as a restarted snapshot does) before it is used.
            chunk = Chunk.from_json(chunk.to_json())
            numbers = [doc["n"] for doc in collection.find(chunk.query(snapshot_filter), sort=[("_id", 1)])]
            seen.extend(numbers)
        wanted = [n for n in range(len(ids)) if snapshot_filter is None or n % 2 == 0]
        assert sorted(seen) == wanted, f"chunk size {chunk_size}: documents missing or read twice"
        # Chunks come in _id order: their concatenation is the collection in _id order.
        in_order = [doc["n"] for doc in collection.find(snapshot_filter or {}, sort=[("_id", 1)])]
        assert seen == in_order


def test_plan_is_stored_and_read_back_identically(kafka_bootstrap, unique_name):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    store = SettledOffsetStore(kafka, f"{unique_name}.offsets")
    store.ensure_topic()
    partition = OffsetPartition(unique_name, "rs0")
    bounds = [
        None,
        -1,
        2.5,
        "k",
        {"a": 1, "b": [1, 2]},
        Binary(uuid.UUID(int=9).bytes, 4),
        ObjectId("65a0000000000000000000ab"),
        True,
        datetime.datetime(2024, 5, 1),
        Timestamp(3, 4),
        None,
    ]
    ranges = {
        ("shop", f"c{n}"): [(bounds[i], bounds[i + 1], 10) for i in range(len(bounds) - 1)]
        for n in range(120)
    }  # 1200 chunks: the plan spans two records
    plan = build_plan(
        "20250101T000000Z-abcdef01",
        ranges,
        mode="initial_only",
        reset_offset=False,
        collections=sorted(f"shop.c{n}" for n in range(120)),
    )
    with TransactionalWriter(kafka, f"{unique_name}-plan") as writer:
        writer.begin()
        writer.commit(plan.records(store, partition))
    markers = store.chunk_markers(partition, plan.snapshot_id)
    assert len(markers) == 2
    restored = SnapshotPlan.from_markers(plan.snapshot_id, markers)
    assert restored is not None
    assert [c.to_json() for c in restored.chunks] == [c.to_json() for c in plan.chunks]
    assert (restored.mode, restored.reset_offset, restored.collections) == (
        "initial_only",
        False,
        plan.collections,
    )
    assert restored.final_chunk.chunk_id == plan.chunks[-1].chunk_id
    assert isinstance(restored.chunks[5].lower, Binary) and restored.chunks[5].lower.subtype == 4


@pytest.mark.unit
def test_snapshot_mode_decisions():
    partition = OffsetPartition("shop", "rs0")
    position = Position(cluster_time=BsonTimestamp(100, 1))
    completed = OffsetState().snapshot_started("s1", position, 3).snapshot_completed()
    running = OffsetState().snapshot_started("s2", position, 3)

    def never(*_):
        raise AssertionError("the oplog is only checked for a stored offset with when_needed or always")

    for mode in ("initial", "initial_only", "always", "when_needed"):
        assert decide({partition: None}, mode, purged=never).action == SNAPSHOT
        assert decide({partition: running}, mode, purged=never).action == RESUME
    assert decide({partition: None}, "no_data", purged=never).action == RECORD_POSITION
    assert decide({partition: running}, "no_data", purged=never).snapshot_id == "s2"
    for mode in ("initial", "initial_only", "no_data"):
        decision = decide({partition: completed}, mode, purged=never)
        assert decision.action == NOTHING and "s1 is already completed" in decision.reason
    kept = decide({partition: completed}, "always", purged=lambda *_: False)
    assert kept.action == SNAPSHOT and kept.reset_offset is False  # streaming goes on from the offset
    gone = decide({partition: completed}, "always", purged=lambda *_: True)
    assert gone.action == SNAPSHOT and gone.reset_offset is True and "no longer in the oplog" in gone.reason
    assert decide({partition: completed}, "initial", purged=never).reset_offset is None
    assert decide({partition: completed}, "initial", force=True, purged=never).action == SNAPSHOT
    assert decide({partition: completed}, "when_needed", purged=lambda *_: False).action == NOTHING
    purged = decide({partition: completed}, "when_needed", purged=lambda *_: True)
    assert purged.action == SNAPSHOT and "no longer in the oplog" in purged.reason
