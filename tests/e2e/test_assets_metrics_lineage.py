"""Assets, metrics and OpenLineage of the snapshot and window tasks, through real Airflow runs
(``airflow dags test``), spark-submit, the real Kafka broker and the MongoDB simulator.

A producer DAG (tests/e2e/dags/mongocdc_assets_dag.py) runs a snapshot then a window, twice; the
example consumer DAG (dags/mongocdc_consumer_example.py) is scheduled on the connector's Asset.
Checked: the asset events and their extra (the runs' summaries) in Airflow's metadata database, the
consumer DAG queued by them, the StatsD datagrams Airflow's Stats sends to a UDP socket the test
listens on, and the OpenLineage events the OpenLineage provider writes with its file transport.
Then an Airflow API server, scheduler (LocalExecutor) and DAG processor on 127.0.0.1 run the queued
consumer DAG, whose task reads the events' summaries (checked through the REST API, which serves
the extra unmasked).
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest
from pymongo import MongoClient

from devtools.kafka.reading import read_topic
from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import AIRFLOW, REPO, Stack, connections_env, start_airflow, stop

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

RUN_TIMEOUT_S = 600
WAIT_S = 120


class StatsdListener:
    """A UDP socket on 127.0.0.1 that keeps every StatsD line it receives."""

    def __init__(self):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.5)
        self.port = self.sock.getsockname()[1]
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65535)
            except TimeoutError:
                continue
            self.lines.extend(data.decode().splitlines())

    def wait_for(self, line: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while line not in self.lines:
            assert time.monotonic() < deadline, (
                f"StatsD line {line!r} not received within {WAIT_S} s; mongocdc lines: "
                f"{[x for x in self.lines if 'mongocdc' in x]}"
            )
            time.sleep(0.1)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.sock.close()


def run(env: dict[str, str], home: Path, *args: str) -> str:
    result = subprocess.run(
        [AIRFLOW, *args], env=env, cwd=home, capture_output=True, text=True, timeout=RUN_TIMEOUT_S
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"airflow {' '.join(args)} failed:\n{output[-6000:]}"
    return output


def of_assets(db: Path, prefix: str, query: str) -> list[tuple]:
    """The rows of ``query`` (on Airflow's metadata database ``db``) whose ``a.uri`` (``?``) is an
    asset of the connector with topic prefix ``prefix``."""
    with sqlite3.connect(db) as conn:
        return conn.execute(query, (f"mongocdc://{prefix}%",)).fetchall()


def asset_events(db: Path, prefix: str) -> list[tuple[str, dict]]:
    rows = of_assets(
        db,
        prefix,
        "SELECT e.source_task_id, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id "
        "WHERE a.uri LIKE ? ORDER BY e.id",
    )
    return [(task, json.loads(extra)) for task, extra in rows]


def queued_dags(db: Path, prefix: str) -> list[str]:
    rows = of_assets(
        db,
        prefix,
        "SELECT q.target_dag_id FROM asset_dag_run_queue q JOIN asset a ON a.id = q.asset_id "
        "WHERE a.uri LIKE ?",
    )
    return [row[0] for row in rows]


def lineage(path: Path, job: str) -> list[dict]:
    """The COMPLETE OpenLineage events of a task (job ``<dag_id>.<task_id>``)."""
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if e.get("eventType") == "COMPLETE" and e["job"]["name"] == job]


@pytest.fixture
def stack(kafka_bootstrap, tmp_path):
    home = tmp_path / "home"
    dags = home / "dags"
    dags.mkdir(parents=True)
    (dags / "mongocdc_assets_dag.py").symlink_to(REPO / "tests/e2e/dags/mongocdc_assets_dag.py")
    (dags / "mongocdc_consumer_example.py").symlink_to(REPO / "dags/mongocdc_consumer_example.py")
    spark_conf = home / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    prefix = f"assets{uuid.uuid4().hex[:8]}"
    statsd = StatsdListener()
    with MongoSim(mode="replset") as sim:
        env = dict(os.environ)
        env.update(
            {
                "AIRFLOW_HOME": str(home),
                "AIRFLOW__CORE__DAGS_FOLDER": str(dags),
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
                "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
                "AIRFLOW__METRICS__STATSD_ON": "True",
                "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
                "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
                "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                    {"type": "file", "log_file_path": str(home / "openlineage.jsonl"), "append": True}
                ),
                **connections_env(sim.uri, kafka_bootstrap),
                "AIRFLOW_VAR_MONGOCDC_ASSETS_PREFIX": prefix,
                "MONGOCDC_ASSETS_PREFIX": prefix,
                "MONGOCDC_CONSUMER_TOPIC_PREFIX": prefix,
                "SPARK_CONF_DIR": str(spark_conf),
            }
        )
        run(env, home, "db", "migrate")
        processes: list[subprocess.Popen] = []
        try:
            yield sim, prefix, env, home, statsd, processes
        finally:
            stop(processes)
            statsd.close()


def test_runs_emit_asset_events_metrics_and_lineage(stack, kafka_bootstrap):
    sim, prefix, env, home, statsd, processes = stack
    db = home / "airflow.db"
    topic = f"{prefix}.shop.orders"
    with MongoClient(sim.uri) as client:
        sim_partition = client.admin.command("hello")["setName"]
        client.shop.orders.insert_many([{"_id": i, "total": i} for i in range(3)])
        run(env, home, "dags", "test", "mongocdc_assets_producer")
        # The consumer DAG starts following the connector's Asset now: the next window queues it.
        run(env, home, "dags", "reserialize")
        run(env, home, "dags", "unpause", "mongocdc_consumer_example")

        with client.start_session() as session:
            client.shop.orders.insert_many([{"_id": 10}, {"_id": 11}], session=session)
            last_change = session.operation_time
    # The window of the next run ends at its logical date: wait until that lies past the inserts.
    deadline = time.monotonic() + WAIT_S
    while time.time() < last_change.time + 1:
        assert time.monotonic() < deadline, f"the clock did not pass {last_change} within {WAIT_S} s"
        time.sleep(0.05)
    run(env, home, "dags", "test", "mongocdc_assets_producer")

    records = read_topic(kafka_bootstrap, topic)
    assert [json.loads(r.value)["payload"]["op"] for r in records] == ["r", "r", "r", "c", "c"]

    # Asset events, extra = the run's summary: every window, and the snapshot that copied data (the
    # second run's snapshot had nothing to do).
    events = asset_events(db, prefix)
    assert [task for task, _ in events] == ["snapshot", "window", "window"], events
    first_snapshot, first_window, second_window = (extra for _, extra in events)
    assert first_snapshot["run"] == "snapshot" and first_snapshot["connector"] == prefix
    assert first_snapshot["documents"] == 3 and first_snapshot["topics"] == {topic: 3}
    assert first_snapshot["documents_by_collection"] == {"shop.orders": 3}
    assert first_window["events"] == 0 and first_window["topics"] == {}
    assert second_window["run"] == "stream_window"
    assert second_window["events"] == 2 and second_window["topics"] == {topic: 2}
    assert second_window["events_by_collection"] == {"shop.orders": 2}
    assert second_window["bytes"] > 0 and second_window["end_position"] and second_window["window_end"]
    # ... which queue a run of the consumer DAG scheduled on the connector's Asset.
    assert queued_dags(db, prefix) == ["mongocdc_consumer_example"]

    # Metrics through Airflow's Stats (StatsD, prefix "airflow"), per connector and tagged.
    statsd.wait_for(f"airflow.mongocdc.snapshot.documents.{prefix}:3|c")
    statsd.wait_for(f"airflow.mongocdc.window.events.{prefix}:2|c")
    statsd.wait_for("airflow.mongocdc.window.events:2|c")
    assert any(
        line.startswith(f"airflow.mongocdc.window.bytes.{prefix}:") and int(line.split(":")[1][:-2]) > 0
        for line in statsd.lines
    ), statsd.lines

    # OpenLineage: MongoDB collections in, Kafka topics out.
    path = home / "openlineage.jsonl"
    deadline = time.monotonic() + WAIT_S
    while len(lineage(path, "mongocdc_assets_producer.window")) < 2:
        assert time.monotonic() < deadline, f"no OpenLineage COMPLETE events of the window in {path}"
        time.sleep(0.2)
    mongo_ns = "mongodb://" + sim.uri.split("://", 1)[1].split("/", 1)[0].split(",", 1)[0]
    window = lineage(path, "mongocdc_assets_producer.window")[-1]
    assert [(d["namespace"], d["name"]) for d in window["inputs"]] == [(mongo_ns, "shop.orders")]
    assert [(d["namespace"], d["name"]) for d in window["outputs"]] == [(f"kafka://{kafka_bootstrap}", topic)]
    snapshot = lineage(path, "mongocdc_assets_producer.snapshot")[0]
    assert [(d["namespace"], d["name"]) for d in snapshot["outputs"]] == [
        (f"kafka://{kafka_bootstrap}", topic)
    ]

    # The scheduler runs the consumer DAG the asset events queued; its task sums the summaries.
    api = start_airflow(Stack(sim, prefix, kafka_bootstrap, env, home, processes))
    consumer = "mongocdc_consumer_example"
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while True:
        runs = api.call("GET", f"/api/v2/dags/{consumer}/dagRuns").json().get("dag_runs", [])
        if runs and runs[0]["state"] in ("success", "failed"):
            break
        assert time.monotonic() < deadline, (
            f"no finished run of {consumer} within {RUN_TIMEOUT_S} s: {runs}\n"
            + (home / "scheduler.log").read_text()[-4000:]
        )
        time.sleep(2)
    (consumer_run,) = runs
    assert consumer_run["state"] == "success" and consumer_run["run_type"] == "asset_triggered", consumer_run
    base = f"/api/v2/dags/{consumer}/dagRuns/{consumer_run['dag_run_id']}"
    upstream = sorted(
        api.call("GET", f"{base}/upstreamAssetEvents").json()["asset_events"], key=lambda e: e["id"]
    )
    assert upstream and upstream[-1]["source_task_id"] == "window", upstream
    assert upstream[-1]["extra"]["events"] == 2 and upstream[-1]["extra"]["topics"] == {topic: 2}
    # The REST API (and so the UI) serves every extra as stored, nothing masked as a secret: the
    # snapshot's end position holds the change stream's resume token, as resume_point.
    served = api.call(
        "GET", "/api/v2/assets/events", params={"source_dag_id": "mongocdc_assets_producer", "limit": 100}
    ).json()["asset_events"]
    assert [event["extra"] for event in sorted(served, key=lambda e: e["id"])] == [e for _, e in events]
    (end,) = first_snapshot["end_position"]
    assert end["partition"] == sim_partition and end["resume_point"] and end["sec"] > 0, end
    # The consumer's task read the summaries of the events that triggered it.
    expected: dict[str, int] = {}
    for event in upstream:
        for name, count in event["extra"]["topics"].items():
            expected[name] = expected.get(name, 0) + count
    xcom = api.call(
        "GET",
        f"{base}/taskInstances/topics_with_new_data/xcomEntries/return_value",
        params={"deserialize": True},
    ).json()
    assert xcom["value"] in (expected, json.dumps(expected)), (xcom, upstream)
