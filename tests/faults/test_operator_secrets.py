"""Secrets in the connections never reach spark-submit's command line or the task logs, for the
snapshot and the window operator; and wrong MongoDB credentials fail the window operator with one
clear error that leaves the offset alone. Credentials inside a connection string (the MongoDB
connection's host) or inside an extra (an ``authMechanismProperties`` session token) are hidden
too, in the values the operators log, while the job uses them to connect.

The MongoDB password is used for real (a simulator with authentication). The Kafka SASL password
is the Kafka connection's password, which the hook puts into the librdkafka configuration as
``sasl.password``: it travels through the job spec into every producer and consumer of the run,
but the session's broker speaks PLAINTEXT, so librdkafka never sends it (the broker has no SASL
to check it against). What this test shows for it: it is in the configuration the application
used (its logs show the key, redacted) and nowhere in argv or the logs.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from airflow.providers.common.compat.sdk import AirflowException

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.faults.support import Connections, changes
from tests.integration.window_helpers import end_after_insert

pytestmark = [pytest.mark.faults, pytest.mark.simulator_only]

MONGO_PASSWORD = "Mongo-s3cr3t-never-in-logs"
SASL_PASSWORD = "Kafka-sasl-s3cr3t-never-in-logs"
WRONG_PASSWORD = "Wrong-passw0rd-also-secret"
SESSION_TOKEN = "Aws-sess10n-t0ken-never-in-logs"


def _authenticated_sim(mongosim, database: str, documents: int):
    """A simulator with authentication (user ``cdc``, MONGO_PASSWORD) holding ``documents``
    documents in ``database``.items."""
    sim = mongosim(auth=("cdc", MONGO_PASSWORD))
    with sim.client() as client:
        client[database].items.insert_many([{"_id": n, "v": 0} for n in range(documents)])
    return sim


def _assert_no_secret(text: str, where: str) -> None:
    for secret in (MONGO_PASSWORD, SASL_PASSWORD, WRONG_PASSWORD, SESSION_TOKEN):
        assert secret not in text, f"a password appears in {where}"


def test_no_secret_in_argv_or_logs_and_wrong_credentials_fail_the_window_clearly(
    mongosim, kafka_bootstrap, unique_name, monkeypatch, capfd, caplog
):
    caplog.set_level(logging.INFO)
    database = unique_name[:40]
    sim = _authenticated_sim(mongosim, database, 40)
    connections = Connections(monkeypatch)
    good = connections.mongo("sec_mongo", sim.uri, "cdc", MONGO_PASSWORD)
    wrong = connections.mongo("sec_wrong", sim.uri, "cdc", WRONG_PASSWORD)
    kafka = connections.kafka(
        "sec_kafka", {"bootstrap.servers": kafka_bootstrap}, "cdc-producer", SASL_PASSWORD
    )
    spark = connections.spark()
    props = {
        "topic.prefix": unique_name,
        "collection.include.list": rf"{database}\..*",
        "connect.max.attempts": 1,
    }
    common = dict(
        connector_config=props, kafka_conn_id=kafka, spark_conn_id=spark, conf={"spark.ui.enabled": "false"}
    )
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets", read_timeout_s=30)
    partition = OffsetPartition(unique_name, "rs0")
    commands = []

    # 1. The snapshot operator with both secrets.
    snapshot = MongoSnapshotOperator(task_id="snapshot", mongo_conn_id=good, **common)
    assert snapshot.execute({})["documents"] == 40
    commands.append(snapshot._hook._build_spark_submit_command(snapshot.application))
    snapshotted = store.read(partition)
    assert snapshotted.snapshot.status == "completed"

    # 2. The window operator with a wrong MongoDB password: one clear error, the offset unchanged.
    with sim.client() as client:
        client[database].items.update_many({}, {"$set": {"v": 1}})
        end = end_after_insert(client[database].items, {"_id": 1000, "v": 1}, f"{database}_m")
    interval_end = datetime.fromtimestamp(end.time, timezone.utc)
    refused = MongoStreamWindowOperator(task_id="window_wrong", mongo_conn_id=wrong, **common)
    with pytest.raises(AirflowException) as info:
        refused.execute({"data_interval_end": interval_end})
    message = str(info.value)
    assert "refused the credentials of user 'cdc'" in message, message
    assert "Cause: AuthenticationFailed" in message and "Fix: check the user name and password" in message
    _assert_no_secret(message, "the error")
    assert store.read(partition) == snapshotted
    commands.append(refused._hook._build_spark_submit_command(refused.application))

    # 3. The window operator with both secrets: it runs.
    window = MongoStreamWindowOperator(task_id="window", mongo_conn_id=good, **common)
    summary = window.execute({"data_interval_end": interval_end})
    assert summary["events"] == 41 and summary["reached_end"] is True, summary
    assert len(changes(kafka_bootstrap, f"{unique_name}.{database}.items")) == 40 + 41
    assert store.read(partition).cluster_time == end
    commands.append(window._hook._build_spark_submit_command(window.application))

    # argv of every spark-submit: the job spec's path, never a secret; nor in Spark's conf.
    for command in commands:
        assert "--job-spec" in command
        _assert_no_secret(" ".join(command), "the spark-submit command line")
    for operator in (snapshot, refused, window):
        _assert_no_secret(repr(operator.conf) + repr(operator.env_vars or {}), "the Spark configuration")

    # The task logs (the operators' and the applications' output): the secrets were used but
    # never written; the Kafka configuration shows the SASL password's key, redacted.
    captured = capfd.readouterr()
    logs = captured.out + captured.err + caplog.text
    assert "Spark-Submit cmd" in logs and "Snapshot decision" in logs and "Window of" in logs
    assert "'sasl.password': '***'" in logs and "'sasl.username': 'cdc-producer'" in logs
    _assert_no_secret(logs, "the task logs")


def test_credentials_inside_a_connection_string_or_an_extra_never_reach_the_logs(
    mongosim, kafka_bootstrap, unique_name, monkeypatch, capfd, caplog
):
    caplog.set_level(logging.INFO)
    database = unique_name[:40]
    sim = _authenticated_sim(mongosim, database, 30)
    assert sim.uri.startswith("mongodb://") and "@" not in sim.uri
    connections = Connections(monkeypatch)
    # The password inside the connection string of the host field (no login/password fields).
    in_uri = connections.mongo(
        "sec_uri", sim.uri.replace("mongodb://", f"mongodb://cdc:{MONGO_PASSWORD}@", 1)
    )
    # A connection of apache-airflow-providers-mongo's type: its extras are connection string
    # options, here authentication properties holding a session token (unused by SCRAM).
    in_extra = connections.add(
        "sec_extra",
        {
            "conn_type": "mongo",
            "host": sim.uri,
            "login": "cdc",
            "password": MONGO_PASSWORD,
            "extra": {"authMechanismProperties": f"AWS_SESSION_TOKEN:{SESSION_TOKEN}"},
        },
    )
    kafka = connections.kafka("sec_kafka2", {"bootstrap.servers": kafka_bootstrap})
    common = dict(
        connector_config={
            "topic.prefix": unique_name,
            "collection.include.list": rf"{database}\..*",
            "connect.max.attempts": 1,
        },
        kafka_conn_id=kafka,
        spark_conn_id=connections.spark(),
        conf={"spark.ui.enabled": "false"},
    )

    # The snapshot connects with the credentials of the connection string.
    snapshot = MongoSnapshotOperator(task_id="snapshot_uri", mongo_conn_id=in_uri, **common)
    assert snapshot.execute({})["documents"] == 30

    # The window connects through the connection whose extra holds the token.
    with sim.client() as client:
        end = end_after_insert(client[database].items, {"_id": 1000, "v": 1}, f"{database}_m")
    window = MongoStreamWindowOperator(task_id="window_extra", mongo_conn_id=in_extra, **common)
    summary = window.execute({"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)})
    assert summary["events"] == 1 and summary["reached_end"] is True, summary
    assert len(changes(kafka_bootstrap, f"{unique_name}.{database}.items")) == 30 + 1

    for operator in (snapshot, window):
        command = operator._hook._build_spark_submit_command(operator.application)
        _assert_no_secret(" ".join(command), "the spark-submit command line")
    captured = capfd.readouterr()
    logs = captured.out + captured.err + caplog.text
    _assert_no_secret(logs, "the task logs")
    # The operators logged what they ran with: the connection string and the extra, redacted.
    assert "'connection_string': 'mongodb://cdc:***@" in logs, logs[-4000:]
    assert "'authMechanismProperties': 'AWS_SESSION_TOKEN:***'" in logs, logs[-4000:]
