"""kill -9 of an open window while changes flow into it, then a re-run: a read_committed consumer
sees every write exactly once, and the re-run continues from the last commit.

The window runs in a process of its own (the same ``run_window`` the application's driver runs for
one stream), killed with SIGKILL once a reader of the offsets topic sees that it committed writes
while open, with its Kafka transaction of the next commit most likely open.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime, timezone

import pytest

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import describe_position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.test_open_window import Writer, open_marker, wait_for
from tests.integration.window_helpers import connector, seed_offset, settled_after_kill, topic_events

pytestmark = pytest.mark.faults

_OPEN_WINDOW = """
import json, sys
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
uri, props, kafka, params = json.loads(sys.argv[1])
config = ConnectorConfig.from_properties(props)
(target,) = plan_streams(connection_details({"connection_string": uri}), config)
run_window(target, config, kafka, WindowParams.from_params(params, config))
"""


def test_open_window_killed_while_changes_flow_then_rerun_loses_and_duplicates_nothing(
    mongodb_uri, kafka_bootstrap, unique_name
):
    db_name = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name, {"max.batch.size": 5})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    reader = OffsetStore(kafka, f"{unique_name}.offsets")
    params = WindowParams(
        datetime.now(timezone.utc), idle_timeout_s=60, commit_interval_s=0.3, open_idle_s=5, max_open_s=300
    )
    # Both runs are tries of one Airflow task instance (the operator passes it as task_run).
    task_run = {"task_run": f"mongocdc_hourly/{unique_name}/window"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _OPEN_WINDOW,
            json.dumps([mongodb_uri, props, kafka, {**params.to_params(), **task_run}]),
        ],
        start_new_session=True,
    )
    try:
        with Writer(mongodb_uri, db_name) as writer:
            wait_for(
                lambda: (
                    (process.poll() is None or pytest.fail("the open window ended before the kill"))
                    and (m := open_marker(reader, partition))
                    and m["commits"] >= 3
                    and m["events"] >= 10
                ),
                "the open window committed no writes while they flowed",
            )
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
            # A few writes after the kill: the re-run carries them too.
            written = len(writer.written)
            wait_for(lambda: len(writer.written) >= written + 5, "the writes stopped")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)

    topic = f"{unique_name}.{db_name}.items"

    def visible() -> list[int]:
        return [
            int(event.key["id"]) for event in topic_events(kafka_bootstrap, topic, settle=0) if event.payload
        ]

    # What the killed window committed is visible, its open transaction is not; its marker stays.
    committed, seen = settled_after_kill(store, partition, lambda: len(visible()))
    assert 10 <= committed.events < len(writer.written) and committed.windows == 0
    assert committed.open_window is not None and committed.open_window["events"] == committed.events
    assert sorted(visible()) == writer.written[:seen]  # the first writes, in order, once

    # The re-run (an open window again) continues from the last commit and closes when idle.
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    rerun = WindowParams(
        datetime.now(timezone.utc), idle_timeout_s=60, commit_interval_s=0.3, open_idle_s=2, max_open_s=300
    )
    start = time.monotonic()
    summary = run_window(target, config, kafka, WindowParams.from_params({**rerun.to_params(), **task_run}))
    print(
        f"killed after {committed.events} of {len(writer.written)} writes; re-run {time.monotonic() - start:.1f} s"
    )
    assert summary["stop_reason"] == "idle"
    assert summary["start_position"] == describe_position(committed.position)  # the last commit
    # The re-run, a retry of the killed try's task instance, counts what the killed try committed:
    # its summary (the task's XCom, asset event and chart point) counts every event delivered.
    assert summary["events"] == len(writer.written), (summary["events"], committed.events)
    assert summary["events_earlier_tries"] == committed.events
    assert summary["events_by_collection"] == {f"{db_name}.items": len(writer.written)}
    assert summary["open_window"]["events"] == len(writer.written)
    assert Counter(int(event.key["id"]) for event in topic_events(kafka_bootstrap, topic)) == Counter(
        writer.written
    )
    state = store.read(partition)
    assert state.open_window is None and state.windows == 1 and state.events == len(writer.written)
