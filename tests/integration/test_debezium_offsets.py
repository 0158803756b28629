"""Switching between a Debezium MongoDB connector and this connector without a re-snapshot:
``mongocdc offsets import-debezium`` / ``export-debezium`` (and OffsetStoreHook) read and write
the offset in a Kafka Connect offsets topic exactly as Kafka Connect stores Debezium 3.x's (key
``["<connector>", {"server_id": "<topic.prefix>"}]`` on the partition Java's murmur2 picks, value
``{"sec", "ord", "resume_token", "lsid", "txnNumber"}``), and a window then continues right after
that position. Real Kafka broker, the simulator (or MONGOCDC_TEST_MONGODB_URI), the installed
console script."""

from __future__ import annotations

import base64
import json

import bson
import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.java_json import document_writer
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.test_cli import mongocdc
from tests.integration.window_helpers import insert_at, next_second, pass_second, topic_events

pytestmark = pytest.mark.integration

CONNECT_PARTITIONS = 5  # a Kafka Connect offsets topic has several partitions (25 by default)
DEBEZIUM = "inventory-connector"


def _murmur2_partition(key: bytes, partitions: int) -> int:
    """Kafka's Java DefaultPartitioner for a keyed record: murmur2(key) & 0x7fffffff % partitions."""
    seed, m, r = 0x9747B28C, 0x5BD1E995, 24
    length = len(key)
    h = (seed ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(key[i : i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = key[length - length % 4 :]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return (h & 0x7FFFFFFF) % partitions


def _connect_topic(bootstrap: str, name: str) -> str:
    topic = f"{name}.connect-offsets"
    ensure_topics(
        {"bootstrap.servers": bootstrap},
        [TopicSpec(topic, CONNECT_PARTITIONS, -1, {"cleanup.policy": "compact"})],
    )
    return topic


def _kafka_connect_writes(bootstrap: str, topic: str, entries: list[tuple[list, dict | None]]) -> None:
    """Write offsets as Kafka Connect's worker does: JsonConverter without schemas (Jackson's
    compact JSON), keyed records on the Java producer's murmur2 partition, no transaction."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for key, value in entries:
        key_bytes = json.dumps(key, separators=(",", ":")).encode()
        value_bytes = None if value is None else json.dumps(value, separators=(",", ":")).encode()
        producer.produce(
            topic,
            key=key_bytes,
            value=value_bytes,
            partition=_murmur2_partition(key_bytes, CONNECT_PARTITIONS),
        )
    assert producer.flush(120) == 0, "the Kafka Connect offsets were not delivered within 120 s"


def _changes(client: MongoClient, database: str, after: Timestamp, count: int) -> list[dict]:
    """The first ``count`` change events of ``database`` from cluster time ``after`` on."""
    with client[database].watch(start_at_operation_time=after, max_await_time_ms=1000) as stream:
        found = []
        for change in stream:
            found.append(change)
            if len(found) == count:
                return found
    raise AssertionError(f"the change stream ended before {count} changes")


def _props(prefix: str, database: str) -> dict:
    return {"topic.prefix": prefix, "collection.include.list": f"{database}\\..*"}


def _created_ids(bootstrap: str, topic: str) -> list:
    return [json.loads(e.key["id"]) for e in topic_events(bootstrap, topic) if e.op == "c"]


@pytest.mark.parametrize("token_format", ["base64", "hex"])
def test_a_window_continues_right_after_an_imported_debezium_offset(
    token_format, mongodb_uri, kafka_bootstrap, unique_name
):
    prefix, database = unique_name, f"db_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    start = insert_at(client[f"{database}_m"]["markers"], {"at": 0})
    orders = client[database]["orders"]
    orders.insert_one({"_id": 1})
    with client.start_session() as session:  # Debezium stopped inside this transaction
        with session.start_transaction():
            orders.insert_one({"_id": 2}, session=session)
            orders.insert_one({"_id": 3}, session=session)
    first, second, _third = _changes(client, database, start, 3)
    assert [c["documentKey"]["_id"] for c in (first, second)] == [1, 2]

    # Debezium's offsets, as its Kafka Connect worker stored them: an older position of the same
    # connector, then the current one (the last change it processed: _id 2, inside the
    # transaction); another connector's; a pre-2.6 per-replica-set entry of the same topic.prefix.
    def token(change) -> str:
        if token_format == "base64":  # Debezium >= 2.7: ResumeTokens.toBase64
            return base64.b64encode(bson.encode(change["_id"])).decode()
        return change["_id"]["_data"]  # before 2.7: the _data hex string

    lsid = document_writer("strict").dumps(second["lsid"])
    current = {
        "sec": second["clusterTime"].time,
        "ord": second["clusterTime"].inc,
        "resume_token": token(second),
        "lsid": lsid,
        "txnNumber": second["txnNumber"],
    }
    older = {"sec": first["clusterTime"].time, "ord": first["clusterTime"].inc, "resume_token": token(first)}
    connect_topic = _connect_topic(kafka_bootstrap, unique_name)
    rs_name = client.admin.command("hello")["setName"]
    _kafka_connect_writes(
        kafka_bootstrap,
        connect_topic,
        [
            ([DEBEZIUM, {"server_id": prefix}], older),
            (["other-connector", {"server_id": "other"}], older),
            ([DEBEZIUM, {"server_id": prefix, "rs": rs_name}], older),
            ([DEBEZIUM, {"server_id": prefix}], current),
        ],
    )

    orders.insert_one({"_id": 4})
    last = insert_at(orders, {"_id": 5})
    end = next_second(last)
    pass_second(client, end, f"{database}_m")

    config = ConnectorConfig.from_properties(_props(prefix, database))
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    imported = mongocdc(
        "import-debezium",
        "--bootstrap-servers",
        kafka_bootstrap,
        "--topic-prefix",
        prefix,
        "--partition",
        target.partition,
        "--connect-offsets-topic",
        connect_topic,
        "--yes",
    )
    assert imported.returncode == 0, imported.stderr
    shown = json.loads(imported.stdout)
    assert shown["debezium"]["connector"] == DEBEZIUM
    assert shown["debezium"]["resume_token_format"] == token_format
    state = OffsetStore(kafka, config.offsets_topic).read(OffsetPartition(prefix, target.partition))
    assert state.resume_token == second["_id"] and state.cluster_time == second["clusterTime"]

    window = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=20))
    assert window["reached_end"] is True, window
    # Exactly the changes after Debezium's position: the rest of the transaction, then the rest.
    assert _created_ids(kafka_bootstrap, f"{prefix}.{database}.orders") == [3, 4, 5]
    client.close()


def test_export_writes_debezium_3_offset_that_imports_back_to_the_same_position(
    mongodb_uri, kafka_bootstrap, unique_name
):
    prefix, database = unique_name, f"db_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    start = insert_at(client[f"{database}_m"]["markers"], {"at": 0})
    client[database]["orders"].insert_one({"_id": 1})
    (change,) = _changes(client, database, start, 1)
    rs_name = client.admin.command("hello")["setName"]
    client.close()

    store = OffsetStore(kafka, f"{prefix}.offsets")
    store.ensure_topic()
    partition = OffsetPartition(prefix, rs_name)
    store.write(partition, OffsetState(position=Position(change["_id"], change["clusterTime"]), events=7))
    connect_topic = _connect_topic(kafka_bootstrap, unique_name)
    common = ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", prefix, "--partition", rs_name]
    common += ["--connect-offsets-topic", connect_topic]

    exported = mongocdc("export-debezium", *common, "--debezium-connector", DEBEZIUM, "--yes")
    assert exported.returncode == 0, exported.stderr
    (record,) = read_topic(kafka_bootstrap, connect_topic)
    # Kafka Connect's key and partition, Debezium 3.x's value.
    assert record.key == json.dumps([DEBEZIUM, {"server_id": prefix}], separators=(",", ":")).encode()
    assert record.partition == _murmur2_partition(record.key, CONNECT_PARTITIONS)
    value = json.loads(record.value)
    assert value == {
        "sec": change["clusterTime"].time,
        "ord": change["clusterTime"].inc,
        "resume_token": base64.b64encode(bson.encode(change["_id"])).decode(),
    }

    assert mongocdc("reset", *common[:6], "--yes").returncode == 0
    assert store.read(partition) is None
    imported = mongocdc("import-debezium", *common, "--debezium-connector", DEBEZIUM, "--yes")
    assert imported.returncode == 0, imported.stderr
    state = store.read(partition)
    assert state.resume_token == change["_id"] and state.cluster_time == change["clusterTime"]


def test_import_errors_name_what_the_connect_offsets_topic_holds(kafka_bootstrap, unique_name):
    prefix = unique_name
    connect_topic = _connect_topic(kafka_bootstrap, unique_name)
    token = base64.b64encode(bson.encode({"_data": "8263"})).decode()
    _kafka_connect_writes(
        kafka_bootstrap,
        connect_topic,
        [
            (["orders-cdc", {"server_id": prefix}], {"sec": 100, "ord": 1, "resume_token": token}),
            (["snapshotting", {"server_id": f"{prefix}_s"}], {"sec": 100, "ord": 1, "initsync": True}),
        ],
    )
    common = ["--bootstrap-servers", kafka_bootstrap, "--partition", "rs0"]
    common += ["--connect-offsets-topic", connect_topic, "--yes"]

    unknown = mongocdc("import-debezium", *common, "--topic-prefix", prefix, "--debezium-connector", "orders")
    assert unknown.returncode == 1, unknown.stdout
    message = unknown.stderr
    assert "No Debezium offset for connector 'orders'" in message, message
    assert f"""connector 'orders-cdc' partition {{"server_id":"{prefix}"}}""" in message, message
    assert "Fix:" in message

    missing = mongocdc("import-debezium", *common, "--topic-prefix", f"{prefix}_none")
    assert missing.returncode == 1 and f"server_id '{prefix}_none'" in missing.stderr, missing.stderr
    assert "'orders-cdc'" in missing.stderr and "'snapshotting'" in missing.stderr

    snapshotting = mongocdc("import-debezium", *common, "--topic-prefix", f"{prefix}_s")
    assert snapshotting.returncode == 1 and "initial snapshot" in snapshotting.stderr, snapshotting.stderr

    no_topic = mongocdc(
        "import-debezium",
        *common[:4],
        "--connect-offsets-topic",
        f"{prefix}.absent",
        "--yes",
        "--topic-prefix",
        prefix,
    )
    assert no_topic.returncode == 1 and "does not exist" in no_topic.stderr, no_topic.stderr
    # Nothing was imported by the refused commands.
    assert OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{prefix}.offsets").read_all() == {}


def test_the_offsets_hook_exports_and_imports_under_the_connector_lease(
    monkeypatch, kafka_bootstrap, unique_name
):
    from airflow_provider_mongocdc.core.base.errors import LeaseHeldError
    from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease, owner_for_task
    from airflow_provider_mongocdc.hooks.offsets import OffsetStoreHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_DBZ",
        json.dumps({"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}),
    )
    prefix = unique_name
    connect_topic = _connect_topic(kafka_bootstrap, unique_name)
    hook = OffsetStoreHook("kafka_dbz", prefix)
    hook.store.ensure_topic()
    token = {"_data": "8264F0A1B2000000012B022C0100296E5A1004"}
    hook.store.write(hook.partition("rs0"), OffsetState(position=Position(token, Timestamp(1693491634, 1))))

    _state, key, value = hook.export_debezium("rs0", connect_topic, DEBEZIUM)
    assert json.loads(key) == [DEBEZIUM, {"server_id": prefix}]
    assert json.loads(value)["resume_token"] == base64.b64encode(bson.encode(token)).decode()
    hook.reset("rs0")

    lease = ConnectorLease({"bootstrap.servers": kafka_bootstrap}, prefix)
    holder = owner_for_task("mongocdc_hourly", WINDOW, "scheduled__2026-01-01T10:00:00+00:00")
    lease.acquire(holder, WINDOW, ttl=600)
    with pytest.raises(LeaseHeldError, match="mongocdc_hourly"):
        hook.import_debezium("rs0", connect_topic, DEBEZIUM)
    assert hook.read("rs0") is None  # refused while a window holds the lease
    lease.release(holder)

    entry, before, after = hook.import_debezium("rs0", connect_topic)
    assert entry.connector == DEBEZIUM and entry.token_format == "base64" and before is None
    assert after.resume_token == token and after.cluster_time == Timestamp(1693491634, 1)
