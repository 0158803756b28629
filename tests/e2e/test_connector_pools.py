"""A connector's pool that does not exist is created when its DAG run starts; an existing pool is kept.

A real Airflow (api-server, scheduler with LocalExecutor, dag-processor, all on 127.0.0.1) with the
MongoDB simulator and the real Kafka broker runs a connector list of two connectors: ``fresh``,
whose pool ``mongocdc_fresh`` nobody created, and ``sized``, whose pool the user created beforehand
with 3 slots. Both hourly DAGs are triggered as the UI's Trigger button does. Airflow 3.3 never
queues a task whose pool does not exist (it stays *scheduled*); the provider's scheduler listener
creates the missing pool with one slot when the run starts, so both runs succeed, the created pool
has 1 slot and a description naming its connector, the scheduler logs one line for it, and the
user's pool keeps its 3 slots and description.

A pool deleted while its connector's run is already running (the scheduler reports no event when
that run's next task becomes *scheduled*) is created again when any other DAG run starts.
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone

import pytest

from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    Stack,
    assert_all_tasks_succeed,
    connections_env,
    dag_folder,
    own_airflow,
    reads,
    start_airflow,
    stop,
    trigger,
    unpause,
    wait_for,
    wait_registered,
)

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

# How long a triggered run's first task may take to leave *scheduled* (the scheduler queues a task of
# an existing pool within seconds; on a loaded machine, well within this bound).
QUEUE_TIMEOUT_S = 300


def test_missing_connector_pool_is_created_when_the_run_starts_and_existing_pool_is_kept(
    airflow_env, kafka_bootstrap, tmp_path_factory
):
    home = tmp_path_factory.mktemp("pools")
    run = uuid.uuid4().hex[:6]
    prefixes = {"fresh": f"fresh{run}", "sized": f"sized{run}"}
    connectors = {
        "connectors": [
            {
                "name": name,
                # Triggered runs only: no scheduled run queues behind them when the DAG is switched on.
                "schedule": None,
                "config": {"topic.prefix": prefix, "collection.include.list": "shop\\.orders"},
            }
            for name, prefix in prefixes.items()
        ]
    }
    env = own_airflow(airflow_env, home, dag_folder(home, connectors))
    with MongoSim(mode="replset") as sim:
        env.update(
            {
                **connections_env(sim.uri, kafka_bootstrap),
            }
        )
        stack = Stack(sim, "", kafka_bootstrap, env, home)
        stack.airflow("pools", "set", "mongocdc_sized", "3", "sized by the user")
        stack.client.shop.orders.insert_many([{"_id": i, "status": "new"} for i in range(1, 8)])
        try:
            api = start_airflow(stack)
            dag_ids = {name: f"mongocdc_{name}_hourly" for name in prefixes}
            for dag_id in dag_ids.values():
                wait_registered(api, dag_id)
            assert api.call("GET", "/api/v2/pools/mongocdc_fresh").status_code == 404, (
                "mongocdc_fresh exists before any run: the test needs it missing"
            )
            for dag_id in dag_ids.values():
                unpause(api, dag_id)
            runs = {
                name: trigger(api, dag_id, datetime.now(timezone.utc).isoformat())
                for name, dag_id in dag_ids.items()
            }

            # The snapshot of the connector without a pool leaves *scheduled*: it was queued.
            def snapshot_state(name: str) -> str | None:
                path = f"/api/v2/dags/{dag_ids[name]}/dagRuns/{runs[name]}/taskInstances/snapshot"
                return api.call("GET", path).json().get("state")

            deadline = time.monotonic() + QUEUE_TIMEOUT_S
            while (state := snapshot_state("fresh")) in (None, "scheduled"):
                if time.monotonic() > deadline:
                    log = (home / "scheduler.log").read_text(errors="replace")
                    stuck = [line for line in log.splitlines() if "non-existent pool" in line][-3:]
                    raise AssertionError(
                        f"the snapshot of {dag_ids['fresh']} is still {state!r} {QUEUE_TIMEOUT_S} s after "
                        "the trigger: Airflow does not queue a task whose pool does not exist and nothing "
                        f"created mongocdc_fresh. Scheduler: {stuck}"
                    )
                time.sleep(2)

            for name, dag_id in dag_ids.items():
                assert_all_tasks_succeed(api, dag_id, runs[name])
                assert reads(kafka_bootstrap, f"{prefixes[name]}.shop.orders") == 7, name

            fresh = api.call("GET", "/api/v2/pools/mongocdc_fresh").json()
            assert fresh["slots"] == 1, fresh
            assert fresh["description"] == (
                "MongoDB CDC connector fresh: one snapshot or window at a time"
            ), fresh
            sized = api.call("GET", "/api/v2/pools/mongocdc_sized").json()
            assert (sized["slots"], sized["description"]) == (3, "sized by the user"), sized
            created = [
                line
                for line in (home / "scheduler.log").read_text(errors="replace").splitlines()
                if "Created the pool" in line
            ]
            assert len(created) == 1 and "mongocdc_fresh" in created[0], created
        finally:
            stop(stack.processes)


PING_DAG = """
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG

with DAG("ping", schedule=None):
    EmptyOperator(task_id="ping")
"""


def test_pool_deleted_during_a_run_is_created_again_when_another_run_starts(
    airflow_env, kafka_bootstrap, tmp_path_factory
):
    home = tmp_path_factory.mktemp("pooldel")
    prefix = f"again{uuid.uuid4().hex[:6]}"
    connectors = {
        "connectors": [
            {
                "name": "again",
                "schedule": None,
                "config": {"topic.prefix": prefix, "collection.include.list": "shop\\.orders"},
            }
        ]
    }
    folder = dag_folder(home, connectors)
    (folder / "ping.py").write_text(PING_DAG)
    env = own_airflow(airflow_env, home, folder)
    with MongoSim(mode="replset") as sim:
        env.update(
            {
                **connections_env(sim.uri, kafka_bootstrap),
            }
        )
        stack = Stack(sim, "", kafka_bootstrap, env, home)
        stack.client.shop.orders.insert_many([{"_id": i} for i in range(1, 5)])
        try:
            api = start_airflow(stack)
            for dag_id in ("mongocdc_again_hourly", "ping"):
                wait_registered(api, dag_id)
                unpause(api, dag_id)
            # The snapshot's reads of shop.orders are held (20 s each, the simulator's failCommand fail
            # point) until the pool is deleted, so the snapshot cannot end before that.
            stack.client.admin.command(
                "configureFailPoint",
                "failCommand",
                mode="alwaysOn",
                data={
                    "failCommands": ["find"],
                    "namespace": "shop.orders",
                    "blockConnection": True,
                    "blockTimeMS": 20_000,
                },
            )
            run_id = trigger(api, "mongocdc_again_hourly", datetime.now(timezone.utc).isoformat())

            def state(task_id: str) -> str | None:
                path = f"/api/v2/dags/mongocdc_again_hourly/dagRuns/{run_id}/taskInstances/{task_id}"
                return api.call("GET", path).json().get("state")

            # The run started with its pool created; delete the pool while the snapshot runs.
            wait_for(
                "the snapshot did not start",
                lambda: state("snapshot") in ("queued", "running", "success"),
                timeout=QUEUE_TIMEOUT_S,
            )
            assert state("snapshot") != "success", "the snapshot ended before the pool could be deleted"

            def delete_pool() -> bool:
                deleted = api.call("DELETE", "/api/v2/pools/mongocdc_again")
                # 500 "Database error": the API server's SQLite database was busy (the scheduler
                # writes to it); the deletion is asked again.
                assert deleted.status_code in (204, 500), deleted.text
                return deleted.status_code == 204

            wait_for("the pool was not deleted", delete_pool, timeout=120)
            stack.client.admin.command("configureFailPoint", "failCommand", mode="off")
            # The window becomes scheduled in a pool that does not exist; nothing starts a run.
            wait_for(
                "the window did not become scheduled after the snapshot",
                lambda: state("snapshot") == "success" and state("window") == "scheduled",
                timeout=600,
            )
            assert api.call("GET", "/api/v2/pools/mongocdc_again").status_code == 404

            ping = trigger(api, "ping", datetime.now(timezone.utc).isoformat())
            assert_all_tasks_succeed(api, "ping", ping)
            assert_all_tasks_succeed(api, "mongocdc_again_hourly", run_id)
            pool = api.call("GET", "/api/v2/pools/mongocdc_again").json()
            assert pool.get("slots") == 1, pool
            assert reads(kafka_bootstrap, f"{prefix}.shop.orders") == 4
        finally:
            stop(stack.processes)
