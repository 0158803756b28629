"""(g) An empty window's whole task tree as the scheduler runs it: the Airflow task process and
everything below it (spark-submit's launcher JVM, SparkSubmit's JVM, the Python driver), with the
LocalExecutor worker that supervises it, in a real Airflow 3 stack (tests/e2e/airflow_stack.py:
api-server, scheduler with LocalExecutor, dag-processor, on 127.0.0.1).

One connector on the clock (no changes, no open windows); its first run takes the snapshot; then
``rounds`` runs are triggered one after the other, each a snapshot task with nothing to do and an
empty window. A sampler reads ``/proc/<pid>/stat`` (utime + stime) of every descendant of the
scheduler and of the API server every 50 ms and keeps each process's last figure (the same as
bench/submit.py's): the CPU a process used between two instants is the difference of the sums.
A window task's tree is every process that the scheduler's tree started from the snapshot task's end
to the window task's end (the task process forked by the executor's worker and its spark-submit
tree), plus what the worker (the task's supervisor) used in that span; the API server's CPU in
the span (the task's execution-API calls, the scheduler's and the dag-processor's polls) is
reported apart, as is the scheduler's own process.
"""

from __future__ import annotations

import json
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

from bench.services import Services
from bench.sidebyside import migrated_env
from bench.submit import SAMPLE_S, _stat

DAG_RUN_TIMEOUT_S = 900


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def _label(command: str) -> str:
    if "org.apache.spark.launcher.Main" in command:
        return "launcher JVM"
    if "java" in command.split(" ", 1)[0]:
        return "SparkSubmit JVM"
    if "stream_window.py" in command or "snapshot.py" in command:
        return "Python driver"
    if "spark-submit" in command:
        return "spark-submit script"
    if "LocalExecutor" in command or "worker" in command:
        return command.split(":", 1)[0][:60]
    if "task" in command or "supervisor" in command:
        return command[:60]
    return command.split(" ", 1)[0].rsplit("/", 1)[-1][:40] or "?"


class Forest:
    """Every descendant of ``roots``: its first-seen time, its label and its last CPU figure."""

    def __init__(self, roots: list[int]):
        self.roots = roots
        self.first_seen: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.command: dict[int, str] = {}
        self.parent: dict[int, int] = {}
        self.history: list[tuple[float, dict[int, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        now = time.time()
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None:
                    parents[int(name)], cpu[int(name)] = stat
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        tree, frontier = set(self.roots), list(self.roots)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        for pid in tree:
            if pid not in cpu:
                continue
            if pid not in self.first_seen:
                self.first_seen[pid] = now
                self.parent[pid] = parents[pid]
            self.last[pid] = max(self.last.get(pid, 0.0), cpu[pid])
            command = self.command.get(pid, "")
            # spark-submit's script execs the JVM: the label follows the process's current command.
            if not command or command.split(" ", 1)[0].endswith(("bash", "sh", "env", "setsid")):
                self.command[pid] = _cmdline(pid)
        self.history.append((now, dict(self.last)))

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def start(self) -> Forest:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def at(self, instant: float) -> dict[int, float]:
        """Each process's CPU at ``instant`` (the last sample at or before it)."""
        state: dict[int, float] = {}
        for when, figures in self.history:
            if when > instant:
                break
            state = figures
        return state

    def between(self, start: float, end: float) -> dict[int, float]:
        before, after = self.at(start), self.at(end)
        return {
            pid: cpu - before.get(pid, 0.0) for pid, cpu in after.items() if cpu - before.get(pid, 0.0) > 0
        }


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def run_scheduled_window(services: Services, rounds: int) -> dict[str, Any]:
    from tests.e2e.airflow_stack import (
        Stack,
        connections_env,
        dag_folder,
        own_airflow,
        start_airflow,
        stop,
        wait_for,
    )

    run = uuid.uuid4().hex[:6]
    prefix, database, name = f"benchm{run}", f"benchm{run}", "tasktree"
    dag_id = f"mongocdc_{name}_hourly"
    connectors = {
        "connectors": [
            {
                "name": name,
                "config": {"topic.prefix": prefix, "collection.include.list": f"{database}\\.orders"},
                "schedule": None,
            }
        ]
    }
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-airflow-") as tmp:
        base = migrated_env(Path(tmp) / "session")
        home = Path(tmp) / "home"
        home.mkdir()
        env = own_airflow(base, home, dag_folder(home, connectors))
        env.update(connections_env(services.mongodb_uri, services.bootstrap))
        with services.client() as client:
            client[database]["orders"].insert_one({"_id": 0, "seeded": True})
        stack = Stack(types.SimpleNamespace(uri=services.mongodb_uri), prefix, services.bootstrap, env, home)
        try:
            api = start_airflow(stack)
            wait_for(
                f"{dag_id} registered", lambda: api.call("GET", f"/api/v2/dags/{dag_id}").status_code == 200
            )
            assert api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False}).status_code == 200
            api_server, scheduler = stack.processes[0].pid, stack.processes[1].pid
            forest = Forest([scheduler, api_server]).start()
            runs = []
            try:
                for _ in range(rounds + 1):
                    created = api.call(
                        "POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": {}}
                    )
                    run_id = created.json()["dag_run_id"]
                    finished = api.wait_run(dag_id, run_id, timeout=DAG_RUN_TIMEOUT_S)
                    if finished["state"] != "success":
                        raise RuntimeError(f"run {run_id} ended {finished['state']}")
                    time.sleep(1.0)  # the sampler's next samples after the task processes were reaped
                    tasks = api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances").json()
                    by_id = {task["task_id"]: task for task in tasks["task_instances"]}
                    runs.append((run_id, by_id))
            finally:
                forest.stop()
        finally:
            stop(stack.processes)
    figures: dict[str, Any] = {"rounds": rounds, "windows": []}
    for run_id, by_id in runs[1:]:  # the first run took the snapshot
        snapshot, window = by_id["snapshot"], by_id["window"]
        start, end = _epoch(snapshot["end_date"]), _epoch(window["end_date"]) + 0.5
        used = forest.between(start, end)
        by_label: dict[str, float] = {}
        task_tree = 0.0
        for pid, cpu in used.items():
            if pid == api_server:
                label = "api-server"
            elif pid == scheduler:
                label = "scheduler"
            else:
                born_in_span = start - SAMPLE_S <= forest.first_seen[pid] <= end
                label = _label(forest.command.get(pid, ""))
                if born_in_span:
                    task_tree += cpu
                    label = f"task tree: {label}"
                elif forest.parent.get(pid) == scheduler:
                    task_tree += cpu  # the executor's worker: the task's supervisor
                    label = f"task tree (supervisor): {label}"
            by_label[label] = round(by_label.get(label, 0.0) + cpu, 2)
        figures["windows"].append(
            {
                "run_id": run_id,
                "window_task_s": round(_epoch(window["end_date"]) - _epoch(window["start_date"]), 2),
                "task_tree_cpu_s": round(task_tree, 2),
                "by_process": dict(sorted(by_label.items(), key=lambda item: -item[1])),
            }
        )
    return figures


def report_scheduled_window(figures: dict[str, Any]) -> list[str]:
    lines = []
    for window in figures["windows"]:
        parts = ", ".join(f"{label} {cpu:.2f}" for label, cpu in window["by_process"].items() if cpu >= 0.01)
        lines.append(
            f"empty window run by the scheduler: task {window['window_task_s']} s, whole task tree "
            f"{window['task_tree_cpu_s']} CPU-s ({parts})"
        )
    trees = [window["task_tree_cpu_s"] for window in figures["windows"]]
    if trees:
        lines.append(
            f"(g) an empty window's whole task tree (scheduler-run), median of {len(trees)}: "
            f"{statistics.median(trees):.2f} CPU-s (goal <= 5)"
        )
    return lines


if __name__ == "__main__":  # python -m bench.task_tree [rounds]
    import sys

    with Services() as services:
        result = run_scheduled_window(services, int(sys.argv[1]) if len(sys.argv) > 1 else 2)
    print(json.dumps(result, indent=2))
    for line in report_scheduled_window(result):
        print(line)
