"""The storage of the connector's Delta tables: its options from an Airflow connection, and what the
MongoDB CDC page shows of each table (delta-rs, read only).

A connection of any type holds the storage options: its extra is delta-rs's ``storage_options``
(object_store's keys, e.g. ``{"AWS_REGION": "eu-west-1", "AWS_ENDPOINT_URL": "http://minio:9000",
"AWS_ALLOW_HTTP": "true"}``); its login and password fill the access key and secret of the
location's store when the extra does not (``s3://``: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``;
``az://``, ``abfs[s]://``: ``AZURE_STORAGE_ACCOUNT_NAME``/``AZURE_STORAGE_ACCOUNT_KEY``). The options
travel in the job spec file only (never on the command line, in the task log or on the page). A
local path needs no connection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_mongocdc.core.apply.layout import SYSTEM_NAMES
from airflow_provider_mongocdc.core.apply.state import last_misfits_app_id, misfits_app_id, position_app_id

LOGIN_KEYS = {
    "s3": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "s3a": ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
    "az": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
    "abfs": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
    "abfss": ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY"),
}


class DeltaStorageHook(BaseHook):
    """The storage options of the connection ``conn_id`` for the tables under ``location``."""

    conn_name_attr = "conn_id"
    hook_name = "Delta Lake storage (for MongoDB CDC)"

    def __init__(self, conn_id: str | None, **kwargs: Any):
        super().__init__(**kwargs)
        self.conn_id = conn_id

    def storage_options(self, scheme: str) -> dict[str, str]:
        if not self.conn_id:
            return {}
        connection = self.get_connection(self.conn_id)
        options = {
            str(key): str(value).lower() if isinstance(value, bool) else str(value)
            for key, value in (connection.extra_dejson or {}).items()
            if value is not None and value != ""
        }
        login_key, password_key = LOGIN_KEYS.get(scheme, (None, None))
        if login_key and connection.login and login_key not in options:
            options[login_key] = connection.login
        if password_key and connection.password and password_key not in options:
            options[password_key] = connection.password
        return options


def table_versions(
    tables: Iterable[tuple[str, str, Iterable[int]]], storage_options: Mapping[str, str] | None
) -> dict[str, dict[str, Any] | None]:
    """For each ``(uri, topic, partitions)``: the table's version, the next offset it records per
    partition, when it was last committed and, per declared column (the table's columns but its
    own), its type and how many values did not fit it since the table was created and in its last
    apply run (None: no table yet)."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    found: dict[str, dict[str, Any] | None] = {}
    for uri, topic, partitions in tables:
        try:
            table = DeltaTable(uri, storage_options=dict(storage_options or {}) or None)
        except TableNotFoundError:
            found[uri] = None
            continue
        history = table.history(1)
        found[uri] = {
            "version": table.version(),
            "positions": {
                partition: table.transaction_version(position_app_id(topic, partition))
                for partition in partitions
            },
            "committed_ms": history[0].get("timestamp") if history else None,
            "misfits": {
                field.name: {
                    "type": getattr(field.type, "type", None) or str(field.type),
                    "total": table.transaction_version(misfits_app_id(topic, field.name)) or 0,
                    "last_run": table.transaction_version(last_misfits_app_id(topic, field.name)) or 0,
                }
                for field in table.schema().fields
                if field.name not in SYSTEM_NAMES
            },
        }
    return found
