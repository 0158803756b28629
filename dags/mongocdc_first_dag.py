"""The README's first DAG: a snapshot, then hourly windows, of two collections to Kafka.

Copy it into your DAG folder and adapt the configuration. ``.airflowignore`` keeps it out of this
repository's DAG folder, where the connector ``default`` of ``mongocdc_connectors.json`` already
captures the topic prefix ``shop``: two connectors must never share a topic prefix.
"""

# START first_dag
import pendulum
from airflow.sdk import DAG

from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

CONFIG = {
    "topic.prefix": "shop",
    "collection.include.list": "shop[.](orders|customers)",
    "provide.transaction.metadata": "true",
    "snapshot.max.threads": "4",
}

with DAG(
    "shop_cdc",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
):
    common = dict(
        connector_config=CONFIG,
        mongo_conn_id="mongocdc_default",
        kafka_conn_id="kafka_default",
        spark_conn_id="spark_default",
        pool="mongocdc_shop",
    )
    snapshot = MongoSnapshotOperator(task_id="snapshot", **common)
    window = MongoStreamWindowOperator(task_id="window", **common)
    snapshot >> window
# END first_dag
