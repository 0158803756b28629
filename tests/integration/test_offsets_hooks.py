"""KafkaConfigHook and OffsetStoreHook over Airflow connections, on the real broker."""

from __future__ import annotations

import json

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook
from airflow_provider_mongocdc.hooks.offsets import OffsetStoreHook
from devtools.kafka.reading import wait_stable

pytestmark = pytest.mark.integration


def set_connection(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_kafka_connection_of_the_apache_kafka_provider_is_read_as_librdkafka_config(
    monkeypatch, kafka_bootstrap
):
    set_connection(
        monkeypatch,
        "kafka_shared",
        conn_type="kafka",
        extra={"bootstrap.servers": kafka_bootstrap, "client.id": "shared"},
    )
    hook = KafkaConfigHook("kafka_shared")
    assert hook.get_kafka_config() == {"bootstrap.servers": kafka_bootstrap, "client.id": "shared"}
    ok, message = hook.test_connection()
    assert ok, message
    assert "broker" in message


def test_mongocdc_kafka_connection_takes_sasl_credentials_from_login_and_password(monkeypatch):
    set_connection(
        monkeypatch,
        "kafka_sasl",
        conn_type="mongocdc_kafka",
        login="svc",
        password="kafka-secret",
        extra={
            "bootstrap.servers": "b1:9093,b2:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-512",
        },
    )
    hook = KafkaConfigHook("kafka_sasl")
    config = hook.get_kafka_config()
    assert config["sasl.username"] == "svc" and config["sasl.password"] == "kafka-secret"
    assert "kafka-secret" not in hook.describe() and '"sasl.username": "svc"' in hook.describe()


def test_kafka_connection_without_bootstrap_servers_is_refused(monkeypatch):
    set_connection(monkeypatch, "kafka_empty", conn_type="kafka", extra={"client.id": "x"})
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        KafkaConfigHook("kafka_empty").get_kafka_config()
    set_connection(monkeypatch, "kafka_wrong_type", conn_type="http", extra={"bootstrap.servers": "b:9092"})
    with pytest.raises(ConfigError, match="mongocdc_kafka"):
        KafkaConfigHook("kafka_wrong_type").get_kafka_config()


def test_offset_store_hook_shows_sets_and_resets(monkeypatch, kafka_bootstrap, unique_name):
    set_connection(
        monkeypatch, "kafka_offsets", conn_type="kafka", extra={"bootstrap.servers": kafka_bootstrap}
    )
    hook = OffsetStoreHook("kafka_offsets", topic_prefix=unique_name)
    assert hook.offsets_topic == f"{unique_name}.offsets"
    assert hook.show()["partitions"] == []

    before, after = hook.set_position("rs0", cluster_time=Timestamp(1714557600, 2))
    assert before is None and after.cluster_time == Timestamp(1714557600, 2)
    # Each read below follows a commit: wait for its markers (see tests/settled_offsets.py).
    wait_stable(kafka_bootstrap, hook.offsets_topic)
    before, after = hook.set_position(
        "rs0", resume_token={"_data": "82AB"}, cluster_time=Timestamp(1714557601, 1)
    )
    assert before.cluster_time == Timestamp(1714557600, 2) and after.resume_token == {"_data": "82AB"}
    wait_stable(kafka_bootstrap, hook.offsets_topic)
    shown = hook.show()
    assert shown["topic"] == f"{unique_name}.offsets"
    assert [(p["partition"]["rs"], p["offset"]["resume_token"]) for p in shown["partitions"]] == [
        ("rs0", "82AB")
    ]
    assert hook.read("rs0").cluster_time == Timestamp(1714557601, 1)

    before, after = hook.reset("rs0")
    assert before.resume_token == {"_data": "82AB"} and after is None
    wait_stable(kafka_bootstrap, hook.offsets_topic)
    assert hook.read("rs0") is None and hook.show()["partitions"] == []


def test_offset_store_hook_honours_offset_storage_topic(monkeypatch, kafka_bootstrap, unique_name):
    set_connection(
        monkeypatch, "kafka_offsets2", conn_type="kafka", extra={"bootstrap.servers": kafka_bootstrap}
    )
    hook = OffsetStoreHook(
        "kafka_offsets2", topic_prefix=unique_name, offsets_topic=f"{unique_name}.custom-offsets"
    )
    hook.set_position("cluster", cluster_time=Timestamp(7, 1))
    wait_stable(kafka_bootstrap, f"{unique_name}.custom-offsets")
    assert hook.show()["topic"] == f"{unique_name}.custom-offsets"
    assert OffsetStoreHook("kafka_offsets2", topic_prefix=unique_name).read("cluster") is None
    with pytest.raises(ConfigError):
        OffsetStoreHook("kafka_offsets2")
