"""The DAGs built from a connector list, as Airflow 3.3's DAG processor loads them, and the
re-snapshot trigger form: the DAG ids, pools and connections of each connector, one import error
naming an invalid entry while the other connectors load, a form that validates as it opens, and
re-snapshot messages in words."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.operators.base import parse_connector_config
from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator, parse_collections

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def dag_folder(tmp_path: Path, connectors: list | None = None) -> Path:
    """A DAGs folder with the repository's connector DAG files and, when given, this connector list."""
    folder = tmp_path / "dags"
    folder.mkdir()
    for name in ("mongocdc_connectors.py", "mongocdc_connectors.json"):
        shutil.copy(REPO / "dags" / name, folder / name)
    if connectors is not None:
        (folder / "mongocdc_connectors.json").write_text(json.dumps({"connectors": connectors}))
    return folder


def load(folder: Path, monkeypatch) -> DagBag:
    monkeypatch.delenv("MONGOCDC_POOL", raising=False)
    monkeypatch.delenv("MONGOCDC_CONNECTORS_FILE", raising=False)
    return DagBag(str(folder))


def resnapshot_dag(tmp_path, monkeypatch):
    bag = load(dag_folder(tmp_path), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mongocdc_resnapshot"]


# -- the connector list ------------------------------------------------------------------------------


def test_repository_dag_folder_keeps_the_default_dag_ids_and_names_its_pool(tmp_path, monkeypatch):
    # The pool comes from the connector list, not from a connector configuration in the environment.
    monkeypatch.setenv("MONGOCDC_CONNECTOR_CONFIG", json.dumps({"topic.prefix": "shop"}))
    bag = load(dag_folder(tmp_path), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == ["mongocdc_hourly", "mongocdc_resnapshot", "mongocdc_watchdog"]
    pools = {task.task_id: task.pool for task in bag.dags["mongocdc_hourly"].tasks}
    assert pools == {"snapshot": "mongocdc_default", "window": "mongocdc_default"}


def test_two_connectors_have_their_own_dags_pools_and_connections(tmp_path, monkeypatch):
    connectors = [
        {"name": "orders", "config": {"topic.prefix": "orders"}, "tags": ["team-a"]},
        {
            "name": "users",
            "config_variable": "users_cdc",
            "pool": "cdc_users",
            "conn_ids": {"mongo": "users_mongo", "kafka": "users_kafka"},
            "schedule": "*/30 * * * *",
        },
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == sorted(
        f"mongocdc_{name}_{kind}"
        for name in ("orders", "users")
        for kind in ("hourly", "resnapshot", "watchdog")
    )
    orders, users = bag.dags["mongocdc_orders_hourly"], bag.dags["mongocdc_users_hourly"]
    assert {t.pool for t in orders.tasks} == {"mongocdc_orders"}
    assert {t.pool for t in users.tasks} == {"cdc_users"}
    assert {t.pool for t in bag.dags["mongocdc_users_resnapshot"].tasks} == {"cdc_users"}
    assert {"team-a", "orders"} <= set(orders.tags)
    assert users.timetable.expression == "*/30 * * * *"
    watchdog = bag.dags["mongocdc_users_watchdog"]
    assert watchdog.get_task("trigger_resnapshot").trigger_dag_id == "mongocdc_users_resnapshot"
    # Run-time macros of each DAG: its own connections and configuration (inline: no Variable read).
    macros = users.user_defined_macros
    assert [macros["mongocdc_conn_id"](kind) for kind in ("mongo", "kafka", "spark")] == [
        "users_mongo",
        "users_kafka",
        "spark_default",
    ]
    assert json.loads(orders.user_defined_macros["mongocdc_connector_config"]()) == {"topic.prefix": "orders"}


def test_an_invalid_entry_is_one_import_error_naming_it_and_the_others_load(tmp_path, monkeypatch):
    connectors = [
        {"name": "orders", "config": {"topic.prefix": "orders"}},
        {"name": "billing", "config": {"topic.prefix": "billing", "snapshot.mode": "sometimes"}},
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert sorted(bag.dags) == [
        "mongocdc_orders_hourly",
        "mongocdc_orders_resnapshot",
        "mongocdc_orders_watchdog",
    ]
    assert [Path(path).name for path in bag.import_errors] == ["mongocdc_connectors.py"]
    (error,) = bag.import_errors.values()
    assert "connector entry #2 ('billing')" in error and "snapshot.mode" in error
    assert "orders" not in error


# -- the re-snapshot form ----------------------------------------------------------------------------


def test_resnapshot_form_is_valid_as_it_opens_and_left_empty(tmp_path, monkeypatch):
    dag = resnapshot_dag(tmp_path, monkeypatch)
    params = dag.params
    params.validate()  # the defaults: the form opens with Trigger enabled
    assert params.dump()["mode"] == "manual"
    # The form sends an emptied field as null: still valid, and each description says what empty means.
    for name in ("collections", "reason"):
        params[name] = None
        params.validate()
        assert "Empty:" in params.get_param(name).description


def test_resnapshot_collection_without_database_is_rejected_in_words():
    with pytest.raises(ConfigError) as raised:
        parse_collections(["shop.orders", "orders"])
    assert str(raised.value).startswith("`orders` is not `<database>.<collection>`")


def test_gap_mode_with_chosen_collections_says_gap_mode_copies_everything_without_claiming_a_gap():
    operator = MongoResnapshotOperator(
        task_id="resnapshot",
        connector_config={"topic.prefix": "shop"},
        mode="gap",
        collections=["shop.orders"],
    )
    with pytest.raises(ConfigError) as raised:
        operator.decide(parse_connector_config(operator.connector_config))
    message = str(raised.value)
    assert "Gap mode copies every captured collection" in message and "manual" in message
    assert "no longer in the oplog" not in message


def test_resnapshot_rendered_templates_show_the_mode_not_a_reset_offset(tmp_path, monkeypatch):
    task = resnapshot_dag(tmp_path, monkeypatch).get_task("resnapshot")
    assert "mode" in task.template_fields
    assert "reset_offset" not in task.template_fields and "force" not in task.template_fields
