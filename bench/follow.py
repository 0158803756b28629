"""(n) How fresh a Delta table is while an open window runs: from a document's write to the first
table version that holds it, at a steady rate of inserts, with the tables following the topic
(the window application under spark-submit, its follower beside its stream, the defaults of an
open window and of ``follow_every``); and the follower's CPU per change beside the batch apply's.

Per rate: a collection snapshotted and applied, then the open window started, then ``seconds`` of
inserts of new documents at ``rate`` per second (each stamped with its write time), then the
window left to close on its idle time. A row's ``_applied_at`` is when the commit that wrote it was
made: for a document inserted once, the first version holding it. The lag is ``_applied_at`` less
the write time, p50/p95/max over every document. The follower reports its process's CPU; the batch
apply of the same topic, to a new table in its own process afterwards (less its start, an apply
of nothing), is the reference: CPU per change of each.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from deltalake import DeltaTable

from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
from airflow_provider_mongocdc.operators.base import application_path
from airflow_provider_mongocdc.spark_apps.delta_apply import job as delta_apply_job
from bench.services import SPARK_ARGS, VENV_BIN, Services, spark_env

DATABASE = "fresh"
COLLECTION = "items"


class _Tasks:
    """A snapshot's chunk copies in this process."""

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        return [copy(group) for group in groups]


def _percentile(values: list[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(share * len(ordered)))], 2)


def _apply_cpu(spec_path: Path) -> tuple[float, dict[str, Any]]:
    """The batch apply in its own process (driver mode): its CPU seconds and summary."""
    result = spec_path.with_suffix(".result.json")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [
            sys.executable,
            application_path("delta_apply"),
            "--job-spec",
            str(spec_path),
            "--result",
            str(result),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise RuntimeError(f"the apply failed: {done.stderr[-3000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), read_result(result)[
        "summary"
    ]


def _wait_open(kafka: dict[str, Any], offsets_topic: str, window: subprocess.Popen) -> None:
    """Until the window's first commit marks it open (its offset state's ``open_window``)."""
    store = OffsetStore(kafka, offsets_topic, read_timeout_s=30.0)
    deadline = time.monotonic() + 300.0
    while time.monotonic() < deadline:
        if window.poll() is not None:
            raise RuntimeError(f"the open window ended before it opened (exit code {window.returncode})")
        if any(state.open_window for state in store.read_everything().states.values()):
            return
        time.sleep(0.5)
    raise RuntimeError("the window did not open within 300 s")


def run_rate(services: Services, rate: int, seconds: float, idle_s: float = 30.0) -> dict[str, Any]:
    prefix = f"benchn{uuid.uuid4().hex[:8]}"
    work = Path(tempfile.mkdtemp(prefix="mongocdc-bench-follow-"))
    lake = work / "lake"
    kafka = services.kafka
    props = {"topic.prefix": prefix, "collection.include.list": f"{DATABASE}{prefix}\\..*"}
    database = f"{DATABASE}{prefix}"
    client = services.client()
    items = client[database][COLLECTION]
    items.insert_many([{"_id": f"seed{n}", "v": n} for n in range(1000)])
    run_snapshot(JobSpec("snapshot", props, {"connection_string": services.mongodb_uri}, kafka, {}), _Tasks())
    delta = {"location": str(lake)}
    delta_apply_job(None, JobSpec("delta_apply", props, {}, kafka, {"delta": delta, "in_driver": True}))

    spec = JobSpec(
        "stream_window",
        props,
        {"connection_string": services.mongodb_uri},
        kafka,
        {
            "window_end": datetime.now(timezone.utc).isoformat(),
            "stream_in_driver": True,
            "open_idle_s": idle_s,
            "max_open_s": 3000.0,
            "commit_interval_s": 1.0,
            "follow_delta": {"delta": delta, "storage_options": {}, "every": 5.0},
        },
    )
    spec_path = spec.write(work / "window.json")
    result = work / "window-result.json"
    command = [str(VENV_BIN / "spark-submit"), *SPARK_ARGS, application_path("stream_window"),
               "--job-spec", str(spec_path), "--result", str(result)]  # fmt: skip
    window = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=spark_env())
    _wait_open(kafka, f"{prefix}.offsets", window)  # writes begin once the window streams
    written: dict[str, float] = {}
    stop = threading.Event()

    def write() -> None:
        batch = max(1, rate // 10)  # ten batches a second
        number = 0
        next_at = time.monotonic()
        deadline = next_at + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            documents = [{"_id": f"w{number + n}", "v": number + n} for n in range(batch)]
            items.insert_many(documents, ordered=False)
            now = time.time()
            for document in documents:
                written[document["_id"]] = now
            number += batch
            next_at += batch / rate
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    writer.join()
    achieved = len(written) / seconds
    window.wait(timeout=seconds + idle_s + 600)
    summary = read_result(result)["summary"]
    follower = summary.get("tables") or {}

    table = DeltaTable(str(lake / database / COLLECTION)).to_pyarrow_table(columns=["_id", "_applied_at"])
    applied = {
        key: stamp.timestamp()
        for key, stamp in zip(table.column("_id").to_pylist(), table.column("_applied_at").to_pylist())
    }
    lags = [applied[json.dumps(key)] - at for key, at in written.items() if json.dumps(key) in applied]

    # The batch apply of the same topic, to a new table: CPU per change beside the follower's.
    batch_lake = work / "batch"
    batch_spec = JobSpec(
        "delta_apply", props, {}, kafka, {"delta": {"location": str(batch_lake)}, "in_driver": True}
    ).write(work / "batch.json")
    batch_cpu, batch_summary = _apply_cpu(batch_spec)
    start_cpu, _ = _apply_cpu(batch_spec)  # an apply of nothing: its start
    batch_events = batch_summary["events"]
    follower_events = int(follower.get("events") or 0)
    return {
        "rate": rate,
        "achieved_writes_per_s": round(achieved, 1),
        "seconds": seconds,
        "documents": len(written),
        "in_table": len(lags),
        "lag_s": {
            "p50": _percentile(lags, 0.5),
            "p95": _percentile(lags, 0.95),
            "max": _percentile(lags, 1.0),
        },
        "follower_events": follower_events,
        "follower_commits": follower.get("commits"),
        "follower_cpu_s": follower.get("cpu_s"),
        "follower_start_cpu_s": follower.get("start_cpu_s"),
        "follower_cpu_us_per_change": round(
            1e6
            * (float(follower.get("cpu_s") or 0) - float(follower.get("start_cpu_s") or 0))
            / max(1, follower_events),
            1,
        ),
        "batch_events": batch_events,
        "batch_cpu_s": round(batch_cpu, 2),
        "batch_start_cpu_s": round(start_cpu, 2),
        "batch_cpu_us_per_change": round(1e6 * max(0.0, batch_cpu - start_cpu) / max(1, batch_events), 1),
    }


def run(services: Services, rates: list[int], seconds: float) -> dict[str, Any]:
    return {"rates": [run_rate(services, rate, seconds) for rate in rates]}


def report(figures: dict[str, Any]) -> list[str]:
    lines = []
    for item in figures["rates"]:
        lag = item["lag_s"]
        lines.append(
            f"{item['rate']:>5} writes/s asked ({item['achieved_writes_per_s']} achieved, {item['documents']} "
            f"documents, {item['in_table']} in the table): write -> first table version p50 {lag['p50']} s, "
            f"p95 {lag['p95']} s, max {lag['max']} s; follower {item['follower_events']} events in "
            f"{item['follower_commits']} commits, {item['follower_cpu_s']} CPU-s "
            f"({item['follower_cpu_us_per_change']} us/change beyond its {item['follower_start_cpu_s']} "
            "CPU-s start); batch apply of the same topic "
            f"{item['batch_cpu_us_per_change']} us/change beyond its {item['batch_start_cpu_s']} CPU-s start"
        )
    return lines
