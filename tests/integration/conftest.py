"""Fixtures shared by the integration tests."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def kafka_config(kafka_bootstrap) -> dict[str, str]:
    """The Kafka client configuration of the test broker."""
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture
def gap_connections(monkeypatch, kafka_bootstrap, unique_name):
    """Airflow connections (environment variables) of the test broker and of a MongoDB URI given
    later: ``gap_connections(uri)`` sets the MongoDB one and returns ``{"mongo": id, "kafka": id}``."""
    ids = {"mongo": f"mongo_{unique_name}".lower(), "kafka": f"kafka_{unique_name}".lower()}
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{ids['kafka'].upper()}",
        json.dumps({"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}),
    )

    def use(uri: str) -> dict[str, str]:
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{ids['mongo'].upper()}", json.dumps({"conn_type": "mongocdc", "host": uri})
        )
        return ids

    return use
