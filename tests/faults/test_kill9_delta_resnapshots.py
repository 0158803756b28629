"""kill -9 of the Delta apply at random points while it applies re-snapshots: a gap re-snapshot
(documents deleted while the history was lost) and an incremental re-snapshot whose chunks lose
reads to changes (DBLog's rule), completed in a later apply run; between them transactions that
begin with a delete, applied in batches smaller than the backlog.

Each trial (seeded; odd trials take ``capture.mode=change_streams``, open windows for the last
stage, spark-submit with Spark tasks for its last apply, and Iceberg tables) writes its own connector's topic in three stages, each followed by applies of
the application process in driver mode that are killed after a random delay and a run that
finishes. Then the table, read by deltalake's own reader, equals MongoDB; every commit starts where
the one before ended; and each MongoDB transaction lies within one commit (the commits' recorded
offset ranges against the transactions' offsets in the topic).
"""

from __future__ import annotations

import json
import random
import time
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.faults import support
from tests.faults.test_kill9_delta import start_apply
from tests.integration.delta_helpers import (
    apply_commits,
    connector,
    mongo_documents,
    snapshot,
    table_documents,
    window,
)
from tests.integration.test_delta_apply_rules import topic_records
from tests.integration.window_helpers import end_after_insert, seed_offset
from tests.spark_submit import run_app

pytestmark = pytest.mark.faults

DOCUMENTS = 160
CHUNK = 40


def _window_to(uri: str, kafka: dict, props: dict, end) -> dict:
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    return run_window(target, config, kafka, WindowParams(datetime.fromtimestamp(end.time, timezone.utc)))


def _open_window(uri: str, kafka: dict, props: dict) -> dict:
    """An open window: it streams what changed, commits every 0.3 s, and closes after 1.5 s
    without a change (then its incremental snapshot phase runs)."""
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    params = WindowParams(
        datetime.now(timezone.utc), idle_timeout_s=60, commit_interval_s=0.3, open_idle_s=1.5, max_open_s=120
    )
    return run_window(target, config, kafka, params)


def _transactions(client: MongoClient, items, rng: random.Random, first_id: int, count: int) -> None:
    """Transactions that begin with a delete (whose tombstone carries no transaction), between
    plain changes."""
    for n in range(count):
        victim = rng.randrange(DOCUMENTS)
        with client.start_session() as session, session.start_transaction():
            items.delete_one({"_id": victim}, session=session)
            items.update_one({"_id": rng.randrange(DOCUMENTS)}, {"$inc": {"v": 1000}}, session=session)
            items.insert_one({"_id": first_id + n, "t": n}, session=session)
        items.update_one({"_id": rng.randrange(DOCUMENTS)}, {"$inc": {"v": 1}})


def _changes(items, rng: random.Random, count: int) -> None:
    for n in range(count):
        key = rng.randrange(DOCUMENTS + 40)
        kind = rng.random()
        if kind < 0.55:
            items.update_one({"_id": key}, {"$inc": {"v": 1}})
        elif kind < 0.7:
            items.replace_one({"_id": key}, {"v": -1, "replaced": n})
        elif kind < 0.85:
            items.delete_one({"_id": key})
        else:
            items.update_one({"_id": key}, {"$set": {"v": n}}, upsert=True)


def _applies(spec_path, tmp, rng: random.Random, stage: str, spark_submit: str | None = None) -> None:
    """The apply killed once after a random delay (if still running), then a run to its end: the
    application process in driver mode, or with ``spark_submit`` the application under spark-submit
    with one Spark task per table."""
    log_path = tmp / "apply.log"
    process = start_apply(spec_path, tmp / f"result-{stage}-killed.json", log_path)
    time.sleep(rng.uniform(0.5, 4.0))
    if process.poll() is None:
        process.kill()
    process.wait(timeout=60)
    result_path = tmp / f"result-{stage}.json"
    if spark_submit is not None:
        spec = JobSpec.read(spec_path)
        tasks = JobSpec(
            spec.application, spec.connector, spec.mongo, spec.kafka, {**spec.params, "in_driver": False}
        )
        in_tasks = tasks.write(tmp / f"spec-{stage}-tasks.json")
        run = run_app(spark_submit, "delta_apply", in_tasks, result_path, timeout=support.RUN_TIMEOUT_S)
        assert run.summary["tables"], run.describe()
        return
    final = start_apply(spec_path, result_path, log_path)
    assert final.wait(timeout=support.RUN_TIMEOUT_S) == 0, log_path.read_text()[-4000:]
    assert read_result(result_path)["status"] == "ok"


@pytest.mark.parametrize("seed", support.trial_params())
def test_kill9_of_the_apply_during_re_snapshots_leaves_the_table_equal_to_mongodb(
    seed, mongodb_uri, kafka_bootstrap, tmp_path, spark_submit
):
    rng = random.Random(seed)
    # Odd trials: capture.mode=change_streams (updates carry no document), the last stage's windows
    # open ones, its last apply under spark-submit in Spark tasks, and Iceberg tables.
    odd = seed % 2 == 1
    capture_mode = "change_streams" if odd else "change_streams_update_full"
    name = f"kill9resnap_{seed}_{random.randrange(1 << 30):x}"
    database, marker_db = f"{name}_db", f"{name}_m"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(DOCUMENTS)])
    props = connector(
        name,
        database,
        **{
            "capture.mode": capture_mode,
            "incremental.snapshot.chunk.size": CHUNK,
            "incremental.snapshot.window.max.documents": CHUNK,
        },
    )
    tables = {
        "format": "iceberg" if odd else "delta",
        "location": str(tmp_path / "lake"),
        "max_batch_events": 25,
        "compact_every": "0s",
    }
    spec = JobSpec("delta_apply", props, {}, kafka, {"tables": tables, "in_driver": True})
    spec_path = spec.write(tmp_path / "spec.json")
    table = tmp_path / "lake" / database / "items"

    # Stage 1: the snapshot, changes and transactions; then a gap: documents deleted while the
    # history is lost, and a blocking re-snapshot from the current position.
    snapshot(mongodb_uri, kafka, props)
    _changes(items, rng, 80)
    _transactions(client, items, rng, 10_000, 6)
    window(mongodb_uri, kafka, props, marker_db)
    items.delete_many({"_id": {"$in": rng.sample(range(DOCUMENTS), 12)}})
    snapshot(mongodb_uri, kafka, props, force=True, reset_offset=True)
    _changes(items, rng, 40)
    window(mongodb_uri, kafka, props, marker_db)
    _applies(spec_path, tmp_path, rng, "gap")

    # Stage 2: more documents deleted while the history is lost, an incremental re-snapshot whose
    # first chunk loses every read to changes, and its first window.
    items.delete_many({"_id": {"$in": rng.sample(range(CHUNK, DOCUMENTS), 8)}})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    request = IncrementalRequest.new([f"{database}.items"])
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())
    end = end_after_insert(client[marker_db]["markers"], {"at": 0}, marker_db)
    items.update_many({"_id": {"$lt": CHUNK}}, {"$inc": {"v": 1}})
    first = _window_to(mongodb_uri, kafka, props, end)
    assert first["incremental_snapshot"]["dropped"] >= CHUNK // 2, first["incremental_snapshot"]
    _applies(spec_path, tmp_path, rng, "incremental")

    # Stage 3: the other chunks, with changes and transactions between them, until it completes.
    for attempt in range(20):
        _changes(items, rng, 10)
        _transactions(client, items, rng, 20_000 + attempt * 10, 2)
        if odd:
            summary = _open_window(mongodb_uri, kafka, props)
            assert summary["stop_reason"] == "idle", summary
        else:
            summary = window(mongodb_uri, kafka, props, marker_db)
        if summary["incremental_snapshot"]["status"] == "completed":
            break
    assert summary["incremental_snapshot"]["status"] == "completed", summary["incremental_snapshot"]
    _applies(spec_path, tmp_path, rng, "completion", spark_submit if odd else None)

    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    commits = apply_commits(table)
    previous = {partition: 0 for partition in commits[0]["mongocdc.from"]}
    for commit in commits:
        assert commit["mongocdc.from"] == previous, (
            f"a commit did not continue where the last ended: {commits}"
        )
        previous = commit["mongocdc.positions"]
    spans = [range(commit["mongocdc.from"]["0"], commit["mongocdc.positions"]["0"]) for commit in commits]
    transactions: dict[str, set[int]] = {}
    txn = None
    for offset, _key, value in topic_records(kafka_bootstrap, f"{name}.{database}.items"):
        if value is not None:  # else a tombstone: of the delete before it
            source = json.loads(value)["payload"]["source"]
            txn = f"{source['lsid']}:{source['txnNumber']}" if source.get("lsid") else None
        if txn is not None:
            transactions.setdefault(txn, set()).add(offset)
    assert len(transactions) >= 10, transactions
    for txn, offsets in transactions.items():
        holding = {index for index, span in enumerate(spans) for offset in offsets if offset in span}
        assert len(holding) == 1, f"transaction {txn} (offsets {sorted(offsets)}) in commits {holding}"
