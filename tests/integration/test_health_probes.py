"""What the MongoDB CDC page reads from MongoDB for a running incremental snapshot: the documents
each collection still has to copy (the current one after its last copied ``_id``, up to the largest
``_id`` it had when its copy began; the pending ones whole; the request's filter applied), and from
them the chunks left the page shows."""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.probes import count_documents_left
from airflow_provider_mongocdc.core.health.record import (
    ConnectorIdentity,
    OffsetsView,
    Reading,
    Sources,
    connector_record,
)
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
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
