"""The processes the demo starts: MongoDB (yours, a local ``mongod``, or the simulator) and the
Airflow commands. Every child runs in its own process group and dies with the demo
(PR_SET_PDEATHSIG); the demo stops each one by its id."""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
MONGODB_URI_ENV = "MONGOCDC_MONGODB_URI"
# Every process the demo starts inherits this variable (value: the demo's work directory), so
# that a leftover can be recognised as the demo's own.
MARKER_ENV = "MONGOCDC_DEMO_DIR"
# SIGTERM ends a running task (and its spark-submit), but `airflow dags test` then waits for the
# task's retry: it gets SIGKILL after this grace period.
AIRFLOW_STOP_GRACE_S = 10.0


class DemoError(RuntimeError):
    """A step of the demo failed; the message says what and how to fix it."""


def _tie_to_parent(sig: int) -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, sig)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def tied_to_parent(sig: int = signal.SIGTERM):
    return lambda: _tie_to_parent(sig)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def stop_group(process: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM to the child's process group, SIGKILL when it is still there after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            pass
        try:
            process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
        # The leader is gone; wait for the rest of its group (e.g. spark-submit's JVM).
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and _group_members(process.pid):
            time.sleep(0.2)
        if not _group_members(process.pid):
            return


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def processes_marked(work_dir: str) -> list[tuple[int, str]]:
    """(pid, command line) of the live processes started by the demo whose work dir is ``work_dir``."""
    marker = f"{MARKER_ENV}={work_dir}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker in environ.split(b"\0") and alive(int(entry)):
            found.append((int(entry), cmdline.replace(b"\0", b" ").decode(errors="replace").strip()))
    return found


# -- MongoDB ------------------------------------------------------------------------------------------
@dataclass
class MongoServer:
    """The MongoDB the demo uses: ``kind`` is ``yours``, ``mongod`` or ``simulator``."""

    kind: str
    uri: str
    pid: int | None = None
    description: str = ""

    def client(self, **options) -> MongoClient:
        return MongoClient(self.uri, serverSelectionTimeoutMS=15000, tz_aware=True, **options)


class LocalMongod:
    """A ``mongod`` from PATH as a one-member replica set on 127.0.0.1, data in ``directory``."""

    START_TIMEOUT_S = 60.0

    def __init__(self, executable: str, directory: Path):
        self.executable = executable
        self.directory = directory
        self.port = 0
        self.process: subprocess.Popen | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "mongod.log"

    def start(self) -> MongoServer:
        data = self.directory / "data"
        data.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        command = [
            self.executable,
            "--replSet",
            "rs0",
            "--bind_ip",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dbpath",
            str(data),
            "--logpath",
            str(self.log_path),
            "--oplogSize",
            "128",
            "--wiredTigerCacheSizeGB",
            "0.25",
        ]
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=tied_to_parent(signal.SIGTERM),
        )
        direct = MongoClient(
            f"mongodb://127.0.0.1:{self.port}/?directConnection=true",
            serverSelectionTimeoutMS=1000,
            tz_aware=True,
        )
        try:
            self._wait(direct, lambda: direct.admin.command("ping"), "to accept connections")
            try:
                direct.admin.command(
                    "replSetInitiate",
                    {"_id": "rs0", "members": [{"_id": 0, "host": f"127.0.0.1:{self.port}"}]},
                )
            except OperationFailure as error:
                if error.code != 23:  # AlreadyInitialized
                    raise DemoError(f"replSetInitiate on the local mongod failed: {error}") from None
            self._wait(
                direct, lambda: direct.admin.command("hello").get("isWritablePrimary"), "to become primary"
            )
            version = direct.server_info().get("version", "?")
        finally:
            direct.close()
        return MongoServer(
            "mongod",
            f"mongodb://127.0.0.1:{self.port}/?replicaSet=rs0",
            self.process.pid,
            f"local mongod {version} ({self.executable}), one-member replica set rs0 on "
            f"127.0.0.1:{self.port}",
        )

    def _wait(self, client: MongoClient, check, what: str) -> None:
        deadline = time.monotonic() + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise DemoError(
                    f"mongod ({self.executable}) exited with code {self.process.returncode} while "
                    f"waiting for it {what}; its log ({self.log_path}) ends with:\n{tail(self.log_path)}"
                )
            try:
                if check():
                    return
            except PyMongoError:
                pass
            time.sleep(0.5)
        raise DemoError(
            f"mongod ({self.executable}) did not start {what} within {self.START_TIMEOUT_S:.0f} s; "
            f"its log ({self.log_path}) ends with:\n{tail(self.log_path)}"
        )

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, grace_s=30)  # SIGTERM: mongod shuts down cleanly
            self.process = None


# -- Airflow ------------------------------------------------------------------------------------------
def airflow_environment(home: Path, work_dir: Path, extra: dict[str, str]) -> dict[str, str]:
    """The environment of the demo's Airflow commands: a throwaway AIRFLOW_HOME with SQLite,
    examples off, the repository's dags/ folder. The caller's own Airflow settings (AIRFLOW_*)
    are left out so that the demo never touches another Airflow installation."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("AIRFLOW_") and k != "MONGOCDC_CONNECTOR_CONFIG"
    }
    spark_conf = home / "spark-conf"
    spark_conf.mkdir(parents=True, exist_ok=True)
    (spark_conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    env.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(home / "logs"),
            "AIRFLOW__API__HOST": "127.0.0.1",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": "http://127.0.0.1:8080/execution/",
            "PYSPARK_PYTHON": sys.executable,
            "PYSPARK_DRIVER_PYTHON": sys.executable,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_CONF_DIR": str(spark_conf),
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
            MARKER_ENV: str(work_dir),
        }
    )
    env.update(extra)
    return env


class AirflowCommand:
    """One ``airflow ...`` command in the background, its output appended to the log file."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log: IO[str], cwd: Path):
        self.args = list(args)
        log.write(f"\n===== airflow {' '.join(self.args)} =====\n")
        log.flush()
        self.started_at = log.tell()
        self.interrupted = False
        self.log_path = Path(log.name)
        self.process = subprocess.Popen(
            [str(VENV_BIN / "airflow"), *self.args],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            preexec_fn=tied_to_parent(signal.SIGTERM),
        )

    def wait(self, timeout_s: float) -> str:
        """Wait for the command; returns its output. Stops it (and its children) on timeout,
        Ctrl-C or any other interruption."""
        try:
            code = self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_group(self.process, grace_s=AIRFLOW_STOP_GRACE_S)
            raise DemoError(
                f"'airflow {' '.join(self.args)}' did not finish within {timeout_s:.0f} s"
            ) from None
        except BaseException:
            self.interrupted = True
            stop_group(self.process, grace_s=AIRFLOW_STOP_GRACE_S)
            raise
        # The command's children (spark-submit) are gone with it; make sure of it.
        stop_group(self.process, grace_s=10)
        output = self.output()
        if code != 0:
            reason = first_error(output)
            raise DemoError(
                f"'airflow {' '.join(self.args)}' failed with exit code {code}"
                + (f": {reason}" if reason else "")
            )
        return output

    def output(self) -> str:
        with open(self.log_path, errors="replace") as log:
            log.seek(self.started_at)
            return log.read()

    def stop(self) -> bool:
        """Stop the command and its children; returns whether it was still running (or had
        been interrupted by the demo)."""
        running = self.process.poll() is None or bool(_group_members(self.process.pid))
        if running:
            stop_group(self.process, grace_s=AIRFLOW_STOP_GRACE_S)
        return running or self.interrupted


def first_error(output: str, limit: int = 700) -> str | None:
    """The error of a failed task in a command's output: the last AirflowException raised (the
    provider's operators put the cause and the fix there) and the first other exception (often
    the root cause, e.g. Spark's)."""
    airflow_error = other = None
    for line in output.splitlines():
        if line.lstrip().startswith("File "):
            continue
        match = re.search(r"\b(?:[\w.]+\.)?(\w*(?:Exception|Error)): (.+)", line)
        if match:
            text = f"{match.group(1)}: {match.group(2)}"
            text = text if len(text) <= limit else text[:limit] + "…"
            if match.group(1) == "AirflowException":
                airflow_error = text
            else:
                other = other or text
    found = [text for text in (airflow_error, other) if text]
    return "\n  first error in the output: ".join(found) if found else None


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} is not readable)"


def mongocdc_offsets_show(bootstrap: str, topic_prefix: str) -> dict:
    """``mongocdc offsets show`` (the provider's command line), parsed."""
    command = [
        str(VENV_BIN / "mongocdc"),
        "offsets",
        "show",
        "--bootstrap-servers",
        bootstrap,
        "--topic-prefix",
        topic_prefix,
    ]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        raise DemoError(f"'mongocdc offsets show' failed (exit {result.returncode}): {result.stderr.strip()}")
    return json.loads(result.stdout)


def find_mongod() -> str | None:
    return shutil.which("mongod")
