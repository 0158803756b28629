"""Where and how a connector's collections are kept as tables (:class:`TableSettings`): the
``"tables"`` object of a connector list entry (``"delta"``: the same with the Delta format), or the
table apply operator's arguments.

    {"format": "delta",                         # or "iceberg"
     "location": "s3://lake/cdc",               # a local path or an object-store URI
     "conn_id": "delta_storage",                # the Airflow connection of the storage options
                                                # (Iceberg: an "iceberg" connection, the catalog)
     "namespace_prefix": "cdc_",                # Iceberg: the namespace is <prefix><database>
     "columns": {"shop.orders": {"total": "double", "customer.name": "string"}},
     "soft_delete": false,
     "collections": ["shop.orders"],            # only these (default: every topic of the connector)
     "max_batch_events": 100000,
     "compact_every": "1h", "vacuum_every": "1d", "vacuum_retention": "7d"}

A Delta table lies at ``<location>/<database>/<collection>`` (the names as in its topic's name); an
Iceberg table is ``<namespace_prefix><database>.<collection>`` in the catalog of its ``iceberg``
connection, or without one in a SQL catalog on SQLite under a local location
(``<location>/catalog.db``, its warehouse the location). Credentials never belong here: the storage options come from the connection, when the task
runs. Durations are seconds or ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``; ``null`` switches compaction
or vacuuming off (``vacuum_every`` or ``vacuum_retention``). The retention is at least an hour
(:data:`MIN_VACUUM_RETENTION_S`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_provider_mongocdc.core.apply.layout import DeclaredColumn, TableLayout, declared_columns
from airflow_provider_mongocdc.core.base.durations import parse_duration
from airflow_provider_mongocdc.core.base.errors import ConfigError

DEFAULT_MAX_BATCH_EVENTS = 100_000
DEFAULT_COMPACT_EVERY_S = 3600.0
DEFAULT_VACUUM_EVERY_S = 86400.0
# Delta's own default (delta.deletedFileRetentionDuration): readers of versions up to a week old
# still find their files.
DEFAULT_VACUUM_RETENTION_S = 7 * 86400.0
# The shortest retention: a vacuum removes only files the table stopped using at least an hour ago,
# so that a query reading an older version (Spark, DuckDB, Trino, the page; minutes long) and another
# writer's files not yet committed (its OPTIMIZE, say) are not removed under them; vacuum works in
# whole hours (a shorter retention would be 0: every file the latest version does not use, at once).
MIN_VACUUM_RETENTION_S = 3600.0
# A topic of several partitions is applied up to a moment when none of its partitions had a
# transaction open (so a MongoDB transaction split over partitions is never applied in part); the
# apply waits at most this long for one.
DEFAULT_QUIET_WAIT_S = 60.0
# While an open window runs, its tables follow the topics: a pass whenever a topic moved, at most
# this often (core/apply/follow.py).
DEFAULT_FOLLOW_EVERY_S = 5.0
FORMATS = ("delta", "iceberg")
KEYS = (
    "format",
    "namespace_prefix",
    "location",
    "conn_id",
    "columns",
    "soft_delete",
    "collections",
    "max_batch_events",
    "compact_every",
    "vacuum_every",
    "vacuum_retention",
    "fail_on_misfit",
    "follow_every",
)
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_USER_PASSWORD = re.compile(r"^[^@/]*:[^@/]*@")
_NAMESPACE = re.compile(r"^[^.]+\.[^.].*$")
EXAMPLE = '{"location": "/data/delta/shop", "columns": {"shop.orders": {"total": "double"}}}'


def _fail_on_misfit(value: Any, what: str) -> tuple[str, ...]:
    """``fail_on_misfit``: true (every table), false, or a list of ``<database>.<collection>``."""
    if value is True:
        return ("*",)
    if value is False or value is None:
        return ()
    if isinstance(value, list) and all(
        isinstance(name, str) and (name == "*" or _NAMESPACE.match(name)) for name in value
    ):
        return tuple(value)
    raise ConfigError(
        f"{what}: 'fail_on_misfit' must be true, false or a list of <database>.<collection>, got {value!r}",
        cause="a table with fail_on_misfit fails its apply on the first value that does not fit a declared "
        "column, instead of leaving the column null",
        fix='give e.g. "fail_on_misfit": ["shop.orders"], or true for every table',
    )


def _optional_duration(value: Any, what: str) -> float | None:
    if value is None:
        return None
    return parse_duration(value, what)


@dataclass(frozen=True)
class TableSettings:
    """The table apply's settings (validated; durations in seconds, None: off)."""

    location: str
    conn_id: str | None = None
    columns: Mapping[str, tuple[DeclaredColumn, ...]] = field(default_factory=dict)
    soft_delete: bool = False
    collections: tuple[str, ...] = ()
    max_batch_events: int = DEFAULT_MAX_BATCH_EVENTS
    compact_every_s: float | None = DEFAULT_COMPACT_EVERY_S
    vacuum_every_s: float | None = DEFAULT_VACUUM_EVERY_S
    vacuum_retention_s: float | None = DEFAULT_VACUUM_RETENTION_S
    # Tables (``<db>.<collection>``) whose apply fails on the first value that does not fit its
    # declared column instead of leaving it null; ``("*",)``: every table.
    fail_on_misfit: tuple[str, ...] = ()
    follow_every_s: float | None = DEFAULT_FOLLOW_EVERY_S  # None: applied after the window only
    format: str = "delta"
    namespace_prefix: str = ""  # Iceberg: the namespace of a collection is <prefix><database>

    @classmethod
    def from_mapping(cls, value: Any, what: str = "'delta'", format: str | None = None) -> TableSettings:
        """From the ``"delta"`` object (every error a ConfigError naming the key, its value and the fix)."""
        if not isinstance(value, Mapping):
            raise ConfigError(
                f"{what} must be a JSON object, got {type(value).__name__}", fix=f"give e.g. {EXAMPLE}"
            )
        unknown = sorted(set(value) - set(KEYS))
        if unknown:
            raise ConfigError(
                f"{what}: unknown key(s) {', '.join(unknown)}", fix=f"use only {', '.join(KEYS)}"
            )
        table_format = value.get("format", format or "delta")
        if table_format not in FORMATS:
            raise ConfigError(
                f"{what}: 'format' must be one of {', '.join(FORMATS)}, got {table_format!r}",
                fix='give "format": "delta" (Delta Lake) or "format": "iceberg" (Apache Iceberg)',
            )
        if format is not None and table_format != format:
            raise ConfigError(
                f"{what}: 'format' is {table_format!r}, but the key names the {format} format",
                fix=f'use the "tables" key for the {table_format} format, or leave "format" out',
            )
        prefix = value.get("namespace_prefix", "")
        if not isinstance(prefix, str) or (prefix and table_format != "iceberg"):
            raise ConfigError(
                f"{what}: 'namespace_prefix' is for Iceberg tables, a text; got {prefix!r}",
                fix='give e.g. "namespace_prefix": "cdc_" with "format": "iceberg", or leave it out',
            )
        location = value.get("location")
        if table_format == "iceberg" and location is None and value.get("conn_id"):
            location = ""  # the catalog of the connection says where the tables lie
        elif not isinstance(location, str) or not location.strip():
            raise ConfigError(
                f"{what}: 'location' is missing",
                cause="the tables lie under one location: a local path or an object-store URI"
                + (
                    " (Iceberg: or in the catalog of an 'iceberg' connection, 'conn_id')"
                    if table_format == "iceberg"
                    else ""
                ),
                fix='give e.g. "location": "/data/delta/shop" or "s3://bucket/cdc/shop"',
            )
        location = location.strip()
        authority = location.split("://", 1)[1].split("/", 1)[0] if "://" in location else ""
        if _USER_PASSWORD.match(authority):
            raise ConfigError(
                f"{what}: 'location' holds credentials",
                cause="credentials in a URI end up in task logs and on the page",
                fix="give the URI without them and put the storage options in the connection 'conn_id'",
            )
        conn_id = value.get("conn_id")
        if conn_id is not None and (not isinstance(conn_id, str) or not conn_id):
            raise ConfigError(f"{what}: 'conn_id' must be an Airflow connection id, got {conn_id!r}")
        columns = value.get("columns") or {}
        if not isinstance(columns, Mapping):
            raise ConfigError(
                f"{what}: 'columns' must be an object of collections, got {type(columns).__name__}",
                fix='give e.g. "columns": {"shop.orders": {"total": "double"}}',
            )
        declared = {}
        for namespace, spec in columns.items():
            if not _NAMESPACE.match(str(namespace)):
                raise ConfigError(
                    f"{what}: 'columns' key {namespace!r} is not <database>.<collection>",
                    fix='key the columns by collection, e.g. "shop.orders"',
                )
            declared[str(namespace)] = declared_columns(spec, f"{what} columns of {namespace}")
        soft_delete = value.get("soft_delete", False)
        if not isinstance(soft_delete, bool):
            raise ConfigError(f"{what}: 'soft_delete' must be true or false, got {soft_delete!r}")
        collections = value.get("collections") or []
        if not isinstance(collections, list) or not all(
            isinstance(name, str) and _NAMESPACE.match(name) for name in collections
        ):
            raise ConfigError(
                f"{what}: 'collections' must be a list of <database>.<collection>, got {collections!r}",
                fix='give e.g. ["shop.orders", "shop.customers"], or leave it out for every collection',
            )
        batch = value.get("max_batch_events", DEFAULT_MAX_BATCH_EVENTS)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ConfigError(
                f"{what}: 'max_batch_events' must be a whole number of 1 or more, got {batch!r}",
                fix=f"leave it out (default {DEFAULT_MAX_BATCH_EVENTS})",
            )
        retention = _optional_duration(
            value.get("vacuum_retention", DEFAULT_VACUUM_RETENTION_S), "vacuum_retention"
        )
        if retention is not None and retention < MIN_VACUUM_RETENTION_S:
            raise ConfigError(
                f"{what}: 'vacuum_retention' must be at least 1 hour, got {value['vacuum_retention']!r}",
                cause="a vacuum removes the files no version younger than the retention needs: with less "
                "than an hour, files a query of an older version or another writer still reads would go",
                fix=f'give 1h or more (default "{DEFAULT_VACUUM_RETENTION_S / 86400:g}d", as Delta\'s own), '
                "or null to switch vacuuming off",
            )
        vacuum_every = _optional_duration(value.get("vacuum_every", DEFAULT_VACUUM_EVERY_S), "vacuum_every")
        return cls(
            location=location.rstrip("/") or "/",
            conn_id=conn_id,
            columns=declared,
            soft_delete=soft_delete,
            collections=tuple(collections),
            max_batch_events=batch,
            compact_every_s=_optional_duration(
                value.get("compact_every", DEFAULT_COMPACT_EVERY_S), "compact_every"
            ),
            vacuum_every_s=None if retention is None else vacuum_every,  # no retention: no vacuum
            vacuum_retention_s=retention,
            fail_on_misfit=_fail_on_misfit(value.get("fail_on_misfit", False), what),
            format=table_format,
            namespace_prefix=prefix,
            follow_every_s=_optional_duration(
                value.get("follow_every", DEFAULT_FOLLOW_EVERY_S), "follow_every"
            ),
        )

    def to_json(self) -> dict[str, Any]:
        """The settings as the ``"tables"`` object (what the job spec carries)."""
        return {
            "format": self.format,
            "namespace_prefix": self.namespace_prefix,
            "location": self.location,
            "conn_id": self.conn_id,
            "columns": {
                namespace: {column.name: {"field": column.path, "type": column.type} for column in columns}
                for namespace, columns in self.columns.items()
            },
            "soft_delete": self.soft_delete,
            "collections": list(self.collections),
            "max_batch_events": self.max_batch_events,
            "compact_every": self.compact_every_s,
            "vacuum_every": self.vacuum_every_s,
            "vacuum_retention": self.vacuum_retention_s,
            "fail_on_misfit": list(self.fail_on_misfit),
            "follow_every": self.follow_every_s,
        }

    @property
    def scheme(self) -> str:
        """The location's URI scheme (``s3``, ``gs``, ``abfss``, ``file``...), ``""`` for a local path."""
        match = _SCHEME.match(self.location)
        return match.group(1).lower() if match else ""

    @property
    def local(self) -> bool:
        return self.scheme in ("", "file")

    def table_uri(self, database: str, collection: str) -> str:
        """Where the table of ``<database>.<collection>`` lies: ``<location>/<database>/<collection>``
        (Iceberg: ``iceberg://<connection or "mongocdc">/<namespace>/<collection>``)."""
        if self.format == "iceberg":
            namespace, table = self.identifier(database, collection)
            return f"iceberg://{self.conn_id or 'mongocdc'}/{namespace}/{table}"
        return f"{self.location.rstrip('/')}/{database}/{collection}"

    def identifier(self, database: str, collection: str) -> tuple[str, str]:
        """An Iceberg table's ``(namespace, table)``."""
        return f"{self.namespace_prefix}{database}", collection

    def default_catalog(self) -> dict[str, str]:
        """The catalog of Iceberg tables without a connection: SQL on SQLite under a local location."""
        if not self.local:
            raise ConfigError(
                f"The Iceberg tables under {self.location} have no catalog",
                cause="without an 'iceberg' connection the catalog is a SQLite file under the location, "
                "which must then be a local path",
                fix="give 'conn_id': an Airflow connection of type iceberg (host: a REST catalog's URI, or "
                'extra {"type": "sql", "uri": "postgresql+psycopg2://...", "warehouse": "s3://..."})',
            )
        root = self.location.removeprefix("file://").rstrip("/") or "/"
        return {"type": "sql", "uri": f"sqlite:///{root}/catalog.db", "warehouse": f"file://{root}"}

    def layout(self, namespace: str) -> TableLayout:
        """The layout of the table of ``namespace`` (``<database>.<collection>`` as in its topic)."""
        return TableLayout(tuple(self.columns.get(namespace, ())), self.soft_delete)

    def refuses_misfits(self, namespace: str) -> bool:
        """Whether the table of ``namespace`` fails on a value that does not fit a declared column."""
        return "*" in self.fail_on_misfit or namespace in self.fail_on_misfit

    def wanted(self, namespace: str) -> bool:
        return not self.collections or namespace in self.collections


# The settings' former name, kept for the ``delta`` key and DAGs of one's own.
DeltaSettings = TableSettings
