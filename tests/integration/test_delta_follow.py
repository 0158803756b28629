"""Delta tables that follow their topics while an open window runs: the window application under
spark-submit (its follower process beside its stream), the real Kafka broker, the MongoDB simulator
(or MONGOCDC_TEST_MONGODB_URI) and delta-rs; the table read back by deltalake's own reader.

While writes keep the window open, the table already holds them (the window has not closed: writes
less than its idle time apart keep it open); when it has closed, the table equals MongoDB, its
commits continue each other, and the apply after the window finds nothing left."""

from __future__ import annotations

import subprocess
import threading
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.jobspec import read_result
from tests.integration.delta_helpers import (
    apply,
    apply_commits,
    connector,
    mongo_documents,
    snapshot,
    table_documents,
)
from tests.integration.window_helpers import write_spec
from tests.spark_submit import app_command, submit_env

pytestmark = pytest.mark.integration

BOUND_S = 240.0


def test_an_open_windows_table_holds_its_changes_while_the_window_is_open(
    mongodb_uri, kafka_bootstrap, unique_name, tmp_path, spark_submit
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(20)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "columns": {f"{database}.items": {"v": "long"}}}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"
    first_version = len(apply_commits(table))

    spec, result = write_spec(
        tmp_path,
        "open",
        props,
        mongodb_uri,
        kafka,
        datetime.now(timezone.utc),
        stream_in_driver=True,
        commit_interval_s=0.5,
        open_idle_s=8,
        max_open_s=600,
        follow_delta={"delta": delta, "storage_options": {}, "every": 1.0},
    )
    log = (tmp_path / "window.log").open("w")
    window = subprocess.Popen(
        app_command(spark_submit, "stream_window", spec, result),
        stdout=log,
        stderr=subprocess.STDOUT,
        env=submit_env(),
    )
    stop = threading.Event()
    written: list[int] = []

    def write() -> None:  # a write every 0.3 s keeps the window open (its idle time is 8 s)
        key = 1000
        while not stop.wait(0.3):
            items.insert_one({"_id": key, "v": key})
            items.update_one({"_id": key % 20}, {"$inc": {"v": 1}})
            written.append(key)
            key += 1

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        # The table holds writes of the open window before it closes.
        seen = False
        done = threading.Event()
        while not done.wait(0.5):
            assert window.poll() is None, (tmp_path / "window.log").read_text()[-4000:]
            if len(written) >= 10:
                held = {key for key in table_documents(table) if isinstance(key, int) and key >= 1000}
                if len(held) >= 10:
                    seen = True
                    break
            assert len(written) < BOUND_S / 0.3, "the table did not follow the open window's topic"
        assert seen and window.poll() is None  # still open: the writes never paused
    finally:
        stop.set()
        writer.join(timeout=30)
    assert window.wait(timeout=BOUND_S) == 0, (tmp_path / "window.log").read_text()[-4000:]

    summary = read_result(result)["summary"]
    (stream,) = summary["partitions"]
    assert stream["stop_reason"] == "idle", summary
    tables = summary["tables"]
    assert tables["commits"] >= 2 and "error" not in tables, tables
    (followed,) = tables["tables"]
    assert followed["passes"] >= 2 and followed["behind"] == 0, followed
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    commits = apply_commits(table)
    assert len(commits) > first_version
    for before, after in zip(commits, commits[1:]):
        assert after["mongocdc.from"] == before["mongocdc.positions"], commits
    left = apply(kafka, props, delta)  # the delta_apply task after the window
    assert left["events"] == 0 and left["commits"] == 0, left
