"""The servers a benchmark needs: a Kafka broker and a MongoDB (simulator), started on first use.

``MONGOCDC_TEST_KAFKA_BOOTSTRAP`` / ``MONGOCDC_TEST_MONGODB_URI`` select external servers instead
(nothing is started for them). Servers this module starts are tied to the benchmark process (they
die with it) and are stopped by :meth:`Services.close`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent


class Services:
    """Lazily started broker and simulator; use as a context manager."""

    def __init__(self) -> None:
        self._broker = None
        self._sim = None
        self._bootstrap = os.environ.get("MONGOCDC_TEST_KAFKA_BOOTSTRAP")
        self._uri = os.environ.get("MONGOCDC_TEST_MONGODB_URI")
        self.started: list[str] = []

    # -- servers --
    @property
    def bootstrap(self) -> str:
        if self._bootstrap is None:
            from devtools.kafka import KafkaBroker

            began = time.monotonic()
            self._broker = KafkaBroker().start()
            self._bootstrap = self._broker.bootstrap_servers
            self.started.append(
                f"Kafka broker {self._bootstrap} (pid {self._broker.pid}, "
                f"{time.monotonic() - began:.1f} s to start)"
            )
        return self._bootstrap

    @property
    def kafka(self) -> dict[str, Any]:
        return {"bootstrap.servers": self.bootstrap}

    @property
    def mongodb_uri(self) -> str:
        if self._uri is None:
            from devtools.mongosim import MongoSim

            self._sim = MongoSim(mode="replset").start()
            self._uri = self._sim.uri
            self.started.append(
                f"MongoDB simulator {self._uri} (pid {self._sim.pid}, "
                f"{self._sim.start_seconds:.1f} s to start)"
            )
        return self._uri

    @property
    def external(self) -> dict[str, bool]:
        return {
            "kafka": bool(os.environ.get("MONGOCDC_TEST_KAFKA_BOOTSTRAP")),
            "mongodb": bool(os.environ.get("MONGOCDC_TEST_MONGODB_URI")),
        }

    def client(self) -> MongoClient:
        return MongoClient(self.mongodb_uri, serverSelectionTimeoutMS=20000)

    def close(self) -> None:
        sim, self._sim = self._sim, None
        broker, self._broker = self._broker, None
        if sim is not None:
            sim.stop()
        if broker is not None:
            broker.stop()

    def __enter__(self) -> Services:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# -- helpers shared by the MongoDB benchmarks ------------------------------------------------------
def operation_time(client: MongoClient, operation) -> Timestamp:
    """Run ``operation(session)`` and return the cluster time of its last write."""
    with client.start_session() as session:
        operation(session)
        return session.operation_time


def pass_second(client: MongoClient, end: Timestamp, marker_db: str, timeout_s: float = 30.0) -> None:
    """Write uncaptured markers until the server's cluster time is at or past ``end`` (so that a
    window ending at ``end`` can close)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ts = operation_time(
            client, lambda s: client[marker_db]["markers"].insert_one({"at": time.time()}, session=s)
        )
        if ts >= end:
            return
        if time.monotonic() >= deadline:
            raise RuntimeError(f"the server's cluster time did not reach {end}")
        time.sleep(max(0.05, min(1.0, end.time - time.time() + 0.05)))


def spark_env() -> dict[str, str]:
    """The environment of a spark-submit run (the venv's Python on both sides, local IP)."""
    env = dict(os.environ)
    env.update(
        {
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PATH": f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        }
    )
    return env


SPARK_ARGS = [
    "--master",
    "local[2]",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    "spark.ui.showConsoleProgress=false",
    # What the operators give the driver JVM in client deploy mode (operators/spark_options.py).
    "--driver-java-options",
    "-XX:TieredStopAtLevel=1 -XX:-UsePerfData",
]


def spark_submit(
    application: str, spec: Path, result: Path, timeout_s: float = 600.0
) -> tuple[int, str, float]:
    """Run ``spark-submit`` (local[2]); returns (exit code, output tail, wall seconds). The run's
    process group is killed when it outlives ``timeout_s``."""
    command = [
        str(VENV_BIN / "spark-submit"),
        *SPARK_ARGS,
        application,
        "--job-spec",
        str(spec),
        "--result",
        str(result),
    ]
    began = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=spark_env(), start_new_session=True
    )
    try:
        output, _ = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        output, _ = process.communicate()
        return -9, output.decode(errors="replace")[-4000:], time.perf_counter() - began
    return process.returncode, output.decode(errors="replace")[-4000:], time.perf_counter() - began
