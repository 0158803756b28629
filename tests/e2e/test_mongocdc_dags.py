"""The example DAGs end to end: real Airflow runs, the real Kafka broker, the MongoDB simulator and
spark-submit.

1. ``airflow dags test mongocdc_hourly``: the first run snapshots, then the windows stream the
   changes; the state rebuilt from the topics equals the collections.
2. The simulator's oplog retention drops the stored position; ``airflow dags test
   mongocdc_watchdog`` finds the gap on its first poke and triggers ``mongocdc_resnapshot`` with the
   gap report. An Airflow API server, scheduler (LocalExecutor) and DAG processor, all on
   127.0.0.1, then run that re-snapshot, and a second one created through the REST API with conf,
   exactly as the UI's trigger form posts it; the second runs with those params.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from pymongo import MongoClient

from airflow_provider_mongocdc.core.offsets import OffsetPartition, OffsetStore
from devtools.kafka.reading import read_topic
from devtools.mongosim import MongoSim

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

AIRFLOW = str(Path(sys.executable).parent / "airflow")
COLLECTIONS = ("orders", "customers")
# Bounds of an Airflow run (spark-submit included) and of a REST call on a loaded machine.
RUN_TIMEOUT_S = 420
HTTP_TIMEOUT_S = 120


# -- helpers -----------------------------------------------------------------------------------------
@dataclass
class Stack:
    sim: MongoSim
    prefix: str
    bootstrap: str
    env: dict[str, str]
    home: Path
    processes: list[subprocess.Popen] = field(default_factory=list)

    @property
    def client(self) -> MongoClient:
        return MongoClient(self.sim.uri)

    def airflow(self, *args: str, timeout: float = RUN_TIMEOUT_S) -> str:
        result = subprocess.run(
            [AIRFLOW, *args], env=self.env, capture_output=True, text=True, timeout=timeout, cwd=self.home
        )
        output = result.stdout + result.stderr
        assert result.returncode == 0, f"airflow {' '.join(args)} failed:\n{output[-6000:]}"
        return output

    def offsets(self):
        store = OffsetStore({"bootstrap.servers": self.bootstrap}, f"{self.prefix}.offsets")
        return store.read(OffsetPartition(self.prefix, "rs0"))


def canonical(value) -> str:
    return json_util.dumps(value, json_options=CANONICAL_JSON_OPTIONS)


def topic_events(bootstrap: str, topic: str) -> list[tuple[dict, dict | None]]:
    """(key payload, value payload or None for a tombstone) of every committed record."""
    events = []
    for record in read_topic(bootstrap, topic):
        key = json.loads(record.key)
        value = json.loads(record.value) if record.value is not None else None
        events.append((key.get("payload", key), value.get("payload", value) if value else None))
    return events


def rebuilt(bootstrap: str, prefix: str, collection: str) -> dict[str, str]:
    """A consumer's view: the last event per key, deletes and tombstones removing the key."""
    state: dict[str, str] = {}
    for key, value in topic_events(bootstrap, f"{prefix}.shop.{collection}"):
        if value is None or value["op"] == "d":
            state.pop(key["id"], None)
        else:
            document = json_util.loads(value["after"])
            state[key["id"]] = canonical(document)
    return state


def in_mongo(client: MongoClient, collection: str) -> dict[str, str]:
    return {canonical(doc["_id"]): canonical(doc) for doc in client.shop[collection].find()}


def normalised(state: dict[str, str]) -> dict[str, str]:
    """Keys as canonical Extended JSON, whatever JSON mode the event keys use."""
    return {canonical(json_util.loads(key)): value for key, value in state.items()}


def assert_topics_equal_mongo(stack: Stack, collections: Iterable[str] = COLLECTIONS) -> None:
    client = stack.client
    for collection in collections:
        assert normalised(rebuilt(stack.bootstrap, stack.prefix, collection)) == in_mongo(
            client, collection
        ), collection


def read_events(stack: Stack, collection: str) -> int:
    return sum(
        1
        for _, value in topic_events(stack.bootstrap, f"{stack.prefix}.shop.{collection}")
        if value is not None and value["op"] == "r"
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def stop(processes: list[subprocess.Popen]) -> None:
    for process in processes:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + 30
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


# -- the stack ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(airflow_env, kafka_bootstrap, tmp_path_factory):
    home = tmp_path_factory.mktemp("e2e")
    spark_conf = home / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    prefix = f"e2e{uuid.uuid4().hex[:8]}"
    props = {"topic.prefix": prefix, "collection.include.list": "shop\\..*"}
    with MongoSim(mode="replset") as sim:
        env = dict(airflow_env)
        env.update(
            {
                "AIRFLOW_CONN_MONGOCDC_DEFAULT": json.dumps({"conn_type": "mongocdc", "host": sim.uri}),
                "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
                    {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
                ),
                "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
                "AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG": json.dumps(props),
                "MONGOCDC_POOL": f"mongocdc_{prefix}",
                "SPARK_CONF_DIR": str(spark_conf),
            }
        )
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        stack.airflow("pools", "set", f"mongocdc_{prefix}", "1", f"MongoDB CDC connector {prefix}")
        try:
            yield stack
        finally:
            stop(stack.processes)


# -- 1: hourly ---------------------------------------------------------------------------------------
def test_first_hourly_run_snapshots_then_windows_stream(stack):
    client = stack.client
    client.shop.orders.insert_many([{"_id": i, "status": "new", "total": i * 10} for i in range(1, 31)])
    client.shop.customers.insert_many([{"_id": f"c{i}", "name": f"customer {i}"} for i in range(1, 11)])
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)

    # A run whose data interval ends in the future: its window ends now.
    stack.airflow("dags", "test", "mongocdc_hourly", (hour + timedelta(hours=1)).isoformat())
    state = stack.offsets()
    assert state.snapshot.status == "completed" and state.windows == 1
    assert read_events(stack, "orders") == 30 and read_events(stack, "customers") == 10
    assert_topics_equal_mongo(stack)

    client.shop.orders.insert_one({"_id": 31, "status": "new", "total": 310})
    client.shop.orders.update_one({"_id": 1}, {"$set": {"status": "paid"}})
    client.shop.orders.delete_one({"_id": 2})
    with client.start_session() as session:
        client.shop.customers.update_one({"_id": "c1"}, {"$set": {"name": "renamed"}}, session=session)
        last_change = session.operation_time
    # The window ends at the whole second of its start: wait until that lies past the changes.
    deadline = time.monotonic() + 120
    while time.time() < last_change.time + 1:
        assert time.monotonic() < deadline, f"the clock did not pass {last_change} within 120 s"
        time.sleep(0.05)
    stack.airflow("dags", "test", "mongocdc_hourly", (hour + timedelta(hours=2)).isoformat())

    after = stack.offsets()
    assert after.windows == 2 and after.events - state.events == 4  # c, u, d (and a tombstone), u
    assert after.snapshot.snapshot_id == state.snapshot.snapshot_id  # no snapshot needed this time
    assert read_events(stack, "orders") == 30
    ops = [value["op"] for _, value in topic_events(stack.bootstrap, f"{stack.prefix}.shop.orders") if value]
    assert ops[30:] == ["c", "u", "d"]
    assert_topics_equal_mongo(stack)


# -- 2: gap, watchdog, re-snapshot, REST API -----------------------------------------------------------
class Api:
    def __init__(self, base: str, password: str):
        self.http = httpx.Client(base_url=base, timeout=HTTP_TIMEOUT_S)
        self.password = password
        self.token: str | None = None

    def login(self) -> None:
        response = self.http.post("/auth/token", json={"username": "admin", "password": self.password})
        assert response.status_code in (200, 201), response.text
        self.token = response.json()["access_token"]

    def call(self, method: str, path: str, *, headers: dict | None = None, **kwargs) -> httpx.Response:
        headers = {"Authorization": f"Bearer {self.token}", **(headers or {})}
        return self.http.request(method, path, headers=headers, **kwargs)

    def wait_run(self, dag_id: str, run_id: str, timeout: float = RUN_TIMEOUT_S) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            run = self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}").json()
            if run.get("state") in ("success", "failed"):
                return run
            time.sleep(2)
        raise AssertionError(f"{dag_id} run {run_id} did not finish within {timeout} s: {run}")

    def task_log(self, dag_id: str, run_id: str, task_id: str) -> str:
        response = self.call(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/1",
            headers={"Accept": "application/json"},
        )
        try:  # Airflow 3.3 answers {"content": [{"event": ..., ...}, ...]}; text for messages
            content = response.json().get("content") or []
            lines = [
                item.get("event", str(item)) if isinstance(item, dict) else str(item) for item in content
            ]
            text = "\n".join(lines)
        except ValueError:
            text = response.text
        return text[-6000:]


def start_airflow(stack: Stack) -> Api:
    """API server, scheduler (LocalExecutor) and DAG processor on 127.0.0.1, no log servers."""
    port = free_port()
    password = uuid.uuid4().hex
    passwords = stack.home / "passwords.json"
    passwords.write_text(json.dumps({"admin": password}))
    stack.env.update(
        {
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "2",
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__API__PORT": str(port),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
            "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
            "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        }
    )
    commands = {
        "api-server": [AIRFLOW, "api-server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
        "scheduler": [AIRFLOW, "scheduler", "--skip-serve-logs"],
        "dag-processor": [AIRFLOW, "dag-processor"],
    }
    for name, command in commands.items():
        log = open(stack.home / f"{name}.log", "w")
        stack.processes.append(
            subprocess.Popen(
                command,
                env=stack.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=stack.home,
                start_new_session=True,
            )
        )
    api = Api(f"http://127.0.0.1:{port}", password)
    deadline = time.monotonic() + 300
    while True:
        try:
            if api.http.get("/api/v2/monitor/health").status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, (stack.home / "api-server.log").read_text()[-4000:]
        assert all(p.poll() is None for p in stack.processes), "an Airflow component exited"
        time.sleep(1)
    api.login()
    return api


def test_watchdog_finds_the_gap_and_resnapshots_then_rest_api_params_are_used(stack):
    client = stack.client
    assert stack.offsets() is not None, "needs the offsets of the hourly runs (previous test)"
    # Changes that the purge takes out of the oplog before any window reads them.
    client.shop.orders.insert_many([{"_id": 100 + i, "status": "late"} for i in range(5)])
    client.shop.orders.update_one({"_id": 3}, {"$set": {"status": "shipped"}})
    client.shop.customers.insert_one({"_id": "c99", "name": "late customer"})
    stack.sim.set_oplog_retention(max_entries=3)

    output = stack.airflow("dags", "test", "mongocdc_watchdog")
    # Found on the first poke: one check, and it saw the gap (no earlier "resumable" poke).
    assert output.count("OPLOG GAP") == 1 and "resumable" not in output
    before_resnapshot = stack.offsets()

    api = start_airflow(stack)
    assert api.call("PATCH", "/api/v2/dags/mongocdc_resnapshot", json={"is_paused": False}).status_code == 200

    (watchdog_run,) = api.call("GET", "/api/v2/dags/mongocdc_watchdog/dagRuns").json()["dag_runs"]
    links = api.call(
        "GET",
        f"/api/v2/dags/mongocdc_watchdog/dagRuns/{watchdog_run['dag_run_id']}/taskInstances/detect_gap/links",
    ).json()["extra_links"]
    assert links["Re-snapshot (trigger form)"].endswith("/dags/mongocdc_resnapshot")

    runs = api.call("GET", "/api/v2/dags/mongocdc_resnapshot/dagRuns").json()["dag_runs"]
    (gap_run,) = runs
    assert gap_run["dag_run_id"].startswith(f"gap__{stack.prefix}__rs0-")
    assert gap_run["conf"]["mode"] == "gap" and gap_run["conf"]["gap_report"]["gap_partitions"] == ["rs0"]
    finished = api.wait_run("mongocdc_resnapshot", gap_run["dag_run_id"])
    assert finished["state"] == "success", api.task_log(
        "mongocdc_resnapshot", gap_run["dag_run_id"], "resnapshot"
    )

    repaired = stack.offsets()
    assert repaired.snapshot.snapshot_id != before_resnapshot.snapshot.snapshot_id
    assert repaired.position == repaired.snapshot.start  # the offset moved to the new snapshot's start
    assert_topics_equal_mongo(stack)
    orders_reads, customers_reads = read_events(stack, "orders"), read_events(stack, "customers")

    # The trigger form's path: POST a run with conf.
    conf = {"collections": ["shop.customers"], "reason": "refresh customers", "mode": "manual"}
    created = api.call(
        "POST", "/api/v2/dags/mongocdc_resnapshot/dagRuns", json={"logical_date": None, "conf": conf}
    )
    assert created.status_code == 200, created.text
    run_id = created.json()["dag_run_id"]
    finished = api.wait_run("mongocdc_resnapshot", run_id)
    assert finished["state"] == "success", api.task_log("mongocdc_resnapshot", run_id, "resnapshot")

    xcom = api.call(
        "GET",
        f"/api/v2/dags/mongocdc_resnapshot/dagRuns/{run_id}/taskInstances/resnapshot/"
        "xcomEntries/return_value",
    ).json()["value"]
    summary = xcom if isinstance(xcom, dict) else json.loads(xcom)
    assert summary["resnapshot"]["collections"] == ["shop.customers"]
    assert (
        summary["resnapshot"]["mode"] == "manual" and summary["resnapshot"]["reason"] == "refresh customers"
    )
    assert summary["resnapshot"]["reset_offset"] is False
    assert summary["collections"] == {"shop.customers": client.shop.customers.count_documents({})}
    assert read_events(stack, "customers") == customers_reads + client.shop.customers.count_documents({})
    assert read_events(stack, "orders") == orders_reads
    assert stack.offsets().position == repaired.position  # streaming continues where it was
    assert_topics_equal_mongo(stack)
