"""What the end-to-end modules share: a stack (the MongoDB simulator, the real Kafka broker and an
Airflow environment), Airflow's CLI and REST API, the views of the topics the tests compare with
MongoDB, and the README's setup commands with the test's servers in place of its examples."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from pymongo import MongoClient

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.kafka.reading import read_topic
from devtools.mongosim import MongoSim

REPO = Path(__file__).resolve().parents[2]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
COLLECTIONS = ("orders", "customers")
# Bounds of an Airflow run (spark-submit included) and of a REST call on a loaded machine.
RUN_TIMEOUT_S = 420
HTTP_TIMEOUT_S = 120
# A triggered DAG run: a snapshot and a window (spark-submit each), possibly queued behind the run
# the scheduler creates when the DAG is switched on.
DAG_RUN_TIMEOUT_S = 900


def connections_env(mongo_uri: str, kafka_bootstrap: str) -> dict[str, str]:
    """The default connections of the example DAGs, as Airflow reads them from the environment."""
    return {
        "AIRFLOW_CONN_MONGOCDC_DEFAULT": json.dumps({"conn_type": "mongocdc", "host": mongo_uri}),
        "AIRFLOW_CONN_KAFKA_DEFAULT": json.dumps(
            {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
        ),
        "AIRFLOW_CONN_SPARK_DEFAULT": json.dumps({"conn_type": "spark", "host": "local[2]"}),
    }


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
    deadline = time.monotonic() + 60
    for process in processes:
        try:
            process.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)


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

    def task_log(self, dag_id: str, run_id: str, task_id: str, try_number: int = 1) -> str:
        response = self.call(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/logs/{try_number}",
            headers={"Accept": "application/json"},
        )
        try:  # Airflow 3.3 answers {"content": [{"event": ..., ...}, ...]}; text for messages
            content = response.json().get("content") or []
            lines = []
            for item in content:
                if not isinstance(item, dict):
                    lines.append(str(item))
                    continue
                lines.append(item.get("event", str(item)))
                # An exception, as the UI shows it under its log line: type and message.
                for error in item.get("error_detail") or []:
                    lines.append(f"{error.get('exc_type')}: {error.get('exc_value')}")
            text = "\n".join(lines)
        except ValueError:
            text = response.text
        return text[-6000:]


def start_airflow(stack: Stack) -> Api:
    """API server, scheduler (LocalExecutor) and DAG processor on 127.0.0.1, no log servers; a
    logged-in REST client."""
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
    # The API server first: a task the scheduler runs at once reports to its execution API.
    api = Api(f"http://127.0.0.1:{port}", password)
    for name, command in commands.items():
        with open(stack.home / f"{name}.log", "w") as log:
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
        deadline = time.monotonic() + 300
        while name == "api-server":
            try:
                if api.http.get("/api/v2/monitor/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, (stack.home / "api-server.log").read_text()[-4000:]
            assert all(p.poll() is None for p in stack.processes), "the Airflow API server exited"
            time.sleep(1)
    api.login()
    return api


def start_triggerer(stack: Stack, log_name: str = "triggerer.log") -> subprocess.Popen:
    """Airflow's triggerer (it runs the AssetWatchers' triggers) with the stack's environment, its
    output in ``home/<log_name>``; stopped with the stack's other processes."""
    with open(stack.home / log_name, "w") as log:
        process = subprocess.Popen(
            [AIRFLOW, "triggerer", "--skip-serve-logs"],
            env=stack.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=stack.home,
            start_new_session=True,
        )
    stack.processes.append(process)
    return process


def return_value(api: Api, dag_id: str, run_id: str, task_id: str) -> dict:
    """A task's XCom ``return_value`` (a run's summary), through the REST API."""
    response = api.call(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/return_value"
    )
    assert response.status_code == 200, response.text
    value = response.json()["value"]
    return value if isinstance(value, dict) else json.loads(value)


def dag_folder(home: Path, connectors: dict | None = None) -> Path:
    """The repository's connector DAG file, its settings and its list (or ``connectors``)."""
    folder = home / "dags"
    folder.mkdir()
    for name in ("mongocdc_connectors.py", "mongocdc_connectors.json"):
        shutil.copy(REPO / "dags" / name, folder / name)
    if connectors is not None:
        (folder / "mongocdc_connectors.json").write_text(json.dumps(connectors))
    return folder


def own_airflow(airflow_env: dict[str, str], home: Path, folder: Path) -> dict[str, str]:
    """An Airflow home of its own (SQLite, a copy of the session's migrated database), with
    ``folder`` as DAGs folder."""
    env = dict(airflow_env)
    for key in [key for key in env if key.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))]:
        del env[key]
    env.pop("MONGOCDC_POOL", None)
    env.pop("MONGOCDC_CONNECTOR_CONFIG", None)
    spark_conf = home / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__DAGS_FOLDER": str(folder),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "SPARK_CONF_DIR": str(spark_conf),
        }
    )
    # The session's freshly migrated database (``migrated.db`` of its Airflow home, see
    # tests/conftest.py): `airflow db migrate` runs once per session.
    shutil.copyfile(Path(airflow_env["AIRFLOW_HOME"]) / "migrated.db", home / "airflow.db")
    return env


def wait_for(what: str, condition, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what} within {timeout} s"
        time.sleep(2)


def wait_registered(api, dag_id: str) -> None:
    """Wait until the dag-processor has registered ``dag_id`` (the REST API knows it)."""
    wait_for(
        f"the dag-processor did not register {dag_id}",
        lambda: api.call("GET", f"/api/v2/dags/{dag_id}").status_code == 200,
    )


def unpause(api, dag_id: str) -> None:
    """Switch ``dag_id`` on, as the UI's toggle does."""
    patched = api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
    assert patched.status_code == 200, patched.text


def reads(bootstrap: str, topic: str) -> int:
    return sum(1 for _, value in topic_events(bootstrap, topic) if value is not None and value["op"] == "r")


def trigger(api, dag_id: str, logical_date: str) -> str:
    created = api.call(
        "POST",
        f"/api/v2/dags/{dag_id}/dagRuns",
        json={"logical_date": logical_date, "conf": {}, "note": None},
    )
    assert created.status_code == 200, created.text
    return created.json()["dag_run_id"]


def assert_all_tasks_succeed(api, dag_id: str, run_id: str) -> None:
    run = api.wait_run(dag_id, run_id, timeout=DAG_RUN_TIMEOUT_S)
    instances = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
    states = {ti["task_id"]: ti["state"] for ti in instances["task_instances"]}
    failed = [task for task, state in states.items() if state != "success"]
    logs = "\n".join(api.task_log(dag_id, run_id, task) for task in failed)
    assert run["state"] == "success" and not failed, f"{dag_id} {run_id}: {states}\n{logs}"
