"""MongoDeltaApplyOperator through Airflow connections and spark-submit (local[2]): one Spark task
per table, the storage connection's options in the job spec only, each changed table an Asset
event on the task's alias with its version, and the tables equal to MongoDB read by deltalake."""

from __future__ import annotations

import json

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.operators.delta_apply import MongoDeltaApplyOperator
from tests.integration.delta_helpers import connector, mongo_documents, snapshot, table_documents

pytestmark = pytest.mark.integration


class OutletEvents(dict):
    """What Airflow's ``outlet_events`` gives a task: an accessor per outlet recording its events."""

    class Accessor:
        def __init__(self):
            self.added = []
            self.extra = {}

        def add(self, asset, extra=None):
            self.added.append((asset, extra))

    def __missing__(self, key):
        self[key] = self.Accessor()
        return self[key]


def test_the_operator_applies_each_table_in_a_spark_task_of_spark_submit(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections, monkeypatch, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    client[database].orders.insert_many([{"_id": n, "total": n} for n in range(40)])
    client[database].customers.insert_many([{"_id": f"c{n}", "name": f"n{n}"} for n in range(25)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE_STORAGE",
        json.dumps({"conn_type": "generic", "extra": {"unused_option": "secret-value"}}),
    )
    lake = tmp_path / "lake"
    operator = MongoDeltaApplyOperator(
        task_id="delta_apply",
        connector_config=props,
        delta={
            "location": str(lake),
            "conn_id": "lake_storage",
            "columns": {f"{database}.orders": {"total": "long"}},
        },
        apply_in_driver=False,
        **operator_connections("delta", mongodb_uri, kafka),
    )
    events = OutletEvents()

    summary = operator.execute({"outlet_events": events})

    assert {table["collection"]: table["events"] for table in summary["tables"]} == {
        f"{database}.customers": 25,
        f"{database}.orders": 40,
    }
    assert summary["events"] == 65 and summary["behind"] == 0 and summary["misfits"] == 0, summary
    for name in ("orders", "customers"):
        assert table_documents(lake / database / name) == mongo_documents(mongodb_uri, database, name)
    (alias,) = operator.outlets
    added = {asset.uri: extra for asset, extra in events[alias].added}
    assert added[f"file://{lake}/{database}/orders"]["version"] == 0
    assert added[f"file://{lake}/{database}/orders"]["events"] == 40
    assert "secret-value" not in json.dumps(summary)
    lineage = operator.get_openlineage_facets_on_complete(None)
    assert sorted(dataset.name for dataset in lineage.inputs) == sorted(
        f"{unique_name}.{database}.{name}" for name in ("customers", "orders")
    )
    assert {dataset.namespace for dataset in lineage.outputs} == {"file://"}
