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
