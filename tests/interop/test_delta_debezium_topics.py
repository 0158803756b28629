"""Topics written the way Debezium's MongoDB connector writes them apply to Delta tables as the
connector's own do: keys and documents in Debezium 3.6.1's own texts (its ``JsonSerialization``),
every record as Kafka Connect's ``JsonConverter`` writes it (schemas on), source.version a Debezium
release, produced without Kafka transactions (Kafka Connect's default) and with no offsets topic of
this provider, to Delta and to Iceberg tables. A blocking snapshot (reads ``true`` ... ``last``), inserts, updates, a replace,
deletes with tombstones and a transaction; then a second blocking snapshot (a Debezium signal's)
after a document was deleted without an event: its ``last`` read sweeps the ghost."""

from __future__ import annotations

import datetime
import json

import bson
import pytest
from bson import Decimal128, Int64, ObjectId, Timestamp
from confluent_kafka import Producer

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from tests.integration.delta_helpers import FORMATS, apply, table_documents
from tests.interop.support import ENCODE

pytestmark = pytest.mark.interop

DEBEZIUM_VERSION = "3.6.1.Final"


class DebeziumTopic:
    """Records of one collection as Debezium's connector and Kafka Connect write them."""

    def __init__(self, harness, prefix: str):
        self.harness = harness
        self.prefix = prefix
        self.topic = f"{prefix}.shop.items"
        config = ConnectorConfig.from_properties({"topic.prefix": prefix})
        self.builder = EventBuilder(config, replica_set="rs0")
        self.records: list[tuple[bytes, bytes | None]] = []
        self.ts = 0

    def _debezium(self, record) -> tuple[bytes, bytes | None]:
        if record.value is None:
            key = self.harness.record(self.topic, record.key, None)["key"]
            return _compact(key), None
        value = json.loads(record.value)
        payload = value["payload"]
        payload["source"]["version"] = DEBEZIUM_VERSION
        key = json.loads(record.key)
        if payload.get("after"):
            document = bson.json_util.loads(payload["after"])
            texts = self.harness.document(bson.encode(document, codec_options=ENCODE))
            payload["after"], key["payload"]["id"] = texts["value"], texts["key"]
        converted = self.harness.record(self.topic, json.dumps(key), json.dumps(value))
        assert converted["ok"], converted
        return _compact(converted["key"]), _compact(converted["value"])

    def add(self, records) -> None:
        for record in records:
            if record.topic == self.topic:
                self.records.append(self._debezium(record))

    def change(self, operation: str, _id, document=None, txn=None):
        self.ts += 1
        change = {
            "_id": {"_data": f"8265{self.ts:016X}"},
            "operationType": operation,
            "clusterTime": Timestamp(1_700_000_000 + self.ts, 1),
            "wallTime": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=self.ts),
            "ns": {"db": "shop", "coll": "items"},
            "documentKey": {"_id": _id},
        }
        if document is not None:
            change["fullDocument"] = document
        if operation == "update":
            change["updateDescription"] = {"updatedFields": {}, "removedFields": [], "truncatedArrays": []}
        if txn is not None:
            change.update(lsid={"id": ObjectId("65500000000000000000000b")}, txnNumber=Int64(txn))
        self.add(self.builder.build_change(change))

    def snapshot(self, documents):
        for index, document in enumerate(documents):
            self.add(
                self.builder.build_snapshot(
                    document, "shop", "items", last=index == len(documents) - 1, position=Timestamp(1, 1)
                )
            )

    def produce(self, bootstrap: str) -> None:
        producer = Producer({"bootstrap.servers": bootstrap})  # no transactions, as Kafka Connect
        for key, value in self.records:
            producer.produce(self.topic, key=key, value=value)
        producer.flush(30)
        self.records = []


def _compact(node) -> bytes:
    return json.dumps(node, separators=(",", ":"), ensure_ascii=False).encode()


@pytest.mark.parametrize("table_format", FORMATS)
def test_debezium_written_topics_apply_like_the_connectors_own(
    table_format, harness, kafka_bootstrap, unique_name, tmp_path
):
    topic = DebeziumTopic(harness, f"dbz_{unique_name}")
    documents = {
        n: {"_id": n, "v": n, "price": Decimal128(f"{n}.50"), "when": datetime.datetime(2024, 1, n + 1)}
        for n in range(10)
    }
    topic.snapshot(list(documents.values()))
    topic.change("insert", 100, {"_id": 100, "v": 100})
    topic.change("update", 1, {"_id": 1, "v": 11})
    topic.change("replace", 2, {"_id": 2, "replaced": True})
    topic.change("delete", 4)
    topic.change("insert", 101, {"_id": 101}, txn=3)
    topic.change("delete", 5, txn=3)
    topic.produce(kafka_bootstrap)
    props = {"topic.prefix": topic.prefix}
    lake = {"location": str(tmp_path / "lake"), "format": table_format}

    first = apply({"bootstrap.servers": kafka_bootstrap}, props, lake)

    expected = {
        **documents,
        100: {"_id": 100, "v": 100},
        1: {"_id": 1, "v": 11},
        2: {"_id": 2, "replaced": True},
        101: {"_id": 101},
    }
    for gone in (4, 5):
        expected.pop(gone)
    assert _plain(table_documents(tmp_path / "lake" / "shop" / "items")) == _plain(expected)
    assert first["events"] == 10 + 6 + 2  # the deletes' tombstones too

    # Document 7 is deleted while the connector is down and its history lost; a blocking snapshot
    # (Debezium's execute-snapshot signal) reads the rest: its last read sweeps the ghost.
    expected.pop(7)
    topic.snapshot(list(expected.values()))
    topic.produce(kafka_bootstrap)
    second = apply({"bootstrap.servers": kafka_bootstrap}, props, lake)
    assert _plain(table_documents(tmp_path / "lake" / "shop" / "items")) == _plain(expected)
    (table,) = second["tables"]
    assert table["rows_swept"] == 1 and table["snapshot"]["completed"] == 1, table


def _plain(documents: dict) -> dict:
    """Documents compared by their canonical extended JSON (dates as read back are UTC-aware)."""
    return {
        str(key): bson.json_util.dumps(
            {k: (v.replace(tzinfo=None) if isinstance(v, datetime.datetime) else v) for k, v in doc.items()},
            sort_keys=True,
        )
        for key, doc in documents.items()
    }
