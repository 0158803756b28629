"""What the MongoDB CDC page reads from MongoDB for a running incremental snapshot: the documents
each collection still has to copy (the current one after its last copied ``_id``, up to the largest
``_id`` it had when its copy began; the pending ones whole; the request's filter applied), and from
them the chunks left the page shows."""

from __future__ import annotations

import socket
import uuid
from datetime import datetime, timezone

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.probes import count_documents_left, probe_oplog
from airflow_provider_mongocdc.core.health.record import (
    ConnectorIdentity,
    OffsetsView,
    Reading,
    Sources,
    connector_record,
)
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.snapshot.id_ranges import bound_json
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress

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
