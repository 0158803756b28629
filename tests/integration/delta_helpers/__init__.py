"""Helpers of the Delta apply tests: a snapshot and windows run in this process, the apply run in
this process (the application's driver path), and the tables read by deltalake's own reader
(pyarrow), which is not the provider's code, compared with MongoDB."""

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


def apply(
    kafka: dict[str, Any], props: dict[str, Any], delta: dict[str, Any], **params: Any
) -> dict[str, Any]:
    """The Delta apply application's job, in this process (its driver path, no SparkContext)."""
    spec = JobSpec("delta_apply", props, {}, dict(kafka), {"delta": delta, "in_driver": True, **params})
    return delta_apply_job(None, spec)


def table_documents(path: str | Path) -> dict[Any, dict[str, Any]]:
    """The live rows of a table, read by deltalake (pyarrow): ``{_id: document}``."""
    table = DeltaTable(str(path)).to_pyarrow_table()
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
    return DeltaTable(str(path)).to_pyarrow_table().to_pylist()


def apply_commits(path: str | Path) -> list[dict[str, Any]]:
    """The apply's commits of a table, oldest first: the metadata each recorded."""
    history = DeltaTable(str(path)).history()
    return [entry for entry in reversed(history) if "mongocdc.positions" in entry]
