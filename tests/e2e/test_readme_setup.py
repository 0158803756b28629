"""The README's setup, run as written, and a connector list with several connectors.

1. The commands between ``<!-- setup:start -->`` and ``<!-- setup:end -->`` in README.md run
   against a real Airflow (api-server, scheduler with LocalExecutor, dag-processor, all on
   127.0.0.1) with the MongoDB simulator and the real Kafka broker; the only substitutions are the
   README's example MongoDB URI, Kafka servers and topic prefix. The hourly DAG is then triggered
   as the UI's Trigger button does (POST /api/v2/dags/{id}/dagRuns with a logical date and the
   form's conf) and every task succeeds in the connector's pool, which the scheduler created with one
   slot (the setup creates none); then the re-snapshot DAG with
   the form as it opens (empty conf) succeeds, while a collection without its database is refused
   by the trigger request itself (400 naming it, no run). A second DAG file with a connector list
   holding two invalid entries gives no import error: its valid connector's DAGs are listed and
   active (``is_stale`` false in ``GET /api/v2/dags``), and each invalid entry is a DAG of its own
   whose name and description name the entry and the fix and whose one run fails with that message.
2. Two connectors of one list run in ``airflow dags test`` with their own topics and offsets
   (their pools: tests/unit/test_connector_dags.py).
"""

from __future__ import annotations

import json
import shlex
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    RUN_TIMEOUT_S,
    Stack,
    assert_all_tasks_succeed,
    connections_env,
    dag_folder,
    own_airflow,
    reads,
    start_airflow,
    stop,
    trigger,
    wait_for,
)
from tests.readme_commands import README_KAFKA, README_MONGO_URI, README_PREFIX, setup_commands, substitute

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

# The one task of an invalid connector entry's DAG.
TASK = "invalid_connector_entry"


# -- 1: the README's setup -----------------------------------------------------------------------------
def test_readme_setup_then_ui_triggers_of_hourly_and_resnapshot_succeed(
    airflow_env, kafka_bootstrap, tmp_path_factory
):
    home = tmp_path_factory.mktemp("readme")
    folder = dag_folder(home)
    # A second list in its own DAG file: one valid connector and one invalid entry.
    side = f"side{uuid.uuid4().hex[:6]}"
    (folder / "side_connectors.json").write_text(
        json.dumps(
            {
                "connectors": [
                    {"name": "side", "config": {"topic.prefix": side}},
                    {"name": "broken", "config": {"topic.prefix": "broken", "snapshot.mode": "sometimes"}},
                    {"name": "bad-name", "config": {"topic.prefix": "bad"}},
                ]
            }
        )
    )
    (folder / "side_connectors.py").write_text(
        "from pathlib import Path\n\nfrom airflow_provider_mongocdc.connector_dags import connector_dags\n\n"
        'globals().update(connector_dags(path=Path(__file__).with_name("side_connectors.json")))\n'
    )
    env = own_airflow(airflow_env, home, folder)
    prefix = f"readme{uuid.uuid4().hex[:8]}"

    with MongoSim(mode="replset") as sim:
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        try:
            commands = substitute(
                setup_commands(),
                {
                    README_MONGO_URI: sim.uri,
                    README_KAFKA: kafka_bootstrap,
                    README_PREFIX: f'"topic.prefix": "{prefix}"',
                },
            )
            for command in commands:
                stack.airflow(*shlex.split(command)[1:])
            client = stack.client
            client.shop.orders.insert_many([{"_id": i, "status": "new"} for i in range(1, 21)])
            client.shop.customers.insert_many([{"_id": f"c{i}", "name": f"c {i}"} for i in range(1, 6)])

            api = start_airflow(stack)

            def dag_loaded(dag_id: str):
                return api.call("GET", f"/api/v2/dags/{dag_id}").status_code == 200

            def listed_dags() -> dict[str, dict]:
                # The UI's DAG list: GET /api/v2/dags leaves stale DAGs out.
                response = api.call("GET", "/api/v2/dags", params={"limit": 100})
                assert response.status_code == 200, response.text
                return {dag["dag_id"]: dag for dag in response.json()["dags"]}

            wait_for(
                "the dag-processor did not register mongocdc_hourly", lambda: dag_loaded("mongocdc_hourly")
            )

            # The invalid entries hide nothing: once side_connectors.py is parsed (an import error
            # or its DAGs), there is no import error, the valid connector's DAGs are listed and
            # active, and each invalid entry is a DAG that names it and the fix.
            def side_parsed():
                errors = api.call("GET", "/api/v2/importErrors").json()["import_errors"]
                return [e for e in errors if e["filename"].endswith("side_connectors.py")] or any(
                    dag["fileloc"].endswith("side_connectors.py") for dag in listed_dags().values()
                )

            wait_for("side_connectors.py was not parsed", side_parsed)
            listed = listed_dags()
            for kind in ("hourly", "resnapshot", "watchdog"):
                dag_id = f"mongocdc_side_{kind}"
                assert dag_id in listed and listed[dag_id]["is_stale"] is False, (dag_id, sorted(listed))
            errors = api.call("GET", "/api/v2/importErrors").json()["import_errors"]
            assert errors == [], errors
            invalid = {
                "mongocdc_invalid_broken": ("connector entry #2 ('broken')", "snapshot.mode"),
                "mongocdc_invalid_bad-name": ("connector entry #3 ('bad-name')", "letters, digits and _"),
            }
            for dag_id, words in invalid.items():
                dag = listed.get(dag_id)
                assert dag is not None and dag["is_stale"] is False, (dag_id, sorted(listed))
                assert words[0] in dag["dag_display_name"], dag
                assert all(word in dag["description"] for word in words), dag
                assert "side_connectors.json" in dag["description"], dag
            # Each runs once, by itself, and fails with the message in its task log.
            for dag_id, words in invalid.items():
                (run,) = wait_for(
                    f"no finished run of {dag_id}",
                    lambda dag_id=dag_id: [
                        run
                        for run in api.call("GET", f"/api/v2/dags/{dag_id}/dagRuns").json()["dag_runs"]
                        if run["state"] in ("success", "failed")
                    ],
                    timeout=RUN_TIMEOUT_S,
                )
                assert run["state"] == "failed", run

                # The log file may still be completing when the run shows failed: wait for the words.
                instance_path = f"/api/v2/dags/{dag_id}/dagRuns/{run['dag_run_id']}/taskInstances/{TASK}"
                deadline = time.monotonic() + 120
                while True:
                    instance = api.call("GET", instance_path).json()
                    log = api.task_log(dag_id, run["dag_run_id"], TASK, instance["try_number"])
                    if all(word in log for word in (*words, "side_connectors.json")):
                        break
                    assert time.monotonic() < deadline, (instance, log)
                    time.sleep(2)

            # The UI: switch the DAG on, press Trigger (a logical date, the form's conf).
            for dag_id in ("mongocdc_hourly", "mongocdc_resnapshot"):
                patched = api.call("PATCH", f"/api/v2/dags/{dag_id}", json={"is_paused": False})
                assert patched.status_code == 200, patched.text
            hourly = trigger(api, "mongocdc_hourly", datetime.now(timezone.utc).isoformat())
            assert_all_tasks_succeed(api, "mongocdc_hourly", hourly)
            # The setup creates no pool: the scheduler's pool plugin created it, with one slot.
            pool = api.call("GET", "/api/v2/pools/mongocdc_default").json()
            assert pool.get("slots") == 1, pool
            assert reads(kafka_bootstrap, f"{prefix}.shop.orders") == 20
            assert reads(kafka_bootstrap, f"{prefix}.shop.customers") == 5

            # A collection without its database: the trigger request is refused in words (the
            # trigger form shows the answer's detail) and no run is created.
            runs_before = api.call("GET", "/api/v2/dags/mongocdc_resnapshot/dagRuns").json()["total_entries"]
            refused = api.call(
                "POST",
                "/api/v2/dags/mongocdc_resnapshot/dagRuns",
                json={"logical_date": None, "conf": {"collections": ["shop.customers", "orders"]}},
            )
            assert refused.status_code == 400, refused.text
            detail = refused.json()["detail"]
            assert "`orders`" in detail and "<database>.<collection>" in detail, detail
            assert "e.g. shop.orders" in detail, detail
            runs_after = api.call("GET", "/api/v2/dags/mongocdc_resnapshot/dagRuns").json()["total_entries"]
            assert runs_after == runs_before

            # The re-snapshot form as it opens: empty conf.
            resnapshot = trigger(api, "mongocdc_resnapshot", datetime.now(timezone.utc).isoformat())
            assert_all_tasks_succeed(api, "mongocdc_resnapshot", resnapshot)
            assert reads(kafka_bootstrap, f"{prefix}.shop.orders") == 40
            assert reads(kafka_bootstrap, f"{prefix}.shop.customers") == 10
        finally:
            stop(stack.processes)


# -- 2: two connectors of one list -------------------------------------------------------------------
def test_two_connectors_of_one_list_run_with_their_own_topics_and_offsets(
    airflow_env, kafka_bootstrap, tmp_path_factory
):
    home = tmp_path_factory.mktemp("two")
    run = uuid.uuid4().hex[:6]
    prefixes = {"alpha": f"alpha{run}", "beta": f"beta{run}"}
    collections = {"alpha": "orders", "beta": "customers"}
    connectors = {
        "connectors": [
            {
                "name": name,
                "config": {
                    "topic.prefix": prefixes[name],
                    "collection.include.list": f"shop\\.{collections[name]}",
                },
            }
            for name in ("alpha", "beta")
        ]
    }
    env = own_airflow(airflow_env, home, dag_folder(home, connectors))
    with MongoSim(mode="replset") as sim:
        env.update(connections_env(sim.uri, kafka_bootstrap))
        stack = Stack(sim, "", kafka_bootstrap, env, home)
        client = stack.client
        client.shop.orders.insert_many([{"_id": i} for i in range(1, 8)])
        client.shop.customers.insert_many([{"_id": i} for i in range(1, 4)])
        # Runs whose data interval ends in the future: each window ends now, after its snapshot.
        # (At least an hour ahead, whenever the clock's hour turns during the test: a run whose
        # interval ended before its snapshot finished would have no window to run.)
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        for name in ("alpha", "beta"):
            stack.airflow("dags", "test", f"mongocdc_{name}_hourly", (hour + timedelta(hours=2)).isoformat())

        for name, prefix in prefixes.items():
            store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{prefix}.offsets")
            state = store.read(OffsetPartition(prefix, "rs0"))
            assert state.snapshot.status == "completed" and state.windows == 1, (name, state)
        assert reads(kafka_bootstrap, f"{prefixes['alpha']}.shop.orders") == 7
        assert reads(kafka_bootstrap, f"{prefixes['beta']}.shop.customers") == 3
        # Each connector reads only its collection: no topic of the other's collection.
        assert reads(kafka_bootstrap, f"{prefixes['alpha']}.shop.customers") == 0
        assert reads(kafka_bootstrap, f"{prefixes['beta']}.shop.orders") == 0
