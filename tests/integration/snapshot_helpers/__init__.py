"""Helpers for the snapshot integration tests: seed data, job specs, spark-submit, topic reading."""

from __future__ import annotations

import datetime
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp

from airflow_provider_mongocdc.core.jobspec import JobSpec
from tests.spark_submit import AppRun, app_command, run_app, submit_env
from tests.topic_records import unwrapped


def tricky_fields(n: int) -> dict[str, Any]:
    """Field values of many BSON types (none of them is an _id)."""
    return {
        "n": n,
        "long": Int64(2**40 + n),
        "double": n / 7,
        "decimal": Decimal128(f"{n}.125"),
        "when": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=n),
        "bin": Binary(bytes([n % 256]) * 5),
        "uuid": Binary(uuid.UUID(int=n).bytes, 4),
        "ts": Timestamp(1_700_000_000, n + 1),
        "re": Regex("^a.c$", "i"),
        "code": Code("function() { return 1; }"),
        "min": MinKey(),
        "max": MaxKey(),
        "nan": float("nan"),
        "nested": {"a": [1, {"b": None}, [True, False]], "e": {}},
        "text": 'h\u00e9llo "quoted" \\ \u2603',
    }


def mixed_ids(count: int) -> list[Any]:
    """``count`` distinct _id values of several BSON types, interleaved."""
    ids: list[Any] = []
    for n in range(count):
        kind = n % 6
        if kind == 0:
            ids.append(ObjectId())
        elif kind == 1:
            ids.append(n)  # int32
        elif kind == 2:
            ids.append(f"key-{n:05d}")
        elif kind == 3:
            ids.append(Binary(uuid.uuid4().bytes, 4))  # UUID, binary subtype 4
        elif kind == 4:
            ids.append({"region": f"r{n % 3}", "seq": n})  # a document _id
        else:
            ids.append(Int64(10**12 + n) if n % 2 else n + 0.5)
    return ids


def seed(client, database: str, sizes: dict[str, int]) -> dict[str, list[Any]]:
    """Create the collections (``mixed`` gets mixed _ids, the others ObjectIds and ints); returns
    the _ids per collection."""
    created: dict[str, list[Any]] = {}
    for name, count in sizes.items():
        if name == "mixed":
            ids = mixed_ids(count)
            docs = [{"_id": _id, **tricky_fields(n)} for n, _id in enumerate(ids)]
        elif name.startswith("orders"):
            ids = list(range(1, count + 1))
            docs = [
                {"_id": _id, "customer": n % 50, "total": Decimal128(f"{n}.99")} for n, _id in enumerate(ids)
            ]
        else:
            ids = [ObjectId() for _ in range(count)]
            docs = [
                {"_id": _id, "name": f"customer {n}", "tags": ["a", "b"][: n % 3]}
                for n, _id in enumerate(ids)
            ]
        for start in range(0, len(docs), 1000):
            client[database][name].insert_many(docs[start : start + 1000], ordered=False)
        created[name] = ids
    return created


def snapshot_connector(
    prefix: str, database: str, chunk_size: int, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Connector properties snapshotting every collection of ``database`` in chunks of
    ``chunk_size`` documents on two threads, giving up at the first failed connection (and ``extra``)."""
    return {
        "topic.prefix": prefix,
        "database.include.list": database,
        "snapshot.chunk.size": chunk_size,
        "snapshot.max.threads": 2,
        "connect.max.attempts": 1,
        **(extra or {}),
    }


def mongo_details(uri: str, *, user: str | None = None, password: str | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"connection_string": uri}
    if user:
        details.update(username=user, password=password)
    return details


def write_spec(
    directory: Path,
    connector: dict[str, Any],
    mongo: dict[str, Any],
    kafka: dict[str, Any],
    params: dict[str, Any] | None = None,
) -> tuple[Path, Path]:
    directory.mkdir(parents=True, exist_ok=True)
    stamp = uuid.uuid4().hex[:8]
    spec_path = directory / f"spec-{stamp}.json"
    JobSpec("snapshot", connector, mongo, kafka, params or {}).write(spec_path)
    return spec_path, directory / f"result-{stamp}.json"


def run_snapshot(spark_submit: str, spec_path: Path, result_path: Path, *, timeout: float = 240) -> AppRun:
    return run_app(spark_submit, "snapshot", spec_path, result_path, timeout=timeout)


def start_snapshot(spark_submit: str, spec_path: Path, result_path: Path, log_path: Path) -> subprocess.Popen:
    """spark-submit in its own process group (so that the test can kill -9 all of it)."""
    log = open(log_path, "w")
    try:
        return subprocess.Popen(
            app_command(spark_submit, "snapshot", spec_path, result_path),
            env=submit_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()


def kill_group(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait(timeout=30)


def payloads(records) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(key payload, value payload) of each record (Kafka Connect JSON with or without schema)."""
    return [(unwrapped(record.key), unwrapped(record.value)) for record in records]


def wait_until(predicate, timeout: float, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()
