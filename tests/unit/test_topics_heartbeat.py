"""Topic names and heartbeat records."""

from __future__ import annotations

import json

import pytest

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.heartbeat import Heartbeat
from airflow_provider_mongocdc.core.events.schema import adjust_schema_name
from airflow_provider_mongocdc.core.events.topics import TopicNamer, sanitize_topic_name

pytestmark = pytest.mark.unit


def config(**props) -> ConnectorConfig:
    return ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})


def test_debezium_topic_names():
    namer = TopicNamer(config())
    assert [
        namer.data_topic("inventory", c) for c in ("products", "products_on_hand", "customers", "orders")
    ] == [
        "fulfillment.inventory.products",
        "fulfillment.inventory.products_on_hand",
        "fulfillment.inventory.customers",
        "fulfillment.inventory.orders",
    ]
    assert namer.transaction_topic == "fulfillment.transaction"
    assert namer.heartbeat_topic == "__debezium-heartbeat.fulfillment"
    assert namer.offsets_topic == "fulfillment.offsets"


def test_topic_name_options():
    namer = TopicNamer(
        config(**{"topic.delimiter": "_", "topic.transaction": "tx", "heartbeat.topics.prefix": "hb"})
    )
    assert namer.data_topic("inventory", "orders") == "fulfillment_inventory_orders"
    assert namer.transaction_topic == "fulfillment_tx"
    assert namer.heartbeat_topic == "hb_fulfillment"
    assert (
        TopicNamer(config(**{"topic.heartbeat.name": "all-heartbeats"})).heartbeat_topic == "all-heartbeats"
    )


def test_topic_names_keep_only_kafka_characters():
    assert sanitize_topic_name("p.my db.café$x") == "p.my_db.caf__x"
    assert sanitize_topic_name("p.db." + "c" * 300) == ("p.db." + "c" * 300)[:249]
    namer = TopicNamer(config())
    assert namer.data_topic("my-db", "a.b c") == "fulfillment.my-db.a.b_c"


@pytest.mark.parametrize(
    ("name", "mode", "adjusted"),
    [
        ("fulfillment.inventory.customers.Envelope", "avro", "fulfillment.inventory.customers.Envelope"),
        ("my-server.inventory.orders.Key", "avro", "my_server.inventory.orders.Key"),
        ("1st.db.c.Key", "avro", "_st.db.c.Key"),
        ("my-server.a_b.Key", "avro_unicode", "my_u002dserver.a_u005fb.Key"),
        ("my-server.x.Key", "none", "my-server.x.Key"),
    ],
)
def test_schema_names_follow_avro_rules(name, mode, adjusted):
    assert adjust_schema_name(name, mode) == adjusted


def test_heartbeat_record_shape():
    heartbeat = Heartbeat(config(**{"heartbeat.interval.ms": 1000}))
    record = heartbeat.record(1_700_000_000_000)
    assert record.topic == "__debezium-heartbeat.fulfillment"
    key, value = json.loads(record.key), json.loads(record.value)
    assert key == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "string", "optional": False, "field": "serverName"}],
            "optional": False,
            "name": "io.debezium.connector.common.ServerNameKey",
            "version": 1,
        },
        "payload": {"serverName": "fulfillment"},
    }
    assert value == {
        "schema": {
            "type": "struct",
            "fields": [{"type": "int64", "optional": False, "field": "ts_ms"}],
            "optional": False,
            "name": "io.debezium.connector.common.Heartbeat",
            "version": 1,
        },
        "payload": {"ts_ms": 1_700_000_000_000},
    }


def test_heartbeats_are_due_once_per_interval():
    heartbeat = Heartbeat(config(**{"heartbeat.interval.ms": 1000}))
    assert heartbeat.maybe(10_000) is not None
    assert heartbeat.maybe(10_500) is None
    assert heartbeat.maybe(11_000) is not None
    disabled = Heartbeat(config())
    assert not disabled.enabled and disabled.maybe(10_000) is None


def test_payload_only_heartbeat():
    heartbeat = Heartbeat(
        config(**{"key.converter.schemas.enable": "false", "value.converter.schemas.enable": "false"})
    )
    record = heartbeat.record(5)
    assert json.loads(record.key) == {"serverName": "fulfillment"}
    assert json.loads(record.value) == {"ts_ms": 5}
