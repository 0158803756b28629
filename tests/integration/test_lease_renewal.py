"""The connector lease outlives its TTL while its job runs, a lost lease stops the job, and a chunk
committed by one snapshot run is not copied again by another that resumes the same snapshot.

Real Kafka broker, spark-submit ``local[2]`` and the MongoDB simulator (started without periodic
no-op writes, so that a window runs until the test writes past its end).
"""

from __future__ import annotations

import json
import threading
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import LeaseHeldError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, owner_for_task
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, position_time
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.snapshot.plan import Chunk, data_chunks_finished, new_snapshot_id
from airflow_provider_mongocdc.core.snapshot.run import copy_chunks
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from devtools.kafka.reading import read_topic
from tests.integration.snapshot_helpers import payloads, wait_until
from tests.integration.window_helpers import connector, seed_offset

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

TTL = timedelta(seconds=30)  # renewed every 10 s while the window runs
BOUND_S = 240.0


def _ti(dag_id: str, task_id: str, run_id: str) -> dict:
    return {"ti": SimpleNamespace(dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=-1)}


@pytest.fixture
def window_setup(mongosim, kafka_bootstrap, unique_name, operator_connections):
    """A simulator without periodic no-ops, a stored offset, the Airflow connections, and a window
    operator with a 30 s lease whose job runs until ``finish()`` writes past its end."""
    sim = mongosim(noop_interval=3600)
    database = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, database)
    store, partition = seed_offset(sim.uri, kafka, props)
    seeded = store.read(partition)
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        **operator_connections("renew", sim.uri, kafka),
        idle_timeout=600,  # no cluster-time progress: only the test's writes end the window
        lease_ttl=TTL,
    )
    # The window ends 2 s after the stored offset: in the past once the clock passed it (so it is
    # not clamped to now), and not reached by the server's cluster time until the test writes.
    end = position_time(seeded.position).time + 2
    assert wait_until(lambda: time.time() > end + 0.5, 30), "the clock did not pass the window end"
    context = {
        **_ti("mongocdc_hourly", "window", "scheduled__renewal"),
        "data_interval_end": datetime.fromtimestamp(end, timezone.utc),
    }
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["summary"] = operator.execute(context)
        except BaseException as error:  # examined by the test
            outcome["error"] = error

    thread = threading.Thread(target=run, name="window-task", daemon=True)
    client = MongoClient(sim.uri, serverSelectionTimeoutMS=20000)

    def finish() -> None:
        """Write uncaptured markers until the window task has ended (its end is then passed)."""
        deadline = time.monotonic() + BOUND_S
        while thread.is_alive():
            assert time.monotonic() < deadline, f"the window task did not end within {BOUND_S:.0f} s"
            client[f"{database}_m"]["markers"].insert_one({"at": time.time()})
            thread.join(1.0)

    setup = SimpleNamespace(
        operator=operator,
        thread=thread,
        outcome=outcome,
        finish=finish,
        lease=ConnectorLease(kafka, unique_name),
        owner=owner_for_task("mongocdc_hourly", "window", "scheduled__renewal"),
        store=store,
        partition=partition,
        seeded=seeded,
    )
    try:
        yield setup
    finally:
        if thread.is_alive():  # a failed test must not leave spark-submit running
            operator.on_kill()
            thread.join(60)
        client.close()


def _wait_for_lease(setup):
    held = {}

    def taken() -> bool:
        current = setup.lease.current()
        if current is not None and current.owner == setup.owner:
            held["lease"] = current
            return True
        return not setup.thread.is_alive()

    assert wait_until(taken, BOUND_S), f"the window did not take its lease within {BOUND_S:.0f} s"
    assert "lease" in held, f"the window task ended before taking its lease: {setup.outcome}"
    return held["lease"]


def test_a_window_running_longer_than_its_lease_ttl_keeps_the_lease(window_setup):
    setup = window_setup
    snapshot_owner = owner_for_task("mongocdc_resnapshot", "resnapshot", "manual__renewal")
    setup.thread.start()
    first = _wait_for_lease(setup)
    assert first.expires_at - first.acquired_at == TTL

    # Wait until the lease as first taken has expired, while the window still runs.
    past_ttl = first.expires_at + timedelta(seconds=2)
    assert wait_until(
        lambda: datetime.now(timezone.utc) > past_ttl or not setup.thread.is_alive(), BOUND_S
    ), "the clock did not pass the lease's first expiry"
    assert setup.thread.is_alive(), f"the window ended before its lease's TTL: {setup.outcome}"

    with pytest.raises(LeaseHeldError) as refused:
        setup.lease.acquire(snapshot_owner, SNAPSHOT, ttl=600)
    assert setup.owner in str(refused.value)
    renewed = setup.lease.current()
    assert renewed.owner == setup.owner and renewed.kind == "window"
    assert renewed.acquired_at == first.acquired_at  # the same lease, renewed
    assert renewed.expires_at > first.expires_at

    setup.finish()
    assert "error" not in setup.outcome, setup.outcome.get("error")
    assert setup.outcome["summary"]["status"] == "completed"
    assert setup.outcome["summary"]["reached_end"] is True
    assert setup.lease.current() is None  # released when the window ended


def test_a_window_whose_lease_was_taken_over_is_stopped_with_a_clear_error(window_setup):
    setup = window_setup
    other_owner = owner_for_task("mongocdc_hourly", "window", "scheduled__next")
    setup.thread.start()
    _wait_for_lease(setup)

    # The lease is lost (as when renewals could not reach Kafka until it expired) and another
    # task takes it: the window must stop rather than run beside the new holder.
    assert setup.lease.release(force=True)
    setup.lease.acquire(other_owner, WINDOW, ttl=600)

    setup.thread.join(BOUND_S)
    assert not setup.thread.is_alive(), (
        f"the window still ran {BOUND_S:.0f} s after another task took over its lease"
    )
    error = setup.outcome.get("error")
    assert error is not None, f"the window succeeded without its lease: {setup.outcome}"
    message = str(error)
    assert "lost" in message and other_owner in message, message
    assert "Cause:" in message and "Fix:" in message, message
    assert setup.lease.current().owner == other_owner  # the new holder's lease is left alone
    assert setup.store.read(setup.partition).position == setup.seeded.position  # nothing committed


def test_a_chunk_committed_by_one_run_is_not_copied_again_by_another(mongosim, kafka_bootstrap, unique_name):
    """Two snapshot runs resume the same snapshot (e.g. a second task after the first one's lease
    expired). Run B reads which chunks are committed, then spends a while on its first chunk;
    meanwhile run A copies and commits the chunk that B does next. B takes over that chunk's
    transactional.id afterwards: it must find the chunk committed instead of copying it again."""
    sim = mongosim()
    database = unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = {"topic.prefix": unique_name, "database.include.list": database, "connect.max.attempts": 1}
    config = ConnectorConfig.from_properties(props)
    client = MongoClient(sim.uri, serverSelectionTimeoutMS=20000)
    client[database]["first"].insert_many([{"_id": n} for n in range(20)])
    client[database]["orders"].insert_many([{"_id": n, "total": n * 10} for n in range(30)])
    rs = client.admin.command("hello")["setName"]
    store = OffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    namer = TopicNamer(config)
    ensure_topics(kafka, [TopicSpec(namer.data_topic(database, name)) for name in ("first", "orders")])

    snapshot_id = new_snapshot_id()
    partition = OffsetPartition(unique_name, rs)
    task = {
        "connector": config.to_properties(),
        "mongo": {"connection_string": sim.uri},
        "kafka": kafka,
        "snapshot_id": snapshot_id,
        "start": current_position(client, config).to_json(),
        "partition": {"server_id": unique_name, "rs": rs, "connector": partition.connector_name},
        "replica_set": rs,
    }
    first = Chunk("0", database, "first", estimated=20)
    orders = Chunk("1", database, "orders", estimated=30, final=True)

    # Run B's read of its first chunk is held up by the server (failCommand blockConnection).
    block = {
        "failCommands": ["find"],
        "namespace": f"{database}.first",
        "blockConnection": True,
        "blockTimeMS": 30000,
    }
    client.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data=block)
    results: dict = {}

    def run_b() -> None:
        try:
            results["b"] = copy_chunks(task, [first.to_json(), orders.to_json()])
        except BaseException as error:  # examined below
            results["b_error"] = error

    run_b_thread = threading.Thread(target=run_b, name="run-b", daemon=True)
    run_b_thread.start()

    def b_is_held_up() -> bool:
        # configureFailPoint answers how often the fail point was entered since it was set; setting
        # it again (the same way) keeps it armed until run B's read has entered it.
        entered = client.admin.command("configureFailPoint", "failCommand", mode={"times": 1}, data=block)
        return entered["count"] >= 1 or not run_b_thread.is_alive()

    try:
        assert wait_until(b_is_held_up, BOUND_S, interval=0.1), "run B never read its first chunk"
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")
    assert run_b_thread.is_alive(), f"run B ended early: {results}"

    # Run A copies and commits the orders chunk while run B waits on its first chunk.
    (a_result,) = copy_chunks(task, [orders.to_json()])
    assert a_result["docs"] == 30 and not a_result["already_committed"]
    assert run_b_thread.is_alive(), "run B went on before run A committed: the test needs a longer block"

    run_b_thread.join(BOUND_S)
    assert not run_b_thread.is_alive(), f"run B did not end within {BOUND_S:.0f} s"
    assert "b_error" not in results, results.get("b_error")
    b_first, b_orders = results["b"]
    assert b_first["docs"] == 20
    assert b_orders["already_committed"] is True, f"run B copied the committed chunk again: {b_orders}"

    events = payloads(read_topic(kafka_bootstrap, namer.data_topic(database, "orders")))
    ids = sorted(json.loads(key["id"]) for key, _value in events)
    assert ids == list(range(30)), f"{len(ids)} read events for 30 documents"
    assert sum(value["source"]["snapshot"] == "last" for _key, value in events) == 1
    assert set(data_chunks_finished(store.chunk_markers(partition, snapshot_id))) == {"0", "1"}
    client.close()
