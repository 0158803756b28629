"""Transaction metadata: BEGIN/END records and the per-event transaction block."""

from __future__ import annotations

import json
import uuid

import pytest
from bson import Binary, Int64, ObjectId, Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.transactions import TransactionTracker, transaction_id

pytestmark = pytest.mark.unit

SESSION = {
    "id": Binary(uuid.UUID("140ed813-35e0-4174-97f4-ec66ce5947db").bytes, 4),
    "uid": Binary(b"\xe3" * 32, 0),
}
LSID_TEXT = (
    '{"id": {"$binary": "FA7YEzXgQXSX9OxmzllH2w==","$type": "04"},'
    '"uid": {"$binary": "4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+Pj4+M=","$type": "00"}}'
)


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties(
        {"topic.prefix": "fulfillment", "provide.transaction.metadata": "true", **props}
    )
    return EventBuilder(config, replica_set="rs0", clock=lambda: 1)


def insert(collection: str, seconds: int, txn: int | None = None) -> dict:
    oid = ObjectId()
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(seconds, 1),
        "ns": {"db": "testDB", "coll": collection},
        "documentKey": {"_id": oid},
        "fullDocument": {"_id": oid},
    }
    if txn is not None:
        change.update(lsid=SESSION, txnNumber=Int64(txn))
    return change


def decode(record):
    key = json.loads(record.key) if record.key else None
    value = json.loads(record.value) if record.value else None
    return record.topic, key, value


def test_transaction_id_is_debezium_2x_lsid_and_txn_number():
    change = insert("a", 10, txn=7)
    assert transaction_id(change) == LSID_TEXT + ":7"
    assert transaction_id(change, "oplog") == "140ed813-35e0-4174-97f4-ec66ce5947db:7"
    assert transaction_id(insert("a", 10)) is None


def test_begin_events_end_in_stream_order_with_counts():
    b = builder()
    records = []
    for change in (
        insert("collectiona", 100, txn=1),
        insert("collectionb", 100, txn=1),
        insert("collectiona", 100, txn=1),
        insert("collectiona", 101),
        insert("collectionb", 102, txn=2),
    ):
        records += b.build_change(change)
    records += b.finish()

    topics = [r.topic for r in records]
    assert topics == [
        "fulfillment.transaction",
        "fulfillment.testDB.collectiona",
        "fulfillment.testDB.collectionb",
        "fulfillment.testDB.collectiona",
        "fulfillment.transaction",
        "fulfillment.testDB.collectiona",
        "fulfillment.transaction",
        "fulfillment.testDB.collectionb",
        "fulfillment.transaction",
    ]
    _, key, begin = decode(records[0])
    assert key["payload"] == {"id": LSID_TEXT + ":1"}
    assert key["schema"]["name"] == "io.debezium.connector.common.TransactionMetadataKey"
    assert begin["schema"]["name"] == "io.debezium.connector.common.TransactionMetadataValue"
    assert begin["payload"] == {
        "status": "BEGIN",
        "id": LSID_TEXT + ":1",
        "event_count": None,
        "data_collections": None,
        "ts_ms": 100_000,
    }
    blocks = [decode(r)[2]["payload"]["transaction"] for r in records[1:4]]
    assert blocks == [
        {"id": LSID_TEXT + ":1", "total_order": 1, "data_collection_order": 1},
        {"id": LSID_TEXT + ":1", "total_order": 2, "data_collection_order": 1},
        {"id": LSID_TEXT + ":1", "total_order": 3, "data_collection_order": 2},
    ]
    end = decode(records[4])[2]["payload"]
    assert end == {
        "status": "END",
        "id": LSID_TEXT + ":1",
        "event_count": 3,
        # java.util.HashMap order of Debezium's TransactionContext (b's bucket comes first)
        "data_collections": [
            {"data_collection": "testDB.collectionb", "event_count": 1},
            {"data_collection": "testDB.collectiona", "event_count": 2},
        ],
        "ts_ms": 101_000,  # the time of the event that closed the transaction (TransactionMonitor)
    }
    assert decode(records[5])[2]["payload"]["transaction"] is None
    assert decode(records[6])[2]["payload"]["status"] == "BEGIN"
    final = decode(records[8])[2]["payload"]
    assert (final["status"], final["event_count"], final["id"]) == ("END", 1, LSID_TEXT + ":2")
    assert b.finish() == []


def test_consecutive_transactions_each_get_begin_and_end():
    b = builder()
    records = b.build_change(insert("a", 5, txn=1)) + b.build_change(insert("a", 6, txn=2))
    statuses = [decode(r)[2]["payload"].get("status") for r in records if r.topic.endswith(".transaction")]
    assert statuses == ["BEGIN", "END", "BEGIN"]


def test_events_not_captured_neither_count_nor_delimit():
    b = builder(**{"collection.include.list": "testDB[.]a"})
    records = (
        b.build_change(insert("a", 5, txn=1))
        + b.build_change(insert("b", 5, txn=1))
        + b.build_change(insert("a", 5, txn=1))
        + b.finish()
    )
    end = decode(records[-1])[2]["payload"]
    assert end["event_count"] == 2
    assert end["data_collections"] == [{"data_collection": "testDB.a", "event_count": 2}]


def test_tombstones_do_not_count():
    b = builder()
    oid = ObjectId()
    delete = {
        "operationType": "delete",
        "clusterTime": Timestamp(9, 1),
        "ns": {"db": "testDB", "coll": "a"},
        "documentKey": {"_id": oid},
        "lsid": SESSION,
        "txnNumber": Int64(4),
    }
    records = b.build_change(delete) + b.finish()
    assert [r.value is None for r in records] == [False, False, True, False]
    assert decode(records[-1])[2]["payload"]["event_count"] == 1


def test_oplog_format_uses_debezium_1x_ids_and_replica_set_qualified_collections():
    b = builder(**{"event.format": "oplog"})
    records = b.build_change(insert("collectiona", 3, txn=8)) + b.finish()
    event = decode(records[1])[2]
    assert [f["field"] for f in event["schema"]["fields"]][-1] == "transaction"
    assert event["payload"]["transaction"]["id"] == "140ed813-35e0-4174-97f4-ec66ce5947db:8"
    end = decode(records[2])[2]["payload"]
    assert end["data_collections"] == [{"data_collection": "rs0.testDB.collectiona", "event_count": 1}]


def test_state_carries_an_open_transaction_to_the_next_window():
    config = ConnectorConfig.from_properties({"topic.prefix": "p", "provide.transaction.metadata": "true"})
    first = TransactionTracker(config)
    first.on_event("tx:1", "db.a", 1000)
    first.on_event("tx:1", "db.b", 1000)
    state = json.loads(json.dumps(first.state()))
    second = TransactionTracker(config, state=state)
    records, block = second.on_event("tx:1", "db.a", 1000)
    assert records == [] and block == {"id": "tx:1", "total_order": 3, "data_collection_order": 2}
    [end] = second.finish()
    assert json.loads(end.value)["payload"]["event_count"] == 3
    assert second.state() is None


def test_payload_only_transaction_records():
    b = builder(**{"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"})
    begin = b.build_change(insert("a", 5, txn=1))[0]
    assert json.loads(begin.key) == {"id": LSID_TEXT + ":1"}
    assert json.loads(begin.value)["status"] == "BEGIN"


def test_transaction_topic_name_follows_topic_transaction():
    b = builder(**{"topic.transaction": "tx"})
    assert b.build_change(insert("a", 5, txn=1))[0].topic == "fulfillment.tx"


def test_the_tracker_counts_the_transactions_whose_begin_it_produced():
    b = builder(**{"collection.include.list": "testDB[.]a"})
    records = []
    for change in (
        insert("a", 5, txn=1),
        insert("a", 5, txn=1),
        insert("a", 6),
        insert("b", 7, txn=2),  # not captured: no BEGIN
        insert("a", 8, txn=3),
        insert("a", 9, txn=4),
    ):
        records += b.build_change(change)
    records += b.finish()
    begins = [
        r
        for r in records
        if r.topic.endswith(".transaction") and decode(r)[2]["payload"]["status"] == "BEGIN"
    ]
    assert b.transactions.begun == len(begins) == 3
