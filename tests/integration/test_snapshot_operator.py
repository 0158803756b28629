"""MongoSnapshotOperator end to end (Airflow connections, spark-submit, real Kafka, simulator):
clear errors for a standalone server and wrong credentials, and no secret in argv or logs."""

from __future__ import annotations

import json

import pytest
from airflow.providers.common.compat.sdk import AirflowException
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import LeaseHeldError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from devtools.kafka.reading import read_topic
from tests.integration.snapshot_helpers import payloads, seed

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

PASSWORD = "s3cr3t-Pa55word-never-logged"


def _connection(monkeypatch, conn_id: str, fields: dict) -> str:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    return conn_id


@pytest.fixture
def connections(monkeypatch, kafka_bootstrap):
    kafka = _connection(
        monkeypatch,
        "snap_kafka",
        {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}},
    )
    spark = _connection(monkeypatch, "snap_spark", {"conn_type": "spark", "host": "local[2]"})

    def mongo(conn_id: str, uri: str, login: str | None = None, password: str | None = None) -> str:
        fields = {"conn_type": "mongocdc", "host": uri}
        if login:
            fields.update(login=login, password=password)
        return _connection(monkeypatch, conn_id, fields)

    return kafka, spark, mongo


def _operator(
    task_id: str,
    prefix: str,
    database: str,
    mongo_conn_id: str,
    kafka_conn_id: str,
    spark_conn_id: str,
    **kwargs,
) -> MongoSnapshotOperator:
    return MongoSnapshotOperator(
        task_id=task_id,
        connector_config={
            "topic.prefix": prefix,
            "database.include.list": database,
            "snapshot.chunk.size": 100,
            "snapshot.max.threads": 2,
            "connect.max.attempts": 1,
        },
        mongo_conn_id=mongo_conn_id,
        kafka_conn_id=kafka_conn_id,
        spark_conn_id=spark_conn_id,
        conf={"spark.ui.enabled": "false"},
        **kwargs,
    )


def test_a_running_window_keeps_the_snapshot_from_starting(
    mongodb_uri, connections, unique_name, kafka_bootstrap
):
    kafka, spark, mongo = connections
    operator = _operator("snapshot", unique_name, "shop", mongo("snap_lease", mongodb_uri), kafka, spark)
    lease = ConnectorLease.for_config(
        {"bootstrap.servers": kafka_bootstrap}, ConnectorConfig.from_properties({"topic.prefix": unique_name})
    )
    with lease.hold("hourly/run-1/window", WINDOW, 600):
        with pytest.raises(LeaseHeldError) as info:
            operator.execute({})
    assert "locked by the window 'hourly/run-1/window'" in str(info.value)
    assert lease.current() is None  # the window released it; the snapshot never took it
    assert OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets").read_all() == {}


def test_standalone_server_is_refused_with_cause_and_fix(mongosim, connections, unique_name):
    kafka, spark, mongo = connections
    sim = mongosim(mode="standalone")
    conn_id = mongo("snap_standalone", sim.uri)
    operator = _operator("snapshot", unique_name, "shop", conn_id, kafka, spark)
    with pytest.raises(AirflowException) as info:
        operator.execute({})
    message = str(info.value)
    assert "standalone MongoDB server" in message
    assert "Cause: a standalone server has no oplog" in message
    assert "Fix: convert it to a one-member replica set" in message


def test_credentials_errors_are_clear_and_secrets_never_leak(
    mongosim, connections, unique_name, capfd, kafka_bootstrap
):
    kafka, spark, mongo = connections
    sim = mongosim(auth=("cdc", PASSWORD))
    database = f"{unique_name}_db"
    with MongoClient(sim.uri, username="cdc", password=PASSWORD) as client:
        ids = seed(client, database, {"customers": 150, "orders": 120})

    # Wrong password: one clear error naming cause and fix.
    wrong = mongo("snap_wrong", sim.uri, "cdc", "not-the-password")
    operator = _operator("snapshot_wrong", unique_name, database, wrong, kafka, spark)
    with pytest.raises(AirflowException) as info:
        operator.execute({})
    message = str(info.value)
    assert "refused the credentials of user 'cdc'" in message
    assert "Cause: AuthenticationFailed" in message and "Fix: check the user name and password" in message
    assert PASSWORD not in message and "not-the-password" not in message

    # The right password: the snapshot runs; the password is nowhere in argv or the logs.
    good = mongo("snap_good", sim.uri, "cdc", PASSWORD)
    operator = _operator(
        "snapshot_good", unique_name, database, good, kafka, spark, collections=[f"{database}.orders"]
    )
    summary = operator.execute({})
    assert summary["action"] == "snapshot"
    assert summary["collections"] == {f"{database}.orders": 120}
    events = payloads(read_topic(kafka_bootstrap, f"{unique_name}.{database}.orders"))
    assert len(events) == len(ids["orders"])
    assert read_topic(kafka_bootstrap, f"{unique_name}.{database}.customers") == []

    command = operator._hook._build_spark_submit_command(operator.application)
    assert "--job-spec" in command and "local[2]" in command
    assert not any(PASSWORD in part for part in command)
    captured = capfd.readouterr()
    task_log = captured.out + captured.err
    assert "Spark-Submit cmd" in task_log and "Snapshot decision" in task_log  # the app's log reached it
    assert PASSWORD not in task_log
