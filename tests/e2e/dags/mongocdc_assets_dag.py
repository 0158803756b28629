"""A snapshot then a window of one connector, for the Assets, metrics and lineage test. The snapshot
gets its topic.prefix at parse time (its outlet is the connector's Asset); the window gets it from a
template (its outlet is the AssetAlias to which the run attaches the connector's Asset)."""

import json
import os

import pendulum
from airflow.sdk import DAG

from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

PREFIX = os.environ.get("MONGOCDC_ASSETS_PREFIX", "assets")
PROPS = {"topic.prefix": PREFIX, "collection.include.list": "shop\\..*"}

with DAG(
    dag_id="mongocdc_assets_producer",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
):
    snapshot = MongoSnapshotOperator(task_id="snapshot", connector_config=PROPS)
    window = MongoStreamWindowOperator(
        task_id="window",
        connector_config=json.dumps({**PROPS, "topic.prefix": "{{ var.value.mongocdc_assets_prefix }}"}),
    )
    snapshot >> window
