"""``make demo`` as a user runs it: ``python -m devtools.demo`` in a subprocess with the venv's PATH.

1. The full run on the MongoDB simulator: exit 0, the simulator announced as such, the event
   counts per topic, the OK check, and nothing it started still running afterwards.
2. Ctrl-C while the snapshot runs in Airflow and Spark: exit 130, everything stopped.
3. A ``mongod`` on PATH that cannot start: a clear error naming it, exit 1, everything stopped.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e]

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
DEMO_TIMEOUT_S = 900


def demo_env(extra_path: Path | None = None) -> dict[str, str]:
    """The environment of ``make demo`` on a machine without MongoDB: the venv first on PATH, no
    MONGOCDC_MONGODB_URI, no directory holding a mongod (unless ``extra_path`` adds one)."""
    env = {k: v for k, v in os.environ.items() if k != "MONGOCDC_MONGODB_URI"}
    path = [d for d in env.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "mongod").exists()]
    env["PATH"] = os.pathsep.join([*([str(extra_path)] if extra_path else []), str(VENV_BIN), *path])
    return env


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess:
    """``make demo``'s command (``python -m devtools.demo``) in ``env``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "devtools.demo"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )


def processes_mentioning(text: str, width: int | None = 200) -> list[str]:
    """Live processes whose command line or environment mentions ``text`` (the demo's work dir:
    every process the demo starts carries it in its environment or its arguments), as
    ``"<pid>: <command line>"`` cut to ``width`` characters (None: whole)."""
    needle = text.encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and (needle in cmdline or needle in environ):
            command = cmdline.replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{entry}: {command[:width] if width else command}")
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:
        return False


def work_dir_of(output: str) -> str:
    match = re.search(r"work dir (/\S+)", output)
    assert match, f"the demo did not print its work dir:\n{output[:2000]}"
    return match.group(1)


def log_of(output: str) -> Path | None:
    match = re.search(r"output go to (/\S+\.log)", output)
    return Path(match.group(1)) if match else None


def assert_nothing_left(output: str) -> None:
    work_dir = work_dir_of(output)
    deadline = time.monotonic() + 120  # processes being reaped by init after the demo exited
    while (left := processes_mentioning(work_dir)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], f"processes of the demo still running: {left}"
    for pid in map(int, re.findall(r"\bpid (\d+)", output)):
        assert not alive(pid), f"pid {pid} printed by the demo is still alive"
    assert "LEFTOVER" not in output
    assert not Path(work_dir).exists(), f"{work_dir} was not removed"


def counts(output: str, topic: str) -> dict[str, int]:
    header = re.search(r"^\s+topic\s+(r\s+c\s+u\s+d\s+tombstones.*)$", output, re.M)
    assert header, f"no counts table in the output:\n{output[-4000:]}"
    columns = header.group(1).split()
    columns[columns.index("in")] = "in txn"
    columns.remove("txn")
    row = re.search(rf"^\s+{re.escape(topic)}\s+([\d\s]+)$", output, re.M)
    assert row, f"no counts for {topic}:\n{output[-4000:]}"
    return dict(zip(columns, map(int, row.group(1).split())))


def test_demo_runs_the_pipeline_end_to_end_and_stops_everything():
    result = run_demo(demo_env())
    output = result.stdout
    try:
        assert result.returncode == 0, f"{output[-6000:]}\n{result.stderr[-4000:]}"
        assert "MongoDB: simulator (devtools/mongosim) — not a real mongod" in output

        customers, products, orders = (
            counts(output, f"demo.shop.{name}") for name in ("customers", "products", "orders")
        )
        assert (customers["r"], products["r"], orders["r"]) == (60, 40, 200)  # the snapshot
        assert customers["c"] == 5 and orders["c"] == 6  # inserts, one order inside the transaction
        assert orders["u"] > 0 and customers["u"] > 0 and products["u"] == 3  # updates, the replace, stock
        assert orders["d"] == orders["tombstones"] == 6
        assert customers["d"] == 1
        assert orders["in txn"] == 1 and products["in txn"] == 2
        transaction = counts(output, "demo.transaction")
        assert (transaction["BEGIN"], transaction["END"]) == (1, 1)

        for sample in (
            "read (snapshot)",
            "update inside the transaction",
            "delete",
            "transaction BEGIN",
            "transaction END",
        ):
            assert f"-- {sample}: " in output, sample
        assert '"topic": "demo.offsets"' in output and '"status": "completed"' in output
        # The second run's snapshot task had nothing to do and did not spark-submit.
        runs = re.findall(r"spark-submit runs: (.*)", output)
        assert runs == [
            "mongocdc-snapshot, mongocdc-stream_window, mongocdc-delta_apply",
            "mongocdc-stream_window, mongocdc-delta_apply",
            "mongocdc-delta_apply",  # the demo's Iceberg DAG: the table apply application
        ], runs

        assert re.search(r"CHECK OK: (\d+) keys rebuilt from the topics, \1 documents in MongoDB", output), (
            output[-3000:]
        )
        # The hourly DAG's delta_apply task kept each collection as a Delta table equal to MongoDB.
        assert re.search(r"CHECK OK: 3 Delta tables, (\d+) rows, \1 documents in MongoDB", output), output[
            -3000:
        ]
        # Its own DAG's MongoTableApplyOperator kept them as Iceberg tables too (read by pyiceberg).
        assert re.search(r"CHECK OK: 3 Iceberg tables, (\d+) rows, \1 documents in MongoDB", output), output[
            -3000:
        ]
        assert "MISMATCH" not in output
        assert re.search(
            r"Time per step: 1\. \d+ s, 2\. \d+ s, 3\. \d+ s, 4\. \d+ s, 5\. \d+ s, 6\. \d+ s, 7\. \d+ s",
            output,
        )
        assert_nothing_left(output)
    finally:
        log = log_of(output)
        if log is not None:
            log.unlink(missing_ok=True)


def hold_snapshot_reads(uri: str) -> None:
    """Delay every find on shop.orders by 20 s (the demo's snapshot reads its chunks with find)."""
    from pymongo import MongoClient

    with MongoClient(uri, serverSelectionTimeoutMS=60_000) as client:
        client.admin.command(
            {
                "configureFailPoint": "failCommand",
                "mode": "alwaysOn",
                "data": {
                    "failCommands": ["find"],
                    "namespace": "shop.orders",
                    "blockConnection": True,
                    "blockTimeMS": 20_000,
                },
            }
        )


def _interruptible_as_from_a_terminal() -> None:
    """In the demo's process before it starts: SIGINT's default action. A test run started in the
    background of a shell without job control (a CI job's ``command &``) ignores SIGINT, every process
    below it inherits that, and Python then leaves Ctrl-C ignored: the demo would never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_the_snapshot_stops_airflow_spark_kafka_and_the_simulator():
    process = subprocess.Popen(
        [sys.executable, "-m", "devtools.demo"],
        cwd=REPO,
        env=demo_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_interruptible_as_from_a_terminal,
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        # Wait until the snapshot's Spark application runs under Airflow (bounded). So that the
        # snapshot cannot finish before the Ctrl-C however fast it is, the simulator holds each read
        # of shop.orders for 20 s (its failCommand fail point, as mongod's test commands have).
        deadline = time.monotonic() + 300
        spark = []
        held = False
        while time.monotonic() < deadline and process.poll() is None:
            output = "".join(lines)
            uri = re.search(r"replica set \S+ at (mongodb://[^\s,]+)", output)
            if uri and not held:
                hold_snapshot_reads(uri.group(1))
                held = True
            if "[3/7]" in output and held:
                # Whole command lines: the JVM's class path and options come before SparkSubmit.
                spark = [
                    p[:200] for p in processes_mentioning(work_dir_of(output), None) if "SparkSubmit" in p
                ]
                if spark:
                    break
            time.sleep(0.5)
        assert spark, f"the snapshot's spark-submit was not seen running:\n{''.join(lines)}"
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=300)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=30)
    reader.join(timeout=10)
    output, errors = "".join(lines), process.stderr.read()
    try:
        assert code == 130, f"{output[-4000:]}\n{errors[-4000:]}"
        assert "Demo FAILED: interrupted (Ctrl-C)" in errors
        assert "stopped: airflow dags test" in output and "Kafka broker" in output
        assert_nothing_left(output)
    finally:
        log = log_of(output)
        if log is not None:
            log.unlink(missing_ok=True)


def test_a_mongod_that_cannot_start_is_reported_and_everything_is_stopped(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "mongod"
    fake.write_text(
        "#!/bin/sh\n"
        "while [ $# -gt 0 ]; do\n"
        '  if [ "$1" = "--logpath" ]; then echo "fake mongod: cannot open the data directory" > "$2"; fi\n'
        "  shift\n"
        "done\n"
        "exit 100\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert shutil.which("mongod", path=demo_env(bin_dir)["PATH"]) == str(fake)

    result = run_demo(demo_env(bin_dir))
    output = result.stdout
    try:
        assert result.returncode == 1, f"{output[-4000:]}\n{result.stderr[-4000:]}"
        assert f"mongod ({fake}) exited with code 100" in result.stderr
        assert "fake mongod: cannot open the data directory" in result.stderr
        assert "simulator" not in output
        assert "Kafka broker (pid" in output  # started, then stopped
        assert_nothing_left(output)
    finally:
        log = log_of(output)
        if log is not None:
            log.unlink(missing_ok=True)
