"""Debezium's and Kafka Connect's own code run on our events (the interop tests): the consumer
side (JsonConverter, ExtractNewDocumentState) and, for a side-by-side comparison, the records
Debezium's MongoDB connector itself emits for a snapshot read or a change stream document.

:func:`ensure_jars` fetches Kafka Connect's ``JsonConverter`` (the Kafka version of
``devtools/kafka/pom.xml``) and Debezium's MongoDB connector (``ExtractNewDocumentState``,
``JsonSerialization``) with Maven into ``devtools/interop/target/lib``; :func:`ensure_harness`
compiles ``Harness.java`` with ``javac`` into ``target/classes``. :class:`Harness` runs it in one
JVM and sends it requests as JSON lines (see ``Harness.java`` for their form).

``python -m devtools.interop fetch`` fetches the jars and compiles the harness (``make test`` runs it).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
POM = HERE / "pom.xml"
SOURCE = HERE / "Harness.java"
TARGET = HERE / "target"
JAR_DIR = TARGET / "lib"
CLASSES = TARGET / "classes"


class InteropError(RuntimeError):
    """The interop harness could not be built or started."""


def _tool(name: str) -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / name).exists():
        return str(Path(java_home) / "bin" / name)
    found = shutil.which(name)
    if not found:
        raise InteropError(
            f"The interop harness needs '{name}', which is not on PATH. Fix: install a Java 17 JDK "
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
        raise InteropError(
            f"Fetching the interop jars with Maven failed (exit {result.returncode}): "
            f"{(result.stdout or '')[-2000:]}{(result.stderr or '')[-2000:]}"
        )
    marker.write_text(POM.read_text())
    return JAR_DIR


def classpath() -> str:
    return os.pathsep.join([str(CLASSES), str(JAR_DIR / "*")])


def ensure_harness(quiet: bool = True) -> str:
    """Fetch the jars and compile ``Harness.java`` when its source or the pom changed; return the classpath."""
    ensure_jars(quiet=quiet)
    marker = CLASSES / ".source"
    stamp = SOURCE.read_text() + POM.read_text()
    if not (marker.exists() and marker.read_text() == stamp):
        if CLASSES.exists():
            shutil.rmtree(CLASSES)
        CLASSES.mkdir(parents=True)
        result = subprocess.run(
            [_tool("javac"), "-nowarn", "-cp", str(JAR_DIR / "*"), "-d", str(CLASSES), str(SOURCE)],
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise InteropError(
                f"Compiling {SOURCE.name} failed: {result.stdout[-2000:]}{result.stderr[-2000:]}"
            )
        marker.write_text(stamp)
    return classpath()


def _b64(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, str):
        data = data.encode()
    return base64.b64encode(data).decode()


class Harness:
    """One JVM running ``Harness`` for many requests; use as a context manager."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self._stderr: Any = None
        self._lock = threading.Lock()
        self._next_id = 0

    def start(self) -> Harness:
        cp = ensure_harness()
        self._stderr = tempfile.TemporaryFile(mode="w+", encoding="utf-8")
        self._process = subprocess.Popen(
            [_tool("java"), "-cp", cp, "Harness"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            encoding="utf-8",
        )
        first = self._process.stdout.readline()  # type: ignore[union-attr]
        if not first or not json.loads(first).get("ready"):
            self._process.kill()
            self._process.wait()
            errors = self._errors()
            self.close()
            raise InteropError(f"The interop harness did not start (first line: {first!r}){errors}")
        return self

    def _errors(self) -> str:
        """The tail of the JVM's standard error, for error messages."""
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read()[-2000:]
        return f"; its standard error ends with: {text}" if text.strip() else ""

    def close(self) -> None:
        if self._process is not None:
            if self._process.stdin:
                self._process.stdin.close()
            try:
                self._process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None

    def __enter__(self) -> Harness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, request: dict[str, Any]) -> dict[str, Any]:
        process = self._process
        if process is None or process.stdin is None or process.stdout is None:
            raise InteropError("The interop harness is not running")
        with self._lock:
            self._next_id += 1
            request = {**request, "id": self._next_id}
            process.stdin.write(json.dumps(request) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
        if not line:
            raise InteropError(f"The interop harness exited (code {process.wait(60)}){self._errors()}")
        answer = json.loads(line)
        if answer.get("id") != request["id"]:
            raise InteropError(f"Answer {answer!r} does not match request {request['id']}")
        return answer

    def record(
        self,
        topic: str,
        key: bytes | str | None,
        value: bytes | str | None,
        smt: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Convert one record with JsonConverter (and back) and, with ``smt``, apply
        ``ExtractNewDocumentState`` configured with it."""
        return self.request(
            {"kind": "record", "topic": topic, "key": _b64(key), "value": _b64(value), "smt": smt}
        )

    def document(self, raw_bson: bytes) -> dict[str, Any]:
        """The Java driver's texts of a BSON document: Debezium's ``JsonSerialization`` key
        (``getDocumentId``) and value (``getDocumentValue``), ``BsonDocument.toJson()`` and the
        relaxed and canonical modes in Debezium's compact layout."""
        return self.request({"kind": "document", "bson": _b64(raw_bson)})

    def emit_read(
        self, connector: dict[str, str], database: str, collection: str, raw_bson: bytes, last: bool = False
    ) -> dict[str, Any]:
        """The records Debezium's MongoDB connector (``connector``: its properties) sends for the
        snapshot read of one document (``last``: the snapshot's final record); see Harness.java."""
        read = {"db": database, "collection": collection, "bson": _b64(raw_bson), "last": last}
        return self.request({"kind": "emit", "connector": connector, "read": read})

    def emit_change(self, connector: dict[str, str], raw_change: bytes) -> dict[str, Any]:
        """The records Debezium's MongoDB connector sends for one change stream document (its
        raw BSON, as the server sent it); see Harness.java."""
        return self.request({"kind": "emit", "connector": connector, "change": _b64(raw_change)})
