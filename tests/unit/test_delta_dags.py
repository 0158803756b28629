"""The Delta apply in the connector's DAGs and its operator: the ``delta`` key of a connector entry
adds ``delta_apply`` after the window, in the connector's pool; an invalid ``delta`` is a DAG saying
so; the operator's job spec carries the storage options of its connection, never the command line
or the log line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from airflow.sdk import AssetAlias

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.operators.delta_apply import MongoDeltaApplyOperator
from tests.unit.test_connector_dags import dag_folder, load

pytestmark = pytest.mark.unit

ENTRY = {
    "name": "sales",
    "config": {"topic.prefix": "sales"},
    "delta": {"location": "/data/delta/sales", "columns": {"shop.orders": {"total": "double"}}},
}


def test_the_delta_key_adds_the_apply_after_the_window_in_the_connectors_pool(tmp_path: Path, monkeypatch):
    bag = load(dag_folder(tmp_path, [ENTRY]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    dag = bag.dags["mongocdc_sales_hourly"]
    apply = dag.get_task("delta_apply")
    assert dag.get_task("window").downstream_task_ids == {"delta_apply"}
    assert apply.pool == "mongocdc_sales" and type(apply).__name__ == "MongoDeltaApplyOperator"
    assert apply.delta["location"] == "/data/delta/sales"
    assert [outlet.name for outlet in apply.outlets if isinstance(outlet, AssetAlias)] == ["mongocdc.delta"]
    assert "Delta Lake tables" in dag.doc_md and "/data/delta/sales" in dag.doc_md
    assert "delta_apply" not in [t.task_id for t in bag.dags["mongocdc_sales_resnapshot"].tasks]


def test_an_open_windows_tables_follow_it_and_a_bounded_ones_are_applied_after_it(
    tmp_path: Path, monkeypatch
):
    opened = {
        **ENTRY,
        "name": "live",
        "config": {"topic.prefix": "live"},
        "window_schedule": {"changes": {"min_changes": 1, "max_delay": "5s"}, "open": {"idle": "30s"}},
    }
    bag = load(dag_folder(tmp_path, [ENTRY, opened]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    window = bag.dags["mongocdc_live_hourly"].get_task("window")
    assert window.tables["location"] == "/data/delta/sales" and window.downstream_task_ids == {"delta_apply"}
    assert bag.dags["mongocdc_sales_hourly"].get_task("window").tables is None


def test_an_invalid_delta_entry_is_a_dag_naming_the_problem(tmp_path: Path, monkeypatch):
    entry = {**ENTRY, "delta": {"location": "/d", "columns": {"shop.orders": {"total": "money"}}}}
    bag = load(dag_folder(tmp_path, [entry]), monkeypatch)
    assert sorted(bag.dags) == ["mongocdc_invalid_sales"]
    description = bag.dags["mongocdc_invalid_sales"].description
    assert "'delta' is not valid" in description and "the type 'money' is unknown" in description


def test_the_operator_refuses_bad_settings_when_the_dag_is_parsed():
    with pytest.raises(ConfigError, match="'location' is missing"):
        MongoDeltaApplyOperator(task_id="t", connector_config={"topic.prefix": "p"}, delta={})
    with pytest.raises(ConfigError, match="apply_in_driver"):
        MongoDeltaApplyOperator(
            task_id="t", connector_config={"topic.prefix": "p"}, delta={"location": "/d"}, apply_in_driver="x"
        )


def test_storage_credentials_travel_in_the_job_spec_only(monkeypatch, tmp_path):
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE",
        json.dumps(
            {
                "conn_type": "generic",
                "login": "AKIAEXAMPLE",
                "password": "s3cr3t-value",
                "extra": {"AWS_REGION": "eu-west-1", "AWS_SESSION_TOKEN": "tok-value"},
            }
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_KAFKA_T",
        json.dumps({"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": "b:9092"}}),
    )
    operator = MongoDeltaApplyOperator(
        task_id="t",
        connector_config={"topic.prefix": "p"},
        kafka_conn_id="kafka_t",
        delta={"location": "s3://lake/cdc", "conn_id": "lake"},
        apply_in_driver=False,
    )
    spec = operator.build_spec({}, ConnectorConfig.from_properties({"topic.prefix": "p"}))
    assert spec.params["storage_options"] == {
        "AWS_REGION": "eu-west-1",
        "AWS_SESSION_TOKEN": "tok-value",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_SECRET_ACCESS_KEY": "s3cr3t-value",
    }
    shown = json.dumps(spec.redacted())
    for secret in ("AKIAEXAMPLE", "s3cr3t-value", "tok-value", "eu-west-1"):
        assert secret not in shown
    assert spec.mongo == {} and spec.params["in_driver"] is False
    path = spec.write(tmp_path / "spec.json")
    assert oct(path.stat().st_mode & 0o777) == "0o600"


def test_the_tables_key_names_the_format_and_iceberg_tables_get_their_apply(tmp_path: Path, monkeypatch):
    iceberg = {
        "name": "lake",
        "config": {"topic.prefix": "lake"},
        "tables": {"format": "iceberg", "location": "/data/lake", "namespace_prefix": "cdc_"},
    }
    wrong = {
        "name": "wrong",
        "config": {"topic.prefix": "wrong"},
        "tables": {"format": "hudi", "location": "/x"},
    }
    both = {**ENTRY, "name": "both", "config": {"topic.prefix": "both"}, "tables": {"location": "/y"}}
    bag = load(dag_folder(tmp_path, [iceberg, wrong, both]), monkeypatch)
    dag = bag.dags["mongocdc_lake_hourly"]
    apply = dag.get_task("iceberg_apply")
    assert type(apply).__name__ == "MongoTableApplyOperator" and apply.pool == "mongocdc_lake"
    assert apply.settings().identifier("shop", "orders") == ("cdc_shop", "orders")
    assert [outlet.name for outlet in apply.outlets if isinstance(outlet, AssetAlias)] == ["mongocdc.iceberg"]
    assert "Apache Iceberg tables" in dag.doc_md
    assert (
        "'format' must be one of delta, iceberg, got 'hudi'" in bag.dags["mongocdc_invalid_wrong"].description
    )
    assert "both 'delta' and 'tables'" in bag.dags["mongocdc_invalid_both"].description
