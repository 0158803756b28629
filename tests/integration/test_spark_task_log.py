"""The task logs of snapshots and windows run through the operators (spark-submit, local[2], the
real Kafka broker), as Airflow's task log holds them: what the operator and the Spark hook log
through Airflow's task logger (the hook logs every line spark-submit prints) and the provider's
Python logging of the task process (leases, offsets, Kafka clients).

- Spark's own lines at WARN from the driver JVM's start on, the provider's progress lines kept;
  ``spark_log_level="INFO"`` gives Spark's INFO lines back (the INFO cases run the window's stream
  in a Spark task, ``stream_in_driver=False``: in the driver, the default here, no SparkContext
  starts and Spark has next to nothing to log).
- A connector's first runs on a new Kafka cluster (snapshot, then window) log the provider's lines,
  each once, and next to nothing else: no JVM notice, no Python warning of pyspark, no librdkafka
  warning of the cluster's first transactional producer.
- A window that fails for a known reason (its resume point purged from the oplog) logs the error in
  words first, without Spark's report of the failed task (the Python worker's traceback and a Java
  stack trace) unless the Spark log level asks for it, and fails with that message: one frame of
  the provider in its traceback, no chained exception.
"""

from __future__ import annotations

import logging
import re
import traceback
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone

import pytest
import structlog
from pymongo import MongoClient
from structlog.testing import capture_logs

from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from devtools.kafka import KafkaBroker
from tests.integration.window_helpers import connector, end_after_insert, seed_offset

pytestmark = pytest.mark.integration

# Spark's log4j pattern (its defaults and the provider's file): "26/11/24 14:15:31 INFO SparkContext: ..."
SPARK_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?P<level>[A-Z]+) [\w$.]+: ")
# The applications' Python logging (spark_apps/runtime.py): "2026-11-24 14:15:31,123 INFO airflow_provider_mongocdc...: "
APP_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) airflow_provider_mongocdc[\w.]*: "
)
SUMMARY_LINE = "MONGOCDC_SUMMARY "
# The provider's progress lines (Python logging of spark_apps/ and core/, see spark_apps/runtime.py).
PROGRESS = (
    "INFO airflow_provider_mongocdc.stream_window: Window of ",
    "INFO airflow_provider_mongocdc.core.window.stream_window: ",
)
JAVA_FRAME = re.compile(r"^\s*at [\w$.<>/]+\(.*\)$")
# Logged by Airflow when a test calls execute() itself (a task runner calls it in Airflow).
OUTSIDE_TASK_RUNNER = re.compile(r"^\w+\.execute cannot be called outside of the Task Runner!$")
# Lines in one task log that are not the provider's: the Spark hook's "Spark-Submit cmd" line, and
# room for one line Spark may log on a loaded machine (a slow heartbeat).
NOT_OURS_BOUND = 2
# A failed window's whole task log (114 lines when Spark's report of the failed task was in it).
FAILED_LOG_BOUND = 15


@dataclass
class TaskLog:
    """The lines of a task log, each with whether it is the provider's own."""

    lines: list[tuple[str, bool]] = field(default_factory=list)

    def add(self, logger: str, text: str) -> None:
        for line in str(text).splitlines():
            if OUTSIDE_TASK_RUNNER.match(line):
                continue
            if logger.endswith("SparkSubmitHook"):  # spark-submit's output, and the hook's own lines
                ours = bool(APP_LINE.match(line)) or line.startswith(SUMMARY_LINE)
            else:  # the operator and the provider's modules; librdkafka's lines are not the provider's
                ours = "airflow_provider_mongocdc" in logger and not logger.endswith(".librdkafka")
            self.lines.append((line, ours))

    @property
    def text(self) -> list[str]:
        return [line for line, _ in self.lines]

    def not_ours(self) -> list[str]:
        return [line for line, ours in self.lines if not ours]

    def repeated(self) -> list[str]:
        """The provider's lines logged more than once (by the task process or the application,
        whose time stamp, level and logger are left out)."""
        counts = Counter(APP_LINE.sub("", line) for line, ours in self.lines if ours)
        return [line for line, count in counts.items() if count > 1]

    def show(self) -> str:
        return "\n".join(f"{'  ' if ours else '! '}{line[:240]}" for line, ours in self.lines)


class _Records(logging.Handler):
    """Python logging records, added to the structlog events captured meanwhile (in order)."""

    def __init__(self, events: list[dict]):
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        self.events.append({"logger": record.name, "event": text})


@contextmanager
def task_log() -> Iterator[TaskLog]:
    """What the block logs, in order, as the task log holds it: the structlog events of the
    operator and the Spark hook, and Python logging records at INFO and above (Airflow's level)."""
    log = TaskLog()
    root = logging.getLogger()
    level = root.level
    with capture_logs(processors=[structlog.stdlib.add_logger_name]) as events:
        handler = _Records(events)
        root.addHandler(handler)
        root.setLevel(logging.INFO)
        try:
            yield log
        finally:
            root.removeHandler(handler)
            root.setLevel(level)
            for event in events:
                log.add(event.get("logger", ""), event.get("event", ""))


def _operator(cls, props: dict, connections: dict, **kwargs):
    return cls(
        task_id=cls.application_name,
        connector_config=props,
        **connections,
        **kwargs,
    )


@pytest.mark.parametrize("spark_log_level", ["default", "INFO"])
def test_window_task_log_holds_our_progress_lines_and_no_spark_info(
    spark_log_level, mongodb_uri, kafka_bootstrap, unique_name, operator_connections
):
    db_name = f"tasklog_{unique_name[-8:]}"  # unique_name ends with a random suffix
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    seed_offset(mongodb_uri, kafka, props)
    connections = operator_connections("log", mongodb_uri, kafka)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[db_name].items.insert_many([{"_id": n} for n in range(2)])
        end = end_after_insert(client[db_name].items, {"_id": 2}, f"{db_name}_m")

    level = (
        {}
        if spark_log_level == "default"
        else {"spark_log_level": spark_log_level, "stream_in_driver": False}
    )
    operator = _operator(MongoStreamWindowOperator, props, connections, **level)
    with task_log() as log:
        summary = operator.execute({"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)})
    assert summary["events"] == 3 and summary["reached_end"] is True, summary

    lines = log.text
    assert any("Spark-Submit cmd" in line for line in lines), "the Spark hook's lines were not captured"
    spark_lines = [line for line in lines if SPARK_LINE.match(line)]
    spark_info = [line for line in spark_lines if SPARK_LINE.match(line)["level"] == "INFO"]
    progress = [line for line in lines if any(marker in line for marker in PROGRESS)]
    assert progress, "the provider's progress lines are missing from the task log:\n" + "\n".join(lines[-80:])
    if spark_log_level == "default":
        assert not spark_info, (
            f"{len(spark_info)} of Spark's INFO lines in the task log ({len(lines)} lines), e.g.:\n"
            + "\n".join(spark_info[:15])
        )
    else:  # Spark's INFO back, from the JVM's start on
        assert any("Running Spark version" in line for line in spark_info), "\n".join(lines[-80:])
        assert len(spark_info) > 20, f"only {len(spark_info)} INFO lines of Spark's with spark_log_level=INFO"


@pytest.fixture
def new_kafka_cluster():
    """A Kafka broker of this test only: the connector's first runs are the cluster's first
    transactional producers."""
    with KafkaBroker() as broker:
        yield broker


def test_first_runs_on_a_new_kafka_cluster_log_the_providers_lines_once_and_little_else(
    new_kafka_cluster, mongodb_uri, unique_name, operator_connections
):
    db_name = f"first_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": new_kafka_cluster.bootstrap_servers}
    props = connector(unique_name, db_name)
    connections = operator_connections("log", mongodb_uri, kafka)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[db_name].items.insert_many([{"_id": n} for n in range(3)])

    logs = {}
    with task_log() as logs["snapshot"]:
        snapshot = _operator(MongoSnapshotOperator, props, connections).execute({})
    assert snapshot["documents"] == 3, snapshot
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        end = end_after_insert(client[db_name].items, {"_id": 3}, f"{db_name}_m")
    with task_log() as logs["window"]:
        window = _operator(MongoStreamWindowOperator, props, connections).execute(
            {"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)}
        )
    assert window["events"] == 1, window

    for task, log in logs.items():
        not_ours = log.not_ours()
        assert len(not_ours) <= NOT_OURS_BOUND, (
            f"{len(not_ours)} lines of the {task} task's log are not the provider's:\n" + log.show()
        )
        assert not log.repeated(), f"the {task} task logged {log.repeated()} more than once:\n" + log.show()


@pytest.mark.simulator_only
@pytest.mark.parametrize("spark_log_level", ["default", "INFO"])
def test_failed_window_task_log_leads_with_the_error_in_words(
    spark_log_level, mongosim, kafka_bootstrap, unique_name, operator_connections
):
    sim = mongosim("replset")
    db_name = f"failed_{unique_name[-8:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    seed_offset(sim.uri, kafka, props)
    connections = operator_connections("log", sim.uri, kafka)
    with sim.client() as client:
        client[db_name].items.insert_many([{"_id": n} for n in range(5)])
        end = end_after_insert(client[db_name].items, {"_id": 5}, f"{db_name}_m")
    sim.set_oplog_retention(max_entries=2)  # the stored resume point is purged

    level = (
        {}
        if spark_log_level == "default"
        else {"spark_log_level": spark_log_level, "stream_in_driver": False}
    )
    operator = _operator(MongoStreamWindowOperator, props, connections, **level)
    with task_log() as log, pytest.raises(Exception) as failure:
        operator.execute({"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)})

    lines = log.text
    java_frames = [line for line in lines if JAVA_FRAME.match(line)]
    if spark_log_level == "default":
        reports = [
            line
            for line in lines
            if re.search(r"\b(ERROR|WARN|WARNING)\b|Exception|Traceback", line)
            and not line.startswith("Spark-Submit cmd")
        ]
        assert reports and "is no longer in the oplog" in reports[0], (
            "the first report of the failure is not the error in words:\n" + log.show()
        )
        assert not java_frames, f"{len(java_frames)} Java frames in the task log:\n" + log.show()
        assert not any("Traceback (most recent call last)" in line for line in lines), log.show()
        assert len(lines) <= FAILED_LOG_BOUND, f"{len(lines)} lines:\n" + log.show()
    else:  # Spark's own report of the failed task is back, with its stack trace
        assert java_frames, "no Java stack trace with spark_log_level=INFO:\n" + log.show()

    message = str(failure.value)
    assert "is no longer in the oplog" in message and "Fix: re-snapshot" in message, message
    provider_frames = [
        frame
        for frame in traceback.extract_tb(failure.value.__traceback__)
        if "airflow_provider_mongocdc" in frame.filename
    ]
    assert len(provider_frames) == 1, f"the provider's frames of the traceback: {provider_frames}"
    assert failure.value.__cause__ is None and failure.value.__suppress_context__, "a chained exception"


def test_an_open_window_of_a_named_connector_logs_its_name_readable_lines_and_where_it_stopped(
    mongodb_uri, kafka_bootstrap, unique_name, operator_connections
):
    # A connector of the connector list: its name (the entry's) is not its topic prefix. Its open
    # window opens at the run's data interval end, reads on past it and closes when idle; then an
    # empty window. The task logs say the connector's name, call the prefix the topic prefix, hold
    # readable lines only (no summary JSON, no "None") and end the open window where it stopped;
    # the XCom and the asset event say the same.
    from collections import defaultdict
    from types import SimpleNamespace

    from airflow_provider_mongocdc.core.base.timefmt import parse_iso
    from airflow_provider_mongocdc.core.offsets.model import Position

    db_name = f"named_{unique_name[-8:]}"
    name = f"orders_{unique_name[-6:]}"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = {**connector(unique_name, db_name), "name": name}
    store, partition = seed_offset(mongodb_uri, kafka, connector(unique_name, db_name))
    connections = operator_connections("log", mongodb_uri, kafka)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        opened_at = client.admin.command("hello")["operationTime"]  # the run's data interval end
        end = end_after_insert(client[db_name].items, {"_id": 1}, f"{db_name}_m")
    assert end.time > opened_at.time

    outlet_events: dict = defaultdict(lambda: SimpleNamespace(extra=None))
    logs = {}
    with task_log() as logs["open"]:
        opened = _operator(
            MongoStreamWindowOperator, props, connections, open_window={"idle": "3s", "commit_interval": "1s"}
        ).execute(
            {
                "data_interval_end": datetime.fromtimestamp(opened_at.time, timezone.utc),
                "outlet_events": outlet_events,
            }
        )
    assert opened["events"] == 1, opened
    stopped = Position.from_json(store.read(partition).to_json()).cluster_time
    stopped_at = datetime.fromtimestamp(stopped.time, timezone.utc)
    assert stopped.time >= end.time
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        quiet_end = end_after_insert(client[f"{db_name}_m"].quiet, {"_id": 1}, f"{db_name}_m")
    with task_log() as logs["empty"]:
        empty = _operator(MongoStreamWindowOperator, props, connections).execute(
            {"data_interval_end": datetime.fromtimestamp(quiet_end.time, timezone.utc)}
        )
    assert empty["events"] == 0, empty

    # The open window ends where it stopped: in its XCom, its asset event and its log line.
    assert parse_iso(opened["window_end"]) == stopped_at, (opened["window_end"], stopped_at)
    (event,) = outlet_events.values()
    assert event.extra["window_end"] == opened["window_end"]
    stopped_text = stopped_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    window_lines = [line for line in logs["open"].text if line.startswith("Stream window of ")]
    assert window_lines and f" up to {stopped_text}: " in window_lines[0], logs["open"].show()
    # The asset event names the connector by its name, and its topic prefix as such.
    assert (event.extra["connector"], event.extra["topic_prefix"]) == (name, unique_name), event.extra

    for task, log in logs.items():
        ours = [line for line, mine in log.lines if mine]
        assert ours, log.show()
        assert not [line for line in log.text if SUMMARY_LINE.strip() in line], (
            f"the {task} window logged its summary's JSON:\n" + log.show()
        )
        assert not [line for line in ours if "None" in line], f"'None' in the {task} window's log:\n" + (
            log.show()
        )
        # Every line of the provider's that names the connector names it by its name; its topic
        # prefix is called so (topic names start with it).
        naming = [line for line in ours if re.search(rf"(?<![\w.-]){unique_name}(?![\w.-])", line)]
        assert naming, log.show()
        for line in naming:
            assert name in line and f"topic prefix {unique_name}" in line, (
                f"the {task} window's line {line!r} names the connector by its topic prefix:\n" + log.show()
            )
        assert any(name in line for line in ours if "Stream window" in line), log.show()
