"""A stream window's events from the MongoDB simulator (or MONGOCDC_TEST_MONGODB_URI) and the
real Kafka broker, read by Kafka Connect's JsonConverter and Debezium's ExtractNewDocumentState,
and side by side with the records Debezium 3.6.1's MongoDB connector sends for the same change
stream documents (devtools/interop): inserts, updates, a replace, deletes with their tombstones, a transaction
over two collections with its BEGIN/END records, and heartbeats, over documents of many BSON
types and _ids of many types.

Every record on the topics converts with JsonConverter and back to the same JSON; each ``after``
and each key is byte for byte what Debezium's JsonSerialization writes for the document decoded
from ``after`` (and for the ``_id`` in the key); the SMT's flattened record is the one it makes of
the same record carrying Debezium's own texts, and equals the document (support.connect_payload).
"""

from __future__ import annotations

import json
import time

import bson
import pytest
from bson import Int64, json_util
from bson.codec_options import DatetimeConversion
from bson.json_util import JSONOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import open_stream
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.window_helpers import connector, next_second, pass_second, seed_offset, write_time
from tests.interop.support import (
    ENCODE,
    IDS,
    REFUSED,
    assert_debeziums,
    connect_payload,
    fields,
    with_debezium_texts,
)

pytestmark = pytest.mark.interop

_READ = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def decoded_after(text: str) -> tuple[bytes, dict]:
    document = json_util.loads(text, json_options=_READ)
    return bson.encode(document, codec_options=ENCODE), document


def test_a_windows_events_read_by_debeziums_consumer_code(harness, mongodb_uri, kafka_bootstrap, unique_name):
    database = unique_name[:40]
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, database, {"heartbeat.interval.ms": 1000})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    start = store.read(partition).position

    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000, datetime_conversion="DATETIME_AUTO")
    db = client[database]
    db.things.insert_many([{"_id": document_id, **fields(n)} for n, document_id in enumerate(IDS)])
    db.things.update_one(
        {"_id": IDS[0]}, {"$set": {"s": "changed", "nested.a.b.1": 20}, "$unset": {"yes": ""}}
    )
    db.things.replace_one({"_id": IDS[1]}, {"_id": IDS[1], **fields(99)})
    db.things.delete_one({"_id": IDS[2]})
    db.things.delete_one({"_id": IDS[8]})

    def transaction(session):
        with session.start_transaction():
            db.things.insert_one({"_id": "in transaction", **fields(50)}, session=session)
            db.other.insert_one({"_id": 1, "v": Int64(5)}, session=session)

    last = write_time(client, transaction)
    end = next_second(last)
    pass_second(client, end, f"{database}_m")
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    before = time.time_ns()
    window = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=20))
    after = time.time_ns()
    assert window["reached_end"] is True, window
    client.close()

    records = {
        topic: read_topic(kafka_bootstrap, topic)
        for topic in (
            f"{prefix}.{database}.things",
            f"{prefix}.{database}.other",
            f"{prefix}.transaction",
            f"__debezium-heartbeat.{prefix}",
        )
    }
    ops = [
        json.loads(r.value)["payload"]["op"] if r.value else None
        for r in records[f"{prefix}.{database}.things"]
    ]
    assert ops == ["c"] * len(IDS) + ["u", "u", "d", None, "d", None, "c"], ops
    assert len(records[f"{prefix}.{database}.other"]) == 1
    statuses = [json.loads(r.value)["payload"]["status"] for r in records[f"{prefix}.transaction"]]
    assert statuses == ["BEGIN", "END"], statuses
    assert records[f"__debezium-heartbeat.{prefix}"], "no heartbeat record"

    checked = 0
    for topic, topic_records in records.items():
        for record in topic_records:
            answer = harness.record(topic, record.key, record.value, {})
            assert answer["ok"], answer
            assert answer["key"] == json.loads(record.key)
            value = json.loads(record.value) if record.value is not None else None
            assert answer["value"] == value
            if not topic.startswith(f"{prefix}.{database}."):
                # BEGIN/END and heartbeats: not change events, the SMT passes them on as they are.
                assert answer["smt"] == {
                    "dropped": False,
                    "topic": topic,
                    "key": answer["key"],
                    "value": value,
                }
                continue
            key_id = json.loads(record.key)["payload"]["id"]
            if value is None:
                assert answer["smt"] == {"dropped": True}, "the default mode drops tombstones"
                continue
            payload = value["payload"]
            if payload["op"] == "d":
                raw_key = bson.encode(
                    json_util.loads('{"_id": ' + key_id + "}", json_options=_READ), codec_options=ENCODE
                )
                assert harness.document(raw_key)["key"] == key_id
                assert answer["smt"]["value"] is None, "the default mode turns deletes into tombstones"
                continue
            raw, document = decoded_after(payload["after"])
            texts = harness.document(raw)
            assert payload["after"] == texts["value"]
            assert key_id == texts["key"]
            reference_value, reference_key = with_debezium_texts(record.value, record.key, texts)
            reference = harness.record(topic, reference_key, reference_value, {})
            assert reference["ok"], reference
            assert answer["smt"] == reference["smt"]
            expected = connect_payload(document)
            assert expected not in (None, REFUSED), payload["after"]
            assert answer["smt"]["value"]["payload"] == expected
            if payload["op"] == "u" and payload["updateDescription"]:
                updated = payload["updateDescription"]["updatedFields"]
                raw_updated, _ = decoded_after(updated)
                assert harness.document(raw_updated)["toJson"] == updated
            checked += 1
    assert checked == len(IDS) + 2 + 2, checked

    # Side by side: the records Debezium's MongoDB connector sends for the same change stream
    # documents (its record emitter, its tombstone, its headers) are ours. Its emitter runs here
    # without Debezium's TransactionMonitor, so its transaction block is null: ours is compared
    # with Debezium's TransactionMonitor in tests/unit/test_transactions.py.
    changes = _raw_changes(mongodb_uri, config, start, count=len(IDS) + 6)
    debezium = {"topic.prefix": prefix}
    expected: dict[str, list] = {}
    for raw in changes:
        answer = harness.emit_change(debezium, raw)
        assert answer["ok"], answer
        for record in answer["records"]:
            expected.setdefault(record["topic"], []).append(record)
    run_ids = set()
    for topic in (f"{prefix}.{database}.things", f"{prefix}.{database}.other"):
        assert len(records[topic]) == len(expected[topic]), topic
        for ours, theirs in zip(records[topic], expected[topic]):
            if ours.value is not None and theirs["value"] is not None:
                theirs["value"]["payload"]["transaction"] = json.loads(ours.value)["payload"]["transaction"]
            run_ids.add(assert_debeziums(ours, theirs, (before, after)))
    assert len(run_ids) == 1 and None not in run_ids, run_ids  # one run id for the window's records
    for topic in (f"{prefix}.transaction", f"__debezium-heartbeat.{prefix}"):
        assert all(record.headers == () for record in records[topic]), topic


def _raw_changes(uri: str, config: ConnectorConfig, start, count: int) -> list[bytes]:
    """The first ``count`` documents of the connector's change stream after ``start``, as the
    server sent them (BSON)."""
    changes: list[bytes] = []
    with MongoClient(uri, serverSelectionTimeoutMS=20000, document_class=RawBSONDocument) as client:
        with open_stream(client, config, start, max_await_time_ms=200) as stream:
            for _ in range(600):  # a bound only: each try_next waits up to 200 ms
                change = stream.try_next()
                if change is not None:
                    changes.append(change.raw)
                if len(changes) == count:
                    return changes
    raise AssertionError(f"{len(changes)} of {count} changes read from the stream")
