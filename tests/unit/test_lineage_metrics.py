"""Assets, OpenLineage namespaces and metrics of the operators and the sensor, without servers."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from airflow.api_fastapi.core_api.datamodels.assets import AssetEventResponse
from airflow.sdk import Asset, AssetAlias
from airflow.sdk.observability import stats

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.lineage import (
    asset_extra,
    connector_asset,
    kafka_namespace,
    mongodb_namespace,
    openlineage_facets,
)
from airflow_provider_mongocdc.metrics import oplog_metrics
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

pytestmark = pytest.mark.unit


def test_outlet_is_the_connector_asset_when_the_prefix_is_known_else_an_alias():
    literal = MongoStreamWindowOperator(task_id="w", connector_config={"topic.prefix": "shop"})
    assert literal.outlets == [connector_asset("shop")]
    assert literal.outlets[0].uri == "mongocdc://shop/"
    as_json = MongoStreamWindowOperator(task_id="j", connector_config=json.dumps({"topic.prefix": "shop"}))
    assert as_json.outlets == [connector_asset("shop")]
    # A snapshot updates the Asset only when it copied data: through the alias.
    snapshot = MongoSnapshotOperator(task_id="s", connector_config={"topic.prefix": "shop"})
    assert [type(o) for o in snapshot.outlets] == [AssetAlias]
    assert not snapshot.wrote_data({"action": "nothing"}) and snapshot.wrote_data({"action": "snapshot"})
    templated = MongoStreamWindowOperator(task_id="t", connector_config="{{ var.value.config }}")
    assert [type(o) for o in templated.outlets] == [AssetAlias]
    mine = Asset("kafka://broker:9092/shop.db.c")
    assert MongoStreamWindowOperator(task_id="m", connector_config={}, outlets=[mine]).outlets == [mine]


@pytest.mark.parametrize(
    ("mongo", "namespace"),
    [
        ({"hosts": "rs0/h1:27018,h2:27017"}, "mongodb://h1:27018"),
        ({"hosts": "h1"}, "mongodb://h1:27017"),
        ({"connection_string": "mongodb://user:pa55@h9:1234,h2/db?replicaSet=rs0"}, "mongodb://h9:1234"),
        (
            {"connection_string": "mongodb+srv://user:pa55@cluster0.example.net/"},
            "mongodb://cluster0.example.net:27017",
        ),
    ],
)
def test_mongodb_namespace_is_the_first_host_without_credentials(mongo, namespace):
    assert mongodb_namespace(mongo) == namespace


def test_kafka_namespace_is_the_first_bootstrap_server():
    assert kafka_namespace({"bootstrap.servers": "SASL_SSL://b1:9093,b2:9093"}) == "kafka://b1:9093"


def test_lineage_and_asset_extra_name_the_collections_and_their_topics():
    config = ConnectorConfig.from_properties({"topic.prefix": "shop"})
    summary = {"events": 3, "events_by_collection": {"inv.items": 2, "inv.orders": 1}, "bytes": 10}
    facets = openlineage_facets(config, "mongodb://h1:27017", "kafka://b1:9092", summary)
    assert [(d.namespace, d.name) for d in facets.inputs] == [
        ("mongodb://h1:27017", "inv.items"),
        ("mongodb://h1:27017", "inv.orders"),
    ]
    assert [(d.namespace, d.name) for d in facets.outputs] == [
        ("kafka://b1:9092", "shop.inv.items"),
        ("kafka://b1:9092", "shop.inv.orders"),
    ]
    extra = asset_extra(config, "stream_window", summary)
    assert extra["topics"] == {"shop.inv.items": 2, "shop.inv.orders": 1} and extra["events"] == 3
    assert "open_window" not in extra
    json.dumps(extra)  # an asset event's extra must be JSON


def test_the_asset_event_names_the_connector_by_its_name_and_its_topic_prefix_as_such():
    # A connector of the connector list: its name is the entry's ("default"), its prefix "shop".
    named = ConnectorConfig.from_properties({"topic.prefix": "shop", "name": "default"})
    summary = {"events": 1, "events_by_collection": {"inv.items": 1}, "bytes": 10}
    for run in ("stream_window", "snapshot"):
        extra = asset_extra(named, run, summary)
        assert extra["connector"] == "default" and extra.get("topic_prefix") == "shop", extra
        assert extra["topics"] == {"shop.inv.items": 1}
    unnamed = asset_extra(ConnectorConfig.from_properties({"topic.prefix": "shop"}), "stream_window", summary)
    assert unnamed["connector"] == "shop" and unnamed.get("topic_prefix") == "shop", unnamed


def test_the_asset_event_of_an_open_window_says_since_when_its_events_and_committed_lag():
    config = ConnectorConfig.from_properties({"topic.prefix": "shop"})
    opened = {
        "opened_at": "2026-11-28T10:00:00Z",
        "closed_at": "2026-11-28T10:05:00Z",
        "open_s": 300.0,
        "events": 1200,
        "commits": 290,
        "committed_lag_ms": 850,
        "stop_reasons": ["idle"],
        "idle_s": 30.0,
        "max_open_s": 3000.0,
        "commit_interval_s": 1.0,
    }
    summary = {"events": 1200, "events_by_collection": {"inv.items": 1200}, "open_window": opened}
    extra = asset_extra(config, "stream_window", summary)
    assert extra["open_window"] == opened
    json.dumps(extra)


@pytest.mark.parametrize("run", ["stream_window", "snapshot"])
def test_asset_event_extra_is_served_by_the_rest_api_without_masked_values(run):
    # The REST API and the UI serve an asset event through AssetEventResponse, which replaces every
    # text value under a key that looks like a secret (Airflow's sensitive names: "token", "secret",
    # ...) by ***: no such key holds a text, neither a field's name nor a replica set's name (counts
    # are numbers, never masked, so collections and topics may be keys).
    config = ConnectorConfig.from_properties({"topic.prefix": "shop"})
    counts = {"shop.orders": 2, "payments.authorizations": 1, "auth.tokens": 3}
    token = "8266A0B1C2000000032B"
    position = {"sec": 1714557600, "ord": 3, "resume_token": token, "time": "2024-05-01T10:00:00Z"}
    summary = {
        "status": "ok",
        "events": 6,
        "documents": 6,
        "events_by_collection": counts,
        "collections": counts,
        "bytes": 600,
        "window_end": "2024-05-01T10:00:00Z",
        "end_position": {"secret-rs": position},
        "start_position": {"secret-rs": {k: v for k, v in position.items() if k != "time"}},
        "snapshot_id": "s1",
    }
    extra = asset_extra(config, run, summary)
    served = AssetEventResponse(
        id=1,
        asset_id=1,
        extra=extra,
        source_map_index=-1,
        created_dagruns=[],
        timestamp=datetime.now(timezone.utc),
    ).model_dump(mode="json")["extra"]
    assert served == json.loads(json.dumps(extra)), served
    assert served["topics"] == {f"shop.{name}": count for name, count in counts.items()}
    (end,) = served["end_position"]
    assert (end["partition"], end["sec"], end["ord"], end["resume_point"]) == (
        "secret-rs",
        1714557600,
        3,
        token,
    )


class Recorder:
    def __init__(self):
        self.calls = []

    def incr(self, stat, count=1, rate=1, *, tags=None):
        self.calls.append(("incr", stat, count, tags))

    def gauge(self, stat, value, rate=1, delta=False, *, tags=None):
        self.calls.append(("gauge", stat, value, tags))


def test_sensor_metrics_headroom_hours_and_gap_per_connector():
    recorder = Recorder()
    stats.initialize(factory=lambda: recorder, export_legacy_names=False)
    try:
        oplog_metrics("shop", 7200, False)
        oplog_metrics("shop", None, True)
    finally:
        stats.initialize(factory=None, export_legacy_names=False)
    assert recorder.calls == [
        ("gauge", "mongocdc.oplog.headroom_hours", 2.0, {"connector": "shop"}),
        ("gauge", "mongocdc.oplog.headroom_hours.shop", 2.0, None),
        ("incr", "mongocdc.oplog.gap_detected", 1, {"connector": "shop"}),
        ("incr", "mongocdc.oplog.gap_detected.shop", 1, None),
    ]
