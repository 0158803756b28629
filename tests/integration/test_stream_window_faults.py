"""Stream windows under faults: kill -9 of the Spark application, a stepDown during a window, a
purged resume point; and the windows' refusals (no offset, snapshot running, initial_only) and
oversize events, checked on the topics and in the offsets."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import OffsetError, OversizeEventError, ResumePointPurgedError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.window_helpers import (
    SPARK_TIMEOUT_S,
    connector,
    end_after_insert,
    failing_commands,
    insert_at,
    next_second,
    pass_second,
    run_window_app,
    seed_offset,
    settled_after_kill,
    topic_events,
    write_spec,
)
from tests.spark_submit import app_command, submit_env

pytestmark = [pytest.mark.integration, pytest.mark.faults]

# Batches of 5 changes and retries after 10 to 50 ms: failures land inside the window's batches.
QUICK_RETRIES = {
    "max.batch.size": 5,
    "connect.backoff.initial.delay.ms": 10,
    "connect.backoff.max.delay.ms": 50,
}


def _ids(events) -> list:
    return [e.key["id"] for e in events if e.payload is not None]


def _preload(uri: str, db_name: str, count: int, *, pass_end: bool = True):
    """``count`` inserts (ids 0 .. count-1) and the end of a window covering them all (with
    ``pass_end``, an uncaptured write then moves the cluster time past it)."""
    with MongoClient(uri, serverSelectionTimeoutMS=20000) as client:
        for start in range(0, count - 1, 500):
            client[db_name].items.insert_many(
                [{"_id": n, "pad": "x" * 100} for n in range(start, min(start + 500, count - 1))]
            )
        end = next_second(insert_at(client[db_name].items, {"_id": count - 1}))
        if pass_end:
            pass_second(client, end, f"{db_name}_m")
    return end


def _start(spark_submit: str, tmp_path, name: str, props: dict, uri: str, kafka: dict, end):
    spec, result = write_spec(tmp_path, name, props, uri, kafka, end)
    return subprocess.Popen(
        app_command(spark_submit, "stream_window", spec, result),
        env=submit_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        text=True,
    )


def _wait_for_commits(process, store, partition, events: int) -> None:
    deadline = time.monotonic() + SPARK_TIMEOUT_S
    while store.read(partition).events < events:
        assert process.poll() is None, "the window ended before the fault: " + process.stdout.read()[-3000:]
        assert time.monotonic() < deadline, "the window did not commit in time"
        time.sleep(0.1)


def _kill(process) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)


def test_killed_window_then_rerun_loses_and_duplicates_nothing(
    mongodb_uri, kafka_bootstrap, spark_submit, unique_name, tmp_path
):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, {"max.batch.size": 5})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    count = 1500
    end = _preload(mongodb_uri, db_name, count)

    process = _start(spark_submit, tmp_path, "killed", props, mongodb_uri, kafka, end)
    try:
        _wait_for_commits(process, store, partition, 10)
        os.killpg(process.pid, signal.SIGKILL)  # the driver, the JVM and the Python workers
        process.wait(timeout=30)
    finally:
        _kill(process)

    topic = f"{unique_name}.{db_name}.items"
    # read_committed consumers see exactly the committed batches: the killed run's open
    # transaction stays invisible (it is aborted when the next run's writer starts).
    committed, _ = settled_after_kill(
        store, partition, lambda: len(_ids(topic_events(kafka_bootstrap, topic, settle=0)))
    )
    print(f"killed after {committed.events} of {count} events committed")
    assert 10 <= committed.events < count and committed.windows == 0

    # The re-run (with any batch size) continues from the last commit; its writer fences the
    # killed one.
    rerun = ConnectorConfig.from_properties({**props, "max.batch.size": 2048})
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), rerun)
    summary = run_window(target, rerun, kafka, WindowParams(end))
    assert summary["events"] == count - committed.events
    ids = _ids(topic_events(kafka_bootstrap, topic))
    assert len(ids) == count and sorted(int(i) for i in ids) == list(range(count))
    state = store.read(partition)
    assert state.cluster_time == end and state.events == count and state.windows == 1


@pytest.mark.simulator_only
def test_window_survives_a_step_down(mongosim, kafka_bootstrap, unique_name):
    # No periodic no-op: the cluster time moves only with this test's writes, so the window cannot
    # reach its end (the second after the preload) before the test writes past it, after the
    # stepDown; the stepDown deterministically falls inside the window.
    sim = mongosim("replset", members=3, noop_interval=3600)
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, {"max.batch.size": 5})
    store, partition = seed_offset(sim.uri, kafka, props)
    count = 600
    end = _preload(sim.uri, db_name, count, pass_end=False)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": sim.uri}), config)
    outcome: dict = {}

    def window() -> None:
        try:  # (it waits, without progress, for the write past its end: a long idle timeout)
            outcome["summary"] = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=300))
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    thread = threading.Thread(target=window, daemon=True)
    thread.start()
    deadline = time.monotonic() + 240
    while store.read(partition).events < 5:
        assert thread.is_alive(), f"the window ended before the stepDown: {outcome}"
        assert time.monotonic() < deadline, "the window committed nothing within 240 s"
        time.sleep(0.05)
    assert thread.is_alive() and store.read(partition).windows == 0, f"the window ended early: {outcome}"
    with sim.client() as client:
        old_primary = client.admin.command("hello")["primary"]
    sim.step_down(seconds=30)
    with sim.client() as client:  # on the new primary: now the window can reach its end
        pass_second(client, end, f"{db_name}_m")
    thread.join(timeout=300)
    assert not thread.is_alive(), "the window did not end within 300 s of the write past its end"
    assert "error" not in outcome, outcome.get("error")
    with sim.client() as client:
        assert client.admin.command("hello")["primary"] != old_primary
    assert outcome["summary"]["events"] == count and outcome["summary"]["reached_end"] is True
    ids = _ids(topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items"))
    assert sorted(int(i) for i in ids) == list(range(count))
    state = store.read(partition)
    assert state.events == count and state.windows == 1 and state.cluster_time == end


@pytest.mark.simulator_only
def test_purged_resume_point_fails_clearly_and_keeps_the_offset(
    mongosim, kafka_bootstrap, spark_submit, unique_name, tmp_path
):
    sim = mongosim("replset")
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    store, partition = seed_offset(sim.uri, kafka, props)
    with sim.client() as client:
        for n in range(5):
            client[db_name].items.insert_one({"_id": n})
        end = end_after_insert(client[db_name].items, {"_id": 5}, f"{db_name}_m")
    sim.set_oplog_retention(max_entries=2)
    before = store.read(partition)

    run = run_window_app(spark_submit, tmp_path, "purged", props, sim.uri, kafka, end)
    assert run.returncode == 1 and run.result["status"] == "failed", run.describe()
    assert run.result["error_type"] == "ResumePointPurgedError"
    message = run.result["message"]
    assert "no longer in the oplog" in message and "mongocdc_resnapshot" in message
    assert "ChangeStreamHistoryLost (286)" in message
    after = store.read(partition)
    assert after.position == before.position and after.windows == 0
    assert topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items") == []

    # With snapshot.mode=when_needed the window reports that a snapshot must run first.
    config = ConnectorConfig.from_properties({**props, "snapshot.mode": "when_needed"})
    (target,) = plan_streams(connection_details({"connection_string": sim.uri}), config)
    with pytest.raises(ResumePointPurgedError) as info:
        run_window(target, config, kafka, WindowParams(end))
    assert "when_needed a new snapshot must run first" in str(info.value)
    assert "hourly DAG's snapshot task" in str(info.value)


def test_window_refuses_to_start_without_a_usable_offset(mongodb_uri, kafka_bootstrap, unique_name):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, unique_name[:40])
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    params = WindowParams(datetime.now(timezone.utc))

    with pytest.raises(OffsetError) as info:
        run_window(target, config, kafka, params)
    assert "No stored offset" in str(info.value) and "run the snapshot first" in str(info.value)
    assert "MongoSnapshotOperator" in str(info.value)

    store, partition = seed_offset(mongodb_uri, kafka, props)
    seeded = store.read(partition)
    running = seeded.snapshot_started("snap-1", seeded.position, 3)
    store.write(partition, running)
    with pytest.raises(OffsetError) as info:
        run_window(target, config, kafka, params)
    assert "snapshot of" in str(info.value) and "is in progress" in str(info.value)

    store.write(partition, store.read(partition).snapshot_completed())
    initial_only = ConnectorConfig.from_properties({**props, "snapshot.mode": "initial_only"})
    summary = run_window(target, initial_only, kafka, params)
    assert summary["stop_reason"] == "initial_only" and summary["events"] == 0
    assert store.read(partition).windows == 0


def test_oversize_events_fail_or_are_skipped(mongodb_uri, kafka_bootstrap, unique_name):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, {"max.batch.size": 1, "event.max.bytes": 20000})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        items = client[db_name].items
        small = insert_at(items, {"_id": 1})
        items.insert_one({"_id": 2, "big": "x" * 50000})
        end = end_after_insert(items, {"_id": 3}, f"{db_name}_m")
    topic = f"{unique_name}.{db_name}.items"
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc))

    with pytest.raises(OversizeEventError) as info:
        run_window(target, config, kafka, params)
    assert "event.max.bytes=20000" in str(info.value)
    # Nothing past the oversize event was committed: the offset stands at the event before it.
    assert _ids(topic_events(kafka_bootstrap, topic)) == ["1"]
    state = store.read(partition)
    assert state.cluster_time == small and state.windows == 0

    skipping = ConnectorConfig.from_properties({**props, "event.oversize.handling.mode": "skip"})
    summary = run_window(target, skipping, kafka, params)
    assert summary["skipped_oversize"] == 1 and summary["events"] == 1
    assert _ids(topic_events(kafka_bootstrap, topic)) == ["1", "3"]
    assert store.read(partition).cluster_time == end


def test_positions_are_never_moved_back_by_an_old_window(mongodb_uri, kafka_bootstrap, unique_name):
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, unique_name[:40])
    store, partition = seed_offset(mongodb_uri, kafka, props)
    seeded = store.read(partition)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    old_end = datetime.fromtimestamp(seeded.cluster_time.time - 3600, timezone.utc)
    summary = run_window(target, config, kafka, WindowParams(old_end))
    assert summary["stop_reason"] == "already_past_end" and summary["events"] == 0
    assert store.read(partition).position == seeded.position


@pytest.mark.simulator_only
def test_stream_errors_are_retried_from_the_last_position_without_loss_or_duplicate(
    mongosim, kafka_bootstrap, unique_name
):
    sim = mongosim("replset")
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, QUICK_RETRIES)
    store, partition = seed_offset(sim.uri, kafka, props)
    with sim.client() as client:
        db = client[db_name]
        db.items.insert_many([{"_id": n} for n in range(40)])
        for txn in range(3):  # transactions larger than a batch, so failures also hit their middle
            with client.start_session() as session, session.start_transaction():
                db.items.insert_many([{"_id": 100 * (txn + 1) + n} for n in range(12)], session=session)
                db.other.insert_one({"_id": txn}, session=session)
        end = end_after_insert(db.items, {"_id": 999}, f"{db_name}_m")
        # 70% of the window's aggregate and getMore commands fail with a resumable error: pymongo
        # resumes once by itself, the window re-opens the stream when that fails too (inside a
        # transaction it rolls back to its last commit and reads the transaction again).
        with failing_commands(
            client,
            {"activationProbability": 0.7},
            ["aggregate", "getMore"],
            errorCode=6,
            errorLabels=["ResumableChangeStreamError"],
        ):
            config = ConnectorConfig.from_properties(props)
            (target,) = plan_streams(connection_details({"connection_string": sim.uri}), config)
            summary = run_window(target, config, kafka, WindowParams(end))

    expected = sorted(list(range(40)) + [100 * t + n for t in (1, 2, 3) for n in range(12)] + [999])
    ids = _ids(topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items"))
    assert sorted(int(i) for i in ids) == expected
    transactions = topic_events(kafka_bootstrap, f"{unique_name}.transaction")
    assert [(e.payload["status"], e.payload["event_count"]) for e in transactions] == [
        ("BEGIN", None),
        ("END", 13),
    ] * 3
    for event in topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items"):
        block = event.payload["transaction"]
        if block is not None:
            assert 1 <= block["total_order"] <= 12 and block["total_order"] == block["data_collection_order"]
    assert summary["events"] == len(expected) + 3 and summary["transactions"] == 3
    assert summary["reconnects"] >= 1  # the window itself re-opened the stream
    assert store.read(partition).cluster_time == end


def test_errors_the_server_labels_resumable_are_retried_without_loss_or_duplicate(
    mongodb_uri, kafka_bootstrap, unique_name
):
    # MongoDB labels the errors of a change stream's aggregate and getMore ResumableChangeStreamError
    # for resumable codes (ErrorLabelBuilder). Here the stream's aggregate fails twice (pymongo
    # retries the read once, then the window re-opens the stream by the label) and a getMore fails
    # after its cursor is checked out (pymongo resumes by the label).
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, QUICK_RETRIES)
    store, partition = seed_offset(mongodb_uri, kafka, props)
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        db = client[db_name]
        db.items.insert_many([{"_id": n} for n in range(20)])
        end = end_after_insert(db.items, {"_id": 99}, f"{db_name}_m")
        with (
            failing_commands(client, {"times": 2}, ["aggregate"], errorCode=6),
            failing_commands(
                client,
                {"times": 1},
                ["getMore"],
                fail_point="failGetMoreAfterCursorCheckout",
                errorCode=11602,
            ),
        ):
            summary = run_window(target, config, kafka, WindowParams(end))

    ids = _ids(topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.items"))
    assert sorted(int(i) for i in ids) == list(range(20)) + [99]
    assert summary["events"] == 21
    assert summary["reconnects"] == 1  # the window re-opened the stream after the aggregates
    assert store.read(partition).cluster_time == end
