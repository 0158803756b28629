"""Example consumer DAG: runs after a connector's stream windows (and its snapshots that copied data).

The provider's snapshot and window tasks update the connector's Asset, ``mongocdc://<topic.prefix>``
(:func:`airflow_provider_mongocdc.lineage.connector_asset`), and each asset event's ``extra`` holds
the run's summary: ``connector``, ``run`` (``snapshot`` or ``stream_window``), ``topics`` (events or
documents per Kafka topic), ``events_by_collection`` / ``documents_by_collection``, ``bytes``,
``window_end`` and ``end_position``. This DAG reads that summary and lists the topics that received
data, e.g. to start the downstream jobs that read them.

The connector is named by the environment variable ``MONGOCDC_CONSUMER_TOPIC_PREFIX`` (default
``shop``), read when the DAG is parsed: the Asset is part of the DAG's schedule.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task

from airflow_provider_mongocdc.lineage import connector_asset

CONNECTOR = connector_asset(os.environ.get("MONGOCDC_CONSUMER_TOPIC_PREFIX", "shop"))

with DAG(
    dag_id="mongocdc_consumer_example",
    schedule=[CONNECTOR],
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    tags=["mongocdc", "example"],
    doc_md=__doc__,
):

    @task
    def topics_with_new_data(triggering_asset_events=None) -> dict[str, int]:
        """Events per topic over the runs that triggered this one."""
        totals: dict[str, int] = {}
        for event in (triggering_asset_events or {}).get(CONNECTOR, []):
            summary = event.extra or {}
            print(
                f"{summary.get('run')} of {summary.get('connector')}: {summary.get('topics')} "
                f"up to {summary.get('window_end') or summary.get('end_position')}"
            )
            for topic, count in (summary.get("topics") or {}).items():
                totals[topic] = totals.get(topic, 0) + int(count)
        return totals

    topics_with_new_data()
