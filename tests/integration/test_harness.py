"""The real parts are real: the Apache Kafka broker, spark-submit and Airflow work together."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from devtools.kafka.reading import read_topic
from tests.spark_submit import SPARK_ARGS, submit_env

pytestmark = pytest.mark.integration
HERE = Path(__file__).resolve().parent
# Bounds of broker round trips (creating a topic, a transaction's init, commit or abort, a flush):
# they only bound a failure, with room for a loaded machine.
KAFKA_TIMEOUT_S = 120


def _create_topic(bootstrap: str, topic: str, config: dict | None = None, partitions: int = 1) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config or {})])
    futures[topic].result(KAFKA_TIMEOUT_S)


def _transactional(bootstrap: str, txn_id: str) -> Producer:
    producer = Producer(
        {"bootstrap.servers": bootstrap, "transactional.id": txn_id, "transaction.timeout.ms": 60000}
    )
    producer.init_transactions(KAFKA_TIMEOUT_S)
    return producer


def test_produce_and_consume(kafka_bootstrap, unique_name):
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(100):
        producer.produce(unique_name, key=f"k{i}".encode(), value=f"v{i}".encode())
    assert producer.flush(KAFKA_TIMEOUT_S) == 0
    records = read_topic(kafka_bootstrap, unique_name, isolation="read_uncommitted")
    assert [r.value for r in records] == [f"v{i}".encode() for i in range(100)]


def test_transactions_hide_aborted_and_open_records_from_read_committed(kafka_bootstrap, unique_name):
    _create_topic(kafka_bootstrap, unique_name)
    producer = _transactional(kafka_bootstrap, f"{unique_name}-txn")
    producer.begin_transaction()
    producer.produce(unique_name, value=b"committed-1")
    producer.produce(unique_name, value=b"committed-2")
    producer.commit_transaction(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(unique_name, value=b"aborted")
    producer.flush(KAFKA_TIMEOUT_S)
    producer.abort_transaction(KAFKA_TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(unique_name, value=b"committed-3")
    producer.commit_transaction(KAFKA_TIMEOUT_S)
    # A transaction left open (its producer stalled) must not be visible either.
    producer.begin_transaction()
    producer.produce(unique_name, value=b"still-open")
    producer.flush(KAFKA_TIMEOUT_S)

    # (No wait for a stable topic: the open transaction holds it back for good, and the earlier
    # ones are complete, since a producer's next transaction starts only after its last one ended.)
    committed = [r.value for r in read_topic(kafka_bootstrap, unique_name, settle=0)]
    assert committed == [b"committed-1", b"committed-2", b"committed-3"]
    uncommitted = [r.value for r in read_topic(kafka_bootstrap, unique_name, isolation="read_uncommitted")]
    assert b"aborted" in uncommitted and b"still-open" in uncommitted
    producer.abort_transaction(KAFKA_TIMEOUT_S)


def test_compacted_topic_really_compacts(kafka_bootstrap, unique_name):
    _create_topic(
        kafka_bootstrap,
        unique_name,
        {
            "cleanup.policy": "compact",
            "segment.ms": "200",
            "min.cleanable.dirty.ratio": "0.01",
            "min.compaction.lag.ms": "0",
            "delete.retention.ms": "100",
        },
    )
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    resource = ConfigResource(ConfigResource.Type.TOPIC, unique_name)
    described = admin.describe_configs([resource])[resource].result(KAFKA_TIMEOUT_S)
    assert described["cleanup.policy"].value == "compact"

    producer = Producer({"bootstrap.servers": kafka_bootstrap, "linger.ms": 0})
    for version in range(20):
        for key in ("a", "b", "c"):
            producer.produce(unique_name, key=key.encode(), value=f"{key}{version}".encode())
        producer.flush(KAFKA_TIMEOUT_S)
    deadline = time.monotonic() + 300
    records = []
    while time.monotonic() < deadline:
        # New appends roll the active segment so that the cleaner can compact the older ones.
        producer.produce(unique_name, key=b"tick", value=b"tick")
        producer.flush(KAFKA_TIMEOUT_S)
        records = read_topic(kafka_bootstrap, unique_name, isolation="read_uncommitted")
        keyed = [r for r in records if r.key in (b"a", b"b", b"c")]
        if len(keyed) == 3:
            break
        time.sleep(1)
    keyed = {r.key: r.value for r in records if r.key in (b"a", b"b", b"c")}
    assert len([r for r in records if r.key in (b"a", b"b", b"c")]) == 3, "the log cleaner never compacted"
    assert keyed == {b"a": b"a19", b"b": b"b19", b"c": b"c19"}


def test_zombie_producer_is_fenced(kafka_bootstrap, unique_name):
    _create_topic(kafka_bootstrap, unique_name)
    txn_id = f"{unique_name}-txn"
    zombie = _transactional(kafka_bootstrap, txn_id)
    zombie.begin_transaction()
    zombie.produce(unique_name, value=b"from-zombie")
    zombie.flush(KAFKA_TIMEOUT_S)

    successor = _transactional(kafka_bootstrap, txn_id)  # fences the zombie, aborts its transaction
    successor.begin_transaction()
    successor.produce(unique_name, value=b"from-successor")
    successor.commit_transaction(KAFKA_TIMEOUT_S)

    with pytest.raises(KafkaException) as raised:
        zombie.produce(unique_name, value=b"late")
        zombie.commit_transaction(KAFKA_TIMEOUT_S)
    error = raised.value.args[0]
    assert error.fatal() or error.code() in (
        KafkaError._FENCED,
        KafkaError.PRODUCER_FENCED,
        KafkaError.INVALID_PRODUCER_EPOCH,
    )
    assert [r.value for r in read_topic(kafka_bootstrap, unique_name)] == [b"from-successor"]


def test_spark_submit_executors_produce_to_kafka(kafka_bootstrap, unique_name, spark_submit):
    _create_topic(kafka_bootstrap, unique_name, partitions=2)
    result = subprocess.run(
        [
            spark_submit,
            *SPARK_ARGS,
            str(HERE / "spark_jobs" / "produce_job.py"),
            kafka_bootstrap,
            unique_name,
            "1000",
            "4",
        ],
        env=submit_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "HARNESS_SENT=1000" in result.stdout
    values = sorted(int(r.value) for r in read_topic(kafka_bootstrap, unique_name))
    assert values == list(range(1000))


def test_airflow_dags_test_runs_spark_submit_operator(kafka_bootstrap, unique_name, airflow_env, tmp_path):
    _create_topic(kafka_bootstrap, unique_name)
    env = dict(airflow_env)
    env.update(
        {
            "AIRFLOW__CORE__DAGS_FOLDER": str(Path(__file__).resolve().parents[1] / "e2e" / "dags"),
            "AIRFLOW_CONN_SPARK_HARNESS": json.dumps({"conn_type": "spark", "host": "local[2]"}),
            "HARNESS_BOOTSTRAP": kafka_bootstrap,
            "HARNESS_TOPIC": unique_name,
            "HARNESS_JOB": str(HERE / "spark_jobs" / "produce_job.py"),
        }
    )
    result = subprocess.run(
        [
            str(Path(os.environ["PATH"].split(os.pathsep)[0]) / "airflow"),
            "dags",
            "test",
            "mongocdc_harness_spark",
            "2026-01-01T00:00:00+00:00",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    values = sorted(int(r.value) for r in read_topic(kafka_bootstrap, unique_name))
    assert values == list(range(50))
