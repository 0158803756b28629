"""The operator that keeps every captured collection as a table, Delta Lake or Apache Iceberg
(``spark_apps/delta_apply.py``, the table apply application)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from airflow.sdk import Asset, AssetAlias

from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.window.summary import counts_words
from airflow_provider_mongocdc.lineage import kafka_namespace, literal_topic_prefix
from airflow_provider_mongocdc.operators.base import MongoCdcSparkSubmitOperator, parse_connector_config

# The AssetAlias of an apply task: each run attaches the Asset of every table it changed.
DELTA_ASSET_ALIAS = "mongocdc.delta"


def delta_alias(topic_prefix: str | None, table_format: str = "delta") -> AssetAlias:
    """``mongocdc.<topic.prefix>.<format>`` when the prefix is known at parse time, else
    ``mongocdc.<format>``."""
    return AssetAlias(
        f"mongocdc.{topic_prefix}.{table_format}" if topic_prefix else f"mongocdc.{table_format}"
    )


def table_asset_uri(table_uri: str) -> str:
    """A table's Asset URI: its object-store or ``iceberg://`` URI, or ``file://`` and its absolute path."""
    return table_uri if "://" in table_uri else "file://" + table_uri


def table_asset(topic_prefix: str, collection: str, table_uri: str, table_format: str = "delta") -> Asset:
    """The Asset of one collection's table."""
    return Asset(
        uri=table_asset_uri(table_uri),
        name=f"mongocdc.{topic_prefix}.{collection}.{table_format}",
        group="mongocdc",
    )


class MongoTableApplyOperator(MongoCdcSparkSubmitOperator):
    """Apply the connector's collection topics to one table per collection, Delta Lake or Apache
    Iceberg, exactly once.

    Each table (Delta: ``<location>/<database>/<collection>``; Iceberg:
    ``<namespace_prefix><database>.<collection>`` in its catalog) records the topic positions it has
    applied in the same commit as the rows (Delta application transactions, Iceberg snapshot summary
    properties); a run reads the topic
    (``read_committed``) from there to its end and commits batches of ``max_batch_events`` (never
    inside a MongoDB transaction). A killed run leaves each table at its last commit; the next run
    continues there, so nothing is applied twice or skipped. Deletes and tombstones remove rows
    (``soft_delete``: mark them), completed snapshots sweep rows that are gone from MongoDB, and
    the tables are compacted and vacuumed on their schedule. Topics written by Debezium 2.x/3.x's
    MongoDB connector apply the same way. The layout, the rules and how to query the tables:
    README, "Tables" ("Delta Lake tables", "Apache Iceberg tables"). Returns (and pushes to XCom) the summary per table: events by
    operation, rows written, deleted and swept, commits, version, positions, how many records it is
    behind, values that did not fit their declared column.

    No connector lease is taken (the apply changes no offsets; one writer per table is kept by the
    format's own commit check and, in the connector's DAGs, by the connector's pool).

    :param tables: the table settings (a mapping or its JSON): ``format`` (``delta`` or
        ``iceberg``), ``location`` (local path or object-store URI), ``conn_id`` (Delta: the storage
        options' connection; Iceberg: an ``iceberg`` connection, the catalog), ``namespace_prefix``,
        ``columns``, ``soft_delete``, ``collections``, ``max_batch_events``, ``compact_every``,
        ``vacuum_every``, ``vacuum_retention``, ``fail_on_misfit``, ``follow_every``
        (:class:`~airflow_provider_mongocdc.core.apply.settings.TableSettings`). (templated)
    :param apply_in_driver: where the tables are applied: ``"auto"`` (default) in the
        application's driver on a ``local[...]`` Spark master, else one Spark task per table;
        ``True``/``False`` to choose.
    Other parameters: see :class:`MongoCdcSparkSubmitOperator` (``connector_config``,
    ``kafka_conn_id``, ``spark_conn_id`` and SparkSubmitOperator's; ``mongo_conn_id`` is not used).
    """

    application_name = "delta_apply"
    lease_kind = ""  # no lease: the apply writes no offsets
    template_fields: Sequence[str] = (*MongoCdcSparkSubmitOperator.template_fields, "tables")
    template_fields_renderers = {**MongoCdcSparkSubmitOperator.template_fields_renderers, "tables": "json"}
    ui_color = "#00add4"
    table_format: str | None = None  # a subclass of one format: the settings' format, said or not

    def __init__(
        self, *, tables: Mapping[str, Any] | str, apply_in_driver: bool | str = "auto", **kwargs: Any
    ):
        if apply_in_driver not in (True, False, "auto"):
            raise ConfigError(
                f"apply_in_driver {apply_in_driver!r} is not one of True, False, 'auto'",
                fix="leave the default 'auto' (in the driver on a local Spark master), or pass True or False",
            )
        literal = isinstance(tables, Mapping) or (
            isinstance(tables, str) and "{{" not in tables and "{%" not in tables
        )
        if "outlets" not in kwargs:
            table_format = self.table_format or "delta"
            if literal:
                table_format = self._settings_of(tables).format
            kwargs["outlets"] = [
                delta_alias(literal_topic_prefix(kwargs.get("connector_config") or {}), table_format)
            ]
        super().__init__(**kwargs)
        self.tables = tables
        self.apply_in_driver = apply_in_driver
        if literal:
            self.settings()  # refused when the DAG is parsed, not only when it runs

    def _settings_of(self, tables: Mapping[str, Any] | str) -> TableSettings:
        if isinstance(tables, str):
            try:
                tables = json.loads(tables)
            except json.JSONDecodeError as error:
                raise ConfigError(
                    "The table settings are not valid JSON",
                    cause=f"{error.msg} at line {error.lineno} column {error.colno}",
                    fix='give a JSON object, e.g. {"format": "iceberg", "location": "/data/lake/shop"}',
                ) from None
        what = f"the {self.table_format.capitalize()} settings" if self.table_format else "the table settings"
        return TableSettings.from_mapping(tables, what, format=self.table_format)

    def settings(self) -> TableSettings:
        return self._settings_of(self.tables)

    def _in_driver(self) -> bool:
        if self.apply_in_driver != "auto":
            return bool(self.apply_in_driver)
        self._use_rendered_spark_connection()
        return self._get_hook().local_master()

    def build_spec(self, context, config: ConnectorConfig) -> JobSpec:
        settings = self.settings()
        kafka = self.kafka_config()
        spec = JobSpec(
            application=self.application_name,
            connector=config.to_properties(),
            mongo={},
            kafka=kafka,
            params={
                "tables": settings.to_json(),
                "storage_options": connection_options(settings),
                "in_driver": self._in_driver(),
            },
        )
        self._lineage_namespaces = ("", kafka_namespace(kafka))
        return spec

    def summarize(self, context, summary: dict[str, Any]) -> dict[str, Any]:
        config = parse_connector_config(self.connector_config)
        self.log.info(
            "%s apply of %s to %s: %d events%s, %d rows written, %d deleted, %d swept in %d commits "
            "over %d table(s); %d records behind; %.1f s",
            self.settings().format.capitalize(),
            config.in_words(),
            summary.get("location"),
            summary.get("events", 0),
            counts_words(summary.get("events_by_op")),
            summary.get("rows_written", 0),
            summary.get("rows_deleted", 0),
            summary.get("rows_swept", 0),
            summary.get("commits", 0),
            len(summary.get("tables") or []),
            summary.get("behind", 0),
            summary.get("duration_s", 0.0),
        )
        for table in summary.get("tables") or []:
            version = table.get("version")
            self.log.info(
                "Table %s (%s): %s, %d events, topic positions %s",
                table.get("table"),
                table.get("collection"),
                "no version yet" if version is None else f"version {version}",
                table.get("events", 0),
                ", ".join(
                    f"partition {p} at offset {o}" for p, o in sorted((table.get("positions") or {}).items())
                )
                or "none applied yet",
            )
            for line in table.get("misfit_lines") or []:
                self.log.warning("Table %s: %s", table.get("table"), line)
            for note in table.get("notes") or []:
                self.log.info("Table %s: %s", table.get("table"), note)
        return summary

    def wrote_data(self, summary: dict[str, Any]) -> bool:
        return bool(summary.get("commits"))

    def report_run(self, context, config: ConnectorConfig, summary: dict[str, Any]) -> dict[str, Any]:
        """The Asset of every table the run changed, on the task's AssetAlias (extra: its version,
        events and positions)."""
        self._run_summary = summary
        outlet_events = (context or {}).get("outlet_events")
        if outlet_events is None:
            return summary
        for outlet in self.outlets or ():
            if not isinstance(outlet, AssetAlias):
                continue
            for table in summary.get("tables") or []:
                if not table.get("commits"):
                    continue
                extra = {
                    "connector": config.name or config.topic_prefix,
                    "topic_prefix": config.topic_prefix,
                    "topic": table.get("topic"),
                    "collection": table.get("collection"),
                    "version": table.get("version"),
                    "events": table.get("events", 0),
                    "positions": table.get("positions"),
                    # per declared column: this run's misfits and the table's total
                    "misfits": table.get("misfits") or {},
                }
                asset = table_asset(
                    config.topic_prefix, table["collection"], table["table"], self.settings().format
                )
                outlet_events[outlet].add(asset, extra=extra)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage inputs (the Kafka topics read) and outputs (the tables written)."""
        from airflow.providers.openlineage.extractors import OperatorLineage
        from openlineage.client.event_v2 import Dataset

        summary = getattr(self, "_run_summary", None) or {}
        namespaces = getattr(self, "_lineage_namespaces", None) or ("", kafka_namespace(self.kafka_config()))
        inputs, outputs = [], []
        for table in summary.get("tables") or []:
            inputs.append(Dataset(namespace=namespaces[1], name=table["topic"]))
            uri = table_asset_uri(table["table"])
            scheme, _, rest = uri.partition("://")
            authority, _, path = rest.partition("/")
            outputs.append(Dataset(namespace=f"{scheme}://{authority}", name="/" + path))
        return OperatorLineage(inputs=inputs, outputs=outputs)


def connection_options(settings: TableSettings) -> dict[str, str]:
    """What the apply needs of the settings' connection (only in the job spec file): Delta, the
    storage options of ``conn_id``; Iceberg, the catalog's properties of the ``iceberg``
    connection ``conn_id`` (none: the SQL catalog under the location)."""
    if settings.format == "iceberg":
        from airflow_provider_mongocdc.hooks.iceberg import IcebergCatalogHook

        return IcebergCatalogHook(settings.conn_id).catalog_properties()
    from airflow_provider_mongocdc.hooks.delta import DeltaStorageHook

    return DeltaStorageHook(settings.conn_id).storage_options(settings.scheme)
