"""Open windows: a window that stays open while changes keep coming, commits every commit interval
and closes when no change came for its idle time; the same window in a Spark task.

Runs against the simulator (or MONGOCDC_TEST_MONGODB_URI) and the real Kafka broker. No fixed
waits: the tests wait on what a reader of the offsets topic sees (the open window's marker), with
generous bounds.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import window_transactional_id
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import StreamWindow, run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.window_helpers import connector, run_window_app, seed_offset, topic_events
from tests.mongo_commands import Recorder

pytestmark = pytest.mark.integration

BOUND_S = 120  # every wait on a condition gives up after this


def wait_for(predicate, message: str, timeout: float = BOUND_S):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, message
        time.sleep(0.1)


class Writer:
    """Inserts ``{"_id": n}`` one after the other (0.05 s apart) until stopped: a steady flow."""

    def __init__(self, uri: str, database: str, first: int = 0):
        self.uri, self.database, self.next = uri, database, first
        self.written: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with MongoClient(self.uri, serverSelectionTimeoutMS=20000) as client:
            while not self._stop.is_set():
                client[self.database].items.insert_one({"_id": self.next})
                self.written.append(self.next)
                self.next += 1
                self._stop.wait(0.05)

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def open_marker(store: OffsetStore, partition):
    """The open window's marker as a reader of the offsets topic sees it now (None: none)."""
    state = store.read(partition)
    return state.open_window if state is not None else None


def item_ids(bootstrap: str, topic: str) -> Counter:
    return Counter(int(event.key["id"]) for event in topic_events(bootstrap, topic) if event.payload)


def seeded_stream(mongodb_uri: str, kafka_bootstrap: str, unique_name: str):
    """A connector of its own database with its offset stored at the stream's current position:
    (database, Kafka config, offset store, offset partition, connector config, stream target)."""
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    return db_name, kafka, store, partition, config, target


def test_open_window_carries_a_flow_of_writes_in_several_commits_and_closes_when_idle(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name, kafka, store, partition, config, target = seeded_stream(
        mongodb_uri, kafka_bootstrap, unique_name
    )
    params = WindowParams(
        datetime.now(timezone.utc), idle_timeout_s=60, commit_interval_s=0.3, open_idle_s=3, max_open_s=300
    )
    reader = OffsetStore(kafka, config.offsets_topic)
    outcome: dict = {}

    def window() -> None:
        try:
            outcome["summary"] = run_window(target, config, kafka, params)
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    thread = threading.Thread(target=window, daemon=True)
    thread.start()
    wait_for(lambda: open_marker(reader, partition), "the window did not say it is open")
    with Writer(mongodb_uri, db_name) as writer:
        # While the writes flow, a reader sees the open window commit them.
        seen = wait_for(
            lambda: (m := open_marker(reader, partition)) and m["events"] >= 10 and m,
            "the open window committed no writes while they flowed",
        )
    thread.join(timeout=BOUND_S)
    assert not thread.is_alive(), "the open window did not close after its idle time"
    assert "error" not in outcome, outcome.get("error")
    summary = outcome["summary"]

    assert seen["commits"] >= 2 and seen["since"] and seen["lag_ms"] is not None
    assert summary["stop_reason"] == "idle" and summary["reached_end"] is True
    # Every write made while it was open is in this one window, once, in several commits.
    assert summary["events"] == len(writer.written) > 10
    assert summary["batches_committed"] >= 3
    opened = summary["open_window"]
    assert opened["stop_reason"] == "idle" and opened["events"] == len(writer.written)
    assert opened["commits"] == summary["batches_committed"] and opened["idle_s"] == 3
    ids = item_ids(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    assert ids == Counter(writer.written)
    state = store.read(partition)
    assert state.open_window is None  # closed: its last commit removed the marker
    assert state.windows == 1 and state.events == len(writer.written)
    assert state.resume_token is not None  # it stands after the last change read


def test_an_open_window_asks_for_a_trickle_of_changes_once_per_commit_interval(
    mongodb_uri, kafka_bootstrap, unique_name
):
    """Changes arriving one by one (the server answers a getMore as soon as it has one) are read
    once per commit interval once the window has caught up, not one getMore each: every write is
    still delivered once, in several commits."""
    db_name, kafka, store, partition, config, target = seeded_stream(
        mongodb_uri, kafka_bootstrap, unique_name
    )
    interval_s = 0.5
    params = WindowParams(
        datetime.now(timezone.utc),
        idle_timeout_s=60,
        commit_interval_s=interval_s,
        open_idle_s=3,
        max_open_s=300,
    )
    reader = OffsetStore(kafka, config.offsets_topic)
    commands = Recorder()  # the window's client: its getMores ask the server again
    outcome: dict = {}

    def window() -> None:
        try:
            with (
                TransactionalWriter(
                    kafka, window_transactional_id(config.topic_prefix, target.partition)
                ) as writer,
                MongoClient(mongodb_uri, event_listeners=[commands]) as client,
            ):
                outcome["summary"] = StreamWindow(
                    config, client, writer, OffsetStore.for_connector(kafka, config), target.partition, params
                ).run()
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    thread = threading.Thread(target=window, daemon=True)
    thread.start()
    wait_for(lambda: open_marker(reader, partition), "the window did not say it is open")
    with Writer(mongodb_uri, db_name) as writer:  # a write every 0.05 s
        wait_for(lambda: len(writer.written) >= 5, "the writer wrote nothing")
        began, asked_before = time.monotonic(), commands.names().count("getMore")
        wait_for(lambda: len(writer.written) >= 125, "the writer did not write 120 more")
        ended, asked = time.monotonic(), commands.names().count("getMore") - asked_before
    thread.join(timeout=BOUND_S)
    assert not thread.is_alive(), "the open window did not close after its idle time"
    assert "error" not in outcome, outcome.get("error")

    # 120 writes or more, one at a time; the window asked for them about once per commit
    # interval (bounded by the time they took, however slow this machine is), not once each.
    assert asked <= (ended - began) / interval_s * 1.5 + 4, (asked, ended - began)
    summary = outcome["summary"]
    assert summary["stop_reason"] == "idle"
    assert summary["events"] == len(writer.written) and summary["batches_committed"] >= 3
    ids = item_ids(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    assert ids == Counter(writer.written)
    assert store.read(partition).events == len(writer.written)


def test_open_window_in_a_spark_task(mongodb_uri, kafka_bootstrap, spark_submit, unique_name, tmp_path):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[db_name].items.insert_many([{"_id": -n} for n in range(1, 4)])  # before it opens
    reader = OffsetStore(kafka, f"{unique_name}.offsets")
    outcome: dict = {}

    def app() -> None:
        outcome["run"] = run_window_app(
            spark_submit,
            tmp_path,
            "open",
            props,
            mongodb_uri,
            kafka,
            datetime.now(timezone.utc),
            stream_in_driver=False,
            open_idle_s=4,
            max_open_s=300,
            commit_interval_s=0.5,
        )

    thread = threading.Thread(target=app, daemon=True)
    thread.start()
    wait_for(lambda: open_marker(reader, partition), "the window did not say it is open", timeout=240)
    with Writer(mongodb_uri, db_name) as writer:
        wait_for(
            lambda: (m := open_marker(reader, partition)) and m["events"] >= 5,
            "the open window committed no writes while they flowed",
        )
    thread.join(timeout=240)
    assert not thread.is_alive(), "the open window did not close after its idle time"
    summary = outcome["run"].summary
    assert set(summary["phases_s"]) == {"driver_checks", "spark_start", "tasks"}
    assert summary["partitions"][0]["stop_reason"] == "idle" and summary["reached_end"] is True
    assert summary["events"] == 3 + len(writer.written)
    assert summary["open_window"]["stop_reasons"] == ["idle"]
    assert summary["open_window"]["events"] == summary["events"]
    ids = item_ids(kafka_bootstrap, f"{unique_name}.{db_name}.items")
    assert ids == Counter([-1, -2, -3, *writer.written])
    assert store.read(partition).open_window is None
