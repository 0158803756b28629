"""An incremental re-snapshot end to end: a real Airflow (api-server, scheduler with LocalExecutor,
dag-processor, all on 127.0.0.1), the MongoDB simulator, the real Kafka broker and spark-submit.

The first ``mongocdc_hourly`` run (triggered as the UI's Trigger button does) snapshots and
streams. Documents then added to a new collection are streamed as inserts; the trigger form of
``mongocdc_resnapshot`` with mode ``incremental`` records the request and ends at once, without
spark-submit. The following ``mongocdc_hourly`` runs copy the collection one chunk per window
(``incremental.snapshot.chunk.size`` 10, ``incremental.snapshot.window.budget.ms`` 1) until the
window's summary says completed: every document then has one read event with ``source.snapshot``
``incremental`` and the state rebuilt from the topics equals MongoDB. Mode ``stop`` with nothing
running reports ``nothing_to_stop``.
"""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import pytest
from bson import json_util

from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    Stack,
    assert_all_tasks_succeed,
    assert_topics_equal_mongo,
    canonical,
    connections_env,
    own_airflow,
    return_value,
    start_airflow,
    stop,
    topic_events,
    unpause,
    wait_registered,
)

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

COLLECTION = "returns"
DOCUMENTS = 35
CHUNK_SIZE = 10
MAX_RUNS = 8


@pytest.fixture(scope="module")
def stack(airflow_env, kafka_bootstrap, tmp_path_factory):
    """The repository's DAG file with the ``default`` connector unscheduled (triggered runs only),
    its configuration in the Variable; no pool set up (the scheduler's pool plugin creates it)."""
    home = tmp_path_factory.mktemp("e2e-incremental")
    # An Airflow home and database of its own: the runs of these DAG ids stay out of the other
    # modules' (they count the re-snapshot runs of the shared database).
    env = own_airflow(airflow_env, home, Path(airflow_env["AIRFLOW__CORE__DAGS_FOLDER"]))
    connectors = home / "connectors.json"
    connectors.write_text(
        json.dumps(
            {
                "connectors": [
                    {
                        "name": "default",
                        "schedule": None,
                        "config_variable": "mongocdc_connector_config",
                        "conn_ids": {
                            "mongo": "mongocdc_default",
                            "kafka": "kafka_default",
                            "spark": "spark_default",
                        },
                    }
                ]
            }
        )
    )
    prefix = f"e2einc{uuid.uuid4().hex[:8]}"
    props = {
        "topic.prefix": prefix,
        "collection.include.list": "shop\\..*",
        "incremental.snapshot.chunk.size": CHUNK_SIZE,
        "incremental.snapshot.window.budget.ms": 1,
    }
    with MongoSim(mode="replset") as sim:
        env.update(
            {
                **connections_env(sim.uri, kafka_bootstrap),
                "AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG": json.dumps(props),
                "MONGOCDC_POOL": f"mongocdc_{prefix}",
                "MONGOCDC_CONNECTORS_FILE": str(connectors),
            }
        )
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        try:
            yield stack
        finally:
            stop(stack.processes)


def trigger(api, dag_id: str, conf: dict | None = None) -> str:
    """A run created as the UI's trigger form posts it: a logical date of now, the form's conf."""
    created = api.call(
        "POST",
        f"/api/v2/dags/{dag_id}/dagRuns",
        json={"logical_date": datetime.now(timezone.utc).isoformat(), "conf": conf or {}, "note": None},
    )
    assert created.status_code == 200, created.text
    return created.json()["dag_run_id"]


def form(mode: str, collections: list[str] | None = None, reason: str | None = None) -> dict:
    """The re-snapshot trigger form's conf: every field of the form, empty ones as null."""
    return {"mode": mode, "collections": collections, "filters": None, "reason": reason}


def test_incremental_resnapshot_is_copied_one_chunk_per_hourly_window(stack):
    client = stack.client
    client.shop.orders.insert_many([{"_id": i, "status": "new"} for i in range(1, 13)])
    api = start_airflow(stack)
    for dag_id in ("mongocdc_hourly", "mongocdc_resnapshot"):
        wait_registered(api, dag_id)
        unpause(api, dag_id)

    # The first run: snapshot and window.
    first = trigger(api, "mongocdc_hourly")
    assert_all_tasks_succeed(api, "mongocdc_hourly", first)
    assert stack.offsets().snapshot.status == "completed"
    assert_topics_equal_mongo(stack, ["orders"])

    # A new collection after the snapshot: its inserts are streamed, no read event of it yet.
    returns = client.shop[COLLECTION]
    returns.insert_many(
        [{"_id": i if i % 2 else f"r{i:03d}", "qty": i, "reason": "damaged"} for i in range(DOCUMENTS)]
    )
    returns.update_one({"_id": 1}, {"$set": {"qty": 100}})

    # The trigger form, mode incremental: recorded, returns at once without spark-submit.
    requested = trigger(api, "mongocdc_resnapshot", form("incremental", [f"shop.{COLLECTION}"], "e2e"))
    assert_all_tasks_succeed(api, "mongocdc_resnapshot", requested)
    outcome = return_value(api, "mongocdc_resnapshot", requested, "resnapshot")
    assert outcome["status"] == "requested", outcome
    request_id = outcome["incremental_snapshot"]["id"]
    assert outcome["incremental_snapshot"]["collections"] == [f"shop.{COLLECTION}"], outcome
    assert outcome["resnapshot"]["reason"] == "e2e", outcome

    # The hourly windows copy the collection, one chunk each, until completed.
    progress: list[dict] = []
    for _ in range(MAX_RUNS):
        run_id = trigger(api, "mongocdc_hourly")
        assert_all_tasks_succeed(api, "mongocdc_hourly", run_id)
        incremental = return_value(api, "mongocdc_hourly", run_id, "window")["incremental_snapshot"]
        assert incremental and incremental["id"] == request_id, incremental
        progress.append(incremental)
        assert incremental["chunks"] <= 1 and incremental["documents"] <= CHUNK_SIZE, (
            f"a window copied more than one chunk with a 1 ms budget: {progress}"
        )
        if incremental["status"] == "completed":
            break
    print(
        f"incremental snapshot per window: {[(p['chunks'], p['documents'], p['status']) for p in progress]}"
    )
    assert progress[-1]["status"] == "completed", f"not completed after {MAX_RUNS} hourly runs: {progress}"
    assert progress[-1]["total_documents"] == DOCUMENTS, progress
    assert len(progress) >= DOCUMENTS // CHUNK_SIZE, progress

    # Every document has exactly one read event of the incremental snapshot; state equals MongoDB.
    reads = [
        (key, value)
        for key, value in topic_events(stack.bootstrap, f"{stack.prefix}.shop.{COLLECTION}")
        if value is not None and value["op"] == "r"
    ]
    assert {value["source"]["snapshot"] for _, value in reads} == {"incremental"}, reads[:3]
    keys = Counter(canonical(json_util.loads(key["id"])) for key, _ in reads)
    assert set(keys.values()) == {1}, [key for key, count in keys.items() if count > 1]
    assert set(keys) == {canonical(document["_id"]) for document in returns.find()}
    assert_topics_equal_mongo(stack, ["orders", COLLECTION])
    state = stack.offsets()
    assert state.incremental["id"] == request_id and state.incremental["status"] == "completed", state

    # Mode stop with nothing running: nothing to stop, and the run succeeds.
    stopped = trigger(api, "mongocdc_resnapshot", form("stop"))
    assert_all_tasks_succeed(api, "mongocdc_resnapshot", stopped)
    outcome = return_value(api, "mongocdc_resnapshot", stopped, "resnapshot")
    assert outcome["status"] == "nothing_to_stop", outcome
