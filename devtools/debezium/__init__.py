"""Debezium's MongoDB connector run by Kafka Connect standalone, for side-by-side benchmarks.

:func:`ensure_jars` fetches Kafka Connect's runtime (``connect-runtime``, the Kafka version of
``devtools/kafka/pom.xml``) and Debezium's MongoDB connector (``pom.xml`` here) with Maven into
``devtools/debezium/target/lib`` (cached in ``~/.m2``). :class:`ConnectStandalone` runs
``org.apache.kafka.connect.cli.ConnectStandalone`` with one connector in a JVM of its own, with
the JVM options of the Kafka distribution's ``connect-standalone.sh`` (``kafka-run-class.sh``):
JsonConverter with schemas for keys and values (Debezium's default), offsets in a file.

``python -m devtools.debezium fetch`` fetches the jars (``make debezium-jars``).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
JAR_DIR = HERE / "target" / "lib"
START_TIMEOUT_S = 240.0
CONNECTOR_CLASS = "io.debezium.connector.mongodb.MongoDbConnector"
# kafka-run-class.sh's defaults for Connect (KAFKA_HEAP_OPTS of connect-standalone.sh, KAFKA_JVM_PERFORMANCE_OPTS).
JVM_OPTIONS = [
    "-Xms256M",
    "-Xmx2G",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]


class ConnectError(RuntimeError):
    """The Kafka Connect worker could not be fetched, started, or its connector failed."""


def _tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / name).exists():
        return str(Path(java_home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise ConnectError(
            f"Kafka Connect needs '{name}', which is not on PATH. Fix: install a Java 17 JDK "
            "(Debian: apt-get install openjdk-17-jdk-headless) and Apache Maven (apt-get install maven)."
        )
    return found


def ensure_jars(quiet: bool = True) -> Path:
    """Fetch the jars with Maven when they are not there yet (or the pom changed); return their directory."""
    marker = JAR_DIR / ".complete"
    if marker.exists() and marker.read_text() == POM.read_text():
        return JAR_DIR
    if JAR_DIR.exists():
        shutil.rmtree(JAR_DIR)
    cmd = [
        _tool("mvn"),
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-DoutputDirectory={JAR_DIR}",
        "-DincludeScope=runtime",
    ]
    if quiet:
        cmd.insert(2, "-q")
    result = subprocess.run(cmd, capture_output=quiet, text=True)
    if result.returncode != 0:
        raise ConnectError(
            f"Fetching the Kafka Connect and Debezium jars with Maven failed (exit {result.returncode}): "
            f"{(result.stdout or '')[-2000:]}{(result.stderr or '')[-2000:]}"
        )
    marker.write_text(POM.read_text())
    return JAR_DIR


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the worker dies with its launcher
    except OSError:
        pass


def _properties(path: Path, values: dict[str, Any]) -> Path:
    path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    return path


class ConnectStandalone:
    """One Kafka Connect standalone worker running one Debezium MongoDB connector; a context manager.

    ``connector``: the connector's properties beyond its name and class (``mongodb.connection.string``,
    ``topic.prefix``, ``collection.include.list``, ...).
    """

    def __init__(self, bootstrap: str, name: str, connector: dict[str, Any], work_dir: Path | None = None):
        self.bootstrap = bootstrap
        self.name = name
        self.connector = dict(connector)
        self._own_dir = work_dir is None
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="mongocdc-connect-"))
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        self.start_seconds: float | None = None

    @property
    def log_path(self) -> Path:
        return self.work_dir / "connect.log"

    def start(self, wait_running: bool = True) -> ConnectStandalone:
        jars = ensure_jars()
        began = time.monotonic()
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        worker = _properties(
            self.work_dir / "worker.properties",
            {
                "bootstrap.servers": self.bootstrap,
                "key.converter": "org.apache.kafka.connect.json.JsonConverter",
                "value.converter": "org.apache.kafka.connect.json.JsonConverter",
                "key.converter.schemas.enable": "true",
                "value.converter.schemas.enable": "true",
                "offset.storage.file.filename": str(self.work_dir / "connect.offsets"),
                "offset.flush.interval.ms": "10000",
                "listeners": f"http://127.0.0.1:{self.port}",
                "plugin.discovery": "only_scan",
            },
        )
        connector = _properties(
            self.work_dir / "connector.properties",
            {"name": self.name, "connector.class": CONNECTOR_CLASS, "tasks.max": "1", **self.connector},
        )
        log = open(self.log_path, "ab")
        command = [
            _tool("java"),
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}",
            "-cp",
            f"{jars}/*",
            "org.apache.kafka.connect.cli.ConnectStandalone",
            str(worker),
            str(connector),
        ]
        self.process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent, cwd=self.work_dir
        )
        log.close()
        self.pid = self.process.pid
        if wait_running:
            self.wait_running(began + START_TIMEOUT_S)
        self.start_seconds = time.monotonic() - began
        return self

    def status(self) -> dict[str, Any] | None:
        """The connector's status from the worker's REST API, or None while it does not answer."""
        try:
            with urllib.request.urlopen(
                f"http://127.0.0.1:{self.port}/connectors/{self.name}/status", timeout=5
            ) as reply:
                return json.loads(reply.read())
        except (urllib.error.URLError, OSError, ValueError):
            return None

    def wait_running(self, deadline: float) -> None:
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise ConnectError(f"Kafka Connect exited (code {self.process.returncode}){self.log_tail()}")
            status = self.status()
            tasks = (status or {}).get("tasks") or []
            if tasks and any(task.get("state") == "FAILED" for task in tasks):
                raise ConnectError(f"the connector's task failed: {tasks}{self.log_tail()}")
            if (
                status
                and status["connector"]["state"] == "RUNNING"
                and tasks
                and all(task.get("state") == "RUNNING" for task in tasks)
            ):
                return
            if time.monotonic() >= deadline:
                raise ConnectError(
                    f"the connector is not running after the start timeout: {status}{self.log_tail()}"
                )
            time.sleep(0.5)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            text = self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""
        return f"; the worker's log ends with: {text}" if text.strip() else ""

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> ConnectStandalone:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
