"""Debezium 3.x's context headers on data records and tombstones (core/events/headers.py).

The names, their order and values are those of Debezium 3.6.1's ``DebeziumHeaders``,
``DebeziumHeaderProducer.contextHeaders()`` and ``CdcSourceTaskContext`` for the MongoDB
connector, as Kafka Connect's ``SimpleHeaderConverter`` writes them (UTF-8 strings);
tests/interop/test_snapshot_events.py and test_window_events.py compare them with what Debezium's
own code produces.
"""

from __future__ import annotations

import uuid

import pytest
from bson import Int64, ObjectId, Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.headers import new_run_id

pytestmark = pytest.mark.unit

RUN = "01933c5e-7b1a-7c00-8a1b-2c3d4e5f6a7b"
OID = ObjectId("596e275826f08b2730779e1f")
NS = {"db": "inventory", "coll": "customers"}
# DebeziumHeaders' names, in DebeziumHeaderProducer's order, with the MongoDB connector's values.
EXPECTED = (
    ("__debezium.context.connectorLogicalName", b"fulfillment"),  # topic.prefix
    ("__debezium.context.taskId", b"0"),  # mongodb.task.id, never set: its default
    ("__debezium.context.connectorName", b"mongodb"),  # Module.name(), not Connect's name
    ("__debezium.context.runId", RUN.encode()),
)


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties(
        {"topic.prefix": "fulfillment", "name": "orders-connector", **props}
    )
    return EventBuilder(config, replica_set="rs0", run_id=RUN)


def change(operation: str, **extra) -> dict:
    return {
        "operationType": operation,
        "ns": NS,
        "documentKey": {"_id": OID},
        "clusterTime": Timestamp(1_700_000_000, 1),
        "_id": {"_data": "82"},
        **extra,
    }


def test_every_data_record_and_tombstone_carries_the_four_headers():
    events = builder()
    records = [
        *events.build_change(change("insert", fullDocument={"_id": OID})),
        *events.build_change(change("update", updateDescription={"updatedFields": {"a": 1}})),
        *events.build_change(change("delete")),  # the event and its tombstone
        *events.build_snapshot({"_id": OID}, "inventory", "customers", position=Timestamp(9, 1)),
        *events.build_snapshot(
            {"_id": OID}, "inventory", "customers", position=Timestamp(9, 1), incremental=True
        ),
    ]
    assert len(records) == 6 and records[3].value is None
    assert all(record.headers == EXPECTED for record in records), [r.headers for r in records]


def test_heartbeats_and_transaction_records_carry_none():
    events = builder(**{"provide.transaction.metadata": "true", "heartbeat.interval.ms": "1000"})
    session = {"lsid": {"id": OID}, "txnNumber": Int64(1)}
    begin, event = events.build_change(change("insert", fullDocument={"_id": OID}, **session))
    (end,) = events.finish()
    assert (begin.headers, end.headers) == ((), ())
    assert event.headers == EXPECTED
    assert events.build_heartbeat(1_700_000_000_000).headers == ()


def test_extended_headers_enabled_false_leaves_them_out():
    events = builder(**{"extended.headers.enabled": "false"})
    records = events.build_change(change("delete"))
    assert len(records) == 2 and all(record.headers == () for record in records)


def test_a_run_id_is_a_uuid_version_7_of_its_start():
    first = uuid.UUID(new_run_id(now_ms=1_700_000_000_000))
    later = uuid.UUID(new_run_id(now_ms=1_700_000_000_001))
    assert (first.version, first.variant) == (7, uuid.RFC_4122)
    assert first.int >> 80 == 1_700_000_000_000  # the start's epoch milliseconds, as UUIDUtils
    assert later > first
    # A builder without a run id makes its own.
    made = EventBuilder(ConnectorConfig.from_properties({"topic.prefix": "p"})).run_id
    assert uuid.UUID(made).version == 7
