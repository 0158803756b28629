"""The snapshot and the window operators on a real Spark standalone cluster: a master and one worker
started from the installed pyspark (``spark-class``), bound to 127.0.0.1 on free ports. The
operators submit with the Spark connection's master ``spark://127.0.0.1:<port>`` (client deploy
mode: the driver runs in the task, the Spark tasks in the worker's executors). Checked: the events
on the topic, the applications the master ran, and each application's executor in the worker's
work directory (its stderr file)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import httpx
import pyspark
import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.operators.base import build_code_archive
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from devtools.kafka.reading import read_topic

pytestmark = [pytest.mark.integration]

SPARK_CLASS = str(Path(pyspark.__file__).resolve().parent / "bin" / "spark-class")
START_TIMEOUT_S = 180
WAIT_S = 120


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_NO_DAEMONIZE": "1"}
    with open(log, "wb") as out:
        return subprocess.Popen(
            [SPARK_CLASS, *args], stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


class Cluster:
    def __init__(self, root: Path):
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.work_dir = root / "work"
        self.root = root
        self.processes: list[subprocess.Popen] = []

    @property
    def master(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def state(self) -> dict:
        return httpx.get(f"http://127.0.0.1:{self.ui_port}/json/", timeout=10).json()

    def start(self) -> None:
        self.processes.append(
            start(
                [
                    "org.apache.spark.deploy.master.Master",
                    *("--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui_port)),
                ],
                self.root / "master.log",
            )
        )
        self.processes.append(
            start(
                [
                    "org.apache.spark.deploy.worker.Worker",
                    self.master,
                    *("--host", "127.0.0.1", "--webui-port", str(self.worker_ui_port)),
                    *("--cores", "2", "--memory", "2g", "--work-dir", str(self.work_dir)),
                ],
                self.root / "worker.log",
            )
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            for process, name in zip(self.processes, ("master", "worker")):
                assert process.poll() is None, (
                    f"the Spark {name} exited:\n{(self.root / f'{name}.log').read_text()[-4000:]}"
                )
            try:
                if any(w.get("state") == "ALIVE" for w in self.state().get("workers", [])):
                    return
            except (httpx.HTTPError, ValueError):
                pass
            assert time.monotonic() < deadline, (
                f"no ALIVE worker on the master within {START_TIMEOUT_S} s:\n"
                f"{(self.root / 'master.log').read_text()[-3000:]}\n"
                f"{(self.root / 'worker.log').read_text()[-3000:]}"
            )
            time.sleep(0.5)

    def stop(self) -> None:
        for process in reversed(self.processes):
            stop(process)


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.simulator_only
def test_snapshot_and_window_run_on_a_standalone_cluster(
    cluster, mongosim, kafka_bootstrap, unique_name, monkeypatch
):
    sim = mongosim("replset")
    prefix = unique_name
    for conn_id, fields in (
        ("sa_mongo", {"conn_type": "mongocdc", "host": sim.uri}),
        ("sa_kafka", {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}),
        ("sa_spark", {"conn_type": "spark", "host": cluster.master}),
    ):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    arguments = {
        "connector_config": {
            "topic.prefix": prefix,
            "collection.include.list": "shop\\..*",
            "snapshot.chunk.size": 2,
            "snapshot.max.threads": 2,
        },
        "mongo_conn_id": "sa_mongo",
        "kafka_conn_id": "sa_kafka",
        "spark_conn_id": "sa_spark",
        "conf": {"spark.ui.enabled": "false", "spark.executor.memory": "512m", "spark.cores.max": "2"},
    }
    topic = f"{prefix}.shop.orders"
    with MongoClient(sim.uri) as client:
        client.shop.orders.insert_many([{"_id": n, "total": n} for n in range(5)])
        snapshot = MongoSnapshotOperator(task_id="snapshot", **arguments).execute({})
        assert snapshot["documents"] == 5, snapshot
        with client.start_session() as session:
            client.shop.orders.insert_many([{"_id": 10}, {"_id": 11}], session=session)
            last_change = session.operation_time
    deadline = time.monotonic() + WAIT_S
    while time.time() < last_change.time + 1:  # the window ends now: past the inserts
        assert time.monotonic() < deadline, f"the clock did not pass {last_change} within {WAIT_S} s"
        time.sleep(0.05)
    window = MongoStreamWindowOperator(task_id="window", **arguments).execute({})
    assert window["events"] == 2, window

    values = [json.loads(record.value)["payload"] for record in read_topic(kafka_bootstrap, topic)]
    assert sorted(v["op"] for v in values) == ["c", "c", "r", "r", "r", "r", "r"]

    # The master ran both applications (named mongocdc-<application>-<topic.prefix>) ...
    names = {f"mongocdc-snapshot-{prefix}", f"mongocdc-stream_window-{prefix}"}
    deadline = time.monotonic() + WAIT_S
    while not names <= {app["name"] for app in cluster.state().get("completedapps", [])}:
        assert time.monotonic() < deadline, f"the master did not list {names} as completed: {cluster.state()}"
        time.sleep(0.5)
    apps = {app["name"]: app["id"] for app in cluster.state()["completedapps"]}
    # ... whose Spark tasks ran in executors the worker launched (a directory per executor, with the
    # executor's stderr), not in the driver.
    for name in sorted(names):
        executors = list((cluster.work_dir / apps[name]).glob("*/stderr"))
        assert executors, f"no executor of {name} ({apps[name]}) in {cluster.work_dir}"


def test_executors_import_every_module_of_core_from_the_shipped_archive(cluster, spark_submit, tmp_path):
    """The operators ship the provider's code to the executors as one archive (``py_files``): every
    module of core's sub-packages is in it and is what an executor imports."""
    archive = build_code_archive(tmp_path)
    result = tmp_path / "modules.json"
    job = Path(__file__).parent / "spark_jobs" / "import_core_job.py"
    done = subprocess.run(
        [
            spark_submit,
            *("--master", cluster.master, "--py-files", archive),
            *("--conf", "spark.ui.enabled=false", "--conf", "spark.cores.max=1"),
            *("--conf", "spark.executor.memory=512m"),
            str(job),
            str(result),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    modules = json.loads(result.read_text())
    core = Path(__file__).resolve().parents[2] / "airflow_provider_mongocdc" / "core"
    expected = {
        ".".join(("airflow_provider_mongocdc", *path.relative_to(core.parent).with_suffix("").parts))
        for path in core.rglob("*.py")
        if path.name != "__init__.py"
    } | {f"airflow_provider_mongocdc.core.{path.parent.name}" for path in core.glob("*/__init__.py")}
    assert set(modules) == expected, sorted(set(modules) ^ expected)
    shipped = f"{Path(archive).name}/"  # the executor's copy of the archive, in its work directory
    outside = {name: path for name, path in modules.items() if shipped not in path}
    assert not outside, f"modules an executor imported from outside the archive {archive}: {outside}"
