"""The Spark applications through spark-submit (``local[2]``, Spark UI off).

(d) ``spark-window``: the wall time of ``spark-submit stream_window.py`` for a window with no
change versus :func:`run_window` in this process for the same empty window (same start position,
same end, a connector of its own each). The difference is what spark-submit costs a window:
JVM and SparkContext start, shipping the task, Python workers.

(f) ``snapshot``: ``spark-submit snapshot.py`` of one collection of ~1 KB documents with
``snapshot.max.threads`` 1 and 2 (rounds alternate). Reported per run: the spark-submit wall
time, the application's own ``docs_per_s`` (from its start, so including the SparkContext
start), and the copy rate of the chunk tasks from the chunk markers' own timings.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import airflow_provider_mongocdc.spark_apps as spark_apps
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from bench.events import make_document
from bench.services import Services, spark_submit
from bench.window import connector, insert_documents, seed, timed_window, window_end_after

APPS = Path(spark_apps.__file__).resolve().parent


def _submit(application: str, spec: JobSpec, directory: Path) -> tuple[dict[str, Any], float]:
    name = uuid.uuid4().hex[:8]
    spec_path = spec.write(directory / f"spec-{name}.json")
    result_path = directory / f"result-{name}.json"
    code, output, wall = spark_submit(str(APPS / f"{application}.py"), spec_path, result_path)
    result = read_result(result_path)
    if code != 0 or not result or result.get("status") != "ok":
        raise RuntimeError(f"spark-submit {application} failed (exit {code}): {result}\n{output}")
    return result["summary"], wall


# -- (d) ---------------------------------------------------------------------------------------------
def run_empty_window(services: Services, rounds: int) -> dict[str, Any]:
    database = f"benchd{uuid.uuid4().hex[:8]}"
    with services.client() as client:
        start = current_position(client, connector(f"{database}p", database))
        window_end = window_end_after(services, client, start.cluster_time, f"{database}_markers")
    in_process, submitted, app_durations = [], [], []
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for round_number in range(rounds):
            for side in ("local", "spark") if round_number % 2 == 0 else ("spark", "local"):
                config = connector(f"{database}{side}{round_number}", database)
                target = seed(services, config, start)
                if side == "local":
                    run = timed_window(services, config, target, window_end)
                    if run["events"] != 0:
                        raise RuntimeError("the empty window saw events")
                    in_process.append(run["wall_s"])
                else:
                    spec = JobSpec(
                        "stream_window",
                        config.to_properties(),
                        {"connection_string": services.mongodb_uri},
                        services.kafka,
                        {"window_end": iso_z(window_end), "poll_ms": 200},
                    )
                    summary, wall = _submit("stream_window", spec, Path(tmp))
                    if summary["events"] != 0 or not summary["reached_end"]:
                        raise RuntimeError(f"the empty spark window did not end cleanly: {summary}")
                    submitted.append(wall)
                    app_durations.append(summary["duration_s"])
    local_s, spark_s = statistics.median(in_process), statistics.median(submitted)
    return {
        "rounds": rounds,
        "in_process_s": round(local_s, 3),
        "spark_submit_s": round(spark_s, 3),
        "spark_app_duration_s": round(statistics.median(app_durations), 3),
        "overhead_s": round(spark_s - local_s, 3),
        "ratio": round(spark_s / local_s, 1),
    }


# -- (f) ---------------------------------------------------------------------------------------------
def run_snapshot(
    services: Services, documents: int, threads: list[int], rounds: int, chunks: int = 8
) -> dict[str, Any]:
    database = f"benchf{uuid.uuid4().hex[:8]}"
    rng = random.Random(3)
    with services.client() as client:
        started = time.perf_counter()
        insert_documents(
            client,
            database,
            "customers",
            [make_document(rng, index) for index in range(documents)],
            batch=1000,
        )
        load_s = time.perf_counter() - started
    runs: dict[int, list[dict[str, Any]]] = {count: [] for count in threads}
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for round_number in range(rounds):
            order = threads if round_number % 2 == 0 else list(reversed(threads))
            for count in order:
                prefix = f"{database}t{count}r{round_number}"
                props = {
                    "topic.prefix": prefix,
                    "collection.include.list": f"{database}\\.customers",
                    "snapshot.max.threads": count,
                    "snapshot.chunk.size": max(1, documents // chunks),
                }
                spec = JobSpec(
                    "snapshot", props, {"connection_string": services.mongodb_uri}, services.kafka, {}
                )
                summary, wall = _submit("snapshot", spec, Path(tmp))
                if summary.get("documents") != documents:
                    raise RuntimeError(
                        f"the snapshot copied {summary.get('documents')} of {documents} documents: {summary}"
                    )
                store = OffsetStore(services.kafka, f"{prefix}.offsets")
                partition = OffsetPartition(prefix, summary["partitions"][0])
                markers = store.chunk_markers(partition, summary["snapshot_id"])
                chunk_seconds = [
                    float(marker.stats.get("seconds", 0))
                    for marker in markers.values()
                    if "seconds" in marker.stats
                ]
                runs[count].append(
                    {
                        "wall_s": wall,
                        "app_s": summary["duration_s"],
                        "app_docs_per_s": summary["docs_per_s"],
                        "chunks": summary["chunks"],
                        # Every chunk task's own time: documents per second of one task.
                        "task_docs_per_s": documents / sum(chunk_seconds) if chunk_seconds else None,
                    }
                )
    table = {}
    for count, items in runs.items():
        table[count] = {
            "spark_submit_s": round(statistics.median(item["wall_s"] for item in items), 2),
            "app_s": round(statistics.median(item["app_s"] for item in items), 2),
            "app_docs_per_s": round(statistics.median(item["app_docs_per_s"] for item in items)),
            "submit_docs_per_s": round(documents / statistics.median(item["wall_s"] for item in items)),
            "task_docs_per_s": round(
                statistics.median(item["task_docs_per_s"] for item in items if item["task_docs_per_s"])
            ),
            "chunks": items[0]["chunks"],
        }
    first, last = table[threads[0]], table[threads[-1]]
    return {
        "documents": documents,
        "rounds": rounds,
        "load_s": round(load_s, 2),
        "threads": table,
        "speedup_app": round(last["app_docs_per_s"] / first["app_docs_per_s"], 2),
    }


def report_empty_window(figures: dict[str, Any]) -> list[str]:
    return [
        f"empty window, median of {figures['rounds']}: run_window in process "
        f"{figures['in_process_s']} s; spark-submit {figures['spark_submit_s']} s (the app's own "
        f"duration {figures['spark_app_duration_s']} s)",
        f"(d) spark-submit overhead of an empty window: {figures['overhead_s']} s "
        f"(x{figures['ratio']} the in-process window)",
    ]


def report_snapshot(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"snapshot of {figures['documents']} ~1 KB documents (loaded in {figures['load_s']} s), "
        f"spark-submit local[2], median of {figures['rounds']}:"
    ]
    for count, row in figures["threads"].items():
        lines.append(
            f"  (f) snapshot.max.threads={count}: {row['app_docs_per_s']} docs/s (app, "
            f"{row['app_s']} s incl. SparkContext start), {row['submit_docs_per_s']} docs/s over "
            f"the whole spark-submit ({row['spark_submit_s']} s), one chunk task copies "
            f"{row['task_docs_per_s']} docs/s ({row['chunks']} chunks)"
        )
    lines.append(
        f"  speedup {list(figures['threads'])[-1]} vs {list(figures['threads'])[0]} threads "
        f"(app docs/s): x{figures['speedup_app']}"
    )
    return lines
