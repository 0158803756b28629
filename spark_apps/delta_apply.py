"""spark-submit entry point of the table apply: ``delta_apply.py --job-spec PATH [--result PATH]``.

The connector's collection topics, each applied to its table, Delta or Iceberg (``core/apply``; the
format's adapter in :mod:`airflow_provider_mongocdc.tables`, chosen by
:mod:`~airflow_provider_mongocdc.spark_apps.table_tasks`). The driver finds the topics, checks the location and every table
(who wrote it, its columns) before any table changes, then applies one table per Spark task, or,
with the ``in_driver`` parameter (the operator sets it on a ``local[...]`` master), every table here
in the driver without starting a SparkContext, as windows of one stream do. The job spec's
``params``: ``tables`` (or ``delta``; :class:`~airflow_provider_mongocdc.core.apply.settings.TableSettings`),
``storage_options`` (from the storage or catalog connection: inside the spec file and the task
closures only),
``in_driver``. Reasons: docs/design.md, "Delta Lake tables".
"""

from __future__ import annotations

import os

# Arrow's memory from the C library's allocator, set before pyarrow loads (Arrow reads it once).
# A table's rewrite allocates and frees hundreds of MB of buffers; pyarrow's default, its bundled
# mimalloc, reserves its arena with transparent huge pages and gives freed memory back soon, so the
# memory used again is faulted and zeroed again 2 MB at a time: about a sixth of the CPU of 100 000
# changes applied to a 1 000 000-row table (system time 0.8 CPU-s, 0.44 with this). A value the
# environment already has is kept.
os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")

import logging
import time
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.apply.topics import data_topics
from airflow_provider_mongocdc.core.base.lifetime import die_with_parent
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.spark_apps.runtime import main
from airflow_provider_mongocdc.spark_apps.table_tasks import (
    apply_table_task,
    check_location,
    check_table,
    table_task,
)
from airflow_provider_mongocdc.tables.arrow import keep_pandas_out_of_pyarrow

APPLICATION = "delta_apply"
log = logging.getLogger("airflow_provider_mongocdc.delta_apply")
TOTALS = (
    "events",
    "rows_written",
    "rows_deleted",
    "rows_swept",
    "commits",
    "behind",
    "updates_without_document",
)


def merge_summaries(tables: list[Mapping[str, Any]], location: str, started: float) -> dict[str, Any]:
    """The run's summary: each table's, and their totals."""
    summary: dict[str, Any] = {"location": location, "tables": sorted(tables, key=lambda t: t["topic"])}
    for name in TOTALS:
        summary[name] = sum(int(table.get(name) or 0) for table in tables)
    ops: dict[str, int] = {}
    for table in tables:
        for op, count in (table.get("events_by_op") or {}).items():
            ops[op] = ops.get(op, 0) + count
    summary["events_by_op"] = ops
    summary["misfits"] = sum(sum(item["count"] for item in (t.get("misfits") or {}).values()) for t in tables)
    summary["duration_s"] = round(time.monotonic() - started, 3)
    return summary


def tables_param(params: Mapping[str, Any]) -> Mapping[str, Any]:
    """The job spec's table settings: ``tables`` (any format), or ``delta`` (the Delta format)."""
    if params.get("tables") is not None:
        return params["tables"]
    return {"format": "delta", **params["delta"]}


def job(spark: Any, spec: JobSpec) -> dict[str, Any]:
    started = time.monotonic()
    if spec.params.get("in_driver"):  # no SparkContext in this process: it is the apply's alone
        keep_pandas_out_of_pyarrow()
    config = ConnectorConfig.from_properties(spec.connector)
    settings = TableSettings.from_mapping(tables_param(spec.params))
    storage_options = spec.params.get("storage_options") or {}
    check_location(settings)
    topics = [topic for topic in data_topics(spec.kafka, config) if settings.wanted(topic.namespace)]
    tasks = [
        table_task(spec.connector, spec.kafka, settings.to_json(), storage_options, topic) for topic in topics
    ]
    for task in tasks:  # before any table changes
        check_table(task)
    log.info(
        "%s apply of %s to %s: %d table(s) %s",
        settings.format.capitalize(),
        config.in_words(),
        settings.location or f"the catalog of {settings.conn_id!r}",
        len(tasks),
        ", ".join(task["topic"] for task in tasks) or "(no collection topic yet)",
    )
    if not tasks:
        return merge_summaries([], settings.location, started)
    if spec.params.get("in_driver"):
        tables = run_in_driver(tasks)
    else:
        tables = run_in_spark_tasks(spark, tasks)
    return merge_summaries(tables, settings.location, started)


def run_in_driver(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every table here, one after the other, without a SparkContext; this process dies with the
    JVM that started it (it does not wait on the Py4J gateway)."""
    tie = die_with_parent(os.getppid())
    if tie is not None:
        tie()
    return [apply_table_task(task) for task in tasks]


def run_in_spark_tasks(spark: Any, tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One Spark task per table."""
    context = spark.sparkContext
    return context.parallelize(tasks, len(tasks)).map(apply_table_task).collect()


if __name__ == "__main__":
    main(APPLICATION, job)
