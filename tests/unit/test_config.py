"""Connector configuration: Debezium property names, defaults, validation and error messages."""

from __future__ import annotations

import json
import pickle

import pytest

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.properties import PROPERTIES

pytestmark = pytest.mark.unit


def config(**props) -> ConnectorConfig:
    return ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})


def error_of(props: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        ConnectorConfig.from_properties(props)
    return info.value


def test_defaults_follow_debezium():
    c = config()
    assert c.topic_prefix == "fulfillment"
    assert c.capture_mode == "change_streams_update_full"
    assert c.capture_scope == "deployment"
    assert c.snapshot_mode == "initial"
    assert c.snapshot_max_threads == 1
    assert c.snapshot_fetch_size == 0
    assert c.max_batch_size == 2048
    assert c.tombstones_on_delete is True
    assert c.provide_transaction_metadata is False
    assert c.heartbeat_interval_ms == 0
    assert c.topic_heartbeat_prefix == "__debezium-heartbeat"
    assert c.skipped_operations == frozenset({"t"})
    assert (c.connect_backoff_initial_delay_ms, c.connect_backoff_max_delay_ms, c.connect_max_attempts) == (
        1000,
        120000,
        16,
    )
    assert c.mongodb_members_auto_discover is True
    assert c.mongodb_connection_mode == "sharded"
    assert c.key_converter_schemas_enable and c.value_converter_schemas_enable
    assert c.event_format == "change_streams"
    assert c.extended_json_mode == "strict"
    assert c.offsets_topic == "fulfillment.offsets"
    assert c.warnings == ()


def test_values_written_as_strings_or_json_types():
    from_strings = config(
        **{
            "max.batch.size": "100",
            "tombstones.on.delete": "false",
            "provide.transaction.metadata": "TRUE",
            "snapshot.max.threads": " 4 ",
            "capture.mode": "Change_Streams",
        }
    )
    from_json = config(
        **{
            "max.batch.size": 100,
            "tombstones.on.delete": False,
            "provide.transaction.metadata": True,
            "snapshot.max.threads": 4,
            "capture.mode": "change_streams",
        }
    )
    assert from_strings == from_json
    assert from_json.max_batch_size == 100 and from_json.tombstones_on_delete is False
    assert from_json.provide_transaction_metadata is True
    assert from_json.capture_mode == "change_streams"


def test_lists_are_comma_separated_and_keep_commas_inside_regex_quantifiers():
    c = config(**{"collection.include.list": "inventory[.]*, shop\\.orders_[0-9]{1,3} ,,"})
    assert c.collection_include_list == ("inventory[.]*", "shop\\.orders_[0-9]{1,3}")


def test_to_properties_round_trips_through_json():
    original = config(
        **{
            "collection.include.list": "inventory[.].*,shop.orders_[0-9]{1,3}",
            "skipped.operations": "u,d",
            "field.renames": "inventory.customers.email:mail",
            "field.exclude.list": "*.*.secret",
            "capture.scope": "database",
            "capture.target": "inventory",
            "snapshot.collection.filter.overrides": "inventory.orders",
            "snapshot.collection.filter.overrides.inventory.orders": '{"status": "open"}',
            "heartbeat.interval.ms": 5000,
            "event.format": "oplog",
            "sanitize.field.names": "true",
        }
    )
    properties = original.to_properties()
    assert json.loads(json.dumps(properties)) == properties
    rebuilt = ConnectorConfig.from_properties(json.loads(json.dumps(properties)))
    assert rebuilt == original
    assert rebuilt.warnings == ()  # canonical names only: no deprecation warning on the way back
    assert properties["topic.prefix"] == "fulfillment"
    assert "max.batch.size" not in properties  # defaults are not repeated


def test_round_trip_of_defaults_only():
    c = config()
    assert c.to_properties() == {"topic.prefix": "fulfillment"}
    assert ConnectorConfig.from_properties(c.to_properties()) == c


def test_one_bad_value_names_property_value_and_allowed_values():
    error = error_of({"topic.prefix": "fulfillment", "snapshot.mode": "sometimes"})
    text = str(error)
    assert "snapshot.mode" in text and "'sometimes'" in text
    for allowed in ("initial", "always", "initial_only", "no_data", "when_needed"):
        assert allowed in text
    assert "Fix:" in text
    assert error.problems == (error.problems[0],)


def test_several_bad_values_are_reported_together():
    error = error_of(
        {
            "topic.prefix": "bad prefix!",
            "snapshot.mode": "sometimes",
            "max.batch.size": "-5",
            "tombstones.on.delete": "maybe",
            "capture.mode": "oplog",
        }
    )
    assert len(error.problems) == 5
    text = str(error)
    assert "5 problems" in text
    for fragment in (
        "topic.prefix",
        "'bad prefix!'",
        "snapshot.mode",
        "max.batch.size",
        "'-5'",
        ">= 1",
        "tombstones.on.delete",
        "true or false",
        "capture.mode",
        "event.format=oplog",
    ):
        assert fragment in text, fragment


def test_unknown_property_suggests_the_closest_name():
    error = error_of({"topic.prefix": "x", "tombstone.on.delete": "true"})
    assert "'tombstone.on.delete' is unknown" in str(error)
    assert "did you mean 'tombstones.on.delete'" in str(error)
    error = error_of({"topic.prefix": "x", "colection.include.list": "a.b"})
    assert "did you mean 'collection.include.list'" in str(error)
    error = error_of({"topic.prefix": "x", "zzz": "1"})
    assert "'zzz' is unknown" in str(error) and "docs/configuration.md" in str(error)


def test_topic_prefix_is_required_and_validated():
    error = error_of({})
    assert "'topic.prefix' is required" in str(error)
    error = error_of({"topic.prefix": ""})
    assert "topic.prefix" in str(error) and "is empty" in str(error)
    error = error_of({"topic.prefix": "a/b"})
    assert "letters, digits" in str(error)
    assert config().topic_prefix == "fulfillment"
    assert (
        ConnectorConfig.from_properties({"topic.prefix": "my-server.v2_x"}).topic_prefix == "my-server.v2_x"
    )


def test_deprecated_aliases_are_accepted_with_a_warning(caplog):
    c = ConnectorConfig.from_properties(
        {
            "mongodb.name": "legacy",
            "heartbeat.topics.prefix": "hb",
            "collection.whitelist": "a.b",
            "sanitize.field.names": "true",
        }
    )
    assert c.topic_prefix == "legacy"
    assert c.topic_heartbeat_prefix == "hb"
    assert c.collection_include_list == ("a.b",)
    assert c.field_name_adjustment_mode == "avro"
    assert any("'mongodb.name' is deprecated; use 'topic.prefix'" in w for w in c.warnings)
    assert "mongodb.name" in caplog.text


def test_alias_and_canonical_name_with_different_values_conflict():
    error = error_of({"topic.prefix": "a", "mongodb.name": "b"})
    assert "'topic.prefix'" in str(error) and "'mongodb.name'" in str(error)
    assert config(**{"mongodb.name": "fulfillment"}).topic_prefix == "fulfillment"


def test_kafka_connect_properties_without_effect_are_ignored_with_a_reason():
    c = config(
        **{
            "name": "inventory-connector",
            "tasks.max": "4",
            "connector.class": "io.debezium.connector.mongodb.MongoDbConnector",
            "key.converter": "org.apache.kafka.connect.json.JsonConverter",
            "value.converter.schemas.enable": "false",
            "producer.override.acks": "1",
        }
    )
    assert c.value_converter_schemas_enable is False
    ignored = [w for w in c.warnings if "is ignored because" in w]
    assert any("'tasks.max'" in w for w in ignored)
    assert any("'producer.override.acks'" in w for w in ignored)
    # Kafka Connect's name is the connector's name: a topic prefix belongs to one connector.
    assert c.name == "inventory-connector" and not any("'name'" in w for w in c.warnings)


def test_properties_that_would_change_output_or_carry_secrets_are_refused():
    error = error_of(
        {
            "topic.prefix": "x",
            "transforms": "unwrap",
            "transforms.unwrap.type": "io.debezium...",
            "mongodb.connection.string": "mongodb://admin:hunter2@db:27017",
            "mongodb.password": "hunter2",
            "signal.data.collection": "db.signals",
            "key.converter": "io.confluent.connect.avro.AvroConverter",
        }
    )
    text = str(error)
    assert "hunter2" not in text  # secrets are never echoed
    assert "Airflow MongoDB connection" in text
    for name in (
        "transforms",
        "transforms.unwrap.type",
        "mongodb.password",
        "signal.data.collection",
        "mongodb.connection.string",
        "key.converter",
    ):
        assert f"'{name}'" in text, name
    assert "JsonConverter" in text


def test_secret_values_are_hidden_even_when_invalid_elsewhere():
    error = error_of({"topic.prefix": "x", "mongodb.ssl.keystore.password": "s3cr3t"})
    assert "s3cr3t" not in str(error)


def test_include_and_exclude_lists_are_mutually_exclusive():
    error = error_of(
        {"topic.prefix": "x", "collection.include.list": "a.b", "collection.exclude.list": "a.c"}
    )
    assert "'collection.include.list' and 'collection.exclude.list'" in str(error)
    error = error_of({"topic.prefix": "x", "database.include.list": "a", "database.exclude.list": "b"})
    assert "'database.include.list' and 'database.exclude.list'" in str(error)


def test_invalid_regular_expression_is_reported():
    error = error_of({"topic.prefix": "x", "collection.include.list": "inventory.(orders"})
    assert "collection.include.list" in str(error)
    assert "invalid regular expression 'inventory.(orders'" in str(error)


def test_capture_scope_needs_a_matching_target():
    assert (
        config(**{"capture.scope": "database", "capture.target": "inventory"}).capture_target == "inventory"
    )
    assert (
        config(**{"capture.scope": "collection", "capture.target": "inventory.orders"}).capture_target
        == "inventory.orders"
    )
    assert "capture.target" in str(error_of({"topic.prefix": "x", "capture.scope": "database"}))
    assert "<db>.<collection>" in str(
        error_of({"topic.prefix": "x", "capture.scope": "collection", "capture.target": "inventory"})
    )
    c = config(**{"capture.target": "inventory"})
    assert c.capture_target is None and any("capture.target" in w for w in c.warnings)


def test_skipped_operations():
    assert config(**{"skipped.operations": "none"}).skipped_operations == frozenset()
    assert config(**{"skipped.operations": "c, D"}).skipped_operations == frozenset({"c", "d"})
    text = str(error_of({"topic.prefix": "x", "skipped.operations": "c,r"}))
    assert "skipped.operations" in text and "unknown operation(s) r" in text
    assert "'none' alone" in str(error_of({"topic.prefix": "x", "skipped.operations": "none,c"}))


def test_snapshot_mode_never_is_a_deprecated_no_data():
    c = config(**{"snapshot.mode": "never"})
    assert c.snapshot_mode == "no_data" and not c.snapshots_data
    assert any("never" in w for w in c.warnings)
    assert "snapshotter" in str(error_of({"topic.prefix": "x", "snapshot.mode": "custom"}))


def test_snapshot_collection_filter_overrides():
    c = config(
        **{
            "snapshot.collection.filter.overrides": "inventory.orders,shop.items",
            "snapshot.collection.filter.overrides.inventory.orders": '{"status": "open"}',
            "snapshot.collection.filter.overrides.shop.items": '{"updated": {"$gte": {"$date": "2024-01-01T00:00:00Z"}}}',
        }
    )
    assert c.filter_overrides == {
        "inventory.orders": '{"status": "open"}',
        "shop.items": '{"updated": {"$gte": {"$date": "2024-01-01T00:00:00Z"}}}',
    }
    text = str(error_of({"topic.prefix": "x", "snapshot.collection.filter.overrides": "inventory.orders"}))
    assert "'snapshot.collection.filter.overrides.inventory.orders' is missing" in text
    text = str(error_of({"topic.prefix": "x", "snapshot.collection.filter.overrides.inventory.orders": "{}"}))
    assert "not listed" in text
    text = str(
        error_of(
            {
                "topic.prefix": "x",
                "snapshot.collection.filter.overrides": "inventory.orders",
                "snapshot.collection.filter.overrides.inventory.orders": "{status:",
            }
        )
    )
    assert "snapshot.collection.filter.overrides.inventory.orders" in text
    assert "not valid JSON" in text


def test_field_rules_syntax():
    c = config(
        **{
            "field.exclude.list": "inventory.customers.ssn,*.*.internal.notes",
            "field.renames": "inventory.*.email:mail,inventory.customers.a.b=c",
        }
    )
    assert c.field_exclude_list == ("inventory.customers.ssn", "*.*.internal.notes")
    assert c.field_renames == (("inventory.*.email", "mail"), ("inventory.customers.a.b", "c"))
    assert "field.exclude.list" in str(error_of({"topic.prefix": "x", "field.exclude.list": "customers.ssn"}))
    assert "<new name>" in str(error_of({"topic.prefix": "x", "field.renames": "inventory.customers.email"}))


def test_cross_property_rule_for_backoff():
    text = str(
        error_of(
            {
                "topic.prefix": "x",
                "connect.backoff.initial.delay.ms": 5000,
                "connect.backoff.max.delay.ms": 1000,
            }
        )
    )
    assert "connect.backoff.max.delay.ms" in text and "1000" in text


def test_event_size_limit_and_offsets_topic():
    c = config(
        **{
            "event.max.bytes": "2000000",
            "event.oversize.handling.mode": "skip",
            "offset.storage.topic": "cdc-offsets",
        }
    )
    assert (c.event_max_bytes, c.event_oversize_handling_mode, c.offsets_topic) == (
        2_000_000,
        "skip",
        "cdc-offsets",
    )
    assert ">= 1024" in str(error_of({"topic.prefix": "x", "event.max.bytes": 10}))


def test_config_error_survives_pickling_across_processes():
    error = error_of({"topic.prefix": "x", "snapshot.mode": "bad"})
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error)


def test_not_a_mapping_is_a_clear_error():
    with pytest.raises(ConfigError, match="not a mapping"):
        ConnectorConfig.from_properties(["topic.prefix", "x"])  # type: ignore[arg-type]


def test_every_registry_property_maps_to_an_attribute():
    c = config()
    for prop in PROPERTIES:
        assert hasattr(c, prop.attribute), prop.name
        assert prop.description.strip()


def test_replace_revalidates():
    c = config()
    assert c.replace(**{"max.batch.size": 10}).max_batch_size == 10
    with pytest.raises(ConfigError):
        c.replace(**{"max.batch.size": 0})
