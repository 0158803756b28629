"""What the fault tests share: seeded trial counts, spark-submit runs that can be killed with
their whole process group, measuring a run's span, and reading topics as a consumer would."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from airflow_provider_mongocdc.core.jobspec import read_result
from devtools.kafka.reading import SETTLE_S, read_topic
from tests.spark_submit import AppRun, app_command, submit_env
from tests.topic_records import DebeziumRecord, unwrapped

# Trials per kill test: a few in the default run, more in the long run
# (MONGOCDC_FAULT_TRIALS=20 python -m pytest tests/faults -m faults). Trials past the default
# count also carry the ``slow`` marker.
TRIALS_ENV = "MONGOCDC_FAULT_TRIALS"
DEFAULT_TRIALS = 2
RUN_TIMEOUT_S = 300.0


def trial_count() -> int:
    value = os.environ.get(TRIALS_ENV, "").strip()
    if not value:
        return DEFAULT_TRIALS
    try:
        count = int(value)
    except ValueError:
        raise pytest.UsageError(f"{TRIALS_ENV}={value!r} is not a whole number of trials") from None
    if count < 1:
        raise pytest.UsageError(f"{TRIALS_ENV} must be at least 1, not {count}")
    return count


def trial_params() -> list:
    """``seed`` parameters 0..n-1; the ones past the default count are marked ``slow``."""
    return [
        pytest.param(seed, id=f"seed{seed}", marks=[pytest.mark.slow] if seed >= DEFAULT_TRIALS else [])
        for seed in range(trial_count())
    ]


class Submitted:
    """spark-submit started in its own session, so that SIGKILL reaches the launcher, the JVM and
    every Python process of the application at once (a kill -9 of the whole Spark app)."""

    def __init__(self, spark_submit: str, application: str, spec: Path, result: Path, log: Path):
        self.result_path = result
        self.log_path = log
        self.began = time.monotonic()
        with open(log, "w") as out:
            self.process = subprocess.Popen(
                app_command(spark_submit, application, spec, result),
                env=submit_env(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.began

    def running(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> bool:
        """SIGKILL the process group; True when it was still running. Waits until every process
        of the group is gone (a surviving Python worker could otherwise still write)."""
        alive = self.process.poll() is None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait(timeout=30)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(self.process.pid, 0)
            except ProcessLookupError:
                return alive
            time.sleep(0.1)
        raise AssertionError(f"processes of the killed Spark application (group {self.process.pid}) survived")

    def wait(self, timeout: float = RUN_TIMEOUT_S) -> AppRun:
        try:
            self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.kill()
        return AppRun(
            self.process.returncode,
            self.log_path.read_text(errors="replace"),
            read_result(self.result_path),
            self.elapsed,
        )

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


class Watermark:
    """The end offset (high watermark, open transactions included) of a one-partition topic: it
    moves with the first record an application writes, committed or not."""

    def __init__(self, bootstrap: str, topic: str):
        self.topic = topic
        self.consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"watch-{uuid.uuid4().hex}",
                "enable.auto.commit": False,
                "allow.auto.create.topics": False,
            }
        )

    def high(self) -> int:
        try:
            _low, high = self.consumer.get_watermark_offsets(
                TopicPartition(self.topic, 0), timeout=5, cached=False
            )
        except Exception:  # the topic does not exist yet
            return -1
        return high

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Span:
    """When an uninterrupted run first and last wrote to its offsets topic, and when it ended
    (seconds from its launch)."""

    first_write: float
    last_write: float
    end: float

    def kill_point(self, seed: int, trials: int) -> tuple[str, float]:
        """Where trial ``seed`` of ``trials`` kills its run, drawn by ``random.Random(seed)``.

        The span runs from the last part of Spark's start (60 % of the time to the first write to
        the offsets topic, but never longer than the part after it, so that a start stretched by
        the machine's load cannot take the later trials out of the work) to a little after the last
        write. It is stratified: trial ``i`` draws
        its point uniformly within the ``i``-th of ``trials`` equal slices, so even two trials
        fall early and late, and twenty cover the span evenly. A point before the first write is
        ``("start", t)``: ``t`` seconds after the launch. A later one is ``("write", t)``: ``t``
        seconds after the trial's own first write, so that Spark's start-up time, which the
        machine's load stretches, does not move the point out of the work.
        """
        import random

        high = self.first_write + 1.1 * (self.last_write - self.first_write) + 0.2
        low = self.first_write - min(0.4 * self.first_write, high - self.first_write)
        point = low + (high - low) * (seed + random.Random(seed).random()) / trials
        if point < self.first_write:
            return "start", point
        return "write", point - self.first_write


def kill_at(submitted: Submitted, watermark: Watermark, point: tuple[str, float]) -> tuple[bool, float]:
    """Kill ``submitted`` at ``point`` (see :meth:`Span.kill_point`); returns whether it was still
    running and when the kill fell (seconds after the launch)."""
    anchor, delay = point
    if anchor == "write":
        start = max(watermark.high(), 0)
        while submitted.running() and watermark.high() <= start and submitted.elapsed < RUN_TIMEOUT_S:
            time.sleep(0.05)
        delay += submitted.elapsed
    while submitted.running() and submitted.elapsed < delay:
        time.sleep(0.05)
    when = submitted.elapsed
    return submitted.kill(), when


def measure(submitted: Submitted, watermark: Watermark, *, interval: float = 0.1) -> tuple[Span, AppRun]:
    """Wait for an uninterrupted run to end, noting when it first wrote to the offsets topic."""
    last = max(watermark.high(), 0)  # -1: the topic does not exist yet (creating it is no write)
    first_write = last_write = None
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while submitted.running() and time.monotonic() < deadline:
        high = watermark.high()
        if high > last:
            last, last_write = high, submitted.elapsed
            first_write = last_write if first_write is None else first_write
        time.sleep(interval)
    run = submitted.wait()
    assert first_write is not None, "the calibration run never wrote its offsets: " + run.describe()
    return Span(first_write, last_write, run.seconds), run


# -- topic content ---------------------------------------------------------------------------------
@dataclass
class Change(DebeziumRecord):
    """One record of a data topic as a read_committed consumer sees it."""

    key: str
    payload: dict[str, Any] | None  # None: tombstone

    @property
    def after(self) -> dict[str, Any] | None:
        if not self.payload or self.payload.get("after") is None:
            return None
        from bson import json_util

        return json_util.loads(self.payload["after"])


def changes(bootstrap: str, topic: str, settle: float = SETTLE_S) -> list[Change]:
    """The records of ``topic`` (``settle``: see :func:`devtools.kafka.reading.read_topic`)."""
    return [
        Change(unwrapped(record.key)["id"], unwrapped(record.value))
        for record in read_topic(bootstrap, topic, settle=settle)
    ]


def wait_for(
    predicate: Callable[[], bool], timeout: float, interval: float = 0.1, message: str = "condition not met"
) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, message
        time.sleep(interval)


@dataclass
class Connections:
    """Airflow connections given as AIRFLOW_CONN_* environment variables (monkeypatched)."""

    monkeypatch: Any
    ids: dict[str, str] = field(default_factory=dict)

    def add(self, conn_id: str, fields: dict[str, Any]) -> str:
        self.monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
        self.ids[conn_id] = conn_id
        return conn_id

    def mongo(self, conn_id: str, uri: str, login: str | None = None, password: str | None = None) -> str:
        fields: dict[str, Any] = {"conn_type": "mongocdc", "host": uri}
        if login:
            fields.update(login=login, password=password)
        return self.add(conn_id, fields)

    def kafka(
        self, conn_id: str, config: dict[str, Any], login: str | None = None, password: str | None = None
    ) -> str:
        fields: dict[str, Any] = {"conn_type": "mongocdc_kafka", "extra": dict(config)}
        if login:
            fields.update(login=login, password=password)
        return self.add(conn_id, fields)

    def spark(self, conn_id: str = "faults_spark") -> str:
        return self.add(conn_id, {"conn_type": "spark", "host": "local[2]"})
