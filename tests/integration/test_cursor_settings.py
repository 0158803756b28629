"""Debezium 3.x cursor settings on a real Kafka broker: a user pipeline (``cursor.pipeline``,
``cursor.pipeline.order``), oversize changes (``cursor.oversize.handling.mode`` fail / skip with
``cursor.oversize.skip.threshold`` / split with ``$changeStreamSplitLargeEvent``) and where a
snapshot-less connector starts (``capture.start.op.time``)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest
from bson import encode
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OversizeEventError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import no_data_start_position
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    failing_commands,
    insert_at,
    seed_offset,
    topic_events,
    write_time,
)
from tests.settled_offsets import SettledOffsetStore

pytestmark = [pytest.mark.integration]

MB = 1024 * 1024
_processed_at = re.compile(rb'"ts_ms":\d+,"transaction":')
# Large events need a producer (and event.max.bytes) above 16 MB; lz4 keeps the batches the broker
# sees small.
LARGE_KAFKA = {"message.max.bytes": 64 * MB, "compression.type": "lz4"}
# Changes with their full document, up to 64 MB, read one a batch (so each fragment of a split
# change comes with a getMore of its own).
LARGE_EVENTS = {"capture.mode": "change_streams_update_full", "event.max.bytes": 64 * MB, "max.batch.size": 1}
SPLIT_LARGE_EVENTS = {**LARGE_EVENTS, "cursor.oversize.handling.mode": "split"}


def _window(uri: str, props: dict, kafka: dict, end: Timestamp) -> dict:
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    return run_window(target, config, kafka, WindowParams(datetime.fromtimestamp(end.time, timezone.utc)))


def _keys(events) -> list[tuple[str, str]]:
    return [(e.key["id"], e.op) for e in events if e.payload is not None]


@pytest.mark.parametrize("order", ["internal_first", "user_first", "user_only"])
def test_user_pipeline_filters_the_events(mongodb_uri, kafka_bootstrap, unique_name, order):
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(
        unique_name,
        db_name,
        {
            "cursor.pipeline": '[{"$match": {"$or": [{"fullDocument.region": "EU"}, '
            '{"operationType": "delete"}]}}]',
            "cursor.pipeline.order": order,
            "skipped.operations": "d",
        },
    )
    seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        items.insert_many([{"_id": 1, "region": "EU"}, {"_id": 2, "region": "US"}])
        items.delete_one({"_id": 2})
        end = end_after_insert(items, {"_id": 3, "region": "EU"}, f"{db_name}_m")
    summary = _window(mongodb_uri, props, kafka, end)
    events = topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    # The user's $match keeps EU documents and deletes; skipped.operations=d drops the delete
    # (on the server with the connector's stage, or when the event is built with user_only).
    assert _keys(events) == [("1", "c"), ("3", "c")], order
    assert summary["events"] == 2


def test_oversize_skip_threshold_drops_large_documents_on_the_server(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(
        unique_name,
        db_name,
        {"cursor.oversize.handling.mode": "skip", "cursor.oversize.skip.threshold": 1000},
    )
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        items.insert_one({"_id": 1, "pad": "x" * 100})
        items.insert_one({"_id": 2, "pad": "x" * 2000})
        items.delete_one({"_id": 1})  # no fullDocument: $bsonSize of a missing field is null
        end = end_after_insert(items, {"_id": 3, "pad": "x" * 900}, f"{db_name}_m")
    summary = _window(mongodb_uri, props, kafka, end)
    events = topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    assert _keys(events) == [("1", "c"), ("1", "d"), ("3", "c")]
    assert summary["events"] == 3
    assert store.read(partition).cluster_time == end


def _event_size(client: MongoClient, db_name: str, length: int) -> int:
    """The BSON size of an update event setting a string of ``length`` (updateLookup)."""
    probe = client[db_name].probe
    probe.insert_one({"_id": 1, "a": ""})
    with probe.watch(full_document="updateLookup", max_await_time_ms=500) as stream:
        probe.update_one({"_id": 1}, {"$set": {"a": "y" * length}})
        change = None
        while change is None:
            change = stream.try_next()
    probe.drop()
    return len(encode(change))


def test_split_events_are_reassembled_into_the_unsplit_event(mongodb_uri, kafka_bootstrap, unique_name):
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap, **LARGE_KAFKA}
    split_props = connector(unique_name, db_name, SPLIT_LARGE_EVENTS)
    whole_name = unique_name[:-1] + ("b" if unique_name[-1] != "b" else "c")
    whole_props = connector(whole_name, db_name, LARGE_EVENTS)
    split_store, split_partition = seed_offset(mongodb_uri, kafka, split_props)
    seed_offset(mongodb_uri, kafka, whole_props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        # An update event just over 16 MB: split with the stage, still readable without it (MongoDB
        # returns events up to 16 MB + 16 KB).
        small = _event_size(client, f"{db_name}_p", 1000)
        length = 1000 + (16 * MB + 8 * 1024 - small) // 2
        items = client[db_name].items
        items.insert_one({"_id": 1, "a": ""})
        big = write_time(
            client, lambda s: items.update_one({"_id": 1}, {"$set": {"a": "y" * length}}, session=s)
        )
        end = end_after_insert(items, {"_id": 2}, f"{db_name}_m")
        assert 16 * MB < _event_size(client, f"{db_name}_p", length) <= 16 * MB + 16 * 1024

    split = _window(mongodb_uri, split_props, kafka, end)
    whole = _window(mongodb_uri, whole_props, kafka, end)
    assert split["events"] == whole["events"] == 3
    split_records = read_topic(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    whole_records = read_topic(kafka_bootstrap, f"{whole_name}.{db_name}.items")
    renamed = whole_name.encode(), unique_name.encode()
    assert [r.key for r in split_records] == [r.key.replace(*renamed) for r in whole_records]
    assert len(split_records) == 3 and len(split_records[1].value) > 16 * MB
    for split_record, whole_record in zip(split_records, whole_records):
        # Byte for byte, but for the envelope's ts_ms (when the connector processed the event).
        assert _processed_at.sub(b"", split_record.value) == _processed_at.sub(
            b"", whole_record.value.replace(*renamed)
        )
    state = split_store.read(split_partition)
    assert state.cluster_time == end and big < end


def test_capture_start_op_time_is_where_a_connector_without_offset_starts(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        insert_at(items, {"_id": 1})
        start = insert_at(items, {"_id": 2})
        end = end_after_insert(items, {"_id": 3}, f"{db_name}_m")
        props = connector(
            unique_name,
            db_name,
            {"snapshot.mode": "no_data", "capture.start.op.time": (start.time << 32) | start.inc},
        )
        config = ConnectorConfig.from_properties(props)
        # What the snapshot task of snapshot.mode=no_data records when no offset is stored.
        position = no_data_start_position(client, config)
        assert position.cluster_time == start and position.resume_token is None
        without = no_data_start_position(
            client, ConnectorConfig.from_properties(connector(unique_name, db_name))
        )
        assert without.cluster_time > start
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    store = SettledOffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    partition = OffsetPartition(config.topic_prefix, target.partition)
    store.write(partition, OffsetState(position=position))
    summary = _window(mongodb_uri, props, kafka, end)
    # Inclusive, as startAtOperationTime: the change at capture.start.op.time and those after it.
    assert _keys(topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items")) == [("2", "c"), ("3", "c")]
    assert summary["events"] == 2 and store.read(partition).cluster_time == end


@pytest.mark.simulator_only
def test_a_window_failing_between_fragments_stores_no_position_inside_the_event(
    mongosim, kafka_bootstrap, unique_name
):
    sim = mongosim("replset")
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap, **LARGE_KAFKA}
    props = connector(unique_name, db_name, SPLIT_LARGE_EVENTS)
    store, partition = seed_offset(sim.uri, kafka, props)
    with sim.client() as client:
        items = client[db_name].items
        first = insert_at(items, {"_id": 1, "a": ""})
        items.update_one({"_id": 1}, {"$set": {"a": "y" * (9 * MB)}})  # an 18 MB event: 2 fragments
        end = end_after_insert(items, {"_id": 2}, f"{db_name}_m")
        # With batches of one, the second getMore returns the second fragment: it fails (and every
        # getMore after it), with an error the stream cannot resume from.
        with (
            failing_commands(client, {"skip": 1}, ["getMore"], errorCode=2),
            pytest.raises(MongoCdcError) as info,
        ):
            _window(sim.uri, props, kafka, end)
    assert "change stream" in str(info.value)
    topic = f"{unique_name}.{db_name}.items"
    failed = store.read(partition)
    # The stored position is at or before the insert before the split change, never a fragment.
    assert failed.cluster_time is not None and failed.cluster_time <= first
    assert _keys(topic_events(kafka_bootstrap, topic)) in ([], [("1", "c")])

    summary = _window(sim.uri, props, kafka, end)
    events = topic_events(kafka_bootstrap, topic)
    assert _keys(events) == [("1", "c"), ("1", "u"), ("2", "c")]
    assert events[1].after == {"_id": 1, "a": "y" * (9 * MB)}
    assert summary["events"] == 3 and store.read(partition).cluster_time == end


@pytest.mark.simulator_only
def test_resumable_errors_between_fragments_lose_and_repeat_nothing(mongosim, kafka_bootstrap, unique_name):
    sim = mongosim("replset")
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap, **LARGE_KAFKA}
    props = connector(
        unique_name,
        db_name,
        {**SPLIT_LARGE_EVENTS, "connect.backoff.initial.delay.ms": 10, "connect.backoff.max.delay.ms": 50},
    )
    store, partition = seed_offset(sim.uri, kafka, props)
    with sim.client() as client:
        items = client[db_name].items
        for n in range(3):
            items.insert_one({"_id": n, "a": ""})
            items.update_one({"_id": n}, {"$set": {"a": str(n) * (9 * MB)}})
        end = end_after_insert(items, {"_id": 99}, f"{db_name}_m")
        # Half of the getMores fail with a resumable error: pymongo resumes from the last fragment's
        # token (the stream goes on with the next fragment), or the window re-opens the stream from
        # its last whole event.
        resumable = {"errorCode": 6, "errorLabels": ["ResumableChangeStreamError"]}
        with failing_commands(client, {"activationProbability": 0.5}, ["getMore"], **resumable):
            summary = _window(sim.uri, props, kafka, end)
    events = topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    assert _keys(events) == [(str(n), op) for n in range(3) for op in ("c", "u")] + [("99", "c")]
    for n in range(3):
        assert events[2 * n + 1].after == {"_id": n, "a": str(n) * (9 * MB)}
    assert summary["events"] == 7 and store.read(partition).cluster_time == end


def test_oversize_fail_names_split_and_skip_when_mongodb_cannot_return_a_change(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = unique_name[:30] + unique_name[-8:]
    kafka = {"bootstrap.servers": kafka_bootstrap, **LARGE_KAFKA}
    props = connector(
        unique_name,
        db_name,
        {"capture.mode": "change_streams_update_full", "event.max.bytes": 64 * MB, "max.batch.size": 1},
    )
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        first = insert_at(items, {"_id": 1, "a": ""})
        items.update_one({"_id": 1}, {"$set": {"a": "y" * (9 * MB)}})  # an 18 MB change event
        end = end_after_insert(items, {"_id": 2}, f"{db_name}_m")
    with pytest.raises(OversizeEventError) as info:
        _window(mongodb_uri, props, kafka, end)
    text = str(info.value)
    assert "BSONObjectTooLarge" in text or "10334" in text
    assert "cursor.oversize.handling.mode=split" in text and "cursor.oversize.skip.threshold" in text
    topic = f"{unique_name}.{db_name}.items"
    assert _keys(topic_events(kafka_bootstrap, topic)) in ([], [("1", "c")])
    assert store.read(partition).cluster_time <= first
