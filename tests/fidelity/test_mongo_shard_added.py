"""A replica set's young oplog and a shard added to a running cluster.

MongoDB's change-stream resumability check compares the resume point with the first oplog entry,
except when that entry is the replica set's initiation (``op: "n"``, ``o.msg: "initiating set"``):
then nothing was ever dropped and the stream resumes from any earlier time (``isNewRS`` in the
server's check). A shard added after a stream's resume point has such an oplog.
"""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

FIRST = {"ts": 1, "op": 1, "o.msg": 1, "_id": 0}


def first_entry(client: MongoClient) -> dict:
    return client.local["oplog.rs"].find_one({}, FIRST, sort=[("$natural", 1)])


def test_an_oplog_that_starts_with_the_initiation_resumes_from_any_earlier_time(client, db):
    first = first_entry(client)
    if first != {"op": "n", "o": {"msg": "initiating set"}, "ts": first["ts"]}:
        pytest.skip(f"the oplog of this replica set no longer starts with its initiation: {first}")
    db.c.insert_one({"_id": 1})
    before_the_set = Timestamp(first["ts"].time - 3600, 1)
    with db.c.watch(start_at_operation_time=before_the_set, max_await_time_ms=200) as stream:
        change = stream.try_next()
        while change is None and stream.alive:
            change = stream.try_next()
    assert change["documentKey"] == {"_id": 1}


@pytest.mark.simulator_only
def test_a_shard_added_later_neither_fails_nor_misses_a_stream_from_before_it(mongosim):
    sim = mongosim("sharded", shards=2)
    with sim.client() as mongo:
        mongo.admin.command("shardCollection", "shop.items", key={"_id": "hashed"})
        mongo.shop.items.insert_many([{"_id": n} for n in range(40)])
        sim.set_oplog_retention(max_entries=8)  # both shards roll past their initiation
        sim.set_oplog_retention(max_entries=None)
        for uri in sim.shard_uris:
            with MongoClient(uri) as shard:
                assert first_entry(shard)["op"] == "i"
        with mongo.start_session() as session:
            mongo.shop.items.insert_one({"_id": "before"}, session=session)
            resume_at = session.operation_time

        new_uri = sim.add_shard()
        assert [s["_id"] for s in mongo.admin.command("listShards")["shards"]] == [
            "shard0",
            "shard1",
            "shard2",
        ]
        assert sim.shard_uris[-1] == new_uri
        with MongoClient(new_uri) as shard:
            first = first_entry(shard)
        assert (first["op"], first["o"], first["ts"] > resume_at) == ("n", {"msg": "initiating set"}, True)
        # Collections sharded before keep their shards (no balancer); new ones spread over the new one.
        mongo.admin.command("shardCollection", "shop.more", key={"_id": "hashed"})
        mongo.shop.more.insert_many([{"_id": n} for n in range(30)])
        with MongoClient(new_uri) as shard:
            on_new = shard.shop.more.count_documents({})
            assert on_new > 0 and shard.shop.items.count_documents({}) == 0
        assert mongo.shop.items.count_documents({}) == 41

        # A stream from before the shard existed opens and reads the new shard's changes too.
        with mongo.watch(start_at_operation_time=resume_at, max_await_time_ms=200) as stream:
            keys = []
            change = stream.try_next()
            while change is not None:
                keys.append((change["ns"]["coll"], change["documentKey"]["_id"]))
                change = stream.try_next()
        assert keys[0] == ("items", "before") and sorted(k for c, k in keys if c == "more") == list(range(30))

        # Once the new shard's oplog rolls past its initiation, the old position is lost on it.
        with MongoClient(new_uri) as shard:
            shard.admin.command({"mongosimSetOplogRetention": 1, "maxEntries": 3})
        with pytest.raises(OperationFailure) as error:
            mongo.watch(start_at_operation_time=resume_at)
    assert error.value.code == 286


@pytest.mark.simulator_only
def test_add_shard_errors(mongosim):
    sim = mongosim("sharded", shards=1)
    with sim.client() as mongo:
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command({"addShard": "shard9/127.0.0.1:1"})
        assert error.value.code == 96
        started = mongo.admin.command({"mongosimStartReplicaSet": "extra"})
        host = started["host"].split("/", 1)[1]
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command({"addShard": f"other/{host}"})
        assert error.value.code == 96 and "does not belong to replica set other" in str(error.value)
        assert mongo.admin.command({"addShard": started["host"]})["shardAdded"] == "extra"
        assert mongo.admin.command({"addShard": started["host"]})["shardAdded"] == "extra"  # idempotent
        assert [s["_id"] for s in mongo.admin.command("listShards")["shards"]] == ["shard0", "extra"]
