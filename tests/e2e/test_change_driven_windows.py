"""Change-driven windows end to end: a connector list whose window DAGs are scheduled by changes
only (``window_schedule: {"changes": ...}``), run by a real Airflow (api-server, scheduler with
LocalExecutor, dag-processor and triggerer, all on 127.0.0.1) with the MongoDB simulator, the real
Kafka broker and spark-submit.

In order, on one stack: a connector with no offset gets no run however long changes wait, until a
Trigger takes its snapshot; then writes start a window run that carries them; idle, no run; a burst
while a window runs makes exactly one follow-up run, which carries it; the triggerer killed with
SIGKILL and started again watches on from the committed position; an incremental snapshot requested
while nothing changes gets the windows that copy it, and none once it completed; a stored position
whose oplog headroom is below ``min_headroom`` starts a run. What is checked is what a user sees: the DAG runs
and their triggering asset events through the REST API, the events in Kafka, the offsets, the
triggerer's log. Quiet periods are judged after the watcher logged two status lines (twelve polls
apart, each poll waiting half a second) past several times ``max_delay``, never after a sleep.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    DAG_RUN_TIMEOUT_S,
    Stack,
    assert_all_tasks_succeed,
    connections_env,
    dag_folder,
    own_airflow,
    return_value,
    start_airflow,
    start_triggerer,
    stop,
    topic_events,
    unpause,
    wait_for,
    wait_registered,
)

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

WATCHED, TIGHT = "mongocdc_watched_hourly", "mongocdc_tight_hourly"
RESNAPSHOT = "mongocdc_watched_resnapshot"
# The watcher's thresholds in these tests: max_delay 2 s, a poll every half second (a status line
# every 12 polls: 6 s, three times max_delay).
MAX_DELAY_S = 2


@pytest.fixture(scope="module")
def stack(airflow_env, kafka_bootstrap, tmp_path_factory):
    home = tmp_path_factory.mktemp("changes")
    run = uuid.uuid4().hex[:6]
    prefixes = {"watched": f"watched{run}", "tight": f"tight{run}"}
    connectors = {
        "connectors": [
            {
                "name": "watched",
                "config": {"topic.prefix": prefixes["watched"], "collection.include.list": "shop\\.orders"},
                "window_schedule": {
                    "changes": {
                        "min_changes": 1000,
                        "max_delay": f"{MAX_DELAY_S}s",
                        "poll_interval": "0.5s",
                        "min_headroom": 0,
                    }
                },
            },
            {
                # Only its oplog headroom can start its windows.
                "name": "tight",
                "config": {"topic.prefix": prefixes["tight"], "collection.include.list": "shop\\.tight"},
                "window_schedule": {
                    "changes": {
                        "min_changes": 1000000,
                        "max_delay": "1d",
                        "poll_interval": "1s",
                        "min_headroom": "1h",
                    }
                },
            },
        ]
    }
    env = own_airflow(airflow_env, home, dag_folder(home, connectors))
    with MongoSim(mode="replset") as sim:
        env.update(
            {
                **connections_env(sim.uri, kafka_bootstrap),
                # A DAG switched on gets its watcher at the next parse of its file.
                "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "5",
                # A killed triggerer's watchers go to a running one after this many seconds.
                "AIRFLOW__TRIGGERER__TRIGGERER_HEALTH_CHECK_THRESHOLD": "10",
            }
        )
        stack = Stack(sim, prefixes["watched"], kafka_bootstrap, env, home)
        stack.tight_prefix = prefixes["tight"]
        try:
            stack.api = start_airflow(stack)
            stack.triggerer = start_triggerer(stack)
            for dag_id in (WATCHED, TIGHT):
                wait_registered(stack.api, dag_id)
                unpause(stack.api, dag_id)
            yield stack
        finally:
            stop(stack.processes)


# -- what the user sees --------------------------------------------------------------------------------
def runs(stack: Stack, dag_id: str = WATCHED) -> list[dict]:
    response = stack.api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns", params={"order_by": "run_after"})
    assert response.status_code == 200, response.text
    return response.json()["dag_runs"]


def watcher_runs(stack: Stack, dag_id: str = WATCHED) -> list[dict]:
    return [run for run in runs(stack, dag_id) if run["run_type"] == "asset_triggered"]


def triggering_events(stack: Stack, dag_id: str, run_id: str) -> list[dict]:
    """The payloads of the watcher's events that started a run (asked once the run has started:
    Airflow 3.3's API answers 500 for a run without a start date)."""
    response = stack.api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/upstreamAssetEvents")
    assert response.status_code == 200, response.text
    return [event["extra"]["payload"] for event in response.json()["asset_events"]]


def window_summary(stack: Stack, run: dict, dag_id: str = WATCHED) -> dict:
    assert_all_tasks_succeed(stack.api, dag_id, run["dag_run_id"])
    return return_value(stack.api, dag_id, run["dag_run_id"], "window")


def created_ids(stack: Stack, topic_prefix: str) -> list[int]:
    """The ``_id``s of the insert events in the orders topic, in order."""
    return [
        int(json.loads(key["id"]))
        for key, value in topic_events(stack.bootstrap, f"{topic_prefix}.shop.orders")
        if value and value["op"] == "c"
    ]


class TriggererLog:
    """The triggerer's output from now on: the watchers' lines."""

    def __init__(self, stack: Stack, name: str = "triggerer.log"):
        self.path = stack.home / name
        self.mark = self.path.stat().st_size if self.path.exists() else 0

    def text(self) -> str:
        with open(self.path, errors="replace") as handle:
            handle.seek(self.mark)
            return handle.read()

    def statuses(self, connector: str) -> list[str]:
        pattern = rf"Change watcher of connector {connector}: \d+ change\(s\) pending[^\n]*polls"
        return re.findall(pattern, self.text())

    def two_statuses(self, connector: str = "watched") -> list[str]:
        """Waits for two status lines of ``connector``'s watcher from now on: twelve polls of at
        least half a second apart, three times ``max_delay``."""
        return wait_for(
            f"two status lines of the {connector} watcher",
            lambda: len(self.statuses(connector)) >= 2 and self.statuses(connector),
        )


# -- the scenarios, in order -------------------------------------------------------------------------
def test_no_window_before_the_snapshot_then_trigger_takes_it(stack):
    client: MongoClient = stack.client
    log = TriggererLog(stack)
    client.shop.orders.insert_many([{"_id": i, "status": "new"} for i in range(1, 4)])

    wait_for(
        "the watcher says it waits for a snapshot",
        lambda: "Change watcher of connector watched: not watching rs0: No stored offset" in log.text(),
    )
    for line in log.two_statuses():
        assert "rs0 not watched (waiting)" in line and "no event yet" in line
    assert runs(stack) == []

    created = stack.api.call(
        "POST", f"/api/v2/dags/{WATCHED}/dagRuns", json={"logical_date": None, "conf": {}}
    )
    assert created.status_code == 200, created.text
    (manual,) = runs(stack)
    assert manual["run_type"] == "manual"
    summary = window_summary(stack, manual)
    assert stack.offsets().snapshot.status == "completed" and summary["events"] == 0
    reads = [
        value["op"] for _, value in topic_events(stack.bootstrap, f"{stack.prefix}.shop.orders") if value
    ]
    assert reads == ["r", "r", "r"]


def test_writes_start_a_window_that_carries_them(stack):
    stack.client.shop.orders.insert_many([{"_id": 10 + i, "status": "new"} for i in range(4)])
    stack.client.shop.users.insert_one({"_id": 1})  # not captured: not counted
    (run,) = wait_for("a run started by the watcher", lambda: watcher_runs(stack))
    summary = window_summary(stack, run)
    assert summary["events"] == 4 and summary["events_by_op"] == {"c": 4}
    (event,) = triggering_events(stack, WATCHED, run["dag_run_id"])
    assert event["reason"] == "max_delay" and event["pending"] == 4 and event["connector"] == "watched"
    assert event["message"].startswith("4 change(s) pending since ")
    assert created_ids(stack, stack.prefix) == [10, 11, 12, 13]


def test_idle_no_run(stack):
    log = TriggererLog(stack)
    before = runs(stack)
    for line in log.two_statuses():
        assert "0 change(s) pending" in line and "no event for" in line
    assert runs(stack) == before


def test_a_burst_while_a_window_runs_makes_exactly_one_follow_up_run(stack):
    client: MongoClient = stack.client
    api = stack.api
    known = {run["dag_run_id"] for run in runs(stack)}
    client.shop.orders.insert_many([{"_id": 20 + i} for i in range(2)])
    first = wait_for(
        "a run started by the watcher",
        lambda: [r for r in watcher_runs(stack) if r["dag_run_id"] not in known],
    )[0]
    # The window task has taken its end (the log line of its job spec): what comes now is after it.
    wait_for(
        "the window task running its job",
        lambda: "Running stream_window for connector" in api.task_log(WATCHED, first["dag_run_id"], "window"),
        timeout=DAG_RUN_TIMEOUT_S,
    )
    client.shop.orders.insert_many([{"_id": 100 + i} for i in range(20)])
    assert window_summary(stack, first)["events"] == 2

    follow_ups = wait_for(
        "the follow-up run",
        lambda: [r for r in watcher_runs(stack) if r["dag_run_id"] not in known | {first["dag_run_id"]}],
    )
    summary = window_summary(stack, follow_ups[0])
    assert summary["events"] == 20
    log = TriggererLog(stack)
    for line in log.two_statuses():
        assert "0 change(s) pending" in line
    (follow_up,) = [r for r in runs(stack) if r["dag_run_id"] not in known | {first["dag_run_id"]}]
    assert follow_up["state"] == "success"
    assert created_ids(stack, stack.prefix)[-22:] == [20, 21, *range(100, 120)]


def test_a_killed_triggerer_started_again_watches_on_from_the_committed_position(stack):
    os.killpg(stack.triggerer.pid, signal.SIGKILL)
    stack.triggerer.wait(timeout=60)
    known = {run["dag_run_id"] for run in runs(stack)}
    stack.client.shop.orders.insert_many([{"_id": 200 + i} for i in range(3)])
    committed = stack.offsets().position

    stack.triggerer = start_triggerer(stack, "triggerer-restarted.log")
    stack.triggerer_log = "triggerer-restarted.log"
    log = TriggererLog(stack, "triggerer-restarted.log")
    wait_for(
        "the restarted triggerer's watcher",
        lambda: (
            f"Change watcher of connector watched: watching rs0 from the committed position {committed.describe()}"
            in log.text()
        ),
    )
    (run,) = wait_for(
        "a run after the restart", lambda: [r for r in watcher_runs(stack) if r["dag_run_id"] not in known]
    )
    assert window_summary(stack, run)["events"] == 3
    (event,) = triggering_events(stack, WATCHED, run["dag_run_id"])
    assert event["pending"] == 3
    assert created_ids(stack, stack.prefix)[-3:] == [200, 201, 202]


def test_an_incremental_snapshot_on_quiet_collections_gets_its_windows(stack):
    # Re-snapshot, mode incremental, while nothing changes: the watcher asks for the windows that
    # copy it (no threshold would), and for none once it completed.
    api = stack.api
    known = {run["dag_run_id"] for run in runs(stack)}
    unpause(api, RESNAPSHOT)
    created = api.call(
        "POST",
        f"/api/v2/dags/{RESNAPSHOT}/dagRuns",
        json={"logical_date": None, "conf": {"mode": "incremental", "collections": ["shop.orders"]}},
    )
    assert created.status_code == 200, created.text
    assert_all_tasks_succeed(api, RESNAPSHOT, created.json()["dag_run_id"])
    (run,) = wait_for(
        "a run for the incremental snapshot",
        lambda: [r for r in watcher_runs(stack) if r["dag_run_id"] not in known][:1],
    )
    window_summary(stack, run)  # (the run's events are asked for once it has started)
    (event,) = triggering_events(stack, WATCHED, run["dag_run_id"])
    assert (event["reason"], event["pending"]) == ("incremental_snapshot", 0), event
    progress = wait_for(
        "the incremental snapshot completed",
        lambda: (
            (incremental := stack.offsets().incremental)
            and incremental.get("status") == "completed"
            and incremental
        ),
        timeout=DAG_RUN_TIMEOUT_S,
    )
    assert progress["documents"] == stack.client.shop.orders.count_documents({})
    log = TriggererLog(stack, getattr(stack, "triggerer_log", "triggerer.log"))  # the running triggerer's
    for line in log.two_statuses():
        assert "0 change(s) pending" in line
    done = {r["dag_run_id"] for r in runs(stack)}
    log.two_statuses()
    assert {r["dag_run_id"] for r in runs(stack)} == done  # no more windows asked for it


def test_low_oplog_headroom_starts_a_window(stack):
    client: MongoClient = stack.client
    assert watcher_runs(stack, TIGHT) == []  # no offset so far: quiet
    # A full oplog of 200 entries: the stored position (its 50th) is among the oldest entries, its
    # headroom a few seconds; the periodic no-ops (every 10 s) purge it in minutes, not seconds.
    stack.sim.set_oplog_retention(max_entries=200)
    client.shop.filler.insert_many([{"_id": i} for i in range(250)])
    oplog = client.local["oplog.rs"]
    position = oplog.find({}, {"ts": 1}).sort("$natural", 1).skip(50).limit(1).next()["ts"]
    store = OffsetStore({"bootstrap.servers": stack.bootstrap}, f"{stack.tight_prefix}.offsets")
    partition = OffsetPartition(stack.tight_prefix, "rs0")
    store.set_position(partition, Position(cluster_time=position))

    (run,) = wait_for(
        "a run started for the headroom", lambda: watcher_runs(stack, TIGHT), timeout=DAG_RUN_TIMEOUT_S
    )
    window_summary(stack, run, TIGHT)
    assert store.read(partition).position.cluster_time > position  # the window moved it on
    (event,) = triggering_events(stack, TIGHT, run["dag_run_id"])
    assert event["reason"] == "min_headroom" and event["pending"] == 0
    assert event["headroom_seconds"] < 3600 and "leaves the oplog in about" in event["message"]
