"""A connector's window schedule in the connector list (``window_schedule``): by the clock, by changes
(the connector's change watcher on an Asset) or both, as Airflow 3.3's DAG processor loads the DAGs;
invalid values as one import error naming the entry; the watcher's stored arguments."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk import AssetOrTimeSchedule
from airflow.serialization.encoders import encode_trigger

from airflow_provider_mongocdc.triggers.change_watcher import MongoChangeWatcher

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, monkeypatch, connectors: list) -> DagBag:
    folder = tmp_path / "dags"
    folder.mkdir()
    shutil.copy(REPO / "dags" / "mongocdc_connectors.py", folder)
    (folder / "mongocdc_connectors.json").write_text(json.dumps({"connectors": connectors}))
    monkeypatch.delenv("MONGOCDC_CONNECTORS_FILE", raising=False)
    return DagBag(str(folder))


def watcher_of(dag) -> tuple[object, MongoChangeWatcher]:
    asset = dag.timetable.asset_condition
    (watcher,) = asset.watchers
    return asset, watcher.trigger


def test_changes_clock_or_both(tmp_path, monkeypatch):
    connectors = [
        {"name": "default", "window_schedule": {"changes": {"max_delay": "30s", "min_changes": 500}}},
        {
            "name": "orders",
            "config": {"topic.prefix": "orders"},
            "conn_ids": {"mongo": "orders_mongo"},
            "window_schedule": {"clock": "@hourly", "changes": {}},
        },
        {"name": "users", "config": {"topic.prefix": "users"}, "window_schedule": {"clock": 900}},
    ]
    bag = load(tmp_path, monkeypatch, connectors)
    assert not bag.import_errors, bag.import_errors

    # By changes only: the DAG is scheduled on the connector's changes Asset and its watcher.
    hourly = bag.dags["mongocdc_hourly"]
    asset, watcher = watcher_of(hourly)
    assert (asset.name, asset.uri) == ("mongocdc.default.changes", "mongocdc-changes://default/")
    assert isinstance(watcher, MongoChangeWatcher)
    assert watcher.settings.max_delay_s == 30 and watcher.settings.min_changes == 500
    assert watcher.config_variable == "mongocdc_connector_config" and watcher.connector_config is None
    assert (watcher.mongo_conn_id, watcher.kafka_conn_id) == ("mongocdc_default", "kafka_default")
    assert watcher.watchdog_dag_id == "mongocdc_watchdog"
    assert "Change-driven windows" in hourly.doc_md and "max_delay 30 s" in hourly.doc_md
    assert hourly.max_active_runs == 1 and not hourly.catchup

    # Both: hourly at the latest, earlier when the watcher asks.
    orders = bag.dags["mongocdc_orders_hourly"]
    assert isinstance(orders.timetable, AssetOrTimeSchedule)
    assert orders.timetable.timetable.expression == "0 * * * *"
    _, watcher = watcher_of(orders)
    assert watcher.connector_config == {"topic.prefix": "orders"} and watcher.mongo_conn_id == "orders_mongo"

    # By the clock only (seconds between windows), as a plain schedule.
    assert bag.dags["mongocdc_users_hourly"].timetable.delta.total_seconds() == 900


def test_the_watchers_stored_arguments_hold_no_secret_and_rebuild_it(tmp_path, monkeypatch):
    bag = load(
        tmp_path,
        monkeypatch,
        [{"name": "orders", "config": {"topic.prefix": "orders"}, "window_schedule": {"changes": {}}}],
    )
    _, watcher = watcher_of(bag.dags["mongocdc_orders_hourly"])
    classpath, kwargs = watcher.serialize()
    assert classpath == "airflow_provider_mongocdc.triggers.change_watcher.MongoChangeWatcher"
    assert set(kwargs) == {
        "connector",
        "connector_config",
        "config_variable",
        "mongo_conn_id",
        "kafka_conn_id",
        "min_changes",
        "max_delay_s",
        "min_headroom_s",
        "poll_interval_s",
        "refire_after_s",
        "watchdog_dag_id",
    }
    assert MongoChangeWatcher(**kwargs).serialize() == (classpath, kwargs)
    encode_trigger(watcher)  # what the DAG processor stores: JSON, no object


@pytest.mark.parametrize(
    "window_schedule, message",
    [
        ({"clock": "often"}, "'window_schedule' 'clock' 'often' is not a cron expression or preset"),
        ({"clock": None}, "'window_schedule' has neither a clock nor changes"),
        (
            {"changes": {"max_delay": "soon"}},
            "'changes' is not valid: max_delay must be a duration, got 'soon'",
        ),
        ({"changes": {"max_wait": 5}}, "unknown key(s) max_wait in 'changes'"),
        ({"every": "hour"}, "'window_schedule' must be an object with 'clock'"),
    ],
)
def test_an_invalid_window_schedule_is_a_dag_of_its_own_naming_the_entry(
    tmp_path, monkeypatch, window_schedule, message
):
    connectors = [
        {"name": "orders", "config": {"topic.prefix": "orders"}},
        {"name": "users", "config": {"topic.prefix": "users"}, "window_schedule": window_schedule},
    ]
    bag = load(tmp_path, monkeypatch, connectors)
    assert not bag.import_errors, bag.import_errors
    assert "mongocdc_orders_hourly" in bag.dags and "mongocdc_users_hourly" not in bag.dags
    error = bag.dags["mongocdc_invalid_users"].description
    assert "connector entry #2 ('users')" in error and message in error


def test_schedule_and_window_schedule_together_are_refused(tmp_path, monkeypatch):
    entry = {
        "name": "users",
        "config": {"topic.prefix": "users"},
        "schedule": "@daily",
        "window_schedule": {"changes": {}},
    }
    bag = load(tmp_path, monkeypatch, [entry])
    assert not bag.import_errors, bag.import_errors
    error = bag.dags["mongocdc_invalid_users"].description
    assert "give either 'schedule' or 'window_schedule', not both" in error


def test_the_watcher_refuses_credential_properties_its_serialized_arguments_would_store():
    from airflow_provider_mongocdc.core.base.errors import ConfigError

    for name in ("value.converter.basic.auth.user.info", "producer.override.sasl.jaas.config"):
        with pytest.raises(ConfigError) as raised:
            MongoChangeWatcher("orders", connector_config={"topic.prefix": "orders", name: "user:secret"})
        assert name in str(raised.value) and "user:secret" not in str(raised.value)
        assert "stored in clear" in str(raised.value)


def test_open_windows_from_the_connector_list(tmp_path, monkeypatch):
    connectors = [
        {
            "name": "default",
            "window_schedule": {
                "changes": {},
                "open": {"idle": "20s", "max_open": "40min", "commit_interval": "2s"},
            },
        },
        {
            "name": "orders",
            "config": {"topic.prefix": "orders"},
            "window_schedule": {"clock": "@hourly", "open": {}},
        },
        {"name": "users", "config": {"topic.prefix": "users"}, "window_schedule": {"clock": "@hourly"}},
    ]
    bag = load(tmp_path, monkeypatch, connectors)
    assert not bag.import_errors, bag.import_errors
    window = bag.dags["mongocdc_hourly"].get_task("window")
    assert window.open_window == {"idle": 20.0, "max_open": 2400.0, "commit_interval": 2.0}
    assert "Open windows" in bag.dags["mongocdc_hourly"].doc_md
    # {} gives the defaults: below the hourly clock and the window task's execution_timeout.
    defaults = bag.dags["mongocdc_orders_hourly"].get_task("window").open_window
    assert defaults == {"idle": 30.0, "max_open": 3000.0, "commit_interval": 1.0}
    assert (
        defaults["max_open"]
        < bag.dags["mongocdc_orders_hourly"].get_task("window").execution_timeout.total_seconds()
    )
    # With the clock alone, bounded windows as before.
    assert bag.dags["mongocdc_users_hourly"].get_task("window").open_window is None


def test_every_bad_open_value_is_named_at_once(tmp_path, monkeypatch):
    entry = {
        "name": "users",
        "config": {"topic.prefix": "users"},
        "window_schedule": {
            "changes": {"max_delay": "soon"},
            "open": {"idle": "never", "max_open": -5, "commit_interval": "2m"},
        },
    }
    bag = load(tmp_path, monkeypatch, [entry])
    assert not bag.import_errors, bag.import_errors
    error = bag.dags["mongocdc_invalid_users"].description
    assert "connector entry #1 ('users')" in error and "4 problems" in error
    assert "'changes' is not valid: max_delay must be a duration, got 'soon'" in error
    assert "'open' is not valid: idle must be a duration, got 'never'" in error
    assert "'open' is not valid: max_open must be a duration, got -5" in error
    assert "'open' is not valid: commit_interval must lie between 0.1 s and 60 s, got 120 s" in error


@pytest.mark.parametrize(
    "opened, message",
    [
        ({"max_open": "2h"}, "max_open (7200 s) is longer than the window task may read (3000 s"),
        ({"idle": "10min", "max_open": "5min"}, "idle (600 s) is longer than max_open (300 s)"),
        ({"idle_after": "5s"}, "unknown key(s) idle_after in 'open'"),
        ("30s", "'open' must be a JSON object of durations"),
    ],
)
def test_an_invalid_open_setting_is_refused(tmp_path, monkeypatch, opened, message):
    entry = {
        "name": "users",
        "config": {"topic.prefix": "users"},
        "window_schedule": {"changes": {}, "open": opened},
    }
    bag = load(tmp_path, monkeypatch, [entry])
    error = bag.dags["mongocdc_invalid_users"].description
    assert message in error, error
