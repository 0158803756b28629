"""Airflow hook for the Kafka cluster the events and offsets go to.

As in apache-airflow-providers-apache-kafka, the connection's extra IS the librdkafka configuration
(``{"bootstrap.servers": "...", "security.protocol": "SASL_SSL", ...}``); that provider's ``kafka``
connections are read as they are (it is not required). This provider's own type is
``mongocdc_kafka``, whose form fields ``bootstrap.servers``, ``security.protocol`` and
``sasl.mechanism`` Airflow stores in the extra under those keys. A key left empty (null or blank)
is not set and falls back to ``extra__<connection type>__<key>``, then, for ``bootstrap.servers``
only, to the host (and port); ``sasl.mechanism`` wins over librdkafka's alias ``sasl.mechanisms``;
the login and password fill ``sasl.username``/``sasl.password`` when the extra does not. Why a type
of its own: docs/design.md, "Kafka connections".
"""

from __future__ import annotations

import json
from typing import Any

from airflow.sdk import BaseHook
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.kafka.admin import admin_client
from airflow_provider_mongocdc.core.kafka.client import redact_config

CONN_TYPE = "mongocdc_kafka"
ACCEPTED_CONN_TYPES = (CONN_TYPE, "kafka")
# The fields of the connection form (get_provider_info.py's conn-fields): librdkafka keys.
FORM_FIELDS = ("bootstrap.servers", "security.protocol", "sasl.mechanism")


def _unset(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value.strip())


def kafka_config_from_connection(conn) -> dict[str, Any]:
    """The librdkafka configuration of an Airflow Kafka connection (see the module's docstring for
    how the form's fields, the extra's keys, the host and login/password combine)."""
    if conn.conn_type and conn.conn_type not in ACCEPTED_CONN_TYPES:
        raise ConfigError(
            f"Connection {conn.conn_id!r} has type {conn.conn_type!r}",
            cause="the Kafka settings are read from a Kafka connection",
            fix="use a connection of type 'mongocdc_kafka' or 'kafka' whose extra is the "
            "librdkafka configuration",
        )
    extras = conn.extra_dejson
    if isinstance(extras, str) or not isinstance(extras, dict):
        raise ConfigError(
            f"The extra of Kafka connection {conn.conn_id!r} is not a JSON object",
            fix='set it to the librdkafka configuration, e.g. {"bootstrap.servers": "host:9092"}',
        )
    # null is no librdkafka value: it is what the form stores for a field left empty.
    config = {
        key: value for key, value in extras.items() if not key.startswith("extra__") and value is not None
    }
    for field in FORM_FIELDS:
        if _unset(config.get(field)):
            config.pop(field, None)
            prefixed = extras.get(f"extra__{conn.conn_type or CONN_TYPE}__{field}")
            if not _unset(prefixed):
                config[field] = prefixed
    plural = config.pop("sasl.mechanisms", None)
    if "sasl.mechanism" not in config and not _unset(plural):
        config["sasl.mechanism"] = plural
    if not config.get("bootstrap.servers") and conn.host:
        hosts = (
            conn.host
            if conn.port is None or "," in conn.host or ":" in conn.host
            else f"{conn.host}:{conn.port}"
        )
        config["bootstrap.servers"] = hosts
    if conn.login and "sasl.username" not in config:
        config["sasl.username"] = conn.login
    if conn.password and "sasl.password" not in config:
        config["sasl.password"] = conn.password
    if not config.get("bootstrap.servers"):
        raise ConfigError(
            f"Kafka connection {conn.conn_id!r} has no bootstrap.servers",
            cause="neither its form field 'Bootstrap servers' nor the extra's key bootstrap.servers "
            "(nor its host) is set",
            fix="fill in 'Bootstrap servers' in the connection form (e.g. broker1:9092,broker2:9092), "
            'or add "bootstrap.servers": "broker1:9092,broker2:9092" to its extra',
        )
    return config


class KafkaConfigHook(BaseHook):
    """The librdkafka configuration of a Kafka connection (type ``mongocdc_kafka`` or ``kafka``).

    :param kafka_conn_id: the Airflow connection.
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = "kafka_default"
    conn_type = CONN_TYPE
    hook_name = "Apache Kafka (for MongoDB CDC)"

    def __init__(self, kafka_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kafka_conn_id = kafka_conn_id

    def get_kafka_config(self) -> dict[str, Any]:
        """The librdkafka configuration (with secrets: never log it; use :meth:`describe`)."""
        return kafka_config_from_connection(self.get_connection(self.kafka_conn_id))

    def describe(self) -> str:
        return json.dumps(redact_config(self.get_kafka_config()), sort_keys=True)

    def get_conn(self) -> AdminClient:
        """An AdminClient, as apache-airflow-providers-apache-kafka's hooks return."""
        return admin_client(self.get_kafka_config())

    def test_connection(self) -> tuple[bool, str]:
        try:
            metadata = self.get_conn().list_topics(timeout=10)
        except (KafkaException, ConfigError) as error:
            return False, str(error)
        return True, f"Connected: {len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)"
