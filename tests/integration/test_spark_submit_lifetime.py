"""spark-submit dies with the Airflow task process that started it.

A window runs through MongoStreamWindowOperator in a process of its own, as an Airflow task does
(spark-submit, local[2], the real Kafka broker). The simulator writes no periodic no-op, so the
window waits for the cluster time to reach its end: in its Spark task (a Python worker) with
``stream_in_driver=False``, in the application's Python driver by default (one stream on a local
master). The task process is then killed with SIGKILL, as Airflow's supervisor or the kernel's
OOM killer kill it: no on_kill runs. The spark-submit JVM, the application's Python driver and the
Python workers it started must end by themselves; otherwise they would keep streaming and holding
the connector.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.window_helpers import connector, seed_offset

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

# Bounds on a loaded 2-core machine: Spark's start up to the window's Python worker, and the
# processes' end after the kill (the JVM's death is immediate; its Python processes notice it).
START_BOUND_S = 300
END_BOUND_S = 120

TASK = """
import json, sys
from datetime import datetime, timezone
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
props, stream_in_driver = json.loads(sys.argv[1]), json.loads(sys.argv[2])
MongoStreamWindowOperator(
    task_id="window", connector_config=props, mongo_conn_id="life_mongo", kafka_conn_id="life_kafka",
    spark_conn_id="life_spark", conf={"spark.ui.enabled": "false"}, idle_timeout=600,
    stream_in_driver=stream_in_driver,
).execute({"data_interval_end": datetime.now(timezone.utc)})
"""


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/<pid>/stat after the command name, or None when there is no such
    process (a zombie counts as ended: it has nothing left to run)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] in ("Z", "X") else fields


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _descendants(root: int) -> dict[int, str]:
    """The live descendants of ``root``: pid -> start time (clock ticks since boot), which tells a
    process from a later one that reuses its pid."""
    children: dict[int, list[int]] = {}
    starts: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None:
                children.setdefault(int(fields[1]), []).append(int(entry.name))
                starts[int(entry.name)] = fields[19]
    found: dict[int, str] = {}
    pending = [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found[child] = starts[child]
            pending.append(child)
    return found


def _alive(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` still running (same pid and start time), with their command lines."""
    alive = {}
    for pid, start in processes.items():
        fields = _stat(pid)
        if fields is not None and fields[19] == start:
            alive[pid] = _cmdline(pid)
    return alive


def _job_directories(processes: dict[int, str]) -> set[str]:
    """The operator's job directories (``--job-spec <dir>/job-spec.json``) on the command lines of
    ``processes``: a killed task process cannot remove its own."""
    found = set()
    for pid in processes:
        match = re.search(r"--job-spec (\S+)/job-spec\.json", _cmdline(pid))
        if match:
            found.add(match.group(1))
    return found


def _python_worker_started(processes: dict[int, str]) -> bool:
    """A Python worker forked by pyspark's daemon (both run ``-m pyspark.daemon``) is among them."""
    daemons = {pid for pid in processes if "pyspark.daemon" in _cmdline(pid)}
    return any((_stat(pid) or ["", ""])[1] in {str(d) for d in daemons} for pid in daemons)


def _streaming_in_driver(output: Path) -> bool:
    """The task's output (the operator logs spark-submit's lines) shows that the window streams:
    the window's line "Window of <stream> from <position> to <end>"."""
    return bool(re.search(r"Window of .+ from .+ to ", output.read_text(errors="replace")))


@pytest.mark.parametrize("stream_in_driver", [False, "auto"], ids=["in-spark-task", "in-driver"])
def test_killed_task_process_takes_spark_submit_and_its_python_workers_with_it(
    mongosim, kafka_bootstrap, unique_name, operator_connections, stream_in_driver, tmp_path
):
    sim = mongosim("replset", noop_interval=3600)  # the cluster time moves only with writes
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, f"life_{unique_name[-8:]}")
    seed_offset(sim.uri, kafka, props)
    operator_connections("life", sim.uri, kafka)

    output = tmp_path / "task.log"
    with output.open("wb") as sink:
        task = subprocess.Popen(
            [sys.executable, "-c", TASK, json.dumps(props), json.dumps(stream_in_driver)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    in_driver = stream_in_driver == "auto"  # one stream on a local master
    started: dict[int, str] = {}
    job_directories: set[str] = set()
    try:
        deadline = time.monotonic() + START_BOUND_S
        while not (_streaming_in_driver(output) if in_driver else _python_worker_started(started)):
            assert task.poll() is None, f"the task process ended (code {task.returncode}) before the kill"
            assert time.monotonic() < deadline, (
                f"the window did not stream within {START_BOUND_S} s "
                f"({'in the driver' if in_driver else 'in a Python worker'}): {_alive(started)}"
            )
            time.sleep(0.5)
            started = _descendants(task.pid)
            job_directories |= _job_directories(started)

        started = _descendants(task.pid)
        # In the driver, the window started no Python worker (no SparkContext).
        assert _python_worker_started(started) is not in_driver
        os.kill(task.pid, signal.SIGKILL)
        task.wait(timeout=60)

        deadline = time.monotonic() + END_BOUND_S
        while _alive(started) and time.monotonic() < deadline:
            time.sleep(0.5)
        survivors = _alive(started)
        assert not survivors, (
            f"{END_BOUND_S} s after the task process was killed, these processes it started still run:\n"
            + "\n".join(f"{pid}: {cmdline[:300]}" for pid, cmdline in survivors.items())
        )
    finally:
        if task.poll() is None:
            task.kill()
            task.wait(timeout=60)
        for pid in _alive(started):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for directory in job_directories:
            shutil.rmtree(directory, ignore_errors=True)
