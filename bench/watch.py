"""Change-driven windows: the change watcher's CPU, and what a write waits for its event in Kafka.

(j) ``watcher-cpu``: the change watcher (``triggers/change_watcher.py``) run in this process as the
triggerer runs it (its ``run()`` on an asyncio loop; the simulator and the broker are other
processes), CPU as ``time.process_time`` of this process:

* idle, at the default settings (a getMore the server holds 5 s, the oplog check and an offsets
  read every minute), after a warm-up, as a percentage of one core;
* per pending change: ``N`` inserts pending when the watcher starts (its committed position
  before them), ``min_changes = N``: the CPU from its start to its event, slope between two sizes
  (the start, the offsets read and the oplog check cancel out), without the idle CPU that accrues
  while the simulator serves the changes (about 1 000 a second), and with it;
* the reading it does, on the same ``N`` changes: pymongo's ``AsyncChangeStream`` of the watcher's
  projected pipeline with ``RawBSONDocument`` against the plain ``aggregate`` cursor the watcher
  counts (the measurement behind that choice);
* beside an open window: a window with the open defaults (``run_window``, in a process of its own,
  the connector's lease taken for it as its task would) carries 10 writes/s (a writer process);
  once the watcher has seen the window open (at its next minute's check), its CPU over the phase, in
  CPU-s per hour.

(i) ``latency``: a real Airflow 3.3 (api-server, scheduler with LocalExecutor, dag-processor,
triggerer, from ``tests/e2e/airflow_stack.py``) runs a connector whose window DAG is scheduled by
changes only (``max_delay`` 30 s, ``min_changes`` 1000, the default poll); after its first run
(the snapshot), a writer inserts at 1, 10 and 100 writes/s and a ``read_committed`` consumer of the
topic notes when each insert's event arrives: write -> readable in Kafka, p50/p95/max per rate,
with the windows run meanwhile. Each window is the real operator path: the snapshot task, then
``spark-submit stream_window.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import statistics
import tempfile
import threading
import time
import types
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from bson.raw_bson import RawBSONDocument
from confluent_kafka import Consumer, TopicPartition
from pymongo import AsyncMongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.mongo.change_stream import watch_options, watch_target
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.watch.settings import POLLS_PER_CHECK
from airflow_provider_mongocdc.core.watch.stream import aggregate_target, watch_aggregate, watch_pipeline
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.triggers.change_watcher import MongoChangeWatcher
from bench.services import Services, operation_time

GOAL_IDLE_PERCENT = 0.5
GOAL_PER_CHANGE_US = 5.0
GOAL_P95_OVER_MAX_DELAY_S = 30.0
MAX_DELAY_S = 30


def _ping_time(client):
    return operation_time(client, lambda session: client.admin.command("ping", session=session))


def _connections(services: Services) -> dict[str, str]:
    """Airflow connections of the benchmark's servers, as environment variables of this process."""
    ids = {"mongo": "benchwatch_mongo", "kafka": "benchwatch_kafka"}
    os.environ["AIRFLOW_CONN_BENCHWATCH_MONGO"] = json.dumps(
        {"conn_type": "mongocdc", "host": services.mongodb_uri}
    )
    os.environ["AIRFLOW_CONN_BENCHWATCH_KAFKA"] = json.dumps(
        {"conn_type": "mongocdc_kafka", "extra": {"bootstrap.servers": services.bootstrap}}
    )
    return ids


def _watched_from_now(services: Services, prefix: str, database: str) -> tuple[dict[str, Any], Position]:
    """A connector capturing ``database`` whose committed position is now (every partition)."""
    props = {"topic.prefix": prefix, "collection.include.list": f"{database}\\..*"}
    config = ConnectorConfig.from_properties(props)
    with services.client() as client:
        start = Position(cluster_time=_ping_time(client))
    store = OffsetStore(services.kafka, config.offsets_topic)
    for target in plan_streams(connection_details({"connection_string": services.mongodb_uri}), config):
        store.set_position(OffsetPartition(prefix, target.partition), start)
    return props, start


def _watcher(props: dict[str, Any], ids: dict[str, str], **settings: Any) -> MongoChangeWatcher:
    return MongoChangeWatcher(
        props["topic.prefix"], props, mongo_conn_id=ids["mongo"], kafka_conn_id=ids["kafka"], **settings
    )


def _insert(services: Services, database: str, count: int) -> None:
    with services.client() as client:
        for first in range(0, count, 1000):
            client[database]["orders"].insert_many(
                [{"_id": n, "status": "new"} for n in range(first, min(count, first + 1000))]
            )


async def _idle_cpu(
    watcher: MongoChangeWatcher, warm_up_s: float, seconds: float, ready=None
) -> tuple[float, float]:
    """The watcher's CPU over ``seconds`` after ``warm_up_s`` (counted once ``ready()`` holds,
    checked every second for up to 300 s); it must send no event."""
    events = watcher.run()
    waiting = asyncio.ensure_future(events.__anext__())
    deadline = time.monotonic() + 300
    while ready is not None and not await asyncio.to_thread(ready):
        if time.monotonic() > deadline:
            raise RuntimeError("not ready within 300 s")
        await asyncio.sleep(1)
    await asyncio.sleep(warm_up_s)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.sleep(seconds)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    if waiting.done():
        raise RuntimeError(f"the watcher fired: {waiting.result().payload}")
    waiting.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await waiting
    await events.aclose()
    return cpu, wall


async def _cpu_to_first_event(watcher: MongoChangeWatcher) -> tuple[float, float, dict[str, Any]]:
    cpu, wall = time.process_time(), time.perf_counter()
    events = watcher.run()
    event = await asyncio.wait_for(events.__anext__(), 600)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await events.aclose()
    return cpu, wall, event.payload


async def _reading_cpu(uri: str, config: ConnectorConfig, start: Position, count: int) -> dict[str, float]:
    """CPU per change to read ``count`` changes: the change stream against the raw aggregate cursor."""
    figures = {}
    for side in ("change_stream", "aggregate"):
        client = AsyncMongoClient(uri, document_class=RawBSONDocument)
        await client.admin.command("ping")
        cpu = time.process_time()
        if side == "change_stream":
            options = watch_options(config, start, max_await_time_ms=200)
            cursor = await watch_target(client, config).watch(watch_pipeline(config), **options)
        else:
            pipeline, options = watch_aggregate(config, start)
            cursor = await aggregate_target(client, config).aggregate(pipeline, maxAwaitTimeMS=200, **options)
        seen = 0
        while seen < count:
            if await cursor.try_next() is not None:
                seen += 1
        figures[side] = round((time.process_time() - cpu) / count * 1e6, 2)
        await cursor.close()
        await client.close()
    return figures


_OPEN_WINDOW = """
import json, sys
from datetime import datetime, timezone
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
props, uri, bootstrap, seconds = json.loads(sys.argv[1])
config = ConnectorConfig.from_properties(props)
(target,) = plan_streams(connection_details({"connection_string": uri}), config)
params = WindowParams(datetime.now(timezone.utc), commit_interval_s=1.0, open_idle_s=30, max_open_s=seconds)
run_window(target, config, {"bootstrap.servers": bootstrap}, params)
"""

_WRITER = """
import json, sys, time
from pymongo import MongoClient
uri, database, rate, seconds = json.loads(sys.argv[1])
with MongoClient(uri) as client:
    collection, began = client[database]["orders"], time.monotonic()
    for number in range(int(rate * seconds)):
        time.sleep(max(0.0, began + number / rate - time.monotonic()))
        collection.insert_one({"_id": number, "status": "new", "note": "x" * 200})
"""


def _beside_open_window(services: Services, ids: dict[str, str], seconds: float) -> dict[str, Any]:
    """The watcher's CPU while a window carries 10 writes/s (the window and the writer are other
    processes)."""
    import subprocess
    import sys

    from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease

    run = uuid.uuid4().hex[:8]
    database = f"benchjopen{run}"
    props, _ = _watched_from_now(services, database, database)
    config = ConnectorConfig.from_properties(props)
    store = OffsetStore(services.kafka, config.offsets_topic)
    (target,) = plan_streams(connection_details({"connection_string": services.mongodb_uri}), config)
    partition = OffsetPartition(props["topic.prefix"], target.partition)
    leases = ConnectorLease(services.kafka, props["topic.prefix"])
    lease = leases.acquire(f"{database}/bench/window", WINDOW, seconds + 600)
    window_s = seconds + 120
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, json.dumps(arguments)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for code, arguments in (
            (_OPEN_WINDOW, [props, services.mongodb_uri, services.bootstrap, window_s]),
            (_WRITER, [services.mongodb_uri, database, 10, window_s]),
        )
    ]
    try:

        def opened() -> bool:
            state = store.read(partition)
            return state is not None and state.open_window is not None

        # A window the watcher did not ask for is seen at its next check of the offsets (every
        # twelve polls, a minute with the defaults).
        watcher = _watcher(props, ids)
        warm_up = POLLS_PER_CHECK * watcher.settings.poll_interval_s + 15
        cpu, wall = asyncio.run(_idle_cpu(watcher, warm_up, seconds, ready=opened))
    finally:
        for child in children:
            child.kill()
            child.wait()
        leases.release(lease=lease)
    return {"seconds": round(wall, 1), "cpu_s": round(cpu, 3), "cpu_s_per_hour": round(cpu / wall * 3600, 2)}


def run_watcher_cpu(services: Services, idle_s: float, sizes: list[int], rounds: int) -> dict[str, Any]:
    logging.getLogger("airflow_provider_mongocdc").setLevel(logging.WARNING)  # its INFO lines: not here
    ids = _connections(services)
    run = uuid.uuid4().hex[:8]
    props, _ = _watched_from_now(services, f"benchjidle{run}", f"benchjidle{run}")
    idle_cpu, idle_wall = asyncio.run(_idle_cpu(_watcher(props, ids), 15.0, idle_s))
    beside = _beside_open_window(services, ids, idle_s)
    per_size: dict[int, list[float]] = {size: [] for size in sizes}
    walls: dict[int, list[float]] = {size: [] for size in sizes}
    reading: list[dict[str, float]] = []
    for round_number in range(rounds):
        for size in sizes if round_number % 2 == 0 else reversed(sizes):
            database = f"benchj{run}r{round_number}n{size}"
            props, start = _watched_from_now(services, database, database)
            _insert(services, database, size)
            cpu, wall, payload = asyncio.run(
                _cpu_to_first_event(_watcher(props, ids, min_changes=size, max_delay_s=86400))
            )
            if payload["pending"] != size or payload["reason"] != "min_changes":
                raise RuntimeError(f"the watcher of {size} changes fired {payload}")
            per_size[size].append(cpu)
            walls[size].append(wall)
            if size == sizes[-1]:
                config = ConnectorConfig.from_properties(props)
                reading.append(asyncio.run(_reading_cpu(services.mongodb_uri, config, start, size)))
    small, large = sizes[0], sizes[-1]
    cpu_small, cpu_large = statistics.median(per_size[small]), statistics.median(per_size[large])
    wall_small, wall_large = statistics.median(walls[small]), statistics.median(walls[large])
    # The watcher's idle CPU (its clients' monitors, the polls) accrues for as long as the server
    # takes to serve the changes; it is the idle figure, not a cost per change.
    idle_rate = idle_cpu / idle_wall
    marginal = (cpu_large - idle_rate * wall_large) - (cpu_small - idle_rate * wall_small)
    return {
        "idle_s": round(idle_wall, 1),
        "idle_cpu_s": round(idle_cpu, 4),
        "idle_percent_of_a_core": round(idle_cpu / idle_wall * 100, 3),
        "beside_open_window": beside,
        "sizes": sizes,
        "rounds": rounds,
        "cpu_to_event_s": {size: round(statistics.median(v), 3) for size, v in per_size.items()},
        "wall_to_event_s": {size: round(statistics.median(v), 2) for size, v in walls.items()},
        "slope_us": round((cpu_large - cpu_small) / (large - small) * 1e6, 2),
        "per_change_us": round(marginal / (large - small) * 1e6, 2),
        "reading_us_per_change": {
            side: round(statistics.median(item[side] for item in reading), 2)
            for side in ("change_stream", "aggregate")
        },
    }


def report_watcher_cpu(figures: dict[str, Any]) -> list[str]:
    idle, per_change = figures["idle_percent_of_a_core"], figures["per_change_us"]
    beside = figures["beside_open_window"]
    reading = figures["reading_us_per_change"]
    return [
        f"idle over {figures['idle_s']} s: {figures['idle_cpu_s']} CPU-s = {idle} % of a core "
        f"(goal <= {GOAL_IDLE_PERCENT}: {'met' if idle <= GOAL_IDLE_PERCENT else 'NOT met'})",
        f"beside a window open at 10 writes/s, over {beside['seconds']} s: {beside['cpu_s']} CPU-s = "
        f"{beside['cpu_s_per_hour']} CPU-s per hour",
        f"CPU from start to event at min_changes: {figures['cpu_to_event_s']} s (wall {figures['wall_to_event_s']} s)",
        f"per pending change: {per_change} us without its idle CPU over the read, {figures['slope_us']} us "
        f"with it (slope between the sizes; goal <= {GOAL_PER_CHANGE_US}: "
        f"{'met' if per_change <= GOAL_PER_CHANGE_US else 'NOT met'})",
        f"reading {figures['sizes'][-1]} changes: AsyncChangeStream {reading['change_stream']} us/change, "
        f"aggregate cursor (the watcher's) {reading['aggregate']} us/change",
    ]


# -- (i) ----------------------------------------------------------------------------------------------
class _Arrivals:
    """A read_committed consumer of a topic noting when each key's event arrives."""

    def __init__(self, bootstrap: str, topic: str):
        self.arrived: dict[int, float] = {}
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-latency-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        partitions = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
        self.consumer.assign(
            [TopicPartition(topic, partition, -1) for partition in partitions]
        )  # -1: the end
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error() or message.value() is None:
                continue
            key = json.loads(message.key())
            value = json.loads(message.value())
            if value.get("payload", value).get("op") == "c":
                self.arrived.setdefault(int(json.loads(key.get("payload", key)["id"])), time.time())

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()


def _write_at(
    services: Services, database: str, rate: float, seconds: float, first_id: int
) -> dict[int, float]:
    """Insert ``rate`` documents a second for ``seconds``; each one's write time by ``_id``."""
    written: dict[int, float] = {}
    with services.client() as client:
        collection = client[database]["orders"]
        began = time.monotonic()
        for number in range(int(rate * seconds)):
            delay = began + number / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            written[first_id + number] = time.time()
            collection.insert_one({"_id": first_id + number, "written": written[first_id + number]})
    return written


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def run_latency(services: Services, rates: list[float], seconds: float) -> dict[str, Any]:
    # The e2e tests' Airflow stack (api-server, scheduler, dag-processor, triggerer on 127.0.0.1).
    from tests.e2e.airflow_stack import (
        Stack,
        connections_env,
        dag_folder,
        own_airflow,
        start_airflow,
        start_triggerer,
        stop,
        wait_for,
    )

    run = uuid.uuid4().hex[:6]
    prefix, database, name = f"benchi{run}", f"benchi{run}", "latency"
    dag_id = f"mongocdc_{name}_hourly"
    connectors = {
        "connectors": [
            {
                "name": name,
                "config": {"topic.prefix": prefix, "collection.include.list": f"{database}\\.orders"},
                "window_schedule": {"changes": {"max_delay": f"{MAX_DELAY_S}s", "min_changes": 1000}},
            }
        ]
    }
    figures: dict[str, Any] = {"max_delay_s": MAX_DELAY_S, "min_changes": 1000, "seconds_per_rate": seconds}
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-airflow-") as tmp:
        from bench.sidebyside import migrated_env

        base = migrated_env(Path(tmp) / "base")
        home = Path(tmp) / "home"
        home.mkdir()
        env = own_airflow(base, home, dag_folder(home, connectors))
        env.update(connections_env(services.mongodb_uri, services.bootstrap))
        stack = Stack(types.SimpleNamespace(uri=services.mongodb_uri), prefix, services.bootstrap, env, home)
        try:
            api = start_airflow(stack)
            start_triggerer(stack)
            wait_for(
                f"{dag_id} registered", lambda: api.call("GET", f"/api/v2/dags/{dag_id}").status_code == 200
            )
            assert api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).status_code == 200
            created = api.call(
                "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}}
            )
            first = api.wait_run(dag_id, created.json()["dag_run_id"], timeout=900)
            if first["state"] != "success":
                raise RuntimeError(f"the first run (snapshot) failed: {first}")
            topic = f"{prefix}.{database}.orders"
            ensure_topics(services.kafka, [TopicSpec(topic)])  # as the first window would create it
            arrivals = _Arrivals(services.bootstrap, topic)
            next_id = 1_000_000
            try:
                for rate in rates:
                    runs_before = len(_runs(api, dag_id))
                    written = _write_at(services, database, rate, seconds, next_id)
                    next_id += 1_000_000
                    wait_for(
                        f"every event of the {rate}/s writes in Kafka",
                        lambda written=written: all(n in arrivals.arrived for n in written),
                        timeout=900,
                    )
                    latencies = [arrivals.arrived[n] - at for n, at in written.items()]
                    runs = _runs(api, dag_id)[runs_before:]
                    figures[f"{rate:g}/s"] = {
                        "writes": len(written),
                        "p50_s": round(_percentile(latencies, 0.5), 1),
                        "p95_s": round(_percentile(latencies, 0.95), 1),
                        "max_s": round(max(latencies), 1),
                        "windows": len(runs),
                        "run_phases_s": _run_phases(api, dag_id, [r for r in runs if r["end_date"]]),
                    }
            finally:
                arrivals.close()
        finally:
            stop(stack.processes)
    return figures


def _runs(api, dag_id: str) -> list[dict[str, Any]]:
    response = api.call(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "run_after", "limit": 1000}
    )
    return response.json()["dag_runs"]


def _seconds(start: str | None, end: str | None) -> float | None:
    if not start or not end:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def _run_phases(api, dag_id: str, runs: list[dict[str, Any]]) -> dict[str, float | None]:
    """Medians over ``runs`` of where a change-driven run's time goes: from the watcher's event to
    the run's start (the triggerer, the scheduler), the snapshot task, from it to the window task's
    start (scheduling, the task process), the window task, within it the window application (from
    the Python driver's start: its summary's ``duration_s``) and the SparkContext's start, and the
    whole run."""
    phases: dict[str, list[float]] = {
        "event_to_run_start": [],
        "snapshot_task": [],
        "to_window_start": [],
        "window_task": [],
        "window_app": [],
        "window_spark_start": [],
        "run": [],
    }
    for run in runs:
        run_id = run["dag_run_id"]
        events = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents").json()
        fired = [event["extra"]["payload"]["at"] for event in events.get("asset_events", [])]
        tasks = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
        by_id = {task["task_id"]: task for task in tasks["task_instances"]}
        snapshot, window = by_id.get("snapshot", {}), by_id.get("window", {})
        summary = api.call(
            "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/window/xcomEntries/return_value"
        ).json()["value"]
        summary = summary if isinstance(summary, dict) else json.loads(summary)
        for name, value in (
            ("event_to_run_start", _seconds(min(fired), run["start_date"]) if fired else None),
            ("snapshot_task", _seconds(snapshot.get("start_date"), snapshot.get("end_date"))),
            ("to_window_start", _seconds(snapshot.get("end_date"), window.get("start_date"))),
            ("window_task", _seconds(window.get("start_date"), window.get("end_date"))),
            ("window_app", summary.get("duration_s")),
            ("window_spark_start", (summary.get("phases_s") or {}).get("spark_start")),
            ("run", _seconds(run["start_date"], run["end_date"])),
        ):
            if value is not None:
                phases[name].append(value)
    return {name: round(statistics.median(values), 1) if values else None for name, values in phases.items()}


def report_latency(figures: dict[str, Any]) -> list[str]:
    lines = []
    goal = figures["max_delay_s"] + GOAL_P95_OVER_MAX_DELAY_S
    for key, row in figures.items():
        if not isinstance(row, dict):
            continue
        met = (
            ""
            if key != "10/s"
            else f" (goal p95 <= {goal:g} s: {'met' if row['p95_s'] <= goal else 'NOT met'})"
        )
        lines.append(
            f"{key}: {row['writes']} writes, write -> Kafka p50 {row['p50_s']} s, p95 {row['p95_s']} s, "
            f"max {row['max_s']} s; {row['windows']} window runs{met}"
        )
        lines.append(f"  a run's phases (median s): {row['run_phases_s']}")
    return lines
