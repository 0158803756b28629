"""The change watcher (MongoChangeWatcher, the AssetWatcher trigger) run as the triggerer runs it,
against the MongoDB simulator and the real Kafka broker: quiet before the first snapshot, counting
only captured changes from the committed position, one event per window (the changes that arrive
meanwhile make one next event after the commit), a restart watching again from the committed
position, a purged position said once, per-shard and whole-cluster streams of a sharded cluster, a
connection repointed to another deployment with other streams, and windows asked for while an
incremental snapshot is requested or running on quiet collections (with the watcher's status in
the offsets topic), and no event while a window is open (a real open window, with the lease its
task would hold; meanwhile the offsets topic is read when its next commit is due, not at every
poll, and MongoDB is not read at all) but again once it closed.

Commits of windows are written to the offsets topic directly (``OffsetStore.set_position``), as a
window's end position: these tests watch the watcher, not the window. Quiet periods are checked
after the watcher has logged two status lines (twelve polls apart) with nothing fired.
"""

from __future__ import annotations

import asyncio
import json
import re
import time

import pymongo
import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.triggers.change_watcher import MongoChangeWatcher

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]

WAIT_S = 120
STATUS = re.compile(r"Change watcher of connector \S+: \d+ change\(s\) pending[^\n]*polls")


class Watching:
    """A watcher's ``run()`` in the background: its events, and its log lines (stdout)."""

    def __init__(self, trigger: MongoChangeWatcher, capsys):
        self.capsys = capsys
        self.events: list[dict] = []
        self.text = ""
        self.task = asyncio.create_task(self._pump(trigger))

    async def _pump(self, trigger: MongoChangeWatcher) -> None:
        async for event in trigger.run():
            self.events.append(event.payload)

    def log(self) -> str:
        self.text += self.capsys.readouterr().out
        return self.text

    async def until(self, what: str, condition, timeout: float = WAIT_S):
        deadline = time.monotonic() + timeout
        while not (value := condition()):
            if self.task.done():
                self.task.result()
            assert time.monotonic() < deadline, f"{what} within {timeout} s; log:\n{self.log()[-4000:]}"
            await asyncio.sleep(0.1)
        return value

    async def event(self, number: int) -> dict:
        """The ``number``-th event (1-based), waited for."""
        await self.until(f"event {number}", lambda: len(self.events) >= number)
        return self.events[number - 1]

    async def statuses(self, count: int = 2) -> list[str]:
        """The next ``count`` status lines (each twelve polls after the one before)."""
        mark = len(self.log())
        return await self.until(
            f"{count} status lines",
            lambda: (found := STATUS.findall(self.log()[mark:])) and len(found) >= count and found,
        )

    async def stop(self) -> None:
        self.task.cancel()
        try:
            await self.task
        except asyncio.CancelledError:
            pass


def watcher(props: dict, ids: dict, **settings) -> MongoChangeWatcher:
    values = {"min_changes": 1000, "max_delay_s": 1, "poll_interval_s": 0.2, "min_headroom_s": 0}
    return MongoChangeWatcher(
        props["topic.prefix"],
        props,
        mongo_conn_id=ids["mongo"],
        kafka_conn_id=ids["kafka"],
        watchdog_dag_id="mongocdc_watchdog",
        **{**values, **settings},
    )


def operation_time(client: MongoClient) -> Timestamp:
    with client.start_session() as session:
        client.admin.command("ping", session=session)
        return session.operation_time


def second_after(client: MongoClient, ts: Timestamp) -> Position:
    """A window end after ``ts`` (``Timestamp(<next second>, 0)``), once the clock has passed it."""
    end = Timestamp(ts.time + 1, 0)
    deadline = time.monotonic() + WAIT_S
    while time.time() < end.time + 0.05:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return Position(cluster_time=end)


def test_counts_captured_changes_from_the_committed_position_one_event_per_window(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    props = {"topic.prefix": unique_name, "collection.include.list": "shop\\.orders"}
    client = MongoClient(sim.uri)
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, "rs0")

    async def scenario():
        start = operation_time(client)
        client.shop.orders.insert_many([{"_id": i} for i in range(5)])
        client.shop.users.insert_many([{"_id": i} for i in range(4)])  # not captured
        client.other.x.insert_many([{"_id": i} for i in range(3)])  # not captured
        first_batch = operation_time(client)

        # No offset yet: quiet, and says why.
        watching = Watching(watcher(props, ids), capsys)
        for line in await watching.statuses(2):
            assert "0 change(s) pending; rs0 not watched (waiting); no event yet" in line
        assert watching.events == []
        assert watching.log().count("not watching rs0: No stored offset for") == 1

        # The snapshot's position: the changes after it are pending, only the captured ones count.
        store.set_position(partition, Position(cluster_time=start))
        event = await watching.event(1)
        assert (
            f"watching rs0 from the committed position {Position(cluster_time=start).describe()}"
            in watching.log()
        )
        assert (event["reason"], event["pending"], event["connector"]) == ("max_delay", 5, unique_name)
        assert event["partitions"]["rs0"]["committed"]["sec"] == start.time
        assert event["pending_since"] and event["pending_since"] <= event["at"]

        # The triggerer restarted: the new watcher knows no event, counts from the committed position.
        await watching.stop()
        watching = Watching(watcher(props, ids), capsys)
        event = await watching.event(1)
        assert event["pending"] == 5

        # Changes while the window runs: no second event before it commits.
        window_end = second_after(client, first_batch)
        client.shop.orders.insert_many([{"_id": 10 + i} for i in range(3)])
        second_batch = operation_time(client)
        for line in await watching.statuses(2):
            assert (
                line.count("3 change(s) pending") == 1
                and "for a window to commit past the last event" in line
            )
        assert len(watching.events) == 1

        # The window ends after the first changes, before the later ones: one next event, for them.
        store.set_position(partition, window_end)
        event = await watching.event(2)
        assert (event["reason"], event["pending"]) == ("max_delay", 3)
        assert event["partitions"]["rs0"]["committed"]["sec"] == window_end.cluster_time.time

        # A window carried everything: quiet.
        store.set_position(partition, second_after(client, second_batch))
        await watching.statuses(1)
        for line in await watching.statuses(2):
            assert line.startswith("Change watcher of connector") and "0 change(s) pending" in line
        assert len(watching.events) == 2

        # The stored position is purged from the oplog: said once, in words; no event.
        client.other.x.insert_many([{"_id": 100 + i} for i in range(30)])
        sim.set_oplog_retention(max_entries=5)
        client.shop.orders.insert_many([{"_id": 100 + i} for i in range(3)])
        await watching.until("the purge noticed", lambda: "is no longer in the oplog" in watching.log())
        await watching.statuses(2)
        log = watching.log()
        assert log.count("not watching rs0: the stored position is no longer in the oplog") == 1, log[-3000:]
        assert "the oplog gap watchdog (mongocdc_watchdog) triggers the re-snapshot" in log
        assert len(watching.events) == 2
        await watching.stop()

    asyncio.run(scenario())


def test_sharded_cluster_whole_cluster_and_per_shard_streams(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    sim = mongosim("sharded", shards=2)
    ids = gap_connections(sim.uri)
    client = MongoClient(sim.uri)
    client.admin.command("shardCollection", "shop.orders", key={"customer": "hashed"})
    kafka = {"bootstrap.servers": kafka_bootstrap}
    whole = {"topic.prefix": f"{unique_name}_c", "collection.include.list": "shop\\.orders"}
    per_shard = {**whole, "topic.prefix": f"{unique_name}_s", "mongodb.connection.mode": "replica_set"}
    start = operation_time(client)
    OffsetStore(kafka, f"{unique_name}_c.offsets").set_position(
        OffsetPartition(whole["topic.prefix"], "cluster"), Position(cluster_time=start)
    )
    shard_store = OffsetStore(kafka, f"{unique_name}_s.offsets")
    for shard_uri, name in zip(sim.shard_uris, ("shard0", "shard1")):
        shard_start = operation_time(MongoClient(shard_uri))
        shard_store.set_position(
            OffsetPartition(per_shard["topic.prefix"], name), Position(cluster_time=shard_start)
        )
    client.shop.orders.insert_many([{"_id": i, "customer": f"c{i}"} for i in range(40)])

    async def scenario():
        watchers = [Watching(watcher(props, ids, min_changes=40), capsys) for props in (whole, per_shard)]
        cluster = await watchers[0].event(1)
        shards = await watchers[1].event(1)
        assert (cluster["reason"], cluster["pending"], list(cluster["partitions"])) == (
            "min_changes",
            40,
            ["cluster"],
        )
        counts = {name: item["pending"] for name, item in shards["partitions"].items()}
        assert shards["pending"] == 40 and sorted(counts) == ["shard0", "shard1"]
        assert all(counts.values()), counts  # the hashed key spread them over both shards
        for watching in watchers:
            await watching.stop()

    asyncio.run(scenario())


def test_a_missing_connection_is_said_once_with_its_fix_and_watching_starts_when_it_exists(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys, monkeypatch
):
    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    client = MongoClient(sim.uri)
    props = {"topic.prefix": unique_name, "collection.include.list": "shop\\.orders"}
    start = operation_time(client)
    OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets").set_position(
        OffsetPartition(unique_name, "rs0"), Position(cluster_time=start)
    )
    client.shop.orders.insert_many([{"_id": i} for i in range(2)])
    missing = f"{ids['mongo']}_later"

    async def scenario():
        watching = Watching(watcher(props, {**ids, "mongo": missing}), capsys)
        await watching.until("the failure said", lambda: "cannot watch:" in watching.log())
        log = watching.log()
        assert f"The conn_id `{missing}` isn't defined" in log
        assert "Fix: create the connection, or correct the connector's conn_ids" in log
        assert "No event is sent meanwhile" in log and not watching.task.done()
        monkeypatch.setenv(
            f"AIRFLOW_CONN_{missing.upper()}", json.dumps({"conn_type": "mongocdc", "host": sim.uri})
        )
        event = await watching.event(1)
        assert event["pending"] == 2
        log = watching.log()
        assert log.count("cannot watch:") == 1 and "watching again" in log
        await watching.stop()

    asyncio.run(scenario())


def test_a_repointed_connection_and_a_changed_set_of_streams_start_the_watch_over(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    # Per-shard streams of a sharded cluster, then the connection repointed to a replica set: the
    # shards' streams are gone (as when a shard is removed), the replica set's is watched.
    sharded = mongosim("sharded", shards=2)
    ids = gap_connections(sharded.uri)
    props = {
        "topic.prefix": unique_name,
        "collection.include.list": "shop\\.orders",
        "mongodb.connection.mode": "replica_set",
    }
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets")
    for shard_uri, name in zip(sharded.shard_uris, ("shard0", "shard1")):
        start = operation_time(MongoClient(shard_uri))
        store.set_position(OffsetPartition(unique_name, name), Position(cluster_time=start))
    replset = mongosim("replset")
    other = MongoClient(replset.uri)
    store.set_position(OffsetPartition(unique_name, "rs0"), Position(cluster_time=operation_time(other)))

    async def scenario():
        watching = Watching(watcher(props, ids, min_changes=4, max_delay_s=3600), capsys)
        await watching.until(
            "both shards watched",
            lambda: "watching shard0 from" in watching.log() and "watching shard1 from" in watching.log(),
        )
        gap_connections(replset.uri)  # the MongoDB connection now names another deployment
        other.shop.orders.insert_many([{"_id": i} for i in range(4)])
        event = await watching.event(1)
        assert (list(event["partitions"]), event["pending"]) == (["rs0"], 4)
        log = watching.log()
        assert (
            "a connection changed; the streams are now rs0 (were shard0, shard1): watching from the "
            "committed positions again" in log
        ), log[-3000:]
        assert "KeyError" not in log and "cannot watch" not in log
        await watching.stop()

    asyncio.run(scenario())


def test_windows_are_asked_for_while_an_incremental_snapshot_is_requested_on_quiet_collections(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    from airflow_provider_mongocdc.core.offsets.model import OffsetState
    from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest

    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    client = MongoClient(sim.uri)
    props = {"topic.prefix": unique_name, "collection.include.list": "shop\\.customers"}
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, "rs0")
    store.set_position(partition, Position(cluster_time=operation_time(client)))

    async def scenario():
        watching = Watching(watcher(props, ids, max_delay_s=3600), capsys)
        await watching.until("watching", lambda: "watching rs0 from" in watching.log())
        # Re-snapshot, mode incremental: the request is in the offsets topic; nothing changes.
        request = IncrementalRequest.new(["shop.customers"], reason="test")
        store.write_incremental_request(unique_name, unique_name, request.to_json())
        event = await watching.event(1)
        assert (event["reason"], event["pending"]) == ("incremental_snapshot", 0)
        assert request.request_id in event["message"]
        # What it counts is in the offsets topic for the MongoDB CDC page (no offset).
        status = await watching.until(
            "its status written",
            lambda: store.read_everything().watchers.get((unique_name, unique_name)),
        )
        assert status["pending"] == 0 and status["partitions"]["rs0"]["state"] == "watched"
        assert status["incremental_snapshot"] and status["waiting_for_window"] is True
        # A window copied a chunk (its commit): the next window is asked for.
        running = IncrementalProgress(request.request_id, current="shop.customers", documents=20, chunks=1)
        state = store.read(partition)
        store.write(partition, OffsetState(position=state.position, incremental=running.to_json()))
        event = await watching.event(2)
        assert event["reason"] == "incremental_snapshot" and "20 documents in 1 chunks" in event["message"]
        # Completed: no more windows for it.
        store.write(
            partition,
            OffsetState(position=state.position, incremental=running.finish("completed").to_json()),
        )
        await watching.until("its end noticed", lambda: "no incremental snapshot to copy" in watching.log())
        await watching.statuses(2)
        assert len(watching.events) == 2
        await watching.stop()

    asyncio.run(scenario())


def test_no_event_while_a_window_is_open_and_events_again_once_it_closed(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys, monkeypatch
):
    import threading
    from datetime import datetime, timezone

    from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
    from airflow_provider_mongocdc.core.kafka.committed_records import CommittedFollower
    from airflow_provider_mongocdc.core.mongo.connection import connection_details
    from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease
    from airflow_provider_mongocdc.core.window.params import WindowParams
    from airflow_provider_mongocdc.core.window.stream_window import run_window
    from airflow_provider_mongocdc.core.window.streams import plan_streams
    from airflow_provider_mongocdc.triggers import change_watch_session
    from airflow_provider_mongocdc.triggers.change_watch_session import WatchSession
    from tests.integration.test_open_window import Writer

    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    db_name = f"{unique_name[:30]}_db"
    props = {"topic.prefix": unique_name, "collection.include.list": f"{db_name}\\.items"}
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(sim.uri)
    store = OffsetStore(kafka, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, "rs0")
    store.set_position(partition, Position(cluster_time=operation_time(client)))
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": sim.uri}), config)
    # The window task's lease, as the operator holds it while its window is open.
    lease = ConnectorLease(kafka, unique_name).acquire(f"{unique_name}/run/window", WINDOW, 600)
    # Commits 3 s apart: between two, pending changes grow older than max_delay (1 s).
    params = WindowParams(
        datetime.now(timezone.utc), idle_timeout_s=60, commit_interval_s=3, open_idle_s=4, max_open_s=300
    )
    outcome: dict = {}
    # How often the watcher polls, reads the offsets topic and connects to MongoDB.
    counts = {"polls": 0, "reads": 0, "clients": 0}
    read, step = CommittedFollower.read, WatchSession.step

    class CountedClient(pymongo.AsyncMongoClient):
        def __init__(self, *args, **kwargs):
            counts["clients"] += 1
            super().__init__(*args, **kwargs)

    def counted_read(follower):
        counts["reads"] += 1
        return read(follower)

    async def counted_step(session):
        counts["polls"] += 1
        return await step(session)

    monkeypatch.setattr(CommittedFollower, "read", counted_read)
    monkeypatch.setattr(WatchSession, "step", counted_step)
    monkeypatch.setattr(pymongo, "AsyncMongoClient", CountedClient)  # the oplog check's clients
    monkeypatch.setattr(change_watch_session, "AsyncMongoClient", CountedClient)  # the streams'

    def window() -> None:
        try:
            outcome["summary"] = run_window(target, config, kafka, params)
        except BaseException as error:  # reported by the assertions below
            outcome["error"] = error

    async def scenario():
        thread = threading.Thread(target=window, daemon=True)
        with Writer(sim.uri, db_name) as writer:
            thread.start()
            # The watcher starts once the window is open (before, it would rightly ask for one).
            deadline = time.monotonic() + WAIT_S
            while (state := store.read(partition)) is None or state.open_window is None:
                assert thread.is_alive() and time.monotonic() < deadline, (
                    f"the window did not open: {outcome}"
                )
                await asyncio.sleep(0.1)
            watching = Watching(watcher(props, ids, max_delay_s=1), capsys)
            await watching.until(
                "the open window noticed", lambda: "a window is open since" in watching.log()
            )
            opened = dict(counts)
            # Changes keep coming for longer than max_delay: the open window carries them, no event.
            for line in await watching.statuses(2):
                assert "a window is open since" in line
            status = await watching.until(
                "the status with the open window",
                lambda: (
                    (s := store.read_everything().watchers.get((unique_name, unique_name)))
                    and s.get("open_window")
                    and s
                ),
            )
            assert status["open_window"]["since"] and status["open_window"]["events"] >= 0
            assert watching.events == []
            # While it commits, the offsets are read when its next commit is due (its idle time
            # and commit interval after its last one) and at the periodic check, not every poll.
            polls, reads, clients = (counts[key] - opened[key] for key in ("polls", "reads", "clients"))
            assert polls >= 12 and 2 * reads <= polls, (polls, reads)
            # It connects to MongoDB for nothing meanwhile: no stream, no oplog check.
            assert clients == 0
        # The writes stopped: the window closes after its idle time, having carried every one.
        await watching.until("the window closed", lambda: "the open window closed" in watching.log())
        thread.join(timeout=WAIT_S)
        assert "error" not in outcome, outcome.get("error")
        assert outcome["summary"]["events"] == len(writer.written)
        assert watching.events == []
        # A change after the close: asked for as before.
        client[db_name].items.insert_one({"_id": "after"})
        event = await watching.event(1)
        assert (event["reason"], event["pending"]) == ("max_delay", 1)
        await watching.stop()

    try:
        asyncio.run(scenario())
    finally:
        ConnectorLease(kafka, unique_name).release(lease=lease)


def test_no_event_while_a_killed_open_windows_task_holds_the_lease_for_its_retry(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    # What a window killed with SIGKILL while open leaves (its task's process group killed, so
    # neither a last commit nor a release ran): its marker, committed a while ago, and the lease of
    # its task instance, live. Airflow's retry of that task takes the lease again and continues
    # from the last commit, so the changes since wait for it: no event meanwhile, however old they
    # get. Once the retry closed (its last commit, its release), changes are asked for as before.
    from datetime import datetime, timedelta, timezone

    from airflow_provider_mongocdc.core.offsets.lease import WINDOW, ConnectorLease
    from airflow_provider_mongocdc.core.offsets.model import OffsetState
    from airflow_provider_mongocdc.core.offsets.open_window import open_marker

    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    props = {"topic.prefix": unique_name, "collection.include.list": "shop\\.orders"}
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(sim.uri)
    store = OffsetStore(kafka, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, "rs0")
    last_commit = Position(cluster_time=operation_time(client))
    now = datetime.now(timezone.utc)
    killed_at = now - timedelta(seconds=90)
    owner = f"{unique_name}/run/window"
    leases = ConnectorLease(kafka, unique_name)
    leases.acquire(owner, WINDOW, 600)
    marker = open_marker(
        since=killed_at - timedelta(minutes=5),
        now=killed_at,
        events=40,
        commits=12,
        lag_ms=800,
        next_commit_within_s=6,
        closes_by=killed_at + timedelta(minutes=45),
    )
    store.write(partition, OffsetState(position=last_commit, events=40, open_window=marker))
    # The changes after the last commit, older than max_delay by the time the watcher counts them.
    client.shop.orders.insert_many([{"_id": n} for n in range(5)])

    async def scenario():
        watching = Watching(watcher(props, ids, max_delay_s=1), capsys)
        await watching.until(
            "the killed window noticed (or an event)",
            lambda: "it was killed" in watching.log() or watching.events,
        )
        assert watching.events == [], "a window was asked for while the killed window's retry is due"
        for line in await watching.statuses(2):
            assert "it was killed" in line
        assert watching.events == []
        # The retry: the same owner takes the lease anew, its window reads the 5 changes and closes
        # (its last commit removes the marker), its task releases the lease.
        retry = leases.acquire(owner, WINDOW, 600)
        closed_at = second_after(client, operation_time(client))
        store.write(partition, OffsetState(position=closed_at, events=45, windows=1))
        leases.release(lease=retry)
        await watching.until(
            "the retry's close noticed",
            lambda: "counting changes for the next window" in watching.log(),
        )
        client.shop.orders.insert_one({"_id": "after"})
        event = await watching.event(1)
        assert (event["reason"], event["pending"]) == ("max_delay", 1)
        await watching.stop()

    try:
        asyncio.run(scenario())
    finally:
        leases.release(owner)
