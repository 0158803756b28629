"""What the MongoDB CDC page reads from MongoDB for a running incremental snapshot: the documents
each collection still has to copy (the current one after its last copied ``_id``, up to the largest
``_id`` it had when its copy began; the pending ones whole; the request's filter applied), and from
them the chunks left the page shows; and from Kafka, the events a Delta table is behind its topic
(committed records, not offsets: commit markers and aborted records are no events)."""

from __future__ import annotations

import socket
import uuid
from datetime import datetime, timezone

import pyarrow as pa
import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import CommitProperties, Transaction, write_deltalake
from pymongo import MongoClient

from airflow_provider_mongocdc.core.apply.settings import DeltaSettings
from airflow_provider_mongocdc.core.apply.state import last_misfits_app_id, misfits_app_id, position_app_id
from airflow_provider_mongocdc.core.apply.topics import topic_ends
from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.probes import (
    RecordCounts,
    count_documents_left,
    count_records,
    probe_oplog,
)
from airflow_provider_mongocdc.core.health.record import (
    ConnectorIdentity,
    OffsetsView,
    Reading,
    Sources,
    connector_record,
)
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.snapshot.id_ranges import bound_json
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress
from tests.integration.snapshot_helpers import wait_until

pytestmark = pytest.mark.integration


def test_documents_and_chunks_left_of_a_running_incremental_snapshot(mongodb_uri):
    database = f"health_{uuid.uuid4().hex[:8]}"
    client = MongoClient(mongodb_uri)
    client[database].orders.insert_many(
        [{"_id": i, "status": "open" if i % 2 else "done"} for i in range(1, 11)]
    )
    client[database].customers.insert_many([{"_id": f"c{i}"} for i in range(1, 6)])
    client[database].orders.insert_one({"_id": 11, "status": "open"})  # after the copy began: not counted
    try:
        config = ConnectorConfig.from_properties(
            {"topic.prefix": database, "incremental.snapshot.chunk.size": "2"}
        )
        progress = IncrementalProgress(
            "incremental-1",
            pending=(f"{database}.customers",),
            current=f"{database}.orders",
            last_key=bound_json(3),
            max_key=bound_json(10),
            documents=3,
            chunks=2,
        )
        view = OffsetsView({OffsetPartition(database, "rs0"): OffsetState(incremental=progress.to_json())})
        left = count_documents_left(config, MongoConnectionDetails(connection_string=mongodb_uri), view)
        assert left == {f"{database}.orders": 7, f"{database}.customers": 5}

        filtered = IncrementalProgress(
            "incremental-2",
            current=f"{database}.orders",
            last_key=bound_json(3),
            max_key=bound_json(10),
            filters={f"{database}.orders": '{"status": "open"}'},
        )
        view_filtered = OffsetsView(
            {OffsetPartition(database, "rs0"): OffsetState(incremental=filtered.to_json())}
        )
        assert count_documents_left(
            config, MongoConnectionDetails(connection_string=mongodb_uri), view_filtered
        ) == {f"{database}.orders": 3}  # 5, 7, 9

        now = datetime.now(timezone.utc)
        identity = ConnectorIdentity(
            database, {"hourly": "h", "resnapshot": "r", "watchdog": "w"}, {}, "p", database, chunk_size=2
        )
        shown = connector_record(
            identity,
            Sources(offsets=Reading(view, now), documents_left=Reading(left, now)),
            now=now,
            headroom_threshold_seconds=3600,
        )["incremental_snapshot"]
        assert shown["documents_left"] == 12 and shown["chunks_left"] == 4 + 3
        assert shown["collection"] == f"{database}.orders" and shown["documents"] == 3
    finally:
        client.drop_database(database)
        client.close()


def test_an_unreachable_mongodb_is_reported_without_a_retry_setting_the_probe_does_not_use():
    # The page's probes (and the gap check's contact) try once: telling the user to "raise
    # connect.max.attempts (now 0)" would point at a setting those reads never use.
    config = ConnectorConfig.from_properties({"topic.prefix": "lost", "connect.max.attempts": "5"})
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        unused_tcp_port = probe.getsockname()[1]
    details = MongoConnectionDetails(connection_string=f"mongodb://127.0.0.1:{unused_tcp_port}/")
    state = OffsetState(position=Position(cluster_time=Timestamp(1_700_000_000, 1)))
    view = OffsetsView({OffsetPartition("lost", "rs0"): state})
    with pytest.raises(MongoCdcError) as raised:
        probe_oplog(config, details, view, timeout_ms=500)
    message = str(raised.value)
    assert (
        f"Could not connect to MongoDB at mongodb://127.0.0.1:{unused_tcp_port}/ after 1 attempt " in message
    ), message
    assert "check that the servers run and are reachable" in message, message
    assert "connect.max.attempts" not in message, message


KAFKA_TIMEOUT_S = 120  # bounds a broker round trip on a loaded machine, only a failure waits for it


def _transactions(bootstrap: str, topic: str, sizes: list[int], aborted: int) -> None:
    """``sizes`` committed transactions of that many records each, then ``aborted`` records in an
    aborted transaction: every transaction leaves a marker after its records."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-txn", "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(KAFKA_TIMEOUT_S)
    number = 0
    for size in sizes:
        producer.begin_transaction()
        for _ in range(size):
            number += 1
            producer.produce(topic, key=f'{{"id": {number}}}'.encode(), value=b'{"op": "c"}')
        producer.commit_transaction(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    for _ in range(aborted):
        producer.produce(topic, key=b'{"id": 0}', value=b'{"op": "u"}')
    producer.flush(KAFKA_TIMEOUT_S)
    producer.abort_transaction(KAFKA_TIMEOUT_S)


def test_a_delta_tables_behind_counts_the_committed_events_not_the_offsets(
    kafka_bootstrap, unique_name, tmp_path
):
    from airflow_provider_mongocdc.plugins.health_tables import read_tables

    prefix = unique_name.lower()
    topic = f"{prefix}.shop.orders"
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(KAFKA_TIMEOUT_S)
    # 60 documents in 6 transactions of 10, and 5 records of an aborted transaction: 72 offsets.
    _transactions(kafka_bootstrap, topic, [10] * 6, aborted=5)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    # The coordinator writes the abort marker after the abort returns: wait for the stable end.
    assert wait_until(lambda: topic_ends(kafka, topic, [0], 0.0).ends == {0: 72}, KAFKA_TIMEOUT_S)
    config = ConnectorConfig.from_properties({"topic.prefix": prefix})
    settings = DeltaSettings.from_mapping({"location": str(tmp_path / "lake")})
    now = datetime.now(timezone.utc)

    def shown() -> dict:
        record = {"name": prefix, "status": "ok", "problems": []}
        add_tables(record, settings.location, Reading(read_tables(settings, config, kafka), now), now)
        (table,) = record["tables"]["tables"]
        return table

    before = shown()  # no table yet: everything from the topic's start
    assert (before["version"], before["ends"], before["behind"]) == (None, {"0": 72}, 60), before

    # A table that applied the first transaction records the offset after its marker: 11; and
    # that 3 values of its declared column total did not fit it, 1 of them in its last run.
    uri = settings.table_uri("shop", "orders")
    write_deltalake(
        uri,
        pa.table({"_id": ["1"], "_doc": ["{}"], "total": pa.array([None], pa.float64()), "status": ["new"]}),
        commit_properties=CommitProperties(
            app_transactions=[
                Transaction(position_app_id(topic, 0), 11),
                Transaction(misfits_app_id(topic, "total"), 3),
                Transaction(last_misfits_app_id(topic, "total"), 1),
            ]
        ),
    )
    table = shown()
    assert table["behind"] == 50
    assert table["misfits"] == {
        "total": {"type": "double", "total": 3, "last_run": 1},
        "status": {"type": "string", "total": 0, "last_run": 0},
    }
    # Applied everything: the markers and the aborted records left are nothing behind.
    write_deltalake(
        uri,
        pa.table({"_id": ["2"], "_doc": ["{}"], "total": [2.5], "status": ["paid"]}),
        mode="append",
        commit_properties=CommitProperties(app_transactions=[Transaction(position_app_id(topic, 0), 66)]),
    )
    assert shown()["behind"] == 0

    # The count is bounded: beyond it, "more than" (the page reads at most that many records).
    assert count_records(kafka, topic, {0: 0}, {0: 72}, limit=25) == (25, False)
    assert count_records(kafka, topic, {0: 0}, {0: 72}, limit=60) == (60, True)
    assert count_records(kafka, topic, {0: 66}, {0: 72}) == (0, True)
    # A range counted once is not read again; one whose end moved on is read from its old end only.
    counts = RecordCounts()
    assert counts.count(kafka, topic, {0: 11}, {0: 55}) == (40, True)
    assert counts.count(kafka, topic, {0: 11}, {0: 72}) == (50, True)
    assert counts.reads == 2 and counts.records_read == 50
    assert counts.count(kafka, topic, {0: 11}, {0: 72}) == (50, True) and counts.reads == 2
