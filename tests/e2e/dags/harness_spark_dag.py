"""A tiny DAG for the harness test: one SparkSubmitOperator whose executors produce to Kafka."""

import os

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import DAG

with DAG(
    dag_id="mongocdc_harness_spark",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
):
    SparkSubmitOperator(
        task_id="produce",
        conn_id="spark_harness",
        application=os.environ.get("HARNESS_JOB", "produce_job.py"),
        application_args=[
            os.environ.get("HARNESS_BOOTSTRAP", ""),
            os.environ.get("HARNESS_TOPIC", ""),
            "50",
            "2",
        ],
        conf={"spark.ui.enabled": "false"},
    )
