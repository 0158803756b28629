"""Helpers of the table apply tests: a snapshot and windows run in this process, the apply run in
this process (the application's driver path), and the tables read by readers that are not the
provider's code, compared with MongoDB: a Delta table by deltalake (pyarrow); an Iceberg table by
pyiceberg and by polars (each must read the same rows).

A table is named by its path ``<location>/<database>/<collection>`` in both formats: a Delta table
lies there; an Iceberg table of the default SQL catalog (``<location>/catalog.db``) is
``<database>.<collection>`` in it. The settings of a test give ``"format": "iceberg"`` for the
latter (``FORMATS`` parametrizes a test over both)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bson import json_util
from bson.json_util import JSONOptions
from deltalake import DeltaTable
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.spark_apps.delta_apply import job as delta_apply_job
from tests.integration.window_helpers import insert_at, next_second, pass_second

DECODE = JSONOptions(tz_aware=True)


class ThreadChunkTasks:
    """The snapshot's chunk copies as threads of this process."""

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(copy, groups))


def connector(prefix: str, database: str, **extra: Any) -> dict[str, Any]:
    return {
        "topic.prefix": prefix,
        "collection.include.list": f"{database}\\..*",
        "snapshot.chunk.size": 50,
        "snapshot.max.threads": 2,
        "provide.transaction.metadata": True,
        **extra,
    }


def snapshot(uri: str, kafka: dict[str, Any], props: dict[str, Any], **params: Any) -> dict[str, Any]:
    """A snapshot (``params``: ``force``, ``reset_offset``, ``collections``), in this process."""
    spec = JobSpec("snapshot", props, {"connection_string": uri}, dict(kafka), params)
    return run_snapshot(spec, ThreadChunkTasks())


def window(uri: str, kafka: dict[str, Any], props: dict[str, Any], marker_db: str) -> dict[str, Any]:
    """A window up to now (the server's cluster time passed first), in this process."""
    with MongoClient(uri) as client:
        end = next_second(insert_at(client[marker_db]["markers"], {"at": 1}))
        pass_second(client, end, marker_db)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60)
    return run_window(target, config, kafka, params)


FORMATS = ("delta", "iceberg")


def apply(
    kafka: dict[str, Any], props: dict[str, Any], delta: dict[str, Any], **params: Any
) -> dict[str, Any]:
    """The table apply application's job, in this process (its driver path, no SparkContext);
    ``delta``: the table settings (Delta unless they name a ``format``)."""
    key = "tables" if "format" in delta else "delta"
    spec = JobSpec("delta_apply", props, {}, dict(kafka), {key: delta, "in_driver": True, **params})
    return delta_apply_job(None, spec)


def is_iceberg(path: str | Path) -> bool:
    path = Path(path)
    return not (path / "_delta_log").exists() and (path.parent.parent / "catalog.db").exists()


def iceberg_table(path: str | Path):
    """The Iceberg table of ``<location>/<database>/<collection>``, loaded by pyiceberg itself."""
    from pyiceberg.catalog import load_catalog

    path = Path(path)
    location = path.parent.parent
    catalog = load_catalog(
        "mongocdc", type="sql", uri=f"sqlite:///{location}/catalog.db", warehouse=f"file://{location}"
    )
    return catalog.load_table((path.parent.name, path.name))


def arrow_rows(path: str | Path):
    """A table's rows as an Arrow table: deltalake's reader, or pyiceberg's checked against polars'."""
    if not is_iceberg(path):
        return DeltaTable(str(path)).to_pyarrow_table()
    import os

    import polars

    os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")
    table = iceberg_table(path)
    rows = table.scan().to_arrow()
    by_polars = polars.scan_iceberg(table).collect().sort("_id")
    assert by_polars["_id"].to_list() == sorted(rows.column("_id").to_pylist())
    assert by_polars["_doc"].to_list() == [
        row["_doc"] for row in sorted(rows.select(["_id", "_doc"]).to_pylist(), key=lambda row: row["_id"])
    ], "polars read other documents than pyiceberg"
    return rows


def table_version(path: str | Path) -> int:
    """A table's version: Delta's, or the sequence number of the Iceberg table's current snapshot."""
    if not is_iceberg(path):
        return DeltaTable(str(path)).version()
    snapshot = iceberg_table(path).current_snapshot()
    return 0 if snapshot is None else snapshot.sequence_number


def table_documents(path: str | Path) -> dict[Any, dict[str, Any]]:
    """The live rows of a table (:func:`arrow_rows`): ``{_id: document}``."""
    table = arrow_rows(path)
    rows = table.to_pylist()
    found = {}
    for row in rows:
        if row.get("_deleted"):
            continue
        document = json_util.loads(row["_doc"], json_options=DECODE)
        key = json_util.loads(row["_id"], json_options=DECODE)
        assert key == document["_id"], row
        found[_hashable(key)] = document
    return found


def mongo_documents(uri: str, database: str, collection: str) -> dict[Any, dict[str, Any]]:
    with MongoClient(uri, tz_aware=True) as client:
        return {_hashable(doc["_id"]): doc for doc in client[database][collection].find()}


def _hashable(value: Any) -> Any:
    return (
        json.dumps(json.loads(json_util.dumps(value)), sort_keys=True) if isinstance(value, dict) else value
    )


def table_rows(path: str | Path) -> list[dict[str, Any]]:
    return arrow_rows(path).to_pylist()


def apply_commits(path: str | Path) -> list[dict[str, Any]]:
    """The apply's commits of a table, oldest first: the metadata each recorded (a Delta commit's,
    an Iceberg snapshot's summary properties)."""
    if not is_iceberg(path):
        history = DeltaTable(str(path)).history()
        return [entry for entry in reversed(history) if "mongocdc.positions" in entry]
    table = iceberg_table(path)
    snapshots = []
    snapshot = table.current_snapshot()
    while snapshot is not None:
        snapshots.append(snapshot)
        parent = snapshot.parent_snapshot_id
        snapshot = table.snapshot_by_id(parent) if parent is not None else None
    commits = []
    for snapshot in reversed(snapshots):
        properties = dict(snapshot.summary.additional_properties)
        if "mongocdc.positions" not in properties:
            continue
        commits.append(
            {
                key: json.loads(value) if key.startswith("mongocdc.") else value
                for key, value in properties.items()
            }
        )
    return commits


def recorded(path: str | Path, app_id: str) -> int | None:
    """What a table records of its apply under ``app_id``: a Delta application transaction's
    version, or the Iceberg table's current snapshot summary property."""
    if not is_iceberg(path):
        return DeltaTable(str(path)).transaction_version(app_id)
    snapshot = iceberg_table(path).current_snapshot()
    value = None if snapshot is None else snapshot.summary.get(app_id)
    return None if value is None else int(value)
