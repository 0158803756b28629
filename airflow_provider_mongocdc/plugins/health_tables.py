"""What the MongoDB CDC page reads of a connector's tables (Delta or Iceberg): each collection topic's end
offsets and the events from the table's positions to them (Kafka, read_committed, at most
:data:`~airflow_provider_mongocdc.core.health.probes.BEHIND_COUNTED`, a range counted once for every
page load: :data:`record_counts`), and its table's version, recorded positions and misfit counts
(delta-rs or pyiceberg, read only), with short bounds; the record's part is
:mod:`airflow_provider_mongocdc.core.health.tables`'s. A table's error is shown without the storage
options' secret values (and the page hides what ``redact_uri`` finds)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.apply.settings import DeltaSettings
from airflow_provider_mongocdc.core.apply.topics import data_topics, partitions_of, topic_ends
from airflow_provider_mongocdc.core.base.redaction import redact_secrets, secret_values
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.health.probes import RecordCounts
from airflow_provider_mongocdc.hooks.delta import DeltaStorageHook, table_versions
from airflow_provider_mongocdc.hooks.iceberg import IcebergCatalogHook, iceberg_versions

# The events counted of each range, kept for the page's reads (the API server's process).
record_counts = RecordCounts()


def read_tables(
    settings: DeltaSettings,
    config: ConnectorConfig,
    kafka_config: Mapping[str, Any],
    counts: RecordCounts = record_counts,
) -> list[dict[str, Any]]:
    """Each collection topic of the connector with its table: ends, earliest offsets, table state,
    the events it is behind."""
    if settings.format == "iceberg":
        storage = IcebergCatalogHook(settings.conn_id).catalog_properties()
    else:
        storage = DeltaStorageHook(settings.conn_id).storage_options(settings.scheme)
    secrets = secret_values(storage)
    found = []
    for topic in data_topics(kafka_config, config):
        if not settings.wanted(topic.namespace):
            continue
        partitions = partitions_of(kafka_config, topic.topic)
        uri = settings.table_uri(topic.database, topic.collection)
        entry: dict[str, Any] = {"collection": topic.namespace, "topic": topic.topic, "table": uri}
        try:
            ends = topic_ends(kafka_config, topic.topic, partitions, 0.0)
            entry.update(ends=ends.ends, earliest=ends.earliest)
            if settings.format == "iceberg":
                state = iceberg_versions(
                    settings, [(topic.database, topic.collection, topic.topic, partitions)], storage
                )[uri]
            else:
                state = table_versions([(uri, topic.topic, partitions)], storage)[uri]
            entry["state"] = state
            positions = (state or {}).get("positions") or {}
            starts = {
                partition: positions.get(partition) if positions.get(partition) is not None else first
                for partition, first in ends.earliest.items()
            }
            records, complete = counts.count(kafka_config, topic.topic, starts, ends.ends)
            entry["behind"] = {"records": records, "complete": complete}
        except Exception as error:  # this table's row says it (delta-rs's text: storage secrets hidden)
            entry["error"] = redact_secrets(str(error), secrets)
        found.append(entry)
    return found
