"""Debezium's documented MongoDB events (its MongoDB connector documentation) reproduced from
MongoDB change events (the MongoDB Kafka connector's documented change stream shapes).

That documentation shows Debezium 1.x events (``event.format=oplog``): its create, update and delete
examples and its key table are checked field by field, schema included. The Debezium 2.x layout
(the default) is checked against a real Debezium 2.7 event.
"""

from __future__ import annotations

import json

import pytest
from bson import Binary, Int64, ObjectId, Timestamp, json_util

from airflow_provider_mongocdc import __version__
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from tests.topic_records import ENVELOPE_FIELDS

pytestmark = pytest.mark.unit

PROCESSED_MS = 1558965515240  # the documented envelope's ts_ms: when the connector processed the event

# Debezium's documentation, "create events": the value schema (transcribed; it names the envelope
# "dbserver1.inventory.customers.Envelope" while its payload's source.name is "fulfillment": the
# schema name is <connector name>.<db>.<collection>.Envelope, so with topic.prefix=fulfillment it
# is "fulfillment.inventory.customers.Envelope").
DOCUMENTED_VALUE_SCHEMA = {
    "type": "struct",
    "fields": [
        {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1, "field": "after"},
        {"type": "string", "optional": True, "name": "io.debezium.data.Json", "version": 1, "field": "patch"},
        {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Json",
            "version": 1,
            "field": "filter",
        },
        {
            "type": "struct",
            "fields": [
                {"type": "string", "optional": False, "field": "version"},
                {"type": "string", "optional": False, "field": "connector"},
                {"type": "string", "optional": False, "field": "name"},
                {"type": "int64", "optional": False, "field": "ts_ms"},
                {"type": "boolean", "optional": True, "default": False, "field": "snapshot"},
                {"type": "string", "optional": False, "field": "db"},
                {"type": "string", "optional": False, "field": "rs"},
                {"type": "string", "optional": False, "field": "collection"},
                {"type": "int32", "optional": False, "field": "ord"},
                {"type": "int64", "optional": True, "field": "h"},
            ],
            "optional": False,
            "name": "io.debezium.connector.mongo.Source",
            "field": "source",
        },
        {"type": "string", "optional": True, "field": "op"},
        {"type": "int64", "optional": True, "field": "ts_ms"},
    ],
    "optional": False,
    "name": "fulfillment.inventory.customers.Envelope",
}

DOCUMENTED_CREATE_PAYLOAD = {
    "after": '{"_id" : {"$numberLong" : "1004"},"first_name" : "Anne","last_name" : '
    '"Kretchmar","email" : "annek@noanswer.org"}',
    "patch": None,
    "source": {
        "version": "{debezium-version}",
        "connector": "mongodb",
        "name": "fulfillment",
        "ts_ms": 1558965508000,
        "snapshot": False,
        "db": "inventory",
        "rs": "rs0",
        "collection": "customers",
        "ord": 31,
        "h": 1546547425148721999,
    },
    "op": "c",
    "ts_ms": 1558965515240,
}
# The source block of the documented update and delete events (the same in both).
DOCUMENTED_UPDATE_SOURCE = {
    "version": "{debezium-version}",
    "connector": "mongodb",
    "name": "fulfillment",
    "ts_ms": 1558965508000,
    "snapshot": True,
    "db": "inventory",
    "rs": "rs0",
    "collection": "customers",
    "ord": 6,
    "h": 1546547425148721999,
}
DOCUMENTED_UPDATE_PAYLOAD = {
    "op": "u",
    "ts_ms": 1465491461815,
    "patch": '{"$set":{"first_name":"Anne Marie"}}',
    "filter": '{"_id" : {"$numberLong" : "1004"}}',
    "source": DOCUMENTED_UPDATE_SOURCE,
}
DOCUMENTED_DELETE_PAYLOAD = {
    "op": "d",
    "ts_ms": 1465495462115,
    "filter": '{"_id" : {"$numberLong" : "1004"}}',
    "source": DOCUMENTED_UPDATE_SOURCE,
}
DOCUMENTED_KEY_SCHEMA = {
    "type": "struct",
    "name": "fulfillment.inventory.customers.Key",
    "optional": False,
    "fields": [{"field": "id", "type": "string", "optional": False}],
}

DOCUMENT = {"_id": Int64(1004), "first_name": "Anne", "last_name": "Kretchmar", "email": "annek@noanswer.org"}
NS = {"db": "inventory", "coll": "customers"}


def _builder(clock_ms: int, **props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})
    return EventBuilder(config, replica_set="rs0", clock=lambda: clock_ms)


def _change(operation_type: str, resume_data: str, increment: int, **fields) -> dict:
    """A change event of the documented customer 1004 in NS: its resume token's ``_data``, operation
    type and cluster time increment, then ``fields``."""
    return {
        "_id": {"_data": resume_data},
        "operationType": operation_type,
        "clusterTime": Timestamp(1558965508, increment),
        "ns": NS,
        "documentKey": {"_id": Int64(1004)},
        **fields,
    }


def _ejson(text: str):
    return json_util.loads(text)


def _check_source(source: dict, expected: dict, *, snapshot: bool) -> None:
    """Every source field of the documentation, with two documented exceptions: ``version`` is this
    connector's version, and ``h`` (the oplog entry's hash, absent from change streams and from
    MongoDB 4.2+ oplogs) is null. ``snapshot`` is the event's real flag."""
    assert list(source) == list(expected)
    for name, value in expected.items():
        if name == "version":
            assert source[name] == __version__
        elif name == "h":
            assert source[name] is None
        elif name == "snapshot":
            assert source[name] is snapshot
        else:
            assert source[name] == value, name


def test_create_event_matches_debezium_docs_field_by_field():
    # MongoDB's insert change event shape, for the documented document.
    change = _change("insert", "825CEBE0E4000000012B", 31, fullDocument=DOCUMENT)
    [event] = _builder(PROCESSED_MS, **{"event.format": "oplog"}).build_change(change)

    assert event.topic == "fulfillment.inventory.customers"
    value = json.loads(event.value)
    assert value["schema"] == DOCUMENTED_VALUE_SCHEMA
    payload = value["payload"]
    assert set(DOCUMENTED_CREATE_PAYLOAD) <= set(payload)
    assert _ejson(payload["after"]) == _ejson(DOCUMENTED_CREATE_PAYLOAD["after"])
    assert '"$numberLong"' in payload["after"]  # 1004 keeps its 64-bit integer type
    assert payload["patch"] is None and payload["filter"] is None
    _check_source(payload["source"], DOCUMENTED_CREATE_PAYLOAD["source"], snapshot=False)
    assert payload["op"] == "c"
    assert payload["ts_ms"] == DOCUMENTED_CREATE_PAYLOAD["ts_ms"]
    assert list(payload) == ["after", "patch", "filter", "source", "op", "ts_ms"]

    key = json.loads(event.key)
    assert key["schema"] == DOCUMENTED_KEY_SCHEMA
    assert json.loads(key["payload"]["id"]) == {"$numberLong": "1004"}


def test_update_event_matches_debezium_docs_field_by_field():
    # MongoDB's update change event shape (no fullDocument: capture.mode=change_streams).
    change = _change(
        "update",
        "825CEBE0E4000000062B",
        6,
        updateDescription={
            "updatedFields": {"first_name": "Anne Marie"},
            "removedFields": [],
            "truncatedArrays": [],
        },
    )
    [event] = _builder(
        1465491461815, **{"event.format": "oplog", "capture.mode": "change_streams"}
    ).build_change(change)

    value = json.loads(event.value)
    assert value["schema"] == DOCUMENTED_VALUE_SCHEMA  # "the same schema as a create event"
    payload = value["payload"]
    assert payload["op"] == "u"
    assert payload["ts_ms"] == DOCUMENTED_UPDATE_PAYLOAD["ts_ms"]
    assert _ejson(payload["patch"]) == _ejson(DOCUMENTED_UPDATE_PAYLOAD["patch"])
    assert _ejson(payload["filter"]) == _ejson(DOCUMENTED_UPDATE_PAYLOAD["filter"])
    assert payload["after"] is None  # "An update event does not contain an after field"
    # The documentation's example says snapshot=true, which a streamed update cannot be: it is false here.
    _check_source(payload["source"], DOCUMENTED_UPDATE_PAYLOAD["source"], snapshot=False)


def test_delete_event_and_tombstone_match_debezium_docs():
    change = _change("delete", "825CEBE0E4000000062B", 6)
    event, tombstone = _builder(1465495462115, **{"event.format": "oplog"}).build_change(change)

    payload = json.loads(event.value)["payload"]
    assert payload["op"] == "d"
    assert payload["ts_ms"] == DOCUMENTED_DELETE_PAYLOAD["ts_ms"]
    assert _ejson(payload["filter"]) == _ejson(DOCUMENTED_DELETE_PAYLOAD["filter"])
    assert payload["after"] is None and payload["patch"] is None
    _check_source(payload["source"], DOCUMENTED_DELETE_PAYLOAD["source"], snapshot=False)
    # "the connector emits a special tombstone event that has the same key but a null value"
    assert tombstone.topic == event.topic
    assert tombstone.key == event.key
    assert tombstone.value is None


@pytest.mark.parametrize(
    ("document_id", "expected_id", "exact"),
    [
        (1234, "1234", True),
        (12.34, "12.34", True),
        ("1234", '"1234"', True),
        (
            {"hi": "kafka", "nums": [10.0, 100.0, 1000.0]},
            '{"hi" : "kafka", "nums" : [10.0, 100.0, 1000.0]}',
            False,
        ),
        (ObjectId("596e275826f08b2730779e1f"), '{"$oid" : "596e275826f08b2730779e1f"}', False),
        (b"kafka", '{"$binary" : "a2Fma2E=", "$type" : "00"}', False),  # BinData("a2Fma2E=",0)
    ],
    ids=["integer", "float", "string", "document", "objectid", "binary"],
)
def test_key_table_of_debezium_docs(document_id, expected_id, exact):
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(1558965508, 1),
        "ns": NS,
        "documentKey": {"_id": document_id},
        "fullDocument": {"_id": document_id, "first_name": "Anne"},
    }
    # The documentation's key table is Debezium 1.x's strict mode: event.format=oplog keys, or any format
    # with key.json.mode=strict (Debezium 2.x/3.x keys are relaxed, see test_debezium3_format).
    for props in ({"event.format": "oplog"}, {"key.json.mode": "strict"}):
        [event] = _builder(PROCESSED_MS, **props).build_change(change)
        key = json.loads(event.key)
        assert key["schema"] == DOCUMENTED_KEY_SCHEMA
        assert list(key["payload"]) == ["id"]
        produced = key["payload"]["id"]
        if exact:
            assert produced == expected_id
        else:  # same JSON; only whitespace differs from the Java driver's 1.x layout
            assert json.loads(produced) == json.loads(expected_id)
        assert _ejson(produced) == _ejson(expected_id)


def test_keys_of_common_ids_are_byte_identical_to_debezium_2x():
    """Debezium 2.x writes ``{"$oid": "..."}`` (Java driver compact layout); so do we, so
    compaction keeps working for a topic first written by Debezium."""
    oid = ObjectId("67f4675b8126ee23e2e79ec1")
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(1744070865, 1),
        "ns": {"db": "public", "coll": "books"},
        "documentKey": {"_id": oid},
        "fullDocument": {"_id": oid, "name": "23rwe\n"},
    }
    [event] = _builder(PROCESSED_MS).build_change(change)
    assert json.loads(event.key)["payload"] == {"id": '{"$oid": "67f4675b8126ee23e2e79ec1"}'}
    after = json.loads(event.value)["payload"]["after"]
    assert after == '{"_id": {"$oid": "67f4675b8126ee23e2e79ec1"},"name": "23rwe\\n"}'


# A Debezium MongoDB update event (schema transcribed from a 2.7.0.Final event), in Debezium 3.x's
# form: no ``rs`` in the source block (MongoDbSourceInfoStructMaker), source schema version 1,
# every SnapshotRecord in the snapshot enum, ``source.ts_ms`` from the change's wallTime.
DEBEZIUM_3_SOURCE_FIELDS = [
    ("version", "string", False),
    ("connector", "string", False),
    ("name", "string", False),
    ("ts_ms", "int64", False),
    ("snapshot", "string", True),
    ("db", "string", False),
    ("sequence", "string", True),
    ("ts_us", "int64", True),
    ("ts_ns", "int64", True),
    ("collection", "string", False),
    ("ord", "int32", False),
    ("lsid", "string", True),
    ("txnNumber", "int64", True),
    ("wallTime", "int64", True),
]


def test_debezium_3x_update_event_layout():
    oid = ObjectId("67f4675b8126ee23e2e79ec1")
    change = {
        "operationType": "update",
        "clusterTime": Timestamp(1744070865, 1),
        "wallTime": json_util.loads('{"$date": 1744070865419}'),
        "ns": {"db": "public", "coll": "books"},
        "documentKey": {"_id": oid},
        "updateDescription": {
            "updatedFields": {"name": "23rwe\n"},
            "removedFields": [],
            "truncatedArrays": [],
        },
        "fullDocument": {"_id": oid, "name": "23rwe\n"},
    }
    config = ConnectorConfig.from_properties({"topic.prefix": "mongo"})
    [event] = EventBuilder(config, replica_set="rs0", clock=lambda: 1744070865593).build_change(change)
    value = json.loads(event.value)
    schema = value["schema"]
    assert schema["name"] == "mongo.public.books.Envelope" and schema["optional"] is False
    assert [f["field"] for f in schema["fields"]] == ENVELOPE_FIELDS
    before, after, description, source, op, ts_ms, transaction = schema["fields"]
    for json_field in (before, after):
        assert json_field == {
            "type": "string",
            "optional": True,
            "name": "io.debezium.data.Json",
            "version": 1,
            "field": json_field["field"],
        }
    assert description == {
        "type": "struct",
        "fields": [
            {
                "type": "array",
                "items": {"type": "string", "optional": False},
                "optional": True,
                "field": "removedFields",
            },
            {
                "type": "string",
                "optional": True,
                "name": "io.debezium.data.Json",
                "version": 1,
                "field": "updatedFields",
            },
            {
                "type": "array",
                "items": {
                    "type": "struct",
                    "fields": [
                        {"type": "string", "optional": False, "field": "field"},
                        {"type": "int32", "optional": False, "field": "size"},
                    ],
                    "optional": False,
                    "name": "io.debezium.connector.mongodb.changestream.truncatedarray",
                    "version": 1,
                },
                "optional": True,
                "field": "truncatedArrays",
            },
        ],
        "optional": True,
        "name": "io.debezium.connector.mongodb.changestream.updatedescription",
        "version": 1,
        "field": "updateDescription",
    }
    assert source["name"] == "io.debezium.connector.mongo.Source" and source["version"] == 1
    assert [(f["field"], f["type"], f["optional"]) for f in source["fields"]] == DEBEZIUM_3_SOURCE_FIELDS
    assert source["fields"][4] == {
        "type": "string",
        "optional": True,
        "name": "io.debezium.data.Enum",
        "version": 1,
        "parameters": {
            "allowed": "true,first,first_in_data_collection,last_in_data_collection,last,false,incremental"
        },
        "default": "false",
        "field": "snapshot",
    }
    assert op == {"type": "string", "optional": True, "field": "op"}
    assert ts_ms == {"type": "int64", "optional": True, "field": "ts_ms"}
    assert transaction == {
        "type": "struct",
        "fields": [
            {"type": "string", "optional": False, "field": "id"},
            {"type": "int64", "optional": False, "field": "total_order"},
            {"type": "int64", "optional": False, "field": "data_collection_order"},
        ],
        "optional": True,
        "name": "event.block",
        "version": 1,
        "field": "transaction",
    }

    payload = value["payload"]
    assert payload == {
        "before": None,
        "after": '{"_id": {"$oid": "67f4675b8126ee23e2e79ec1"},"name": "23rwe\\n"}',
        "updateDescription": {
            "removedFields": None,
            "updatedFields": '{"name": "23rwe\\n"}',
            "truncatedArrays": None,
        },
        "source": {
            "version": __version__,
            "connector": "mongodb",
            "name": "mongo",
            "ts_ms": 1744070865419,
            "snapshot": "false",
            "db": "public",
            "sequence": None,
            "ts_us": 1744070865419000,
            "ts_ns": 1744070865419000000,
            "collection": "books",
            "ord": 1,
            "lsid": None,
            "txnNumber": None,
            "wallTime": 1744070865419,
        },
        "op": "u",
        "ts_ms": 1744070865593,
        "transaction": None,
    }


def test_binary_key_uses_relaxed_binary_form_or_strict_on_request():
    change = {
        "operationType": "insert",
        "clusterTime": Timestamp(1, 1),
        "ns": NS,
        "documentKey": {"_id": Binary(b"kafka", 0)},
        "fullDocument": {"_id": Binary(b"kafka", 0)},
    }
    [event] = _builder(PROCESSED_MS).build_change(change)
    assert json.loads(event.key)["payload"]["id"] == '{"$binary": {"base64": "a2Fma2E=","subType": "00"}}'
    [event] = _builder(PROCESSED_MS, **{"key.json.mode": "strict"}).build_change(change)
    assert json.loads(event.key)["payload"]["id"] == '{"$binary": "a2Fma2E=","$type": "00"}'
