"""kill -9 of the table apply at random points, then runs to completion: the table (Delta in even
trials, Iceberg in odd ones) equals MongoDB and nothing was applied twice.

The apply runs as its application process in driver mode (what the operator runs on a ``local[...]``
master, without the Spark JVM), in batches of 40 events, so a run makes some 60 commits; each trial
(seeded) kills it up to three times after random delays over the run's span (reading the topic,
building a batch, inside delta-rs while it writes files or the commit, between commits, the
compaction at the end), then lets a run finish. Every commit of the table must start exactly where
the one before ended (its recorded ``mongocdc.from`` is the previous commit's positions), so no
record is applied twice or skipped, and the table must equal MongoDB.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.operators.base import application_path
from tests.faults import support
from tests.integration.delta_helpers import (
    FORMATS,
    apply_commits,
    connector,
    mongo_documents,
    snapshot,
    table_documents,
    window,
)

pytestmark = pytest.mark.faults


@pytest.fixture(scope="module")
def changed_topic(mongodb_uri, kafka_bootstrap, tmp_path_factory):
    """A collection snapshotted and then changed (updates, replaces, deletes, inserts and
    transactions), its topic written by a snapshot and a window; shared by the trials."""
    name = f"kill9delta_{random.randrange(1 << 30):x}"
    database = f"{name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0, "tags": ["a"] * (n % 3)} for n in range(1500)])
    props = connector(name, database)
    snapshot(mongodb_uri, kafka, props)
    rng = random.Random(7)
    for n in range(600):
        key = rng.randrange(1700)
        kind = rng.random()
        if kind < 0.5:
            items.update_one({"_id": key}, {"$inc": {"v": 1}})
        elif kind < 0.65:
            items.replace_one({"_id": key}, {"v": -1, "replaced": n})
        elif kind < 0.8:
            items.delete_one({"_id": key})
        else:
            items.update_one({"_id": key}, {"$set": {"v": n}}, upsert=True)
    for n in range(20):
        with client.start_session() as session, session.start_transaction():
            items.insert_one({"_id": 10_000 + n, "t": n}, session=session)
            items.delete_one({"_id": n * 3}, session=session)
            items.update_one({"_id": n * 3 + 1}, {"$set": {"t": n}}, session=session)
    window(mongodb_uri, kafka, props, f"{name}_markers")
    return {
        "uri": mongodb_uri,
        "kafka": kafka,
        "props": props,
        "database": database,
        "tmp": tmp_path_factory.mktemp("kill9delta"),
    }


def start_apply(spec_path, result_path, log_path) -> subprocess.Popen:
    with open(log_path, "a") as log:
        return subprocess.Popen(
            [
                sys.executable,
                application_path("delta_apply"),
                "--job-spec",
                str(spec_path),
                "--result",
                str(result_path),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.mark.parametrize("seed", support.trial_params())
def test_kill9_of_the_apply_leaves_the_table_equal_to_mongodb_with_nothing_applied_twice(changed_topic, seed):
    data = changed_topic
    table_format = FORMATS[seed % 2]  # the trials alternate between Delta and Iceberg tables
    rng = random.Random(seed)
    lake = data["tmp"] / f"lake-{seed}-{table_format}"
    tables = {
        "format": table_format,
        "location": str(lake),
        "max_batch_events": 40,
        "compact_every": "0s",
        "vacuum_every": None,
    }
    spec = JobSpec("delta_apply", data["props"], {}, data["kafka"], {"tables": tables, "in_driver": True})
    spec_path = spec.write(data["tmp"] / f"spec-{seed}-{table_format}.json")
    log_path = data["tmp"] / f"apply-{seed}-{table_format}.log"
    table = lake / data["database"] / "items"

    # A calibration run of this trial's size is not needed: the delays spread over a few seconds,
    # the time a run of some 60 commits takes on a loaded machine (the last kills land late, or
    # after the run ended, which the trial then sees as a clean finish).
    kills = 0
    for attempt in range(3):
        result_path = data["tmp"] / f"result-{seed}-{table_format}-{attempt}.json"
        process = start_apply(spec_path, result_path, log_path)
        time.sleep(rng.uniform(0.8, 6.0))
        if process.poll() is None:
            process.kill()
            kills += 1
        process.wait(timeout=60)
    result_path = data["tmp"] / f"result-{seed}-{table_format}-final.json"
    final = start_apply(spec_path, result_path, log_path)
    assert final.wait(timeout=support.RUN_TIMEOUT_S) == 0, log_path.read_text()[-4000:]
    assert read_result(result_path)["status"] == "ok"

    assert table_documents(table) == mongo_documents(data["uri"], data["database"], "items")
    commits = apply_commits(table)
    previous = {partition: 0 for partition in commits[0]["mongocdc.from"]}
    for commit in commits:
        assert commit["mongocdc.from"] == previous, (
            f"a commit did not continue where the last ended: {commits}"
        )
        previous = commit["mongocdc.positions"]
    assert len(commits) > 10, len(commits)  # the kills fell among many commits
