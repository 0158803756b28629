"""(k) The Delta apply: changes applied per CPU-second to a large table, the start's cost, and the
files a table holds after many applies with and without compaction.

``apply``: a table of ``rows`` documents (~200 bytes each, written with the apply's layout and
position, so the apply takes it as its own), then ``changes`` change events on its topic, as the
connector writes them (schemas on): 60% updates, 20% inserts of new keys, 15% deletes (with their
tombstones), 5% in multi-document transactions. The apply application runs as its own process in
driver mode (what the operator runs on a ``local[...]`` master) and applies them in one commit;
its CPU is the process's (Python, delta-rs's and librdkafka's threads; ``RUSAGE_CHILDREN``). The
start is an apply of the same table with nothing new, run right after: imports, Kafka metadata,
the table's state, the topic's ends. "Beyond its start" is the difference.

``files``: ``applies`` applies of ``per_apply`` changes each to a table of ``rows`` rows, an hour
apart on the apply's clock, as a growing collection changes (mostly inserts; the updates and
deletes on documents inserted by the same apply, so each apply leaves the older files alone): without compaction,
compacting every 6 hours, and every apply (``compact_every`` 0). Files in the table's last version,
and data files on disk (vacuum off).
"""

from __future__ import annotations

import random
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bson import Int64, ObjectId, Timestamp
from confluent_kafka import Producer
from deltalake import DeltaTable

from airflow_provider_mongocdc.core.apply.batch import Commit
from airflow_provider_mongocdc.core.apply.layout import (
    APPLIED_AT,
    DELETED,
    DOCUMENT,
    GENERATION,
    ID,
    KAFKA_OFFSET,
    KAFKA_PARTITION,
    OP,
    SOURCE_ORD,
    SOURCE_TS,
    TXN,
    TableLayout,
)
from airflow_provider_mongocdc.core.apply.run import TableApply, TableJob
from airflow_provider_mongocdc.core.apply.state import TableState
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.java_json import document_writer
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.operators.base import application_path
from airflow_provider_mongocdc.tables.delta import DeltaTableStore
from bench.services import Services

GOAL_CHANGES_PER_CPU_S = 50_000
GOAL_START_CPU_S = 3.0
DATABASE, COLLECTION = "bench", "items"


def _document(n: int, version: int = 0) -> dict[str, Any]:
    return {
        "_id": n,
        "name": f"customer {n:07d}",
        "total": round(n * 1.25 + version, 2),
        "count": Int64(n + version),
        "status": "open" if n % 3 else "closed",
        "tags": ["a", "b"][: n % 3],
        "address": {"city": f"city {n % 100}", "zip": f"{n % 99999:05d}"},
    }


def _store(uri: str, table_format: str):
    """The table at ``uri`` (``<location>/<database>/<collection>``) of the format: Delta there, or
    Iceberg ``<database>.<collection>`` in the SQL catalog under the location."""
    if table_format == "delta":
        return DeltaTableStore(uri)
    from airflow_provider_mongocdc.core.apply.settings import TableSettings
    from airflow_provider_mongocdc.tables.iceberg import IcebergTableStore

    location = Path(uri).parent.parent
    settings = TableSettings.from_mapping({"format": "iceberg", "location": str(location)})
    return IcebergTableStore(settings.default_catalog(), (DATABASE, COLLECTION))


def _seed_table(uri: str, topic: str, rows: int, table_format: str = "delta") -> None:
    """A table of ``rows`` documents as the apply writes them, recording offset 0 of ``topic``."""
    writer = document_writer("strict")
    documents = [writer.dumps(_document(n)) for n in range(rows)]
    layout = TableLayout()
    columns = {
        ID: [str(n) for n in range(rows)],
        DOCUMENT: documents,
        OP: ["r"] * rows,
        SOURCE_TS: [1_700_000_000_000_000] * rows,
        SOURCE_ORD: [1] * rows,
        TXN: [None] * rows,
        KAFKA_PARTITION: [0] * rows,
        KAFKA_OFFSET: [0] * rows,
        APPLIED_AT: [1_700_000_000_000_000] * rows,
        GENERATION: [1] * rows,
        DELETED: [False] * rows,
    }
    state = TableState(topic, positions={0: 0}, generation=1)
    commit = Commit(columns, None, state.versions(), {"mongocdc.topic": topic}, rows, 0)
    _store(uri, table_format).commit(commit, layout, f"{DATABASE}.{COLLECTION}", "benchmark table")


def _change_records(
    prefix: str,
    rows: int,
    changes: int,
    next_key: int,
    seed: int,
    recent: int | None = None,
    schemas: bool = True,
) -> tuple[list, int]:
    """The records of ``changes`` changes to the table's documents (and new ones): 60% updates,
    20% inserts, 20% deletes of random keys; with ``recent``, 80% inserts and 15% updates and 5%
    deletes of documents inserted by the same changes (a collection that grows: the table's older
    files stay as they are)."""
    update_share, insert_share = (0.6, 0.8) if recent is None else (0.15, 0.95)
    first_new = next_key
    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": prefix,
            "key.converter.schemas.enable": schemas,
            "value.converter.schemas.enable": schemas,
        }
    )
    builder = EventBuilder(config, replica_set="rs0")
    rng = random.Random(seed)
    records = []
    ts = 1_700_000_100
    made = 0
    txn = 0
    while made < changes:
        kind = rng.random()
        ts += 1
        base = {
            "_id": {"_data": f"82{ts:08X}{made:08X}"},
            "clusterTime": Timestamp(ts, 1),
            "ns": {"db": DATABASE, "coll": COLLECTION},
        }
        group = 1
        if kind >= 0.95:
            group = 5
            txn += 1
            base.update(lsid={"id": ObjectId()}, txnNumber=Int64(txn))
        for _ in range(group):
            roll = rng.random()
            low = rows if recent is None else first_new
            if recent is not None and next_key == first_new:
                roll = update_share  # nothing inserted yet to change: an insert
            if roll < update_share:
                key = rng.randrange(low) if recent is None else rng.randrange(low, next_key)
                change = {**base, "operationType": "update", "documentKey": {"_id": key},
                          "fullDocument": _document(key, made),
                          "updateDescription": {"updatedFields": {"total": 1.0}, "removedFields": [], "truncatedArrays": []}}  # fmt: skip
            elif roll < insert_share:
                key = next_key
                next_key += 1
                change = {
                    **base,
                    "operationType": "insert",
                    "documentKey": {"_id": key},
                    "fullDocument": _document(key),
                }
            else:
                key = rng.randrange(low) if recent is None else rng.randrange(low, next_key)
                change = {**base, "operationType": "delete", "documentKey": {"_id": key}}
            records.extend(
                record for record in builder.build_change(change) if record.topic.endswith(COLLECTION)
            )
            made += 1
    return records, next_key


def _produce(bootstrap: str, topic: str, records: list) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "compression.type": "lz4",
            "enable.idempotence": True,
        }
    )
    for record in records:
        while True:
            try:
                producer.produce(topic, key=record.key, value=record.value)
                break
            except BufferError:  # the local queue is full: let librdkafka send
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(120) == 0, "the change records were not all delivered"


def _apply_process(spec: Path) -> tuple[float, float, dict[str, Any]]:
    """The apply application in its own process: (CPU seconds, wall seconds, summary)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.perf_counter()
    done = subprocess.run(
        [sys.executable, application_path("delta_apply"), "--job-spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    wall = time.perf_counter() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the apply failed: {done.stderr[-3000:]}")
    summary = next(
        line.split(" ", 1)[1] for line in done.stdout.splitlines() if line.startswith("MONGOCDC_SUMMARY ")
    )
    import json

    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, json.loads(summary)


def run_apply(
    services: Services, rows: int, changes: int, schemas: bool = True, table_format: str = "delta"
) -> dict[str, Any]:
    prefix = f"benchk{uuid.uuid4().hex[:8]}"
    topic = f"{prefix}.{DATABASE}.{COLLECTION}"
    ensure_topics(services.kafka, [TopicSpec(topic, 1)])
    work = Path(tempfile.mkdtemp(prefix="mongocdc-bench-delta-"))
    lake = work / "lake"
    uri = str(lake / DATABASE / COLLECTION)
    began = time.perf_counter()
    _seed_table(uri, topic, rows, table_format)
    seeded_s = time.perf_counter() - began
    records, _ = _change_records(prefix, rows, changes, rows, seed=5, schemas=schemas)
    _produce(services.bootstrap, topic, records)
    tables = {
        "format": table_format,
        "location": str(lake),
        "max_batch_events": max(changes * 2, 1),
        "compact_every": None,
        "vacuum_every": None,
    }
    spec = JobSpec(
        "delta_apply", {"topic.prefix": prefix}, {}, services.kafka, {"tables": tables, "in_driver": True}
    )
    spec_path = spec.write(work / "spec.json")
    cpu, wall, summary = _apply_process(spec_path)
    start_cpu, start_wall, empty = _apply_process(spec_path)
    assert empty["events"] == 0, empty
    beyond = max(cpu - start_cpu, 1e-9)
    if table_format == "delta":
        table = DeltaTable(uri)
        rows_after, files_after = table.count() if hasattr(table, "count") else None, len(table.file_uris())
    else:
        iceberg = _store(uri, table_format).table()
        files = list(iceberg.scan().plan_files())
        rows_after, files_after = sum(task.file.record_count for task in files), len(files)
    return {
        "format": table_format,
        "schemas": schemas,
        "record_bytes": round(sum(len(r.value or b"") + len(r.key or b"") for r in records) / len(records)),
        "rows": rows,
        "changes": changes,
        "records": len(records),
        "seed_table_s": round(seeded_s, 1),
        "apply_cpu_s": round(cpu, 2),
        "apply_wall_s": round(wall, 2),
        "start_cpu_s": round(start_cpu, 2),
        "start_wall_s": round(start_wall, 2),
        "beyond_start_cpu_s": round(beyond, 2),
        "changes_per_cpu_s": round(changes / beyond),
        "events_per_cpu_s": round(summary["events"] / beyond),
        "commits": summary["commits"],
        "rows_after": rows_after,
        "files_after": files_after,
    }


FILE_VARIANTS = {
    # name: (compact_every_s, vacuum_every_s, vacuum_retention_s)
    "no compaction": (None, None, None),
    "compact_every 6h": (6 * 3600.0, None, None),
    "compact_every 0 (every apply)": (0.0, None, None),
    "compact_every 6h, vacuum_every 6h, retention 1 h": (6 * 3600.0, 6 * 3600.0, 3600.0),
}


def _table_files(uri: str, table_format: str) -> dict[str, Any]:
    """Files in the table's current version, data files on disk, versions (snapshots) kept."""
    if table_format == "delta":
        table = DeltaTable(uri)
        return {
            "files": len(table.file_uris()),
            "files_on_disk": len(list(Path(uri).glob("*.parquet"))),
            "version": table.version(),
            "log_files": len(list((Path(uri) / "_delta_log").glob("*.json"))),
        }
    table = _store(uri, table_format).table()
    return {
        "files": len(list(table.scan().plan_files())),
        "files_on_disk": len(list((Path(uri) / "data").glob("*.parquet"))),
        "version": int(table.current_snapshot().sequence_number),
        "snapshots": len(table.snapshots()),
        "metadata_files": len(list((Path(uri) / "metadata").iterdir())),
    }


def run_files(
    services: Services, rows: int, applies: int, per_apply: int, table_format: str = "delta"
) -> dict[str, Any]:
    found = {}
    for name, (compact, vacuum, retention) in FILE_VARIANTS.items():
        if vacuum is not None and table_format == "delta":
            continue  # delta-rs's vacuum keeps files by their real removal time: an hour of the bench is seconds
        prefix = f"benchkf{uuid.uuid4().hex[:8]}"
        topic = f"{prefix}.{DATABASE}.{COLLECTION}"
        ensure_topics(services.kafka, [TopicSpec(topic, 1)])
        work = Path(tempfile.mkdtemp(prefix="mongocdc-bench-files-"))
        uri = str(work / "lake" / DATABASE / COLLECTION)
        _seed_table(uri, topic, rows, table_format)
        clock = [1_800_000_000.0 if table_format == "delta" else time.time()]
        next_key = rows
        job = TableJob(
            topic,
            f"{DATABASE}.{COLLECTION}",
            TableLayout(),
            1_000_000,
            compact_every_s=compact,
            vacuum_every_s=vacuum,
            vacuum_retention_s=retention or 7 * 86400.0,
        )
        cpu = 0.0
        for index in range(applies):
            records, next_key = _change_records(
                prefix, rows, per_apply, next_key, seed=100 + index, recent=per_apply
            )
            _produce(services.bootstrap, topic, records)
            clock[0] += 3600.0
            began = time.process_time()
            TableApply(job, _store(uri, table_format), services.kafka, clock=lambda now=clock[0]: now).run()
            cpu += time.process_time() - began
        found[name] = {**_table_files(uri, table_format), "apply_cpu_s": round(cpu / applies, 3)}
    return {
        "format": table_format,
        "rows": rows,
        "applies": applies,
        "per_apply": per_apply,
        "variants": found,
    }


def report_apply(figures: dict[str, Any]) -> list[str]:
    rate = figures["changes_per_cpu_s"]
    return [
        f"{figures.get('format', 'delta')} table, records with schemas {'on' if figures.get('schemas', True) else 'off'} "
        f"({figures.get('record_bytes')} bytes each on average):",
        f"{figures['changes']} changes ({figures['records']} records with tombstones) applied to a "
        f"{figures['rows']}-row table in {figures['commits']} commit(s): {figures['apply_cpu_s']} CPU-s, "
        f"{figures['apply_wall_s']} s wall",
        f"start (an apply with nothing new): {figures['start_cpu_s']} CPU-s, {figures['start_wall_s']} s wall "
        f"(goal <= {GOAL_START_CPU_S:g} CPU-s: {'met' if figures['start_cpu_s'] <= GOAL_START_CPU_S else 'NOT met'})",
        f"beyond the start: {figures['beyond_start_cpu_s']} CPU-s = {rate} changes per CPU-second "
        f"(goal >= {GOAL_CHANGES_PER_CPU_S}: {'met' if rate >= GOAL_CHANGES_PER_CPU_S else 'NOT met'})",
        f"table after: {figures['rows_after']} rows in {figures['files_after']} file(s)",
    ]


def report_files(figures: dict[str, Any]) -> list[str]:
    table_format = figures.get("format", "delta")
    lines = [
        f"{table_format} table, {figures['applies']} hourly applies of {figures['per_apply']} changes (80% "
        f"inserts, the rest on documents inserted by the same apply) to a {figures['rows']}-row table:"
    ]
    for name, found in figures["variants"].items():
        kept = (
            f"{found['log_files']} log entries"
            if table_format == "delta"
            else f"{found['snapshots']} snapshots kept, {found['metadata_files']} metadata files"
        )
        lines.append(
            f"  {name}: {found['files']} files in the table's version {found['version']}, "
            f"{found['files_on_disk']} data files on disk, {kept}; {found.get('apply_cpu_s')} CPU-s per apply"
        )
    return lines
