"""The example DAGs end to end: real Airflow runs, the real Kafka broker, the MongoDB simulator and
spark-submit.

1. ``airflow dags test mongocdc_hourly``: the first run snapshots, then the windows stream the
   changes; the state rebuilt from the topics equals the collections.
2. The simulator's oplog retention drops the stored position; ``airflow dags test
   mongocdc_watchdog`` finds the gap on its first poke and triggers ``mongocdc_resnapshot`` with the
   gap report. An Airflow API server, scheduler (LocalExecutor) and DAG processor, all on
   127.0.0.1, then run that re-snapshot, and a second one created through the REST API with conf,
   exactly as the UI's trigger form posts it; the second runs with those params.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import datetime, timedelta, timezone

import pytest

from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    Stack,
    assert_topics_equal_mongo,
    connections_env,
    read_events,
    start_airflow,
    stop,
    topic_events,
)

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]


# -- the stack ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def stack(airflow_env, kafka_bootstrap, tmp_path_factory):
    home = tmp_path_factory.mktemp("e2e")
    spark_conf = home / "spark-conf"
    spark_conf.mkdir()
    (spark_conf / "spark-defaults.conf").write_text("spark.ui.enabled false\n")
    prefix = f"e2e{uuid.uuid4().hex[:8]}"
    props = {"topic.prefix": prefix, "collection.include.list": "shop\\..*"}
    with MongoSim(mode="replset") as sim:
        env = dict(airflow_env)
        env.update(
            {
                **connections_env(sim.uri, kafka_bootstrap),
                "AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG": json.dumps(props),
                "MONGOCDC_POOL": f"mongocdc_{prefix}",
                "SPARK_CONF_DIR": str(spark_conf),
            }
        )
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        stack.airflow("pools", "set", f"mongocdc_{prefix}", "1", f"MongoDB CDC connector {prefix}")
        try:
            yield stack
        finally:
            stop(stack.processes)


# -- 1: hourly ---------------------------------------------------------------------------------------
def test_first_hourly_run_snapshots_then_windows_stream(stack):
    client = stack.client
    client.shop.orders.insert_many([{"_id": i, "status": "new", "total": i * 10} for i in range(1, 31)])
    client.shop.customers.insert_many([{"_id": f"c{i}", "name": f"customer {i}"} for i in range(1, 11)])
    hour = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0)

    # A run whose data interval ends in the future: its window ends now. (At least an hour ahead,
    # whenever the clock's hour turns during the test: a run whose interval ended before its
    # snapshot finished would have no window to run.)
    stack.airflow("dags", "test", "mongocdc_hourly", (hour + timedelta(hours=2)).isoformat())
    state = stack.offsets()
    assert state.snapshot.status == "completed" and state.windows == 1
    assert read_events(stack, "orders") == 30 and read_events(stack, "customers") == 10
    assert_topics_equal_mongo(stack)

    client.shop.orders.insert_one({"_id": 31, "status": "new", "total": 310})
    client.shop.orders.update_one({"_id": 1}, {"$set": {"status": "paid"}})
    client.shop.orders.delete_one({"_id": 2})
    with client.start_session() as session:
        client.shop.customers.update_one({"_id": "c1"}, {"$set": {"name": "renamed"}}, session=session)
        last_change = session.operation_time
    # The window ends at the whole second of its start: wait until that lies past the changes.
    deadline = time.monotonic() + 120
    while time.time() < last_change.time + 1:
        assert time.monotonic() < deadline, f"the clock did not pass {last_change} within 120 s"
        time.sleep(0.05)
    stack.airflow("dags", "test", "mongocdc_hourly", (hour + timedelta(hours=3)).isoformat())

    after = stack.offsets()
    assert after.windows == 2 and after.events - state.events == 4  # c, u, d (and a tombstone), u
    assert after.snapshot.snapshot_id == state.snapshot.snapshot_id  # no snapshot needed this time
    assert read_events(stack, "orders") == 30
    ops = [value["op"] for _, value in topic_events(stack.bootstrap, f"{stack.prefix}.shop.orders") if value]
    assert ops[30:] == ["c", "u", "d"]
    assert_topics_equal_mongo(stack)


# -- 2: gap, watchdog, re-snapshot, REST API -----------------------------------------------------------
def test_watchdog_finds_the_gap_and_resnapshots_then_rest_api_params_are_used(stack):
    client = stack.client
    assert stack.offsets() is not None, "needs the offsets of the hourly runs (previous test)"
    # Changes that the purge takes out of the oplog before any window reads them.
    client.shop.orders.insert_many([{"_id": 100 + i, "status": "late"} for i in range(5)])
    client.shop.orders.update_one({"_id": 3}, {"$set": {"status": "shipped"}})
    client.shop.customers.insert_one({"_id": "c99", "name": "late customer"})
    stack.sim.set_oplog_retention(max_entries=3)
    # The purge is done; from now on the oplog keeps what is written, so the server's periodic
    # no-op writes (one per 10 s idle) cannot purge the re-snapshot's own position later on.
    stack.sim.set_oplog_retention(max_entries=None)

    output = stack.airflow("dags", "test", "mongocdc_watchdog")
    # Found on the first poke: one check, and it saw the gap (no earlier "resumable" poke).
    assert output.count("OPLOG GAP") == 1 and "resumable" not in output
    before_resnapshot = stack.offsets()

    api = start_airflow(stack)
    assert api.call("PATCH", "/api/v2/dags/mongocdc_resnapshot", json={"is_paused": False}).status_code == 200

    (watchdog_run,) = api.call("GET", "/api/v2/dags/mongocdc_watchdog/dagRuns").json()["dag_runs"]
    links = api.call(
        "GET",
        f"/api/v2/dags/mongocdc_watchdog/dagRuns/{watchdog_run['dag_run_id']}/taskInstances/detect_gap/links",
    ).json()["extra_links"]
    assert links["Re-snapshot (trigger form)"].endswith("/dags/mongocdc_resnapshot")

    runs = api.call("GET", "/api/v2/dags/mongocdc_resnapshot/dagRuns").json()["dag_runs"]
    (gap_run,) = runs
    assert gap_run["dag_run_id"].startswith(f"gap__{stack.prefix}__rs0-")
    assert gap_run["conf"]["mode"] == "gap" and gap_run["conf"]["gap_report"]["gap_partitions"] == ["rs0"]
    finished = api.wait_run("mongocdc_resnapshot", gap_run["dag_run_id"])
    assert finished["state"] == "success", api.task_log(
        "mongocdc_resnapshot", gap_run["dag_run_id"], "resnapshot"
    )

    repaired = stack.offsets()
    assert repaired.snapshot.snapshot_id != before_resnapshot.snapshot.snapshot_id
    assert repaired.position == repaired.snapshot.start  # the offset moved to the new snapshot's start
    assert_topics_equal_mongo(stack)
    orders_reads, customers_reads = read_events(stack, "orders"), read_events(stack, "customers")

    # The trigger form's path: POST a run with conf.
    conf = {"collections": ["shop.customers"], "reason": "refresh customers", "mode": "manual"}
    created = api.call(
        "POST", "/api/v2/dags/mongocdc_resnapshot/dagRuns", json={"logical_date": None, "conf": conf}
    )
    assert created.status_code == 200, created.text
    run_id = created.json()["dag_run_id"]
    finished = api.wait_run("mongocdc_resnapshot", run_id)
    assert finished["state"] == "success", api.task_log("mongocdc_resnapshot", run_id, "resnapshot")

    xcom = api.call(
        "GET",
        f"/api/v2/dags/mongocdc_resnapshot/dagRuns/{run_id}/taskInstances/resnapshot/"
        "xcomEntries/return_value",
    ).json()["value"]
    summary = xcom if isinstance(xcom, dict) else json.loads(xcom)
    assert summary["resnapshot"]["collections"] == ["shop.customers"]
    assert (
        summary["resnapshot"]["mode"] == "manual" and summary["resnapshot"]["reason"] == "refresh customers"
    )
    assert summary["resnapshot"]["reset_offset"] is False
    assert summary["collections"] == {"shop.customers": client.shop.customers.count_documents({})}
    assert read_events(stack, "customers") == customers_reads + client.shop.customers.count_documents({})
    assert read_events(stack, "orders") == orders_reads
    assert stack.offsets().position == repaired.position  # streaming continues where it was
    assert_topics_equal_mongo(stack)
