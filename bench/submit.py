"""Whole spark-submit runs, measured as users pay for them: wall time and the CPU of the process tree.

(g) ``submit-window``: ``spark-submit stream_window.py`` over 0 (an empty window: the fixed cost),
then two sizes of insert changes of ~1 KB documents (bench.events), the one stream in the driver;
empty windows with the stream in a Spark task and in the driver, alternately; and the Airflow task
around spark-submit: a Python process that runs ``MongoStreamWindowOperator.execute`` (the lease,
the job spec, the operator's spark-submit through Airflow's SparkSubmitHook, the summary) with
``AIRFLOW_CONN_*`` connections, as a task process does without the task runner and its API
server, empty windows with ``stream_in_driver=False`` and ``"auto"`` alternately. (h) ``submit-snapshot``:
``spark-submit snapshot.py`` of an empty collection, then two sizes of ~1 KB documents at
each ``snapshot.max.threads`` (1, 2, 4).

CPU of the tree: a sampler reads ``/proc/<pid>/stat`` (utime + stime) of every descendant of the
spark-submit process every 50 ms and keeps each process's last figure; when the run ends,
``os.wait4`` gives the rusage of spark-submit with every descendant it or they reaped. The larger
of the two is reported (both can only miss CPU: the sampler the last <50 ms of a process, the
rusage the processes that nobody reaped). The simulator is another process: its own CPU over the
run is read from ``/proc/<pid>/stat`` and reported apart (only when this command started it).

Marginal CPU per event or document = slope between the two sizes. Phases come from the
applications' summaries (``phases_s``).
"""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from bench.events import make_document
from bench.services import SPARK_ARGS, VENV_BIN, Services, spark_env
from bench.spark import APPS
from bench.window import connector, insert_documents, seed, window_end_after

TICKS = os.sysconf("SC_CLK_TCK")
SAMPLE_S = 0.05


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, utime + stime in seconds) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def process_cpu(pid: int | None) -> float | None:
    stat = _stat(pid) if pid else None
    return stat[1] if stat else None


class TreeSampler:
    """The last CPU figure of every descendant of ``root`` (sampled every ``SAMPLE_S``)."""

    def __init__(self, root: int):
        self.root = root
        self.last: dict[int, float] = {}
        self.labels: dict[int, str] = {}
        self.peak_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        parents: dict[int, int] = {}
        cpu: dict[int, float] = {}
        for name in os.listdir("/proc"):
            if name.isdigit():
                stat = _stat(int(name))
                if stat is not None:
                    parents[int(name)], cpu[int(name)] = stat
        tree, frontier = {self.root}, [self.root]
        children: dict[int, list[int]] = {}
        for pid, parent in parents.items():
            children.setdefault(parent, []).append(pid)
        while frontier:
            for child in children.get(frontier.pop(), []):
                if child not in tree:
                    tree.add(child)
                    frontier.append(child)
        alive = [pid for pid in tree if pid in cpu]
        self.peak_processes = max(self.peak_processes, len(alive))
        for pid in alive:
            self.last[pid] = max(self.last.get(pid, 0.0), cpu[pid])
            if self.labels.get(pid) in (
                None,
                "bash",
                "sh",
                "setsid",
                "env",
                "jspawnhelper",
            ):  # spark-submit execs the JVM
                self.labels[pid] = _label(pid)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self._sample()

    def start(self) -> TreeSampler:
        self._sample()
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return sum(self.last.values())

    def by_label(self) -> dict[str, float]:
        totals: dict[str, float] = {}
        for pid, cpu in self.last.items():
            label = self.labels.get(pid, "?")
            totals[label] = round(totals.get(label, 0.0) + cpu, 2)
        return totals


def _label(pid: int) -> str:
    """What a process of the tree is: the JVM, the Python driver, a Python worker (forked from
    pyspark.daemon), or its command name."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            args = handle.read().split(b"\0")
    except OSError:
        return "?"
    text = b" ".join(args)
    if args and args[0].endswith(b"java"):
        return "jvm launcher" if b"org.apache.spark.launcher.Main" in text else "jvm"
    if b"pyspark.daemon" in text or b"pyspark.worker" in text:
        return "python workers"
    if b".py" in text and b"python" in args[0]:
        return "python driver"
    return os.path.basename(args[0].decode(errors="replace")) if args and args[0] else "?"


def submit(application: str, spec: JobSpec, directory: Path, sim_pid: int | None) -> dict[str, Any]:
    """One spark-submit run: its summary, wall seconds, tree CPU and the simulator's CPU."""
    name = uuid.uuid4().hex[:8]
    spec_path = spec.write(directory / f"spec-{name}.json")
    result_path = directory / f"result-{name}.json"
    command = [str(VENV_BIN / "spark-submit"), *SPARK_ARGS, str(APPS / f"{application}.py")]
    command += ["--job-spec", str(spec_path), "--result", str(result_path)]
    run = _measured(command, directory / f"out-{name}.log", spark_env(), sim_pid)
    result = read_result(result_path)
    if run.pop("returncode") != 0 or not result or result.get("status") != "ok":
        tail = (directory / f"out-{name}.log").read_text(errors="replace")[-4000:]
        raise RuntimeError(f"spark-submit {application} failed: {result}\n{tail}")
    return {"summary": result["summary"], **run}


def _measured(command: list[str], output: Path, env: dict[str, str], sim_pid: int | None) -> dict[str, Any]:
    """Run ``command`` (its output to ``output``): exit code, wall seconds, tree CPU, the simulator's CPU."""
    sim_before = process_cpu(sim_pid)
    began = time.perf_counter()
    log = open(output, "wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    sampler = TreeSampler(process.pid).start()
    try:
        _, status, rusage = os.wait4(process.pid, 0)
    finally:
        log.close()
    wall = time.perf_counter() - began
    sampled = sampler.stop()
    process.returncode = os.waitstatus_to_exitcode(status)
    reaped = rusage.ru_utime + rusage.ru_stime
    sim_after = process_cpu(sim_pid)
    return {
        "returncode": process.returncode,
        "wall_s": round(wall, 3),
        "cpu_s": round(max(sampled, reaped), 3),
        "cpu_sampled_s": round(sampled, 3),
        "cpu_reaped_s": round(reaped, 3),
        "processes": sampler.peak_processes,
        "cpu_by_process_s": sampler.by_label(),
        "sim_cpu_s": None if sim_before is None or sim_after is None else round(sim_after - sim_before, 3),
    }


def _slope(small: dict[str, Any], large: dict[str, Any], n_small: int, n_large: int, key: str) -> float:
    return round((large[key] - small[key]) / (n_large - n_small) * 1e6, 1)


def _sim_pid(services: Services) -> int | None:
    services.mongodb_uri  # noqa: B018 - started on first use
    sim = getattr(services, "_sim", None)
    return getattr(sim, "pid", None)


def _window_phases(summary: dict[str, Any]) -> dict[str, Any]:
    phases = dict(summary.get("phases_s") or {})
    for item in summary.get("partitions") or []:
        for key, value in (item.get("phases_s") or {}).items():
            phases[f"window.{key}"] = round(phases.get(f"window.{key}", 0.0) + value, 3)
    return phases


# -- (g) ---------------------------------------------------------------------------------------------
def run_window(services: Services, sizes: list[int], empty_rounds: int = 1) -> dict[str, Any]:
    """The windows of ``sizes`` changes with their one stream in the driver (the operators' default
    on a local master), then ``empty_rounds`` pairs of empty windows, one stream in a Spark task
    and in the driver alternately (the fixed cost of either path)."""
    sim_pid = _sim_pid(services)
    database = f"benchg{uuid.uuid4().hex[:8]}"
    rng = random.Random(11)
    runs: dict[int, dict[str, Any]] = {}
    empty: dict[str, list[dict[str, Any]]] = {"task": [], "driver": []}
    plan = [(size, True) for size in [0, *sizes]]
    for round_number in range(empty_rounds):
        plan += [(0, False), (0, True)] if round_number % 2 == 0 else [(0, True), (0, False)]
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for number, (size, in_driver) in enumerate(plan):
            with services.client() as client:
                probe = connector(f"{database}x{number}", database)
                start = current_position(client, probe)
                documents = [make_document(rng, index) for index in range(size)]
                collection = f"c{number}"
                if documents:
                    last = insert_documents(client, database, collection, documents, batch=1000)
                else:
                    last = current_position(client, probe).cluster_time
                window_end = window_end_after(services, client, last, f"{database}_markers")
            config = connector(f"{database}w{number}", database)
            seed(services, config, start)
            spec = JobSpec(
                "stream_window",
                config.to_properties(),
                {"connection_string": services.mongodb_uri},
                services.kafka,
                {"window_end": iso_z(window_end), "poll_ms": 200, "stream_in_driver": in_driver},
            )
            run = submit("stream_window", spec, Path(tmp), sim_pid)
            summary = run.pop("summary")
            if summary["events"] != size or not summary["reached_end"]:
                raise RuntimeError(f"the window of {size} changes ended with {summary}")
            run["app_s"] = summary["duration_s"]
            run["phases_s"] = _window_phases(summary)
            if number <= len(sizes):
                runs[size] = run
            else:
                empty["driver" if in_driver else "task"].append(run)
    small, large = sizes
    return {
        "sizes": sizes,
        "runs": runs,
        "empty": empty,
        "fixed_wall_s": runs[0]["wall_s"],
        "fixed_cpu_s": runs[0]["cpu_s"],
        "marginal_cpu_us": _slope(runs[small], runs[large], small, large, "cpu_s"),
        "marginal_wall_us": _slope(runs[small], runs[large], small, large, "wall_s"),
        "marginal_sim_cpu_us": _slope(runs[small], runs[large], small, large, "sim_cpu_s")
        if runs[small]["sim_cpu_s"] is not None
        else None,
    }


OPERATOR_TASK = """
import json, sys
from datetime import datetime, timezone
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
props, end, stream_in_driver = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
summary = MongoStreamWindowOperator(
    task_id="window", connector_config=props, mongo_conn_id="bench_mongo", kafka_conn_id="bench_kafka",
    spark_conn_id="bench_spark", conf={"spark.ui.enabled": "false"}, stream_in_driver=stream_in_driver,
).execute({"data_interval_end": datetime.fromisoformat(end)})
print("BENCH_SUMMARY " + json.dumps(summary))
"""


def run_operator_window(services: Services, rounds: int) -> dict[str, Any]:
    """Empty windows through the operator in a process of its own (the Airflow task around
    spark-submit), ``stream_in_driver`` False and "auto" (a local master: in the driver) alternately."""
    sim_pid = _sim_pid(services)
    database = f"benchgo{uuid.uuid4().hex[:8]}"
    env = spark_env()
    for conn_id, fields in (
        ("bench_mongo", {"conn_type": "mongocdc", "host": services.mongodb_uri}),
        ("bench_kafka", {"conn_type": "mongocdc_kafka", "extra": services.kafka}),
        ("bench_spark", {"conn_type": "spark", "host": "local[2]"}),
    ):
        env[f"AIRFLOW_CONN_{conn_id.upper()}"] = json.dumps(fields)
    # The operator adds -XX:TieredStopAtLevel=1 -XX:-UsePerfData itself (client deploy mode), as the
    # runs above have them.
    runs: dict[str, list[dict[str, Any]]] = {"task": [], "driver": []}
    plan = []
    for round_number in range(rounds):
        plan += [False, "auto"] if round_number % 2 == 0 else ["auto", False]
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for number, setting in enumerate(plan):
            with services.client() as client:
                probe = connector(f"{database}x{number}", database)
                start = current_position(client, probe)
                window_end = window_end_after(services, client, start.cluster_time, f"{database}_markers")
            config = connector(f"{database}w{number}", database)
            seed(services, config, start)
            output = Path(tmp) / f"operator-{number}.log"
            command = [
                sys.executable,
                "-c",
                OPERATOR_TASK,
                json.dumps(config.to_properties()),
                iso_z(window_end),
            ]
            command.append(json.dumps(setting))
            run = _measured(command, output, env, sim_pid)
            text = output.read_text(errors="replace")
            summaries = [line for line in text.splitlines() if line.startswith("BENCH_SUMMARY ")]
            if run.pop("returncode") != 0 or not summaries:
                raise RuntimeError(f"the operator's window failed:\n{text[-4000:]}")
            summary = json.loads(summaries[-1][len("BENCH_SUMMARY ") :])
            if summary["events"] != 0 or not summary["reached_end"]:
                raise RuntimeError(f"the empty operator window ended with {summary}")
            run["app_s"] = summary["duration_s"]
            run["phases_s"] = _window_phases(summary)
            runs["driver" if setting == "auto" else "task"].append(run)
    return {"rounds": rounds, "runs": runs}


def report_operator_window(figures: dict[str, Any]) -> list[str]:
    lines = []
    for path, runs in figures["runs"].items():
        label = "a Spark task" if path == "task" else "the driver"
        lines += [_run_line(f"operator task, empty window, stream in {label}", run) for run in runs]
        lines.append(
            f"(g) the Airflow task around spark-submit (operator.execute in its own process), empty window, "
            f"stream in {label}, median of {len(runs)}: "
            f"{statistics.median(r['wall_s'] for r in runs):.2f} s wall, "
            f"{statistics.median(r['cpu_s'] for r in runs):.2f} CPU-s"
        )
    return lines


# -- (h) ---------------------------------------------------------------------------------------------
def run_snapshot(services: Services, sizes: list[int], threads: list[int], chunks: int = 8) -> dict[str, Any]:
    sim_pid = _sim_pid(services)
    database = f"benchh{uuid.uuid4().hex[:8]}"
    rng = random.Random(13)
    with services.client() as client:
        client[database].create_collection("c0")
        for size in sizes:
            insert_documents(
                client, database, f"c{size}", [make_document(rng, i) for i in range(size)], batch=1000
            )
    plan = [(0, 1)] + [(size, count) for count in threads for size in sizes]
    runs: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="mongocdc-bench-") as tmp:
        for size, count in plan:
            prefix = f"{database}s{size}t{count}"
            props = {
                "topic.prefix": prefix,
                "collection.include.list": f"{database}\\.c{size}",
                "snapshot.max.threads": count,
                "snapshot.chunk.size": max(1, size // chunks),
            }
            spec = JobSpec("snapshot", props, {"connection_string": services.mongodb_uri}, services.kafka, {})
            run = submit("snapshot", spec, Path(tmp), sim_pid)
            summary = run.pop("summary")
            if summary.get("documents") != size:
                raise RuntimeError(f"the snapshot copied {summary.get('documents')} of {size}: {summary}")
            run["app_s"] = summary["duration_s"]
            run["phases_s"] = summary.get("phases_s") or {}
            runs[f"{size}x{count}"] = run
    small, large = sizes
    base = runs["0x1"]
    per_thread = {}
    # Per document at each thread count: slope between the two sizes at that thread count (each
    # thread count starts its own Python workers: a fixed cost that cancels out).
    for count in threads:
        run, ref = runs[f"{large}x{count}"], runs[f"{small}x{count}"]
        per_thread[count] = {
            "wall_s": run["wall_s"],
            "client_cpu_us": round((run["cpu_s"] - ref["cpu_s"]) / (large - small) * 1e6, 1),
            "sim_cpu_us": round((run["sim_cpu_s"] - ref["sim_cpu_s"]) / (large - small) * 1e6, 1)
            if run["sim_cpu_s"] is not None
            else None,
        }
    return {
        "sizes": sizes,
        "threads": threads,
        "runs": runs,
        "fixed_wall_s": base["wall_s"],
        "fixed_cpu_s": base["cpu_s"],
        "marginal_cpu_us": _slope(runs[f"{small}x1"], runs[f"{large}x1"], small, large, "cpu_s"),
        "marginal_sim_cpu_us": _slope(runs[f"{small}x1"], runs[f"{large}x1"], small, large, "sim_cpu_s")
        if base["sim_cpu_s"] is not None
        else None,
        "per_thread": per_thread,
        "thread_ratio": round(per_thread[threads[-1]]["client_cpu_us"] / per_thread[1]["client_cpu_us"], 2),
    }


def _run_line(label: str, run: dict[str, Any]) -> str:
    phases = ", ".join(f"{k} {v}" for k, v in run["phases_s"].items())
    sim = f", simulator {run['sim_cpu_s']} CPU-s" if run["sim_cpu_s"] is not None else ""
    return (
        f"{label}: wall {run['wall_s']} s, tree CPU {run['cpu_s']} s (sampled {run['cpu_sampled_s']}, "
        f"reaped {run['cpu_reaped_s']}, {run['processes']} processes: {run['cpu_by_process_s']}){sim}; "
        f"app {run['app_s']} s" + (f"; phases: {phases}" if phases else "")
    )


def report_window(figures: dict[str, Any]) -> list[str]:
    return _report_submit_window(figures) + (
        report_operator_window(figures["operator"]) if figures.get("operator") else []
    )


def _report_submit_window(figures: dict[str, Any]) -> list[str]:
    lines = [
        _run_line(f"{size} changes (stream in the driver)", run) for size, run in figures["runs"].items()
    ]
    for path, runs in figures["empty"].items():
        lines += [
            _run_line(
                "empty window, stream in a Spark task"
                if path == "task"
                else "empty window, stream in the driver",
                run,
            )
            for run in runs
        ]
    for path, runs in figures["empty"].items():
        if runs:
            lines.append(
                f"(g) empty window, stream in {'a Spark task' if path == 'task' else 'the driver'}, median of "
                f"{len(runs)}: {statistics.median(r['wall_s'] for r in runs):.2f} s wall, "
                f"{statistics.median(r['cpu_s'] for r in runs):.2f} CPU-s"
            )
    lines.append(
        f"(g) fixed cost (empty window): {figures['fixed_wall_s']} s wall, {figures['fixed_cpu_s']} CPU-s; "
        f"marginal per change {figures['marginal_cpu_us']} us CPU (whole tree), "
        f"{figures['marginal_wall_us']} us wall, simulator {figures['marginal_sim_cpu_us']} us"
    )
    return lines


def report_snapshot(figures: dict[str, Any]) -> list[str]:
    lines = [_run_line(f"{key} (documents x threads)", run) for key, run in figures["runs"].items()]
    lines.append(
        f"(h) fixed cost (empty collection): {figures['fixed_wall_s']} s wall, {figures['fixed_cpu_s']} "
        f"CPU-s; marginal per document at 1 thread {figures['marginal_cpu_us']} us CPU (tree, without "
        f"the simulator), simulator {figures['marginal_sim_cpu_us']} us"
    )
    for count, row in figures["per_thread"].items():
        lines.append(
            f"  {figures['sizes'][-1]} docs, threads={count}: wall {row['wall_s']} s, client CPU "
            f"{row['client_cpu_us']} us/doc (slope between the sizes), simulator {row['sim_cpu_us']} us/doc"
        )
    lines.append(f"  client CPU per doc, {figures['threads'][-1]} vs 1 thread: x{figures['thread_ratio']}")
    return lines
