"""Run the real Apache Kafka broker (KRaft, one combined broker+controller node) on 127.0.0.1.

The broker jars come from Maven Central through ``devtools/kafka/pom.xml`` (``mvn
dependency:copy-dependencies``); nothing else is downloaded. The broker listens on a free port
chosen at start, keeps its data in a temporary directory, and is configured so that
transactions and log compaction work on a single node.
"""

from __future__ import annotations

import base64
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
JAR_DIR = Path(os.environ.get("MONGOCDC_KAFKA_JARS", HERE / "target" / "lib"))
# Bounds only: a JVM start on a loaded 2-core machine can take a minute or more.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
KILL_TIMEOUT_S = 60.0

# Single-node settings: internal topics with replication factor 1 and min ISR 1 so that
# consumer groups and transactions work; a fast log cleaner so compaction is observable.
BROKER_SETTINGS = {
    "process.roles": "broker,controller",
    "node.id": "1",
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "num.partitions": "1",
    "default.replication.factor": "1",
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "true",
    "log.cleaner.enable": "true",
    "log.cleaner.backoff.ms": "500",
    "log.retention.check.interval.ms": "1000",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "5000",
    "transaction.remove.expired.transaction.cleanup.interval.ms": "60000",
    "message.max.bytes": "10485760",
}


class KafkaLaunchError(RuntimeError):
    """The broker could not be fetched or started."""


def ensure_jars(quiet: bool = True) -> Path:
    """Fetch the broker jars with Maven when they are not there yet; return their directory."""
    marker = JAR_DIR / ".complete"
    if marker.exists() and marker.read_text() == POM.read_text():
        return JAR_DIR
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaLaunchError(
            "Cannot fetch the Kafka broker jars: 'mvn' is not on PATH. "
            "Fix: install Apache Maven (Debian: apt-get install maven) or set MONGOCDC_KAFKA_JARS "
            "to a directory holding the kafka_2.13 jars and their dependencies."
        )
    if JAR_DIR.exists():
        shutil.rmtree(JAR_DIR)
    cmd = [
        mvn,
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
        raise KafkaLaunchError(
            "Fetching the Kafka broker jars with Maven failed "
            f"(exit {result.returncode}): {(result.stdout or '')[-2000:]}{(result.stderr or '')[-2000:]}"
        )
    marker.write_text(POM.read_text())
    return JAR_DIR


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the broker dies with its launcher
    except OSError:
        pass


def _java() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise KafkaLaunchError("Cannot start Kafka: 'java' is not on PATH. Fix: install Java 17 or later.")
    return java


class KafkaBroker:
    """A single-node KRaft broker. Use as a context manager, or call start() and stop().

    ``tie_to_parent`` makes the broker die with the Python process that started it, so that a
    killed test run leaves nothing behind; the command line's detached mode turns it off.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        heap: str = "512m",
        tie_to_parent: bool = True,
        extra_settings: dict[str, str] | None = None,
    ):
        self._own_dir = data_dir is None
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="mongocdc-kafka-"))
        self.heap = heap
        self.tie_to_parent = tie_to_parent
        self.extra_settings = dict(extra_settings or {})
        self.port = 0
        self.controller_port = 0
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        self.start_seconds: float | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _write_config(self) -> Path:
        settings = dict(BROKER_SETTINGS)
        settings.update(
            {
                "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
                "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
                "log.dirs": str(self.data_dir / "logs"),
            }
        )
        settings.update(self.extra_settings)
        path = self.data_dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        return path

    def start(self) -> KafkaBroker:
        jars = ensure_jars()
        began = time.monotonic()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.port, self.controller_port = free_port(), free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        config = self._write_config()
        classpath = f"{jars}/*"
        java = _java()
        cluster_id = _cluster_id()
        fmt = subprocess.run(
            [
                java,
                "-Xmx256m",
                f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}",
                "-cp",
                classpath,
                "kafka.tools.StorageTool",
                "format",
                "-t",
                cluster_id,
                "-c",
                str(config),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if fmt.returncode != 0:
            raise KafkaLaunchError(f"Formatting the KRaft log directory failed: {fmt.stdout}{fmt.stderr}")
        self._launch(config, began, classpath)
        return self

    def restart(self) -> KafkaBroker:
        """Start this broker again after :meth:`kill` or ``stop(keep_data=True)``: the same ports,
        the same data directory and cluster id (the KRaft log directory is already formatted), so
        clients configured with :attr:`bootstrap_servers` reconnect and find their topics,
        committed records and transaction state again."""
        if self.pid is not None and _alive(self.pid):
            raise KafkaLaunchError(
                f"The Kafka broker (pid {self.pid}) is still running; kill or stop it first"
            )
        if not self.port or not (self.data_dir / "logs" / "meta.properties").exists():
            raise KafkaLaunchError(
                f"No formatted KRaft log directory under {self.data_dir} to restart from; "
                "call start() first (and stop(keep_data=True) rather than stop())"
            )
        jars = ensure_jars()
        began = time.monotonic()
        self._wait_ports_free(began + START_TIMEOUT_S)
        self._launch(self._write_config(), began, classpath=f"{jars}/*", keep_data=True)
        return self

    def _wait_ports_free(self, deadline: float) -> None:
        """The killed broker's listening sockets are gone with it; wait until both ports bind."""
        while True:
            try:
                for port in (self.port, self.controller_port):
                    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        sock.bind(("127.0.0.1", port))
                return
            except OSError as error:
                if time.monotonic() >= deadline:
                    raise KafkaLaunchError(
                        f"Cannot restart the Kafka broker: port {port} stays busy ({error})"
                    ) from None
                time.sleep(0.25)

    def _launch(self, config: Path, began: float, classpath: str, keep_data: bool = False) -> None:
        java = _java()
        log = open(self.log_path, "ab")
        cmd = [
            java,
            f"-Xmx{self.heap}",
            "-Xms128m",
            "-XX:+UseG1GC",
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={HERE / 'log4j2.properties'}",
            "-cp",
            classpath,
            "kafka.Kafka",
            str(config),
        ]
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent if self.tie_to_parent else os.setsid,
        )
        log.close()
        self.pid = self.process.pid
        try:
            self._wait_ready(began)
        except BaseException:
            self.stop(keep_data=keep_data)
            raise
        self.start_seconds = time.monotonic() - began

    def _wait_ready(self, began: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = began + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise KafkaLaunchError(
                    f"The Kafka broker exited with code {self.process.returncode} during start; "
                    f"last log lines:\n{self.tail_log()}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    pass
            except OSError:
                time.sleep(0.25)
                continue
            admin = AdminClient(
                {"bootstrap.servers": self.bootstrap_servers, "log_level": 0, "logger": _quiet_logger()}
            )
            try:
                metadata = admin.list_topics(timeout=5)
                if metadata.brokers:
                    return
            except Exception:  # broker not answering metadata yet
                time.sleep(0.25)
        raise KafkaLaunchError(
            f"The Kafka broker did not become ready within {START_TIMEOUT_S:.0f}s; "
            f"last log lines:\n{self.tail_log()}"
        )

    def tail_log(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no broker log)"

    def kill(self) -> None:
        """Kill -9 the broker (fault tests); data and ports stay so that restart() can reuse them."""
        if self.pid:
            _signal_group(self.pid, signal.SIGKILL)
            if not _wait_gone(self.pid, KILL_TIMEOUT_S):
                raise KafkaLaunchError(
                    f"The Kafka broker (pid {self.pid}) survived SIGKILL for {KILL_TIMEOUT_S:.0f}s"
                )
            if self.process is not None:
                try:
                    self.process.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass

    def stop(self, keep_data: bool = False) -> None:
        """Stop the broker (SIGTERM, then SIGKILL). Its temporary data directory is removed unless
        ``keep_data`` is true (then :meth:`restart` can start it again)."""
        if self.pid:
            stop_pid(self.pid)
            if self.process is not None:
                try:
                    self.process.wait(timeout=1)
                except subprocess.TimeoutExpired:
                    pass
            self.pid = None
            self.process = None
        if self._own_dir and not keep_data:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _cluster_id() -> str:
    """A random KRaft cluster id. One starting with "-" would be read as an option by
    kafka-storage's argument parser (1 in 64 of them), so those are drawn again."""
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def _quiet_logger():
    import logging

    logger = logging.getLogger("mongocdc.devtools.kafka")
    logger.addHandler(logging.NullHandler())
    logger.propagate = False
    return logger


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child counts as gone
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        try:
            os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            pass
        time.sleep(0.1)
    return not _alive(pid)


def stop_pid(pid: int, timeout: float = STOP_TIMEOUT_S) -> None:
    """Stop a broker by its PID: SIGTERM for a clean shutdown, SIGKILL when it does not go."""
    _signal_group(pid, signal.SIGTERM)
    if not _wait_gone(pid, timeout):
        _signal_group(pid, signal.SIGKILL)
        _wait_gone(pid, 10)


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m devtools.kafka --help")
