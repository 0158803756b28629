"""One table's apply as the table apply application runs it, in its driver or in a Spark task: the
table's store of the settings' format (:mod:`airflow_provider_mongocdc.tables`: delta-rs or
pyiceberg), its job, and the checks before any table changes. What a task needs travels inside the
task (:func:`table_task`), never in Spark's configuration; ``storage_options`` are the format's
connection properties (Delta: delta-rs's storage options; Iceberg: the catalog's properties, or
without a connection the SQL catalog under the location)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from airflow_provider_mongocdc.core.apply.run import TableApply, TableJob, TableStore
from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.apply.snapshots import SnapshotStatus, read_status
from airflow_provider_mongocdc.core.apply.topics import DataTopic, partitions_of
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig


def table_store(settings: TableSettings, topic: DataTopic, options: Mapping[str, str] | None) -> TableStore:
    """The store of ``topic``'s table in the settings' format."""
    if settings.format == "iceberg":
        from airflow_provider_mongocdc.tables.iceberg import IcebergTableStore

        catalog = dict(options or {}) or settings.default_catalog()
        return IcebergTableStore(
            catalog,
            settings.identifier(topic.database, topic.collection),
            conn_id=settings.conn_id,
            uri=settings.table_uri(topic.database, topic.collection),
        )
    from airflow_provider_mongocdc.tables.delta import DeltaTableStore

    return DeltaTableStore(
        settings.table_uri(topic.database, topic.collection), options, conn_id=settings.conn_id
    )


def check_location(settings: TableSettings) -> None:
    """The tables' location can be written (a local one; before any table changes)."""
    if settings.location:
        from airflow_provider_mongocdc.tables.location import check_writable

        check_writable(settings.location)


def _table_apply(
    task: Mapping[str, Any], status: Callable[[str], SnapshotStatus | None] | None = None
) -> TableApply:
    config = ConnectorConfig.from_properties(task["connector"])
    settings = TableSettings.from_mapping(task["tables"])
    topic = DataTopic(task["topic"], task["database"], task["collection"])
    store = table_store(settings, topic, task.get("storage_options"))
    kafka = dict(task["kafka"])
    job = TableJob(
        topic=topic.topic,
        namespace=topic.namespace,
        layout=settings.layout(topic.namespace),
        max_batch_events=settings.max_batch_events,
        json_mode=config.extended_json_mode,
        compact_every_s=settings.compact_every_s,
        vacuum_every_s=settings.vacuum_every_s,
        vacuum_retention_s=settings.vacuum_retention_s,
        fail_on_misfit=settings.refuses_misfits(topic.namespace),
    )
    if status is None:
        return TableApply(job, store, kafka, lambda: read_status(kafka, config, topic.topic))
    return TableApply(job, store, kafka, lambda: status(topic.topic))


def apply_table_task(
    task: Mapping[str, Any], status: Callable[[str], SnapshotStatus | None] | None = None
) -> dict[str, Any]:
    """Apply one topic to its table (``task``: what :func:`table_task` wrote); returns its summary.
    Runs in the application's driver or in a Spark task (importable from the shipped code).
    ``status``: the connector's snapshot status of a topic (default: read from the offsets topic
    each time)."""
    return _table_apply(task, status).run()


def table_task(
    connector: Mapping[str, Any],
    kafka: Mapping[str, Any],
    tables: Mapping[str, Any],
    storage_options: Mapping[str, str] | None,
    topic: DataTopic,
) -> dict[str, Any]:
    """What a table's task needs (it travels inside the task, never in Spark's configuration)."""
    return {
        "connector": dict(connector),
        "kafka": dict(kafka),
        "tables": dict(tables),
        "storage_options": dict(storage_options or {}),
        "topic": topic.topic,
        "database": topic.database,
        "collection": topic.collection,
    }


def check_table(task: Mapping[str, Any]) -> None:
    """A table's checks before any table changes: who wrote it, its columns, the first record it
    would apply of each partition."""
    _table_apply(task).check(partitions_of(task["kafka"], task["topic"]), records=True)
