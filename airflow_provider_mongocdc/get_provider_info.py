"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_mongocdc import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-mongocdc",
        "name": "MongoDB CDC",
        "description": "MongoDB change data capture: Debezium-compatible change events from "
        "snapshots and bounded change-stream windows, run on Spark, delivered exactly once to Kafka.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "MongoDB CDC",
                "external-doc-url": "https://debezium.io/documentation/reference/stable/connectors/mongodb.html",
                "tags": ["software"],
            }
        ],
        "hooks": [],
        "operators": [],
        "sensors": [],
        "triggers": [],
        "connection-types": [],
        "extra-links": [],
    }
