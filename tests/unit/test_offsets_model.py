"""The offset model: Kafka Connect / Debezium compatible keys and values, and state transitions."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from bson.binary import Binary
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.offsets.keys import parse_key
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position, SnapshotState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore

pytestmark = pytest.mark.unit

TOKEN = {"_data": "8265F1A2B3000000012B022C0100296E5A1004"}
END = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)


def test_key_follows_kafka_connects_offset_convention():
    partition = OffsetPartition("fulfillment", "rs0")
    assert partition.key() == b'["fulfillment",{"server_id":"fulfillment","rs":"rs0"}]'
    assert partition.connector == "fulfillment"
    named = OffsetPartition("fulfillment", "shard01", connector="inventory-cdc")
    assert json.loads(named.key()) == ["inventory-cdc", {"server_id": "fulfillment", "rs": "shard01"}]
    assert parse_key(named.key()) == (named, None)


def test_chunk_markers_have_their_own_keys():
    partition = OffsetPartition("p", "rs0")
    key = partition.chunk_key("snap-1", "inventory.orders#3")
    assert json.loads(key) == [
        "p",
        {"server_id": "p", "rs": "rs0", "snapshot": "snap-1", "chunk": "inventory.orders#3"},
    ]
    assert key != partition.key()
    assert parse_key(key) == (partition, ("snap-1", "inventory.orders#3"))


@pytest.mark.parametrize(
    "key",
    [
        None,
        b"",
        b"not json",
        b'{"a": 1}',
        b'["c", {"rs": "x"}]',
        b'["c", {"server_id": "", "rs": "x"}]',
        b"[1, 2]",
    ],
)
def test_foreign_keys_are_not_offset_keys(key):
    assert parse_key(key) is None


def test_value_carries_debeziums_fields_and_round_trips():
    state = OffsetState(
        position=Position(TOKEN, Timestamp(1714557600, 7)),
        last_window_end=END,
        events=42,
        windows=3,
        snapshots=1,
        updated_at=END,
    )
    data = json.loads(state.to_bytes())
    assert data["sec"] == 1714557600 and data["ord"] == 7
    assert data["resume_token"] == TOKEN["_data"]  # Debezium stores the token's _data string
    assert "initsync" not in data
    assert data["snapshot"] == {"status": "none"}
    assert data["last_window_end"] == "2024-05-01T10:00:00Z"
    assert data["counters"] == {"events": 42, "windows": 3, "snapshots": 1}
    assert OffsetState.from_bytes(state.to_bytes()) == state
    assert state.resume_token == TOKEN and state.cluster_time == Timestamp(1714557600, 7)


def test_tokens_with_more_than_data_keep_their_bson_types():
    # pymongo decodes BinData subtype 0 as bytes; it must come back as bytes, not as a string.
    token = {"_data": "82AB", "_typeBits": b"\x01\x02"}
    state = OffsetState(position=Position(token, None))
    assert json.loads(state.to_bytes())["resume_token"]["_typeBits"]["$binary"]
    restored = OffsetState.from_bytes(state.to_bytes())
    assert restored.resume_token == token
    assert isinstance(restored.resume_token["_typeBits"], bytes)
    with_binary = OffsetState(position=Position({"_data": "82", "_typeBits": Binary(b"\x05", 0)}))
    assert OffsetState.from_bytes(with_binary.to_bytes()).resume_token["_typeBits"] == b"\x05"


def test_snapshot_lifecycle_hands_the_recorded_start_to_streaming():
    start = Position(TOKEN, Timestamp(1714557000, 1))
    running = OffsetState().snapshot_started("snap-1", start, plan_size=12)
    data = json.loads(running.to_bytes())
    assert data["initsync"] is True
    assert data["snapshot"]["status"] == "in_progress" and data["snapshot"]["id"] == "snap-1"
    assert data["snapshot"]["plan_size"] == 12
    assert data["snapshot"]["start"] == {"sec": 1714557000, "ord": 1, "resume_token": TOKEN["_data"]}
    assert running.position is None  # streaming has not started yet
    assert OffsetState.from_bytes(running.to_bytes()).snapshot == running.snapshot

    done = running.snapshot_completed(events=500)
    assert done.position == start
    assert done.snapshot.status == "completed" and done.snapshot.start == start
    assert done.snapshots == 1 and done.events == 500
    assert "initsync" not in json.loads(done.to_bytes())
    with pytest.raises(OffsetError, match="No snapshot is in progress"):
        done.snapshot_completed()


def test_window_transition_counts_and_keeps_position_when_none_given():
    base = OffsetState(position=Position(TOKEN, Timestamp(10, 1)))
    after = base.after_window(None, END, events=0)
    assert after.position == base.position and after.windows == 1 and after.last_window_end == END
    moved = after.after_window(Position({"_data": "83"}, Timestamp(20, 2)), END, events=5)
    assert moved.cluster_time == Timestamp(20, 2) and moved.events == 5 and moved.windows == 2


def test_position_validation():
    with pytest.raises(OffsetError):
        Position()
    with pytest.raises(OffsetError):
        Position(resume_token="82AB")  # a token is a document
    with pytest.raises(OffsetError):
        Position(cluster_time=(10, 1))
    assert Position(cluster_time=Timestamp(5, 0)).to_json() == {"sec": 5, "ord": 0}
    with pytest.raises(OffsetError):
        SnapshotState("in_progress")
    with pytest.raises(ConfigError):
        OffsetPartition("", "rs0")


def test_offset_and_chunk_records_target_the_offsets_topic():
    store = OffsetStore({"bootstrap.servers": "127.0.0.1:1"}, "fulfillment.offsets")
    partition = OffsetPartition("fulfillment", "rs0")
    record = store.offset_record(partition, OffsetState(position=Position(TOKEN, None)))
    assert record.topic == "fulfillment.offsets" and record.key == partition.key()
    assert OffsetState.from_bytes(record.value).updated_at is not None
    chunk = store.chunk_record(partition, "s1", "c7", {"documents": 1000})
    assert chunk.key == partition.chunk_key("s1", "c7")
    assert json.loads(chunk.value)["stats"] == {"documents": 1000}
    assert [r.value for r in store.chunk_tombstones(partition, "s1", ["c2", "c1", "c2"])] == [None, None]
    assert store.tombstone(partition).value is None
    with pytest.raises(ConfigError):
        OffsetStore({}, "t")


def test_store_from_a_connector_configuration():
    from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

    kafka = {"bootstrap.servers": "127.0.0.1:1"}
    default = ConnectorConfig.from_properties({"topic.prefix": "shop"})
    assert OffsetStore.from_config(kafka, default).topic == "shop.offsets"
    custom = ConnectorConfig.from_properties({"topic.prefix": "shop", "offset.storage.topic": "cdc-offsets"})
    assert OffsetStore.from_config(kafka, custom).topic == "cdc-offsets"
