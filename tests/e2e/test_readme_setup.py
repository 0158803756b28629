"""The README's setup, run as written, and a connector list with several connectors.

1. The commands between ``<!-- setup:start -->`` and ``<!-- setup:end -->`` in README.md run
   against a real Airflow (api-server, scheduler with LocalExecutor, dag-processor, all on
   127.0.0.1) with the MongoDB simulator and the real Kafka broker; the only substitutions are the
   README's example MongoDB URI, Kafka servers and topic prefix. The hourly DAG is then triggered
   as the UI's Trigger button does (POST /api/v2/dags/{id}/dagRuns with a logical date and the
   form's conf) and every task succeeds in the connector's pool, which the scheduler created with one
   slot (the setup creates none); then the re-snapshot DAG with
   the form as it opens (empty conf) succeeds. A second DAG file with a connector list holding one
   invalid entry shows one import error naming it (/api/v2/importErrors) while its valid
   connector's DAGs are registered.
2. Two connectors of one list run in ``airflow dags test`` with their own topics and offsets
   (their pools: tests/unit/test_connector_dags.py).
"""

from __future__ import annotations

import json
import shlex
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    README_KAFKA,
    README_MONGO_URI,
    README_PREFIX,
    Stack,
    assert_all_tasks_succeed,
    connections_env,
    dag_folder,
    own_airflow,
    readme_setup_commands,
    reads,
    start_airflow,
    stop,
    substitute,
    trigger,
    wait_for,
)

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]


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
                ]
            }
        )
    )
    (folder / "side_connectors.py").write_text(
        "from pathlib import Path\n\nfrom airflow_provider_mongocdc.dags import connector_dags\n\n"
        'globals().update(connector_dags(path=Path(__file__).with_name("side_connectors.json")))\n'
    )
    env = own_airflow(airflow_env, home, folder)
    prefix = f"readme{uuid.uuid4().hex[:8]}"

    with MongoSim(mode="replset") as sim:
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        try:
            commands = substitute(
                readme_setup_commands(),
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

            wait_for(
                "the dag-processor did not register mongocdc_hourly", lambda: dag_loaded("mongocdc_hourly")
            )

            # The invalid entry: one import error, naming it; the valid connector of that list loads.
            def side_errors():
                errors = api.call("GET", "/api/v2/importErrors").json()["import_errors"]
                return [error for error in errors if error["filename"].endswith("side_connectors.py")]

            (error,) = wait_for("no import error for side_connectors.py", side_errors)
            assert "connector entry #2 ('broken')" in error["stack_trace"], error["stack_trace"]
            assert "snapshot.mode" in error["stack_trace"]
            wait_for("mongocdc_side_hourly was not registered", lambda: dag_loaded("mongocdc_side_hourly"))
            all_errors = api.call("GET", "/api/v2/importErrors").json()["import_errors"]
            assert [e["filename"] for e in all_errors] == [error["filename"]], all_errors

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
        hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)
        for name in ("alpha", "beta"):
            stack.airflow("dags", "test", f"mongocdc_{name}_hourly", (hour + timedelta(hours=1)).isoformat())

        for name, prefix in prefixes.items():
            store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{prefix}.offsets")
            state = store.read(OffsetPartition(prefix, "rs0"))
            assert state.snapshot.status == "completed" and state.windows == 1, (name, state)
        assert reads(kafka_bootstrap, f"{prefixes['alpha']}.shop.orders") == 7
        assert reads(kafka_bootstrap, f"{prefixes['beta']}.shop.customers") == 3
        # Each connector reads only its collection: no topic of the other's collection.
        assert reads(kafka_bootstrap, f"{prefixes['alpha']}.shop.customers") == 0
        assert reads(kafka_bootstrap, f"{prefixes['beta']}.shop.orders") == 0
