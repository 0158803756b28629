"""A real Apache Iceberg REST catalog server on 127.0.0.1 for tests.

``IcebergRestServer.java`` serves the Iceberg REST API (version 1: config, namespaces, tables,
commits of one table and multi-table transactions, views) on the JDK's HTTP server, each route
handled by iceberg-core's own ``CatalogHandlers`` over a ``JdbcCatalog`` kept in a SQLite file; the
warehouse is written on the local file system by ``LocalFileIO.java`` (no Hadoop). With a
credential (``client_id:client_secret``) it serves OAuth2's client-credentials token endpoint
(``/v1/oauth/tokens``, as pyiceberg's ``credential`` property uses it) and refuses every other
request without a bearer token it gave.

:func:`ensure_jars` fetches iceberg-core and the SQLite JDBC driver with Maven
(``devtools/iceberg/pom.xml``) into ``devtools/iceberg/target/lib``; :func:`ensure_server` compiles
the two Java files with ``javac`` into ``target/classes``. :class:`IcebergRestCatalog` starts the
server in a JVM tied to the Python process that started it.

``python -m devtools.iceberg fetch`` fetches the jars and compiles the server (``make test`` runs it).
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
SOURCES = (HERE / "IcebergRestServer.java", HERE / "LocalFileIO.java")
TARGET = HERE / "target"
JAR_DIR = TARGET / "lib"
CLASSES = TARGET / "classes"
MAIN_CLASS = "IcebergRestServer"
# The server reads the credential from its environment, never from its command line.
CREDENTIAL_ENV = "MONGOCDC_ICEBERG_CREDENTIAL"
# Bounds only: a JVM start on a loaded 2-core machine can take a minute or more.
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
REQUEST_TIMEOUT_S = 30.0


class IcebergLaunchError(RuntimeError):
    """The REST catalog server could not be fetched, built or started."""


def _tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / name).exists():
        return str(Path(java_home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise IcebergLaunchError(
            f"The Iceberg REST catalog server needs '{name}', which is not on PATH. Fix: install a "
            "Java 17 JDK (Debian: apt-get install openjdk-17-jdk-headless) and Apache Maven "
            "(apt-get install maven)."
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
        raise IcebergLaunchError(
            f"Fetching the Iceberg REST catalog jars with Maven failed (exit {result.returncode}): "
            f"{(result.stdout or '')[-2000:]}{(result.stderr or '')[-2000:]}"
        )
    marker.write_text(POM.read_text())
    return JAR_DIR


def classpath() -> str:
    return os.pathsep.join([str(CLASSES), str(JAR_DIR / "*")])


def ensure_server(quiet: bool = True) -> str:
    """Fetch the jars and compile the server when its sources or the pom changed; return the classpath."""
    ensure_jars(quiet=quiet)
    marker = CLASSES / ".source"
    stamp = "".join(source.read_text() for source in SOURCES) + POM.read_text()
    if not (marker.exists() and marker.read_text() == stamp):
        if CLASSES.exists():
            shutil.rmtree(CLASSES)
        CLASSES.mkdir(parents=True)
        result = subprocess.run(
            [_tool("javac"), "-nowarn", "-cp", str(JAR_DIR / "*"), "-d", str(CLASSES), *map(str, SOURCES)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise IcebergLaunchError(
                f"Compiling the Iceberg REST catalog server failed: {result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        marker.write_text(stamp)
    return classpath()


def _die_with_parent() -> None:  # pragma: no cover - runs in the child before exec
    os.setsid()
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the server dies with its launcher
    except OSError:
        pass


class IcebergRestCatalog:
    """An Iceberg REST catalog server. Use as a context manager, or call start() and stop().

    ``warehouse_dir`` holds the tables (data and metadata files; a temporary directory when
    None); the catalog's SQLite file, settings and log are in a state directory of their own
    (``state_dir``, temporary when None). ``credential`` (``client_id:client_secret``) turns on
    OAuth2 client credentials. ``properties`` are added to the JdbcCatalog's (``io-impl``, ...).
    ``tie_to_parent`` makes the server die with the Python process that started it.
    """

    def __init__(
        self,
        warehouse_dir: str | os.PathLike | None = None,
        credential: str | None = None,
        *,
        state_dir: str | os.PathLike | None = None,
        heap: str = "256m",
        tie_to_parent: bool = True,
        properties: dict[str, str] | None = None,
    ):
        if credential is not None and ":" not in credential:
            raise IcebergLaunchError(
                "The Iceberg REST catalog's credential must be client_id:client_secret (it has no ':')"
            )
        self._own_warehouse = warehouse_dir is None
        self._own_state = state_dir is None
        self.warehouse_dir = (
            Path(warehouse_dir) if warehouse_dir else Path(tempfile.mkdtemp(prefix="mongocdc-iceberg-wh-"))
        )
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="mongocdc-iceberg-"))
        self.credential = credential
        self.heap = heap
        self.tie_to_parent = tie_to_parent
        self.properties = dict(properties or {})
        self.port = 0
        self.process: subprocess.Popen | None = None
        self.pid: int | None = None
        self.start_seconds: float | None = None

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def warehouse(self) -> str:
        """The warehouse location, a ``file://`` URI."""
        return self.warehouse_dir.resolve().as_uri()

    @property
    def log_path(self) -> Path:
        return self.state_dir / "server.log"

    def catalog_properties(self) -> dict[str, str]:
        """The properties of a REST catalog client of this server (pyiceberg's ``load_catalog``)."""
        props = {"type": "rest", "uri": self.uri, "warehouse": self.warehouse}
        if self.credential is not None:
            props["credential"] = self.credential
            props["oauth2-server-uri"] = f"{self.uri}/v1/oauth/tokens"
        return props

    def _write_settings(self, port_file: Path) -> Path:
        settings = {
            "server.host": "127.0.0.1",
            "server.port": "0",
            "server.port-file": str(port_file),
            "uri": f"jdbc:sqlite:{self.state_dir.resolve() / 'catalog.db'}",
            "warehouse": self.warehouse,
            # Views need the JDBC catalog's second schema; one connection, as SQLite has one writer.
            "jdbc.schema-version": "V1",
            "clients": "1",
        }
        settings.update(self.properties)
        path = self.state_dir / "server.properties"
        path.write_text("".join(f"{_escape(k)}={_escape(v)}\n" for k, v in settings.items()))
        return path

    def start(self) -> IcebergRestCatalog:
        began = time.monotonic()
        cp = ensure_server()
        self.warehouse_dir.mkdir(parents=True, exist_ok=True)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        port_file = self.state_dir / "server.port"
        port_file.unlink(missing_ok=True)
        settings = self._write_settings(port_file)
        env = dict(os.environ)
        env.pop(CREDENTIAL_ENV, None)
        if self.credential is not None:
            env[CREDENTIAL_ENV] = self.credential
        log = open(self.log_path, "ab")
        cmd = [
            _tool("java"),
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-Djava.awt.headless=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-cp",
            cp,
            MAIN_CLASS,
            str(settings),
        ]
        self.process = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            preexec_fn=_die_with_parent if self.tie_to_parent else os.setsid,
        )
        log.close()
        self.pid = self.process.pid
        try:
            self._wait_ready(began, port_file)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        return self

    def _wait_ready(self, began: float, port_file: Path) -> None:
        """Wait until the server wrote its port and its config endpoint answers 200 (with a token
        of the credential, when there is one)."""
        deadline = began + START_TIMEOUT_S
        last_error = "no port written yet"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise IcebergLaunchError(
                    f"The Iceberg REST catalog server exited with code {self.process.returncode} "
                    f"during start; last log lines:\n{self.tail_log()}"
                )
            if not self.port:
                try:
                    self.port = int(port_file.read_text())
                except (OSError, ValueError):
                    time.sleep(0.1)
                    continue
            try:
                headers = {}
                if self.credential is not None:
                    headers["Authorization"] = f"Bearer {self.token()}"
                status, _ = self.request("GET", "/v1/config", headers=headers)
                if status == 200:
                    return
                last_error = f"GET /v1/config answered {status}"
            except (OSError, urllib.error.URLError) as error:
                last_error = str(error)
            time.sleep(0.2)
        raise IcebergLaunchError(
            f"The Iceberg REST catalog server did not become ready within {START_TIMEOUT_S:.0f}s "
            f"({last_error}); last log lines:\n{self.tail_log()}"
        )

    def token(self) -> str:
        """A bearer token of the configured credential, from the server's token endpoint."""
        if self.credential is None:
            raise IcebergLaunchError("This Iceberg REST catalog has no credential to get a token for")
        client_id, _, secret = self.credential.partition(":")
        form = urllib.parse.urlencode(
            {
                "grant_type": "client_credentials",
                "client_id": client_id,
                "client_secret": secret,
                "scope": "catalog",
            }
        ).encode()
        status, body = self.request(
            "POST",
            "/v1/oauth/tokens",
            data=form,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
        if status != 200:
            raise IcebergLaunchError(
                f"The Iceberg REST catalog refused its own credential ({status}): {body}"
            )
        return body["access_token"]

    def request(
        self, method: str, path: str, *, data: bytes | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        """One HTTP request to the server: its status and JSON body (None when it has none)."""
        req = urllib.request.Request(self.uri + path, data=data, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as error:
            status, raw = error.code, error.read()
        return status, (json.loads(raw) if raw else None)

    def tail_log(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no server log)"

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove the temporary directories it made."""
        if self.pid:
            from devtools.kafka import stop_pid

            stop_pid(self.pid, STOP_TIMEOUT_S)
            if self.process is not None:
                try:
                    self.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    pass
            self.pid = None
            self.process = None
        if self._own_warehouse:
            shutil.rmtree(self.warehouse_dir, ignore_errors=True)
        if self._own_state:
            shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> IcebergRestCatalog:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _escape(text: str) -> str:
    """A key or value of a Java properties file."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("=", "\\=").replace(":", "\\:")


__all__ = ["CREDENTIAL_ENV", "IcebergLaunchError", "IcebergRestCatalog", "ensure_jars", "ensure_server"]
