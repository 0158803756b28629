"""Debezium 3.7's ``json.serialization.mode`` is accepted with Debezium's meaning
(MongoDbConnectorConfig.JsonSerializationMode and JsonSerialization): mapped onto
``extended.json.mode``, ``strict`` also writing ``updatedFields`` in compact JsonMode.STRICT, and
refused when it disagrees with ``extended.json.mode``."""

from __future__ import annotations

import datetime
import json

import pytest
from bson import Int64, Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder

pytestmark = pytest.mark.unit

UPDATED = {"visits": Int64(7), "seen": datetime.datetime(2023, 11, 14, 22, 13, 20), "name": "Anne"}
# Debezium's updatedFields text per json.serialization.mode (JsonSerialization.updatedFieldsTransformer).
UPDATED_TEXT = {
    "legacy": '{"visits": 7, "seen": {"$date": "2023-11-14T22:13:20Z"}, "name": "Anne"}',  # toJson()
    "strict": '{"visits": {"$numberLong": "7"},"seen": {"$date": 1700000000000},"name": "Anne"}',
    "relaxed": '{"visits": 7,"seen": {"$date": "2023-11-14T22:13:20Z"},"name": "Anne"}',
    "extended": '{"visits": {"$numberLong": "7"},"seen": {"$date": {"$numberLong": "1700000000000"}},'
    '"name": "Anne"}',
}
MAPPED = {"legacy": "strict", "strict": "strict", "relaxed": "relaxed", "extended": "canonical"}


def config(**props) -> ConnectorConfig:
    return ConnectorConfig.from_properties({"topic.prefix": "fulfillment", **props})


def updated_fields(cfg: ConnectorConfig) -> str:
    change = {
        "_id": {"_data": "82650000000000000001"},
        "operationType": "update",
        "clusterTime": Timestamp(1_700_000_000, 7),
        "ns": {"db": "inventory", "coll": "customers"},
        "documentKey": {"_id": 1},
        "updateDescription": {"updatedFields": UPDATED, "removedFields": []},
    }
    [event] = EventBuilder(cfg, replica_set="rs0", clock=lambda: 0).build_change(change)
    return json.loads(event.value)["payload"]["updateDescription"]["updatedFields"]


@pytest.mark.parametrize("mode", sorted(MAPPED))
def test_each_debezium_mode_is_accepted_and_writes_debezium_text(mode):
    cfg = config(**{"json.serialization.mode": mode, "capture.mode": "change_streams"})
    assert cfg.extended_json_mode == MAPPED[mode]
    assert updated_fields(cfg) == UPDATED_TEXT[mode]
    assert config(**cfg.to_properties()) == cfg  # rebuilt (e.g. by the Spark application) unchanged


def test_without_it_extended_json_mode_decides_as_before():
    assert updated_fields(config(**{"capture.mode": "change_streams"})) == UPDATED_TEXT["legacy"]


def test_values_that_agree_are_accepted_and_a_disagreement_names_both():
    assert config(
        **{"json.serialization.mode": "Extended", "extended.json.mode": "canonical"}
    ).extended_json_mode == ("canonical")
    with pytest.raises(ConfigError) as raised:
        config(**{"json.serialization.mode": "relaxed", "extended.json.mode": "strict"})
    message = str(raised.value)
    assert "'json.serialization.mode' = 'relaxed'" in message
    assert "'extended.json.mode' = 'strict'" in message and "disagree" in message
