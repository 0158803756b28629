"""The change watcher's poll of several streams at once (triggers/change_watch_session.py): each
stream's outcome stays with that stream, whichever of them ended meanwhile. The cursors here stand in
for pymongo's: one that the server closed (an invalidate) and one whose getMore fails."""

from __future__ import annotations

import asyncio

import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from airflow_provider_mongocdc.core.offsets.model import Position
from airflow_provider_mongocdc.core.watch.watcher import BLOCKED, WATCHED
from airflow_provider_mongocdc.triggers.change_watch_session import WatchSession
from airflow_provider_mongocdc.triggers.change_watcher import MongoChangeWatcher

pytestmark = pytest.mark.unit


class ClosedByServer:
    """A cursor the server closed: no more changes, no longer alive."""

    alive = False

    async def try_next(self):
        return None

    async def close(self):
        pass


class HistoryLost:
    """A cursor whose next read fails: the position is no longer in the oplog (error 286)."""

    alive = True

    async def try_next(self):
        raise OperationFailure("Resume of change stream was not possible", code=286)

    async def close(self):
        pass


def test_a_stream_closed_by_the_server_and_one_that_fails_keep_their_own_outcomes():
    trigger = MongoChangeWatcher("shop", connector_config={"topic.prefix": "shop"}, poll_interval_s=0.1)
    session = WatchSession(trigger)
    start = Position(cluster_time=Timestamp(1_800_000_000, 1))
    session.watch.committed({"shard0": start, "shard1": start}, 1_800_000_000)
    for name in ("shard0", "shard1"):
        session.watch.opened(name)
    session.cursors = {"shard0": ClosedByServer(), "shard1": HistoryLost()}

    asyncio.run(session.read_streams(0.1))

    partitions = session.watch.partitions
    # shard0 was closed by the server: it is reopened where it was; shard1 lost its history: blocked.
    assert partitions["shard0"].state == WATCHED and session.watch.to_open() == {"shard0": start}
    assert partitions["shard1"].state == BLOCKED, partitions["shard1"]
    assert "no longer in the oplog" in partitions["shard1"].note
    assert session.cursors == {}
