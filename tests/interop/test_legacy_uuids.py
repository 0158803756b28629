"""UUIDs stored as binary subtype 3 (written by drivers with a legacy ``uuidRepresentation``) keep
subtype 3 and their stored bytes in events and keys, as Debezium's MongoDB connector writes them,
whatever ``uuidRepresentation`` the MongoDB connection sets.

A window run in process against the simulator (or MONGOCDC_TEST_MONGODB_URI) and the real Kafka
broker, with the connection's ``uuidRepresentation`` set to each legacy representation, streams an
insert, an update of a subtype 3 field and a delete, and copies the existing documents as an
incremental snapshot's read events. Each ``after``, key and ``updatedFields`` is compared byte for
byte with what Debezium's ``JsonSerialization`` (the Java driver, devtools/interop) writes for the
document as MongoDB stores it.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone

import bson
import pytest
from bson import Binary
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.window_helpers import connector, next_second, pass_second, seed_offset, write_time

pytestmark = pytest.mark.interop

RAW = CodecOptions(document_class=RawBSONDocument)


def legacy(n: int) -> Binary:
    """A UUID as a legacy driver stores it: binary subtype 3 (bytes that no byte order maps onto
    themselves, so a conversion shows)."""
    return Binary(uuid.UUID(f"00112233-4455-6677-8899-aabbccdd{n:04x}").bytes, 3)


def document(n: int) -> dict:
    return {
        "_id": legacy(n),
        "owner": legacy(1000 + n),
        "standard": Binary(uuid.UUID(int=n).bytes, 4),
        "n": n,
    }


def with_uuid_representation(uri: str, representation: str) -> str:
    return f"{uri}{'&' if '?' in uri else '?'}uuidRepresentation={representation}"


@pytest.mark.parametrize("representation", ["pythonLegacy", "javaLegacy", "csharpLegacy"])
def test_subtype_3_uuids_stay_subtype_3_in_events_and_keys(
    representation, harness, mongodb_uri, kafka_bootstrap, unique_name
):
    database = f"uuids_{unique_name[-8:]}"  # unique_name ends with a random suffix
    prefix = unique_name
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(prefix, database, {"incremental.snapshot.chunk.size": 2})
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    things = client[database]["things"]
    things.insert_many([document(n) for n in range(3)])  # read events of the incremental snapshot
    store, partition = seed_offset(mongodb_uri, kafka, props)
    request = IncrementalRequest.new([f"{database}.things"], reason="test")
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())

    def changes(session) -> None:
        things.insert_one(document(10), session=session)
        things.update_one({"_id": legacy(0)}, {"$set": {"owner": legacy(2000)}}, session=session)
        things.delete_one({"_id": legacy(2)}, session=session)

    end = next_second(write_time(client, changes))
    pass_second(client, end, f"{database}_m")
    config = ConnectorConfig.from_properties(props)
    uri = with_uuid_representation(mongodb_uri, representation)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    window = run_window(
        target, config, kafka, WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=20)
    )
    assert window["reached_end"] is True, window
    stored = {  # the documents as MongoDB stores them, by their "n"
        doc["n"]: doc.raw for doc in client[database].get_collection("things", codec_options=RAW).find()
    }
    client.close()

    ops = []
    for record in read_topic(kafka_bootstrap, f"{prefix}.{database}.things"):
        if record.value is None:
            continue  # the tombstone after the delete
        payload = json.loads(record.value)["payload"]
        key_id = json.loads(record.key)["payload"]["id"]
        op = payload["op"]
        ops.append(op)
        assert '"subType": "03"' in key_id, f"{op} event's key: {key_id}"
        if op == "d":
            assert key_id == harness.document(bson.encode({"_id": legacy(2)}))["key"]
            continue
        texts = harness.document(stored[json.loads(payload["after"])["n"]])
        assert payload["after"] == texts["value"], f"{op} event's after"
        assert key_id == texts["key"], f"{op} event's key"
        if op == "u":
            updated = payload["updateDescription"]["updatedFields"]
            assert updated == harness.document(bson.encode({"owner": legacy(2000)}))["toJson"]
    assert sorted(ops) == ["c", "d", "r", "r", "r", "u"], ops
