"""The catalog of the connector's Iceberg tables: its properties from an Airflow connection of type
``iceberg`` (apache-airflow-providers-apache-iceberg's, read here without needing that provider),
as that provider's ``IcebergHook`` makes its catalog: the extra holds any pyiceberg catalog
property (``type``, ``uri``, ``warehouse``, ``s3.*``...), the host is the catalog's URI, ``type``
is ``rest`` unless the extra says otherwise, and for a REST catalog login and password are the
OAuth2 client id and secret (``credential``). Glue and Hive catalogs are pyiceberg configuration
in the extra (``{"type": "glue", "glue.region": ...}``, ``{"type": "hive", "uri": "thrift://..."}``),
a SQL catalog on a database ``{"type": "sql", "uri": "postgresql+psycopg2://...", "warehouse":
"s3://..."}``. The properties travel in the job spec file only (never on the command line, in the
task log or on the page). Without a connection the tables' catalog is a SQL catalog on SQLite under
the local location (:meth:`~airflow_provider_mongocdc.core.apply.settings.TableSettings.default_catalog`).
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook


class IcebergCatalogHook(BaseHook):
    """The pyiceberg catalog properties of the ``iceberg`` connection ``conn_id``."""

    conn_name_attr = "conn_id"
    hook_name = "Iceberg catalog (for MongoDB CDC)"

    def __init__(self, conn_id: str | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def catalog_properties(self) -> dict[str, str]:
        """The catalog's properties ({} without a connection: the SQL catalog under the location)."""
        if not self.conn_id:
            return {}
        connection = self.get_connection(self.conn_id)
        properties = {
            str(key): str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in (connection.extra_dejson or {}).items()
            if value is not None and value != ""
        }
        if connection.host:
            properties["uri"] = connection.host.rstrip("/")
        properties.setdefault("type", "rest")
        if properties["type"] == "rest" and connection.login and connection.password:
            properties.setdefault("credential", f"{connection.login}:{connection.password}")
        return properties


def iceberg_versions(
    settings: Any, tables: list[tuple[str, str, str, list[int]]], catalog: dict[str, str]
) -> dict[str, dict[str, Any] | None]:
    """For each ``(database, collection, topic, partitions)`` of ``settings``' Iceberg tables (its
    catalog's properties ``catalog``, {}: the SQL catalog under the location), as the Delta tables'
    :func:`~airflow_provider_mongocdc.hooks.delta.table_versions`: the current snapshot's sequence
    number, the next offset recorded per partition, when it was committed, and per declared column
    its type and misfit counts (None: no table yet). Keyed by the table's URI."""
    from airflow_provider_mongocdc.core.apply.layout import SYSTEM_NAMES
    from airflow_provider_mongocdc.core.apply.state import (
        last_misfits_app_id,
        misfits_app_id,
        position_app_id,
    )
    from airflow_provider_mongocdc.tables.iceberg import IcebergTableStore

    found: dict[str, dict[str, Any] | None] = {}
    for database, collection, topic, partitions in tables:
        uri = settings.table_uri(database, collection)
        store = IcebergTableStore(
            catalog or settings.default_catalog(),
            settings.identifier(database, collection),
            conn_id=settings.conn_id,
            uri=uri,
        )
        table = store.table()
        if table is None:
            found[uri] = None
            continue
        snapshot = table.current_snapshot()
        found[uri] = {
            "version": store.version(),
            "positions": {
                partition: store.app_version(position_app_id(topic, partition)) for partition in partitions
            },
            "committed_ms": snapshot.timestamp_ms if snapshot is not None else None,
            "misfits": {
                field.name: {
                    "type": str(field.field_type),
                    "total": store.app_version(misfits_app_id(topic, field.name)) or 0,
                    "last_run": store.app_version(last_misfits_app_id(topic, field.name)) or 0,
                }
                for field in table.schema().fields
                if field.name not in SYSTEM_NAMES
            },
        }
    return found
