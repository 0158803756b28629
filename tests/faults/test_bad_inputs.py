"""Bad inputs end with one clear error each, and no offset moves past undelivered data.

Through the operators: an invalid value or an unknown property (refused before anything is
submitted), a standalone server and an unreachable MongoDB (snapshot and window). Through the
snapshot application: an oversize document during a snapshot, and a collection dropped while the
snapshot copies it. Wrong credentials for the window operator: test_operator_secrets.py.
"""

from __future__ import annotations

import socket
import threading
import time
from collections import Counter
from datetime import datetime, timezone

import pytest
from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
from airflow.providers.common.compat.sdk import AirflowException
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.timestamp import Timestamp
from confluent_kafka.admin import AdminClient
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_COMPLETED,
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
)
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.plan import data_chunks_finished
from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.faults.support import Connections, changes, wait_for
from tests.integration.snapshot_helpers import snapshot_connector
from tests.integration.window_helpers import failing_commands
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.faults


def _canonical(value) -> str:
    return json_util.dumps({"v": value}, json_options=CANONICAL_JSON_OPTIONS)


def _topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def connections(monkeypatch, kafka_bootstrap) -> Connections:
    conns = Connections(monkeypatch)
    conns.kafka("faults_kafka", {"bootstrap.servers": kafka_bootstrap})
    conns.spark()
    return conns


@pytest.fixture
def submitted(monkeypatch) -> list[str]:
    """The applications handed to spark-submit during the test (they still run)."""
    calls: list[str] = []
    original = SparkSubmitHook.submit

    def counting(self, application: str = "", **kwargs):
        calls.append(application)
        return original(self, application, **kwargs)

    monkeypatch.setattr(SparkSubmitHook, "submit", counting)
    return calls


def _operators(prefix: str, props: dict, mongo_conn_id: str, **extra) -> list:
    common = dict(
        connector_config=props,
        mongo_conn_id=mongo_conn_id,
        kafka_conn_id="faults_kafka",
        spark_conn_id="faults_spark",
        conf={"spark.ui.enabled": "false"},
    )
    return [
        MongoSnapshotOperator(task_id="snapshot", **common, **extra.get("snapshot", {})),
        MongoStreamWindowOperator(task_id="window", **common, **extra.get("window", {})),
        MongoResnapshotOperator(task_id="resnapshot", **common, **extra.get("resnapshot", {})),
    ]


# -- configuration ---------------------------------------------------------------------------------
def test_invalid_values_and_unknown_properties_are_refused_by_every_operator_before_submitting(
    mongodb_uri, connections, kafka_bootstrap, unique_name, submitted
):
    mongo = connections.mongo("faults_mongo", mongodb_uri)
    props = {
        "topic.prefix": unique_name,
        "snapshot.mode": "sometimes",
        "max.batch.sise": 100,
        "heartbeat.interval.ms": -5,
    }
    context = {"data_interval_end": datetime.now(timezone.utc)}
    for operator in _operators(unique_name, props, mongo):
        with pytest.raises((AirflowException, MongoCdcError)) as info:
            operator.execute(context)
        message = str(info.value)
        # Every problem at once, each naming the property; the fix.
        assert "'max.batch.sise' is unknown; did you mean 'max.batch.size'?" in message, message
        assert "'snapshot.mode' = 'sometimes' is not one of the allowed values" in message, message
        assert "initial, always, initial_only, no_data, when_needed" in message, message
        assert "'heartbeat.interval.ms'" in message and "Fix:" in message, message

    # Run parameters of the operators are checked before submitting too.
    good = {"topic.prefix": unique_name}
    bad_parameters = _operators(
        unique_name,
        good,
        mongo,
        snapshot={"collections": ["no-database-part"]},
        window={"idle_timeout": -1},
        resnapshot={"mode": "sometimes"},
    )
    expected = ["no-database-part", "idle_timeout_s=-1", "Unknown re-snapshot mode 'sometimes'"]
    for operator, text in zip(bad_parameters, expected):
        with pytest.raises((AirflowException, MongoCdcError)) as info:
            operator.execute(context)
        assert text in str(info.value) and "Fix:" in str(info.value), str(info.value)

    assert submitted == []  # refused before spark-submit
    assert (
        f"{unique_name}.offsets" not in _topics(kafka_bootstrap)
        or OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets").read_all() == {}
    )


# -- the MongoDB server ----------------------------------------------------------------------------
def test_standalone_server_is_refused_by_the_window_operator(
    mongosim, connections, kafka_bootstrap, unique_name
):
    sim = mongosim(mode="standalone")
    operator = _operators(
        unique_name,
        {"topic.prefix": unique_name, "connect.max.attempts": 1},
        connections.mongo("faults_standalone", sim.uri),
    )[1]
    with pytest.raises(AirflowException) as info:
        operator.execute({"data_interval_end": datetime.now(timezone.utc)})
    message = str(info.value)
    assert "standalone MongoDB server" in message, message
    assert "Cause: a standalone server has no oplog" in message
    assert "Fix: convert it to a one-member replica set" in message
    assert OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets").read_all() == {}


def test_unreachable_mongodb_fails_snapshot_and_window_clearly_and_keeps_the_offset(
    connections, kafka_bootstrap, unique_name, submitted
):
    port = _free_port()  # nothing listens there
    mongo = connections.mongo("faults_unreachable", f"mongodb://127.0.0.1:{port}/?replicaSet=rs0")
    props = {
        "topic.prefix": unique_name,
        "connect.max.attempts": 1,
        "connect.backoff.initial.delay.ms": 10,
        "connect.backoff.max.delay.ms": 10,
        "mongodb.server.selection.timeout.ms": 300,
        "mongodb.connect.timeout.ms": 300,
    }
    snapshot, window, _ = _operators(unique_name, props, mongo)

    # The snapshot operator finds out before submitting anything.
    with pytest.raises(AirflowException) as info:
        snapshot.execute({})
    message = str(info.value)
    assert f"Could not connect to MongoDB at mongodb://127.0.0.1:{port}" in message, message
    assert "after 2 attempts" in message and "Connection refused" in message, message
    assert "connect.max.attempts (now 1)" in message, message
    assert submitted == []  # refused before spark-submit
    kafka = {"bootstrap.servers": kafka_bootstrap}
    store = OffsetStore(kafka, f"{unique_name}.offsets")
    assert store.read_all() == {}

    # The window finds out in its Spark driver; a stored offset stays as it was.
    partition = OffsetPartition(unique_name, "rs0")
    stored = store.write(
        partition, OffsetState(position=Position(cluster_time=Timestamp(int(time.time()) - 60, 1)))
    )
    with pytest.raises(AirflowException) as info:
        window.execute({"data_interval_end": datetime.now(timezone.utc)})
    message = str(info.value)
    assert f"Could not connect to MongoDB at mongodb://127.0.0.1:{port}" in message, message
    assert "connect.max.attempts (now 1)" in message, message
    assert len(submitted) == 1
    assert store.read_all() == {partition: stored}


# -- snapshot data -----------------------------------------------------------------------------------
def test_oversize_document_fails_the_snapshot_then_skip_mode_resumes_it(
    mongodb_uri, kafka_bootstrap, unique_name, run_in_jvm
):
    database = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        rs = client.admin.command("hello")["setName"]
        client[database].items.insert_many([{"_id": n, "pad": "x" * 200} for n in range(200)])
        client[database].items.insert_one({"_id": 137.5, "big": "y" * 60_000})  # inside a middle chunk
    props = snapshot_connector(unique_name, database, 20, {"event.max.bytes": 20_000})
    mongo = {"connection_string": mongodb_uri}
    store = SettledOffsetStore(kafka, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, rs)
    topic = f"{unique_name}.{database}.items"

    failed = run_in_jvm("snapshot", props, mongo, kafka)
    assert failed["status"] == "failed" and failed["error_type"] == "OversizeEventError", failed
    assert "more than event.max.bytes=20000" in failed["message"]
    assert "cursor.oversize.handling.mode=skip" in failed["message"]  # the fix
    state = store.read(partition)
    assert state.snapshot.status == SNAPSHOT_IN_PROGRESS  # not completed: streaming cannot start
    markers = data_chunks_finished(store.chunk_markers(partition, state.snapshot.snapshot_id))
    assert len(markers) < state.snapshot.plan_size
    visible = Counter(_canonical(json_util.loads(event.key)) for event in changes(kafka_bootstrap, topic))
    assert _canonical(137.5) not in visible and set(visible.values()) <= {1}
    assert sum(visible.values()) == sum(marker.stats["events"] for marker in markers.values())

    resumed = run_in_jvm("snapshot", {**props, "cursor.oversize.handling.mode": "skip"}, mongo, kafka)
    assert resumed["status"] == "ok", resumed
    summary = resumed["summary"]
    assert summary["action"] == "resume" and summary["snapshot_id"] == state.snapshot.snapshot_id
    assert summary["events"] == 200
    keys = Counter(_canonical(json_util.loads(event.key)) for event in changes(kafka_bootstrap, topic))
    assert keys == Counter({_canonical(n): 1 for n in range(200)})
    completed = store.read(partition)
    assert completed.snapshot.status == SNAPSHOT_COMPLETED and completed.position == completed.snapshot.start
    markers = data_chunks_finished(store.chunk_markers(partition, state.snapshot.snapshot_id))
    assert sum(marker.stats.get("skipped_oversize", 0) for marker in markers.values()) == 1


@pytest.mark.simulator_only
def test_a_connector_error_raised_in_a_spark_task_is_the_runs_error(
    mongosim, kafka_bootstrap, unique_name, run_in_jvm
):
    """A chunk whose read fails inside its Spark task: the run's result is the connector's error
    as the task raised it (its type, and its message with cause and fix), not Spark's wrapper."""
    sim = mongosim("replset")
    database = unique_name[:40]
    with sim.client() as client:
        client[database].items.insert_many([{"_id": n} for n in range(50)])
        with failing_commands(client, "alwaysOn", ["find"], errorCode=2):
            result = run_in_jvm(
                "snapshot",
                snapshot_connector(unique_name, database, 25),
                {"connection_string": sim.uri},
                {"bootstrap.servers": kafka_bootstrap},
            )
    assert result["status"] == "failed", result
    assert result["error_type"] == "ConnectionFailedError", result
    assert result["message"].startswith("Reading snapshot chunk"), result
    assert "committed chunks are skipped" in result["message"], result


def test_collection_dropped_while_the_snapshot_copies_it(
    mongodb_uri, kafka_bootstrap, unique_name, run_in_jvm, capfd
):
    """Expected, as with Debezium (whose snapshot reads each collection with a find): the snapshot
    does not crash and its offsets stay consistent; the dropped collection's read events are the
    documents that were read before the drop, each once. A real MongoDB kills a find cursor on a
    dropped collection (QueryPlanKilled): that chunk's Spark task fails with a clear error, and the
    next run resumes and finds the collection gone. The simulator keeps the open cursor's
    documents, so there the first run completes."""
    database = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    sizes = {"a_kept": 300, "b_dropped": 600, "c_kept": 300}
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        rs = client.admin.command("hello")["setName"]
        for name, count in sizes.items():
            client[database][name].insert_many(
                [{"_id": n, "name": name, "pad": "z" * 300} for n in range(count)]
            )
    props = snapshot_connector(unique_name, database, 25, {"snapshot.fetch.size": 10})
    mongo = {"connection_string": mongodb_uri}
    store = SettledOffsetStore(kafka, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, rs)
    outcome: dict = {}

    def snapshot() -> None:
        try:
            outcome["result"] = run_in_jvm("snapshot", props, mongo, kafka)
        except BaseException as error:  # reported below
            outcome["error"] = error

    thread = threading.Thread(target=snapshot, daemon=True)
    thread.start()

    def chunks_committed() -> int:
        state = store.read(partition)
        if state is None or state.snapshot.snapshot_id is None:
            return 0
        return len(data_chunks_finished(store.chunk_markers(partition, state.snapshot.snapshot_id)))

    wait_for(
        lambda: chunks_committed() >= 3 or not thread.is_alive(),
        timeout=240,
        interval=0.2,
        message="no chunk committed in time",
    )
    assert thread.is_alive(), f"the snapshot ended before the drop: {outcome}"
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[database].drop_collection("b_dropped")
    thread.join(300)
    assert not thread.is_alive() and "error" not in outcome, outcome
    result = outcome["result"]
    if result["status"] == "failed":  # a server that kills the dropped collection's cursor
        assert result["error_type"] == "ConnectionFailedError", result
        assert "Reading snapshot chunk" in result["message"] and "b_dropped" in result["message"]
        assert "committed chunks are skipped" in result["message"]
        assert store.read(partition).snapshot.status == SNAPSHOT_IN_PROGRESS
        result = run_in_jvm("snapshot", props, mongo, kafka)
        assert result["status"] == "ok" and result["summary"]["action"] == "resume", result
    summary = result["summary"]
    logged = capfd.readouterr()
    assert "Traceback" not in logged.out + logged.err

    state = store.read(partition)
    assert state.snapshot.status == SNAPSHOT_COMPLETED and state.position == state.snapshot.start
    markers = data_chunks_finished(store.chunk_markers(partition, state.snapshot.snapshot_id))
    assert len(markers) == state.snapshot.plan_size
    read = {}
    for name, count in sizes.items():
        keys = Counter(
            int(json_util.loads(event.key))
            for event in changes(kafka_bootstrap, f"{unique_name}.{database}.{name}")
        )
        assert set(keys.values()) <= {1}, f"{name}: a document was read twice"
        assert set(keys) <= set(range(count))
        read[name] = len(keys)
        assert (
            sum(m.stats["events"] for m in markers.values() if m.stats["ns"] == f"{database}.{name}")
            == len(keys)
            == summary["collections"].get(f"{database}.{name}", 0)
        )
    assert read["a_kept"] == 300 and read["c_kept"] == 300  # the other collections are complete
    print(f"read before the drop: {read['b_dropped']} of {sizes['b_dropped']} documents of b_dropped")
    lasts = sum(
        bool(event.payload and event.payload["source"]["snapshot"] == "last")
        for name in sizes
        for event in changes(kafka_bootstrap, f"{unique_name}.{database}.{name}")
    )
    assert lasts == 1  # the final chunk is c_kept's
