"""Sharded mode: mongos in front of shard replica sets, shard keys, merged change streams."""

from __future__ import annotations

import time

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.fidelity.streams import next_event

pytestmark = [pytest.mark.fidelity, pytest.mark.simulator_only]


@pytest.fixture
def cluster(mongosim):
    return mongosim(mode="sharded", shards=2)


def test_mongos_identifies_itself(cluster):
    with cluster.client() as mongo:
        hello = mongo.admin.command("hello")
        assert hello["msg"] == "isdbgrid" and "setName" not in hello
        assert mongo.admin.command("isdbgrid")["isdbgrid"] == 1
        shards = mongo.admin.command("listShards")["shards"]
        assert [s["_id"] for s in shards] == ["shard0", "shard1"]
        assert list(mongo.config.shards.find({}, {"_id": 1})) == [{"_id": "shard0"}, {"_id": "shard1"}]
        assert shards[0]["host"].startswith("shard0/127.0.0.1:")
        with pytest.raises(OperationFailure):
            mongo.admin.command("replSetGetStatus")


def test_each_shard_is_a_replica_set_of_its_own(cluster):
    assert len(cluster.shard_uris) == 2
    for index, uri in enumerate(cluster.shard_uris):
        with MongoClient(uri, serverSelectionTimeoutMS=5000) as shard:
            assert shard.admin.command("hello")["setName"] == f"shard{index}"


def test_documents_are_routed_by_shard_key(cluster):
    with cluster.client() as mongo:
        mongo.admin.command("shardCollection", "shop.orders", key={"customer": "hashed"})
        orders = mongo.shop.orders
        orders.insert_many([{"_id": i, "customer": f"c{i % 10}"} for i in range(200)])
        assert orders.count_documents({}) == 200
        per_shard = []
        for uri in cluster.shard_uris:
            with MongoClient(uri) as shard:
                per_shard.append(shard.shop.orders.count_documents({}))
        assert sum(per_shard) == 200 and all(count > 0 for count in per_shard)
        collection = mongo.config.collections.find_one({"_id": "shop.orders"})
        assert collection["key"] == {"customer": "hashed"}
        orders.update_many({"customer": "c1"}, {"$set": {"vip": True}})
        assert orders.count_documents({"vip": True}) == 20
        assert orders.delete_many({"customer": "c2"}).deleted_count == 20
        assert sorted(d["_id"] for d in orders.find({"_id": {"$lt": 5}})) == [0, 1, 3, 4]


def test_change_stream_through_mongos_merges_shards_in_cluster_time_order(cluster):
    with cluster.client() as mongo:
        mongo.admin.command("shardCollection", "shop.orders", key={"customer": 1})
        orders = mongo.shop.orders
        with orders.watch(max_await_time_ms=200) as stream:
            orders.insert_many([{"_id": i, "customer": f"c{i}"} for i in range(20)])
            orders.update_one({"customer": "c3", "_id": 3}, {"$set": {"x": 1}})
            events = [next_event(stream) for _ in range(21)]
        assert [e["documentKey"] for e in events[:3]] == [
            {"customer": "c0", "_id": 0},
            {"customer": "c1", "_id": 1},
            {"customer": "c2", "_id": 2},
        ]
        assert events[-1]["operationType"] == "update"
        assert events[-1]["documentKey"] == {"customer": "c3", "_id": 3}
        times = [e["clusterTime"] for e in events]
        assert times == sorted(times)
        tokens = [e["_id"]["_data"] for e in events]
        assert tokens == sorted(tokens)


def test_shard_key_in_document_key_on_a_shard_stream(cluster):
    with cluster.client() as mongo:
        mongo.admin.command("shardCollection", "shop.orders", key={"customer": 1})
        with MongoClient(cluster.shard_uris[0]) as shard, MongoClient(cluster.shard_uris[1]) as other:
            streams = [
                shard.shop.orders.watch(max_await_time_ms=100),
                other.shop.orders.watch(max_await_time_ms=100),
            ]
            mongo.shop.orders.insert_many([{"_id": i, "customer": f"k{i}"} for i in range(10)])
            seen = []
            deadline = time.monotonic() + 120
            while len(seen) < 10 and time.monotonic() < deadline:
                for stream in streams:
                    event = stream.try_next()
                    if event is not None:
                        seen.append(event["documentKey"])
            for stream in streams:
                assert stream.try_next() is None  # nothing more: each insert once, on one shard
                stream.close()
        assert sorted(seen, key=lambda k: k["_id"]) == [{"customer": f"k{i}", "_id": i} for i in range(10)]


def test_transaction_through_mongos(cluster):
    with cluster.client() as mongo:
        mongo.admin.command("shardCollection", "shop.orders", key={"customer": "hashed"})
        orders = mongo.shop.orders
        with orders.watch(max_await_time_ms=200) as stream:
            with mongo.start_session() as session:
                session.with_transaction(
                    lambda s: [
                        orders.insert_one({"_id": i, "customer": f"t{i}"}, session=s) for i in range(6)
                    ]
                )
            events = [next_event(stream) for _ in range(6)]
        assert sorted(e["documentKey"]["_id"] for e in events) == list(range(6))
        assert len({e["clusterTime"] for e in events}) == 1
        assert all("lsid" in e and "txnNumber" in e for e in events)


def test_unsharded_collection_lives_on_the_primary_shard(cluster):
    with cluster.client() as mongo:
        mongo.app.things.insert_many([{"_id": i} for i in range(5)])
        with MongoClient(cluster.shard_uris[0]) as primary, MongoClient(cluster.shard_uris[1]) as other:
            assert primary.app.things.count_documents({}) == 5
            assert other.app.things.count_documents({}) == 0
        with mongo.app.things.watch(max_await_time_ms=200) as stream:
            mongo.app.things.drop()
            assert next_event(stream)["operationType"] == "drop"
            assert next_event(stream)["operationType"] == "invalidate"
