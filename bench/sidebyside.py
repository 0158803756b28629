"""Open windows through a real Airflow stack, alone (i) and side by side with Debezium (l).

Both run a real Airflow 3.3 (api-server, scheduler with LocalExecutor, dag-processor, triggerer,
from ``tests/e2e/airflow_stack.py``, its own SQLite database migrated at the start) with one
connector whose window DAG is scheduled by changes (``min_changes`` 1, ``max_delay`` 5 s) and whose
windows stay open (``window_schedule.open`` at its defaults: ``idle`` 30 s, ``max_open`` 50 min,
``commit_interval`` 1 s), with docker-compose.yaml's settings of Airflow's loops (:data:`DEPLOYMENT_TUNING`;
``MONGOCDC_BENCH_AIRFLOW_DEFAULTS=1``: Airflow's defaults instead) and any others given as
``MONGOCDC_BENCH_AIRFLOW_SETTINGS="AIRFLOW__SECTION__KEY=value ..."`` (the report names them).
The first run (Trigger) takes the snapshot. A writer then inserts at a
steady rate (``insert_one`` of single documents), phase after phase, and one ``read_committed``
consumer of the topics notes when each insert's event arrives.

(i) ``open-latency``: 10 writes/s for 10 minutes: write -> readable in Kafka p50/p95/max, the
window runs started (one window start per burst is the goal: a burst = writes with no gap longer
than ``idle``; a steady stream is one burst).

(l) ``debezium``: the same stack, and Debezium's MongoDB connector 3.6.1.Final run by Kafka Connect
standalone (connect-runtime 4.1.0, devtools/debezium: JsonConverter with schemas, its own topic
prefix) capturing the same collection of the same simulator, sending to the same broker. Phases:
idle, 10 writes/s, 100 writes/s. CPU of each side's whole process tree over each phase, from
``/proc``: the Airflow side is every process below the api-server, the scheduler (its executor
workers, the task supervisors and task processes, spark-submit's JVMs and the Python driver),
the dag-processor and the triggerer; the Debezium side is the Connect JVM. The broker and the
simulator serve both and are not counted. Events each side delivered are counted per insert.

CPU of a process tree (:class:`ProcessTrees`): every 0.25 s, the ``utime + stime + cutime +
cstime`` of every process of the trees (found through the parent pids; a process once seen stays
tracked even when re-parented). A process that exits and is reaped by a tracked parent moves its
CPU into that parent's ``cutime``/``cstime``, so the sum over live processes keeps it; one reaped
by an outside process (re-parented) keeps its last sampled figure. Children that live and die
between two samples are counted through their parent's ``cutime``. The by-process split counts
each process's own ``utime + stime`` (what died between samples shows as "reaped between samples").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, TopicPartition

from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from bench.services import REPO, VENV_BIN, Services, spark_env

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.25
IDLE_S = 30.0
MAX_OPEN_S = 50 * 60.0  # a steady flow's window closes after this and the next one starts
GOAL_P95_S = 10.0
SCHEDULE = {
    "changes": {"min_changes": 1, "max_delay": "5s"},
    "open": {"idle": f"{IDLE_S:g}s", "max_open": f"{MAX_OPEN_S / 60:g}min", "commit_interval": "1s"},
}


# -- CPU of process trees from /proc -------------------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, float, float] | None:
    """(parent pid, start time, own utime+stime, reaped children's cutime+cstime) of ``pid``."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    own = (int(fields[11]) + int(fields[12])) / TICKS
    children = (int(fields[13]) + int(fields[14])) / TICKS
    return int(fields[1]), int(fields[19]), own, children


def _label(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = [arg.decode(errors="replace") for arg in handle.read().split(b"\0") if arg]
    except OSError:
        return "?"
    text = " ".join(args)
    if not args:
        return "?"
    if os.path.basename(args[0]) in ("bash", "sh", "dash", "setsid", "env"):
        return os.path.basename(args[0])  # a launcher script that execs the real program: labelled again
    if args[0].endswith("java"):
        if "ConnectStandalone" in text:
            return "Kafka Connect JVM"
        if "org.apache.spark.launcher.Main" in text:
            return "spark-submit launcher JVM"
        return "spark-submit JVM"
    if "stream_window.py" in text or "snapshot.py" in text:
        return "Python driver (" + ("window" if "stream_window.py" in text else "snapshot") + ")"
    if args[0].startswith("airflow "):  # a process title set by Airflow (setproctitle)
        return " ".join(args[0].split()[:3]).rstrip(":")
    for name in ("api-server", "scheduler", "dag-processor", "triggerer"):
        if name in args[1:3] or f"airflow {name}" in text:
            return f"airflow {name}"
    return os.path.basename(args[0])[:40]


class _Tracked:
    __slots__ = ("ppid", "start", "own", "children", "label", "alive")

    def __init__(self, ppid: int, start: int, own: float, children: float, label: str):
        self.ppid, self.start, self.own, self.children, self.label = ppid, start, own, children, label
        self.alive = True


class ProcessTrees:
    """The CPU of named process trees, sampled from ``/proc`` (see the module's docstring)."""

    def __init__(self, roots: dict[str, list[int]]):
        self.roots = roots
        self.tracked: dict[str, dict[tuple[int, int], _Tracked]] = {side: {} for side in roots}
        self.frozen: dict[str, float] = dict.fromkeys(roots, 0.0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        stats: dict[int, tuple[int, int, float, float]] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None:
                    stats[int(name)] = stat
        children: dict[int, list[int]] = {}
        for pid, stat in stats.items():
            children.setdefault(stat[0], []).append(pid)
        with self._lock:
            for side, roots in self.roots.items():
                tracked = self.tracked[side]
                members = {pid for pid in roots if pid in stats}
                members |= {key[0] for key, item in tracked.items() if item.alive}
                frontier = list(members)
                while frontier:
                    for child in children.get(frontier.pop(), []):
                        if child not in members:
                            members.add(child)
                            frontier.append(child)
                live: set[tuple[int, int]] = set()
                for pid in members:
                    stat = stats.get(pid)
                    if stat is None:
                        continue
                    key = (pid, stat[1])
                    live.add(key)
                    item = tracked.get(key)
                    if item is None:
                        tracked[key] = _Tracked(stat[0], stat[1], stat[2], stat[3], _label(pid))
                    else:
                        item.ppid, item.own, item.children = stat[0], stat[2], stat[3]
                        if item.label in (
                            "?",
                            "bash",
                            "sh",
                            "dash",
                            "setsid",
                            "env",
                            "jspawnhelper",
                            "python",
                        ):
                            item.label = _label(pid)
                alive_pids = {key[0] for key in live}
                gone = {key[0]: item for key, item in tracked.items() if item.alive and key not in live}
                for item in gone.values():
                    item.alive = False
                for item in gone.values():
                    # Reaped by a live tracked ancestor (through parents gone in the same interval):
                    # its CPU is in that ancestor's cutime now. Otherwise its last figure stays.
                    parent, seen = item.ppid, set()
                    while parent in gone and parent not in seen:
                        seen.add(parent)
                        parent = gone[parent].ppid
                    if parent not in alive_pids:
                        self.frozen[side] += item.own + item.children

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def start(self) -> ProcessTrees:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def mark(self) -> dict[str, Any]:
        """The trees' totals now and each process's own CPU (a fresh sample first)."""
        self._sample()
        with self._lock:
            return {
                "at": time.monotonic(),
                "total": {
                    side: self.frozen[side]
                    + sum(item.own + item.children for item in tracked.values() if item.alive)
                    for side, tracked in self.tracked.items()
                },
                "own": {
                    side: {key: (item.label, item.own) for key, item in tracked.items()}
                    for side, tracked in self.tracked.items()
                },
            }


def cpu_between(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Per side: CPU-s between two marks, per hour of wall, and split by process label."""
    wall = after["at"] - before["at"]
    sides = {}
    for side, total in after["total"].items():
        cpu = total - before["total"][side]
        split: dict[str, float] = {}
        for key, (label, own) in after["own"][side].items():
            start = before["own"][side].get(key, (label, 0.0))[1]
            if own - start > 0:
                split[label] = split.get(label, 0.0) + own - start
        rest = cpu - sum(split.values())
        if abs(rest) >= 0.01:
            split["reaped between samples"] = rest
        sides[side] = {
            "cpu_s": round(cpu, 2),
            "cpu_s_per_hour": round(cpu / wall * 3600, 1),
            "percent_of_a_core": round(cpu / wall * 100, 2),
            "by_process_s": {k: round(v, 2) for k, v in sorted(split.items(), key=lambda kv: -kv[1])},
        }
    return {"wall_s": round(wall, 1), "sides": sides}


# -- the Airflow stack -----------------------------------------------------------------------------
# The settings of docker-compose.yaml's Airflow services that tune their own CPU (its comments say
# what each costs): the bench runs the deployment the README describes
# (``MONGOCDC_BENCH_AIRFLOW_DEFAULTS=1``: Airflow's defaults).
DEPLOYMENT_TUNING = (
    "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME",
    "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC",
    "AIRFLOW__SCHEDULER__JOB_HEARTBEAT_SEC",
    "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC",
    "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD",
    "AIRFLOW__DAG_PROCESSOR__HEALTH_CHECK_THRESHOLD",
    "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD",
    "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL",
    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL",
    "AIRFLOW__SCHEDULER__TRIGGER_TIMEOUT_CHECK_INTERVAL",
    "AIRFLOW__SCHEDULER__PARSING_CLEANUP_INTERVAL",
)


def deployment_settings() -> dict[str, str]:
    """docker-compose.yaml's values of :data:`DEPLOYMENT_TUNING` (none with the defaults' switch),
    then ``MONGOCDC_BENCH_AIRFLOW_SETTINGS`` (``AIRFLOW__SECTION__KEY=value`` words: a deployment's
    other choices, measured the same way)."""
    settings: dict[str, str] = {}
    if os.environ.get("MONGOCDC_BENCH_AIRFLOW_DEFAULTS") != "1":
        import yaml

        compose = yaml.safe_load((REPO / "docker-compose.yaml").read_text())
        environment = compose["x-airflow"]["environment"]
        settings = {key: str(environment[key]) for key in DEPLOYMENT_TUNING if key in environment}
    for word in os.environ.get("MONGOCDC_BENCH_AIRFLOW_SETTINGS", "").split():
        key, sep, value = word.partition("=")
        if not sep or not key.startswith("AIRFLOW__"):
            raise SystemExit(f"MONGOCDC_BENCH_AIRFLOW_SETTINGS: {word!r} is not AIRFLOW__SECTION__KEY=value")
        settings[key] = value
    return settings


def migrated_env(home: Path) -> dict[str, str]:
    """An environment whose ``AIRFLOW_HOME`` holds ``migrated.db`` (``airflow db migrate`` once),
    which ``tests/e2e/airflow_stack.own_airflow`` copies."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        **spark_env(),
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
    }
    done = subprocess.run(
        [str(VENV_BIN / "airflow"), "db", "migrate"], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        raise RuntimeError(f"airflow db migrate failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    shutil.copyfile(home / "airflow.db", home / "migrated.db")
    return env


@contextmanager
def airflow_stack(services: Services, name: str, prefix: str, database: str):
    """A running Airflow stack with one connector (open windows), its snapshot taken; yields
    (api, stack, dag_id)."""
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

    dag_id = f"mongocdc_{name}_hourly"
    connectors = {
        "connectors": [
            {
                "name": name,
                "config": {"topic.prefix": prefix, "collection.include.list": f"{database}\\.orders"},
                "window_schedule": SCHEDULE,
            }
        ]
    }
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-airflow-") as tmp:
        base = migrated_env(Path(tmp) / "base")
        home = Path(tmp) / "home"
        home.mkdir()
        env = own_airflow(base, home, dag_folder(home, connectors))
        env.update(connections_env(services.mongodb_uri, services.bootstrap))
        env.update(deployment_settings())
        stack = Stack(types.SimpleNamespace(uri=services.mongodb_uri), prefix, services.bootstrap, env, home)
        try:
            api = start_airflow(stack)
            start_triggerer(stack)
            wait_for(
                f"{dag_id} registered", lambda: api.call("GET", f"/api/v2/dags/{dag_id}").status_code == 200
            )
            assert api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).status_code == 200
            # The change watcher of a DAG unpaused after its parse is registered at the file's next
            # parse: asked for at once, as "Reparse Dag" in the UI does.
            token = api.call("GET", f"/api/v2/dags/{dag_id}/details").json()["file_token"]
            assert api.call("PUT", f"/api/v2/parseDagFile/{token}").status_code in (200, 201)
            created = api.call(
                "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}}
            )
            first = api.wait_run(dag_id, created.json()["dag_run_id"], timeout=900)
            if first["state"] != "success":
                raise RuntimeError(f"the first run (snapshot) failed: {first}")
            yield api, stack, dag_id
        finally:
            stop(stack.processes)


def _runs(api, dag_id: str) -> list[dict[str, Any]]:
    response = api.call(
        "GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "run_after", "limit": 1000}
    )
    return response.json()["dag_runs"]


def _open_windows(api, dag_id: str, runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each run's window summary: its open span and stop reasons."""
    found = []
    for run in runs:
        response = api.call(
            "GET",
            f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/window/xcomEntries/return_value",
        )
        if response.status_code != 200:
            found.append({"run": run["dag_run_id"], "state": run["state"], "summary": None})
            continue
        summary = response.json()["value"]
        summary = summary if isinstance(summary, dict) else json.loads(summary)
        found.append(
            {
                "run": run["dag_run_id"],
                "state": run["state"],
                "events": summary.get("events"),
                "duration_s": summary.get("duration_s"),
                "open_window": summary.get("open_window"),
                "stop_reasons": [p.get("stop_reason") for p in summary.get("partitions") or []],
            }
        )
    return found


# -- writes and arrivals ---------------------------------------------------------------------------
class Arrivals:
    """A read_committed consumer of several topics: when each key's first create event arrived, and
    how many create events each key had (duplicates)."""

    def __init__(self, bootstrap: str, topics: list[str]):
        self.arrived: dict[str, dict[int, float]] = {topic: {} for topic in topics}
        self.count: dict[str, dict[int, int]] = {topic: {} for topic in topics}
        self._stop = threading.Event()
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-sidebyside-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            }
        )
        assignment = []
        for topic in topics:
            partitions = self.consumer.list_topics(topic, timeout=30).topics[topic].partitions
            assignment += [TopicPartition(topic, partition, -1) for partition in partitions]  # -1: the end
        self.consumer.assign(assignment)
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            message = self.consumer.poll(0.2)
            if message is None or message.error() or message.value() is None:
                continue
            now = time.time()
            key = json.loads(message.key())
            value = json.loads(message.value())
            if value.get("payload", value).get("op") != "c":
                continue
            number = int(json.loads(key.get("payload", key)["id"]))
            topic = message.topic()
            self.arrived[topic].setdefault(number, now)
            self.count[topic][number] = self.count[topic].get(number, 0) + 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.consumer.close()


def write_at(
    services: Services,
    database: str,
    rate: float,
    seconds: float,
    first_id: int,
    until: Callable[[dict[int, float]], bool] | None = None,
) -> dict[int, float]:
    """Insert ``rate`` documents a second for ``seconds`` (or, with ``until``, until it holds for
    the writes so far, checked once a second); each one's write time by ``_id``."""
    written: dict[int, float] = {}
    with services.client() as client:
        collection = client[database]["orders"]
        began = time.monotonic()
        for number in range(int(rate * seconds)):
            if until is not None and number and number % int(rate) == 0 and until(written):
                break
            delay = began + number / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            written[first_id + number] = time.time()
            collection.insert_one({"_id": first_id + number, "written": written[first_id + number]})
    return written


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))]


def bursts(times: list[float], idle_s: float) -> int:
    """Writes with no gap longer than ``idle_s`` form one burst."""
    ordered = sorted(times)
    return (
        (1 + sum(1 for a, b in zip(ordered, ordered[1:], strict=False) if b - a > idle_s)) if ordered else 0
    )


def _delivery(arrivals: Arrivals, topic: str, written: dict[int, float]) -> dict[str, Any]:
    arrived, counts = arrivals.arrived[topic], arrivals.count[topic]
    latencies = [arrived[n] - at for n, at in written.items() if n in arrived]
    return {
        "writes": len(written),
        "delivered": sum(1 for n in written if n in arrived),
        "duplicates": sum(counts.get(n, 0) - 1 for n in written if counts.get(n, 0) > 1),
        "p50_s": round(_percentile(latencies, 0.5), 2) if latencies else None,
        "p95_s": round(_percentile(latencies, 0.95), 2) if latencies else None,
        "max_s": round(max(latencies), 2) if latencies else None,
    }


def _load() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


START_SETTLE_S = 10.0  # a start phase goes on this long after the window's first delivery


def run(services: Services, phases: list[tuple[Any, ...]], debezium: bool) -> dict[str, Any]:
    """``phases``: (writes per second, seconds), 0 writes/s being an idle phase, or (writes per
    second, at most seconds, "start"): writes until the open window has delivered the phase's first
    write and ``START_SETTLE_S`` more (the window's start, reported apart from the steady phases)."""
    from devtools.debezium import ConnectStandalone
    from tests.e2e.airflow_stack import wait_for

    tag = uuid.uuid4().hex[:6]
    prefix, database, name = f"benchl{tag}", f"benchl{tag}", "sidebyside"
    topics = {"airflow": f"{prefix}.{database}.orders"}
    figures: dict[str, Any] = {
        "schedule": SCHEDULE,
        "airflow_settings": deployment_settings(),
        "phases": [],
        "started_utc": _utc(),
    }
    with services.client() as client:
        client[database].create_collection("orders")
    with airflow_stack(services, name, prefix, database) as (api, stack, dag_id):
        snapshot_runs = len(_runs(api, dag_id))
        worker = None
        roots = {"airflow": [process.pid for process in stack.processes]}
        try:
            if debezium:
                topics["debezium"] = f"dbz{tag}.{database}.orders"
                worker = ConnectStandalone(
                    services.bootstrap,
                    f"dbz{tag}",
                    {
                        "mongodb.connection.string": services.mongodb_uri,
                        "topic.prefix": f"dbz{tag}",
                        "collection.include.list": f"{database}\\.orders",
                    },
                ).start()
                figures["debezium_start_s"] = round(worker.start_seconds, 1)
                roots["debezium"] = [worker.pid]
            ensure_topics(services.kafka, [TopicSpec(topic) for topic in topics.values()])
            arrivals = Arrivals(services.bootstrap, list(topics.values()))
            trees = ProcessTrees(roots).start()
            time.sleep(10)  # the starts settle (Connect's first offset flush, the snapshot run's end)
            next_id = 1_000_000
            all_writes: dict[int, float] = {}
            try:
                for rate, seconds, *kind in phases:
                    start = kind == ["start"]
                    load_before = _load()
                    before = trees.mark()
                    began_utc = _utc()
                    if start:
                        first, delivered_at = next_id, []

                        def started(
                            written: dict[int, float], first: int = first, marks=delivered_at
                        ) -> bool:
                            if not marks and first in arrivals.arrived[topics["airflow"]]:
                                marks.append(time.monotonic())
                            return bool(marks) and time.monotonic() - marks[0] >= START_SETTLE_S

                        written = write_at(services, database, rate, seconds, next_id, until=started)
                        next_id += 1_000_000
                    elif rate:
                        written = write_at(services, database, rate, seconds, next_id)
                        next_id += 1_000_000
                    else:
                        time.sleep(seconds)
                        written = {}
                    after = trees.mark()
                    all_writes.update(written)
                    phase = {
                        "rate": rate,
                        "seconds": round(after["at"] - before["at"], 1) if start else seconds,
                        "start": start,
                        "began_utc": began_utc,
                        "load_before": load_before,
                        "load_after": _load(),
                        "cpu": cpu_between(before, after),
                        "written": written,
                    }
                    figures["phases"].append(phase)
                wait_for(
                    "every write's event on every side",
                    lambda: all(
                        n in arrivals.arrived[topic] for topic in topics.values() for n in all_writes
                    ),
                    timeout=600,
                )
                # The open window closes after its idle time; then the runs are counted.
                wait_for(
                    "the open window's run to end",
                    lambda: all(run["state"] in ("success", "failed") for run in _runs(api, dag_id)),
                    timeout=IDLE_S * 4 + 300,
                )
                time.sleep(2)
            finally:
                arrivals.close()
                trees.stop()
            runs = _runs(api, dag_id)[snapshot_runs:]
            figures["window_runs"] = len(runs)
            figures["windows"] = _open_windows(api, dag_id, runs)
            figures["bursts"] = bursts(list(all_writes.values()), IDLE_S)
            for phase in figures["phases"]:
                written = phase.pop("written")
                if written:
                    phase["delivery"] = {
                        side: _delivery(arrivals, topic, written) for side, topic in topics.items()
                    }
            writes = {n: at for n, at in all_writes.items()}
            figures["delivery"] = {side: _delivery(arrivals, topic, writes) for side, topic in topics.items()}
        finally:
            if worker is not None:
                figures["debezium_log_errors"] = [
                    line[:300]
                    for line in worker.log_path.read_text(errors="replace").splitlines()
                    if " ERROR " in line
                ][:10]
                worker.stop()
    figures["ended_utc"] = _utc()
    figures["start_cost"] = start_cost(figures)
    return figures


def start_cost(figures: dict[str, Any]) -> dict[str, Any] | None:
    """The window's start apart from the steady work: a start phase's Airflow CPU less what the
    following steady phase at the same rate takes in as long, and each steady phase's CPU per hour
    with that start paid once per ``max_open`` (a steady flow's window closes then and the next one
    starts)."""
    phases = figures["phases"]
    starts = [n for n, phase in enumerate(phases) if phase.get("start")]
    if not starts:
        return None
    start = phases[starts[0]]
    steady = next((p for p in phases[starts[0] + 1 :] if p["rate"] == start["rate"]), None)
    if steady is None:
        return None
    wall = start["cpu"]["wall_s"]
    own = (
        start["cpu"]["sides"]["airflow"]["cpu_s"]
        - steady["cpu"]["sides"]["airflow"]["cpu_s"] / steady["cpu"]["wall_s"] * wall
    )
    per_hour = {}
    for phase in phases[starts[0] + 1 :]:
        sides = phase["cpu"]["sides"]
        with_starts = sides["airflow"]["cpu_s_per_hour"] + own * 3600 / MAX_OPEN_S
        row = {"airflow_with_starts_cpu_s_per_hour": round(with_starts, 1)}
        if "debezium" in sides and sides["debezium"]["cpu_s_per_hour"] > 0:
            row["ratio"] = round(with_starts / sides["debezium"]["cpu_s_per_hour"], 2)
        per_hour[f"{phase['rate']:g}/s"] = row
    return {"start_phase_s": wall, "start_cpu_s": round(own, 2), "per_hour_with_starts": per_hour}


def _utc() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())


# -- reports ---------------------------------------------------------------------------------------
def report_latency(figures: dict[str, Any]) -> list[str]:
    lines = [f"{figures['started_utc']} -> {figures['ended_utc']}; window_schedule {json.dumps(SCHEDULE)}"]
    if figures.get("airflow_settings"):
        lines.append(
            f"Airflow settings: {' '.join(f'{k}={v}' for k, v in figures['airflow_settings'].items())}"
        )
    for phase in figures["phases"]:
        if "delivery" not in phase:
            continue
        row = phase["delivery"]["airflow"]
        met = "met" if row["p95_s"] is not None and row["p95_s"] <= GOAL_P95_S else "NOT met"
        lines.append(
            f"{phase['rate']:g}/s for {phase['seconds']:g} s (from {phase['began_utc']}, load "
            f"{phase['load_before'][0]} -> {phase['load_after'][0]}): {row['writes']} writes, "
            f"{row['delivered']} delivered, {row['duplicates']} duplicates; write -> Kafka p50 {row['p50_s']} s, "
            f"p95 {row['p95_s']} s (goal <= {GOAL_P95_S:g}: {met}), max {row['max_s']} s"
        )
    lines.append(
        f"window runs (starts): {figures['window_runs']}, bursts: {figures['bursts']} "
        f"(at most one start per burst: {'met' if figures['window_runs'] <= figures['bursts'] else 'NOT met'})"
    )
    for window in figures["windows"]:
        lines.append(f"  window run: {json.dumps(window, default=str)[:400]}")
    return lines


def report_sidebyside(figures: dict[str, Any]) -> list[str]:
    lines = report_latency(figures)
    for phase in figures["phases"]:
        cpu = phase["cpu"]["sides"]
        label = f"{phase['rate']:g}/s" if phase["rate"] else "idle"
        if phase.get("start"):
            label += " (the window's start: not a steady phase)"
        text = ", ".join(
            f"{side} {row['cpu_s']} CPU-s = {row['cpu_s_per_hour']} CPU-s/h ({row['percent_of_a_core']} % of a core)"
            for side, row in cpu.items()
        )
        ratio = ""
        if "debezium" in cpu and cpu["debezium"]["cpu_s"] > 0:
            value = cpu["airflow"]["cpu_s"] / cpu["debezium"]["cpu_s"]
            ratio = f"; airflow/debezium {value:.2f} ({'met' if value <= 1 else 'NOT met'}: goal <= 1)"
        lines.append(f"{label} over {phase['cpu']['wall_s']} s: {text}{ratio}")
        for side, row in cpu.items():
            lines.append(f"  {side} by process: {row['by_process_s']}")
        if "delivery" in phase:
            for side, row in phase["delivery"].items():
                lines.append(
                    f"  {side}: {row['delivered']}/{row['writes']} delivered, {row['duplicates']} duplicates, "
                    f"p50 {row['p50_s']} s, p95 {row['p95_s']} s, max {row['max_s']} s"
                )
    cost = figures.get("start_cost")
    if cost:
        lines.append(
            f"the window's start: {cost['start_cpu_s']} CPU-s beyond the steady work ({cost['start_phase_s']} s "
            f"phase); steady phases with it paid once per max_open ({MAX_OPEN_S / 60:g} min): "
            + "; ".join(
                f"{rate} {row['airflow_with_starts_cpu_s_per_hour']} CPU-s/h"
                + (f" (ratio {row['ratio']})" if "ratio" in row else "")
                for rate, row in cost["per_hour_with_starts"].items()
            )
        )
    if figures.get("debezium_log_errors"):
        lines.append(f"Kafka Connect log errors: {figures['debezium_log_errors']}")
    return lines
