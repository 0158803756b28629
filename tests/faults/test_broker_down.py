"""The Kafka broker killed in the middle of a stream window (a broker of this test's own, not the
session's): the window fails with one clear error within a bounded time, set through the Kafka
connection's producer timeouts, and the offset does not move past what was delivered; once the
broker is back on the same ports and data, the re-run completes and every change is on the topic
exactly once."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from airflow.providers.common.compat.sdk import AirflowException
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from devtools.kafka import KafkaBroker
from tests.faults.support import Connections, changes, wait_for
from tests.integration.window_helpers import connector, end_after_insert, seed_offset

pytestmark = pytest.mark.faults

# The producer settings of the Kafka connection for this test: an undeliverable batch fails after
# message.timeout.ms instead of librdkafka's default of 5 minutes (and the broker would abort an
# abandoned transaction after transaction.timeout.ms instead of the writer's default 10 minutes).
PRODUCER_TIMEOUTS = {"message.timeout.ms": 5000, "transaction.timeout.ms": 10000, "socket.timeout.ms": 5000}
# How long the broker stays down at most, waiting for the window to fail: the delivery timeout
# above, the abort of the open transaction and the Spark task's end take far less, even on a loaded
# machine; it stays below librdkafka's default message.timeout.ms (300 s), so a window that only
# fails by that default (the connection's timeouts not applied) does not pass.
FAILURE_BOUND_S = 240.0
CHANGES = 1500


@pytest.fixture
def broker():
    """A broker of this test only: it is killed and restarted."""
    dedicated = KafkaBroker()
    dedicated.start()
    try:
        yield dedicated
    finally:
        dedicated.stop()


def test_broker_killed_mid_window_fails_clearly_then_rerun_completes_exactly_once(
    broker, mongodb_uri, unique_name, monkeypatch
):
    db_name = unique_name[:40]
    kafka_plain = {"bootstrap.servers": broker.bootstrap_servers}
    props = connector(unique_name, db_name, {"max.batch.size": 5, "provide.transaction.metadata": False})
    config = ConnectorConfig.from_properties(props)
    store, partition = seed_offset(mongodb_uri, kafka_plain, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        for start in range(0, CHANGES - 1, 500):
            client[db_name].items.insert_many(
                [{"_id": n} for n in range(start, min(start + 500, CHANGES - 1))]
            )
        end = end_after_insert(client[db_name].items, {"_id": CHANGES - 1}, f"{db_name}_m")
    connections = Connections(monkeypatch)
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        mongo_conn_id=connections.mongo("bd_mongo", mongodb_uri),
        kafka_conn_id=connections.kafka("bd_kafka", {**kafka_plain, **PRODUCER_TIMEOUTS}),
        spark_conn_id=connections.spark(),
        conf={"spark.ui.enabled": "false"},
        idle_timeout=60,
    )
    outcome: dict = {}

    def window() -> None:
        try:
            outcome["summary"] = operator.execute(
                {"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)}
            )
        except BaseException as error:  # asserted below
            outcome["error"] = error

    thread = threading.Thread(target=window, daemon=True)
    thread.start()
    wait_for(
        lambda: (store.read(partition).events >= 20) or not thread.is_alive(),
        timeout=240,
        message="the window committed nothing in time",
    )
    assert thread.is_alive(), f"the window ended before the broker was killed: {outcome}"
    broker.kill()
    thread.join(FAILURE_BOUND_S)  # the broker stays down until the window has failed
    failed_while_down = not thread.is_alive()
    broker.restart()
    thread.join(300)
    assert not thread.is_alive(), "the window did not end after the broker came back"

    # One clear error naming Kafka; nothing past the delivered events.
    assert "error" in outcome, f"the window completed although the broker was killed: {outcome}"
    error = outcome["error"]
    assert isinstance(error, AirflowException), repr(error)
    message = str(error)
    assert "Kafka" in message and "Cause:" in message and "Fix:" in message, message
    assert (
        "the run continues from the last committed offset" in message
        or "nothing past the last committed offset" in message
    ), message
    topic = f"{unique_name}.{db_name}.items"
    committed = store.read(partition)
    visible = [int(event.key) for event in changes(broker.bootstrap_servers, topic) if event.payload]
    assert visible == list(range(len(visible))), "the committed events are not the first changes in order"
    assert committed.events == len(visible) and committed.windows == 0
    assert committed.cluster_time < end

    # The re-run (the code a Spark task runs) continues from the last committed offset.
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    summary = run_window(
        target, config, {**kafka_plain, **PRODUCER_TIMEOUTS}, WindowParams(end, idle_timeout_s=60)
    )
    assert summary["events"] == CHANGES - len(visible) and summary["reached_end"] is True
    ids = [int(event.key) for event in changes(broker.bootstrap_servers, topic) if event.payload]
    assert ids == list(range(CHANGES))  # every change once, in order
    state = store.read(partition)
    assert state.cluster_time == end and state.events == CHANGES and state.windows == 1

    assert failed_while_down, (
        f"with the broker down the window did not fail within {FAILURE_BOUND_S:.0f} s (it ended "
        f"once the broker was back): the failure is not bounded by the Kafka connection's timeouts "
        f"{PRODUCER_TIMEOUTS}; its error: {message}"
    )
