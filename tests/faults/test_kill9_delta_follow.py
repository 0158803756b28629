"""kill -9 while an open window's tables follow its topics: of the follower process alone (even
seeds; the window goes on and closes on its idle time), or of the window's whole process group
(odd seeds; the follower dies with it, and the next window continues from the last commit). Then
the apply after the window; the table, read by deltalake's own reader, equals MongoDB, its commits
continue each other, and each MongoDB transaction lies within one commit.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
from pymongo import MongoClient

from tests.faults import support
from tests.integration.delta_helpers import (
    apply,
    apply_commits,
    connector,
    mongo_documents,
    snapshot,
    table_documents,
    window,
)
from tests.integration.test_delta_apply_rules import topic_records
from tests.integration.window_helpers import write_spec
from tests.spark_submit import app_command, submit_env

pytestmark = pytest.mark.faults

BOUND_S = 240.0


def _parent(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _follower_pid(window_pid: int) -> int | None:
    """The follower process under the window's process (by its command line and ancestry)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if b"airflow_provider_mongocdc.spark_apps.delta_follow" not in command:
            continue
        ancestor = int(entry.name)
        for _ in range(10):
            ancestor = _parent(ancestor)
            if ancestor is None or ancestor <= 1:
                break
            if ancestor == window_pid:
                return int(entry.name)
    return None


def _write(client: MongoClient, items, stop: threading.Event, rng: random.Random) -> None:
    """Inserts, updates, deletes and transactions that begin with a delete, until ``stop``."""
    key = 1000
    while not stop.wait(0.05):
        kind = rng.random()
        if kind < 0.5:
            items.insert_one({"_id": key, "v": 0})
            key += 1
        elif kind < 0.8:
            items.update_one({"_id": rng.randrange(60)}, {"$inc": {"v": 1}})
        elif kind < 0.9:
            items.delete_one({"_id": rng.randrange(60)})
        else:
            with client.start_session() as session, session.start_transaction():
                items.delete_one({"_id": rng.randrange(60)}, session=session)
                items.update_one({"_id": rng.randrange(60)}, {"$inc": {"v": 100}}, session=session)
                items.insert_one({"_id": key, "t": 1}, session=session)
                key += 1


@pytest.mark.parametrize("seed", support.trial_params())
def test_kill9_beside_a_followed_open_window_leaves_the_table_equal_to_mongodb(
    seed, mongodb_uri, kafka_bootstrap, unique_name, tmp_path, spark_submit
):
    rng = random.Random(seed)
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(60)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "max_batch_events": 7}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"

    spec, result = write_spec(
        tmp_path,
        "open",
        props,
        mongodb_uri,
        kafka,
        datetime.now(timezone.utc),
        stream_in_driver=True,
        commit_interval_s=0.3,
        open_idle_s=6,
        max_open_s=600,
        follow_delta={"delta": delta, "storage_options": {}, "every": 0.5},
    )
    log = (tmp_path / "window.log").open("w")
    window_process = subprocess.Popen(
        app_command(spark_submit, "stream_window", spec, result),
        env=submit_env(),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    stop = threading.Event()
    writer = threading.Thread(target=_write, args=(client, items, stop, rng), daemon=True)
    writer.start()
    try:
        # Once the follower has applied something of the open window, kill at a random point.
        deadline = time.monotonic() + BOUND_S
        while len(apply_commits(table)) < 2:
            assert window_process.poll() is None, (tmp_path / "window.log").read_text()[-4000:]
            assert time.monotonic() < deadline, "the table did not follow the open window"
            time.sleep(0.3)
        time.sleep(rng.uniform(0.0, 3.0))
        if seed % 2 == 0:
            pid = None
            while pid is None and time.monotonic() < deadline:  # (its start is under way)
                pid = _follower_pid(window_process.pid)
                time.sleep(0.1)
            assert pid is not None, "no follower process found"
            os.kill(pid, signal.SIGKILL)
        else:
            os.killpg(window_process.pid, signal.SIGKILL)
        time.sleep(rng.uniform(0.5, 2.0))  # writes go on after the kill
    except BaseException:
        os.killpg(window_process.pid, signal.SIGKILL)  # no window left behind a failed trial
        raise
    finally:
        stop.set()
        writer.join(timeout=30)
    code = window_process.wait(timeout=BOUND_S)
    if seed % 2 == 0:
        assert code == 0, (tmp_path / "window.log").read_text()[-4000:]
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")  # the next window: the rest
    apply(kafka, props, delta)  # the apply after it

    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    commits = apply_commits(table)
    for before, after in zip(commits, commits[1:]):
        assert after["mongocdc.from"] == before["mongocdc.positions"], commits
    spans = [range(commit["mongocdc.from"]["0"], commit["mongocdc.positions"]["0"]) for commit in commits]
    txn = None
    transactions: dict[str, set[int]] = {}
    for offset, _key, value in topic_records(kafka_bootstrap, f"{unique_name}.{database}.items"):
        if value is not None:
            source = json.loads(value)["payload"]["source"]
            txn = f"{source['lsid']}:{source['txnNumber']}" if source.get("lsid") else None
        if txn is not None:
            transactions.setdefault(txn, set()).add(offset)
    for txn, offsets in transactions.items():
        holding = {index for index, span in enumerate(spans) for offset in offsets if offset in span}
        assert len(holding) == 1, f"transaction {txn} (offsets {sorted(offsets)}) in commits {holding}"
