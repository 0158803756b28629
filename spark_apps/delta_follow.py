"""The follower of an open window's Delta tables: a process the window's application starts beside
its streams, which applies the connector's topics to their tables while the window is open
(:mod:`airflow_provider_mongocdc.core.apply.follow`), and once more when it has closed.

    python -m airflow_provider_mongocdc.spark_apps.delta_follow --job-spec PATH --result PATH
    (its standard input: "stop")

The window's application (spark_apps/stream_window.py) starts it with :func:`start` when the job
spec's ``follow_delta`` parameter holds the connector's ``delta`` settings and the window is an open
one, and stops it with :meth:`FollowerProcess.stop` when its streams have committed: the follower's
last pass applies what the window committed last. The follower dies with the window's process
(a killed window leaves each table at its last commit; the ``delta_apply`` task after the window,
or the next run, continues there). Its job spec is a file of its own, readable by its owner only,
in a directory of the window's process; the storage options travel in it, never in argv.
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from airflow_provider_mongocdc.core.apply.follow import Follower
from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.apply.snapshots import StatusReader
from airflow_provider_mongocdc.core.apply.topics import StableEnds, data_topics
from airflow_provider_mongocdc.core.base.durations import parse_duration
from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.base.lifetime import die_with_parent
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result, write_failure, write_result

APPLICATION = "delta_follow"
log = logging.getLogger("airflow_provider_mongocdc.delta_follow")
STOP = b"stop\n"
# How long the window's process waits for the follower's last pass (it applies what the window
# committed last; the delta_apply task after the window applies whatever is left).
STOP_TIMEOUT_S = 600.0


def follow_params(spec: JobSpec) -> Mapping[str, Any] | None:
    """The ``follow_delta`` parameter of a window's job spec: ``delta`` (the connector's settings),
    ``storage_options``, ``every`` (seconds between passes); None: no follower."""
    value = spec.params.get("follow_delta")
    return value if isinstance(value, Mapping) and (value.get("tables") or value.get("delta")) else None


class FollowerProcess:
    """A running follower: :meth:`stop` asks it for its last pass and returns its summary."""

    def __init__(self, process: subprocess.Popen, directory: tempfile.TemporaryDirectory, result: Path):
        self.process = process
        self.directory = directory
        self.result = result

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any]:
        try:
            try:
                self.process.stdin.write(STOP)
                self.process.stdin.close()
            except OSError:
                pass  # it ended already: its result says how
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
                return {"error": f"the tables' follower did not end within {timeout_s:g} s: stopped"}
            result = read_result(self.result)
            if not result:
                return {"error": f"the tables' follower ended with exit code {self.process.returncode}"}
            if result.get("status") != "ok":
                return {"error": result.get("message")}
            return result["summary"]
        finally:
            self.directory.cleanup()


def start(spec: JobSpec) -> FollowerProcess | None:
    """Start the follower of the tables of ``spec``'s connector (a window's job spec), or None when
    the spec asks for none."""
    params = follow_params(spec)
    if params is None:
        return None
    directory = tempfile.TemporaryDirectory(prefix="mongocdc-follow-")
    own = JobSpec(APPLICATION, spec.connector, {}, dict(spec.kafka), dict(params))
    spec_path = own.write(Path(directory.name) / "spec.json")
    result = Path(directory.name) / "result.json"
    # Its code from where this process has it (an installed provider, or the zip of py_files).
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    process = subprocess.Popen(
        [sys.executable, "-m", __name__, "--job-spec", str(spec_path), "--result", str(result)],
        stdin=subprocess.PIPE,
        env=environment,
        preexec_fn=die_with_parent(),
    )
    log.info("Tables of %s follow the topics while the window is open", spec.connector.get("topic.prefix"))
    return FollowerProcess(process, directory, result)


def job(spec: JobSpec, stopped: threading.Event) -> dict[str, Any]:
    """Follow the connector's topics until ``stopped`` is set, then a last pass."""
    from airflow_provider_mongocdc.spark_apps.delta_apply import tables_param
    from airflow_provider_mongocdc.spark_apps.table_tasks import (
        apply_table_task,
        check_location,
        check_table,
        table_task,
    )
    from airflow_provider_mongocdc.tables.arrow import keep_pandas_out_of_pyarrow

    keep_pandas_out_of_pyarrow()
    config = ConnectorConfig.from_properties(spec.connector)
    settings = TableSettings.from_mapping(tables_param(spec.params))
    storage_options = spec.params.get("storage_options") or {}
    every_s = parse_duration(spec.params.get("every", 5.0), "follow")
    check_location(settings)
    tasks: dict[str, dict[str, Any]] = {}

    def topics() -> list[str]:
        for topic in data_topics(spec.kafka, config):
            if settings.wanted(topic.namespace) and topic.topic not in tasks:
                task = table_task(spec.connector, spec.kafka, settings.to_json(), storage_options, topic)
                check_table(task)  # before it changes: who wrote it, its columns
                tasks[topic.topic] = task
        return sorted(tasks)

    status = StatusReader(spec.kafka, config)
    usage = resource.getrusage(resource.RUSAGE_SELF)
    started_cpu_s = usage.ru_utime + usage.ru_stime  # its start: imports, the settings, the location
    try:
        follower = Follower(
            topics,
            StableEnds(spec.kafka),
            lambda topic: apply_table_task(tasks[topic], status=status),
            stopped.wait,
            every_s,
        )
        summary = follower.run()
    finally:
        status.close()
    summary["location"] = settings.location
    usage = resource.getrusage(resource.RUSAGE_SELF)
    summary["cpu_s"] = round(usage.ru_utime + usage.ru_stime, 3)  # the follower process's own
    summary["start_cpu_s"] = round(started_cpu_s, 3)
    return summary


def _wait_for_stop(stopped: threading.Event) -> None:
    """Standard input: "stop", or its end (the window's process closed it), sets ``stopped``."""
    try:
        sys.stdin.buffer.readline()
    finally:
        stopped.set()


def main(argv: list[str] | None = None) -> int:
    from airflow_provider_mongocdc.spark_apps.runtime import configure_logging

    parser = argparse.ArgumentParser(prog=f"{APPLICATION}.py")
    parser.add_argument("--job-spec", required=True)
    parser.add_argument("--result", required=True)
    args = parser.parse_args(argv)
    configure_logging()
    stopped = threading.Event()
    threading.Thread(target=_wait_for_stop, args=(stopped,), daemon=True).start()
    try:
        summary = job(JobSpec.read(args.job_spec), stopped)
    except MongoCdcError as error:
        log.error("The tables' follower failed: %s", error)
        write_failure(args.result, error)
        return 1
    except Exception as error:
        log.exception("The tables' follower failed unexpectedly")
        write_failure(args.result, error)
        return 1
    write_result(args.result, summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
