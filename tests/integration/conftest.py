"""Fixtures shared by the integration tests."""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def kafka_config(kafka_bootstrap) -> dict[str, str]:
    """The Kafka client configuration of the test broker."""
    return {"bootstrap.servers": kafka_bootstrap}


@pytest.fixture
def new_offsets_store(kafka_config, unique_name):
    """``new_offsets_store(store_class)``: a ``store_class`` (an OffsetStore) of the test's offsets
    topic ``<unique_name>.offsets`` on the test broker, the topic created."""

    def make(store_class):
        store = store_class(kafka_config, f"{unique_name}.offsets")
        store.ensure_topic()
        return store

    return make


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


@pytest.fixture
def operator_connections(monkeypatch):
    """``operator_connections(name, mongo_uri, kafka, master="local[2]")``: the Airflow connections
    (environment variables) ``<name>_mongo`` of a MongoDB URI, ``<name>_kafka`` of a Kafka client
    configuration and ``<name>_spark`` of a Spark master; returns the operator's keyword arguments
    naming them, with Spark's UI off."""

    def use(name: str, mongo_uri: str, kafka: dict, master: str = "local[2]") -> dict:
        for conn_id, fields in (
            (f"{name}_mongo", {"conn_type": "mongocdc", "host": mongo_uri}),
            (f"{name}_kafka", {"conn_type": "mongocdc_kafka", "extra": kafka}),
            (f"{name}_spark", {"conn_type": "spark", "host": master}),
        ):
            monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
        return {
            "mongo_conn_id": f"{name}_mongo",
            "kafka_conn_id": f"{name}_kafka",
            "spark_conn_id": f"{name}_spark",
            "conf": {"spark.ui.enabled": "false"},
        }

    return use
