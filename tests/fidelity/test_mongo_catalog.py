"""Catalog commands and the sizes/aggregations a snapshot uses to plan its chunks."""

from __future__ import annotations

import pytest
from bson import MaxKey, MinKey
from pymongo.errors import OperationFailure

pytestmark = pytest.mark.fidelity


def test_list_databases_and_collections_with_options(client, db):
    db.create_collection("images", changeStreamPreAndPostImages={"enabled": True})
    db.plain.insert_one({"_id": 1})
    names = client.list_database_names()
    assert db.name in names and "admin" in names and "local" in names
    infos = {c["name"]: c for c in db.list_collections()}
    assert set(infos) == {"images", "plain"}
    assert infos["images"]["options"]["changeStreamPreAndPostImages"] == {"enabled": True}
    assert infos["plain"]["type"] == "collection"
    assert infos["plain"]["info"]["uuid"].subtype == 4
    assert infos["plain"]["idIndex"]["key"] == {"_id": 1}
    assert db.list_collection_names(filter={"name": "plain"}) == ["plain"]
    entry = next(d for d in client.list_databases() if d["name"] == db.name)
    assert entry["sizeOnDisk"] > 0 and entry["empty"] is False


def test_coll_mod_enables_pre_and_post_images(db):
    db.create_collection("c")
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    info = next(db.list_collections(filter={"name": "c"}))
    assert info["options"]["changeStreamPreAndPostImages"] == {"enabled": True}
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": False})
    info = next(db.list_collections(filter={"name": "c"}))
    assert "changeStreamPreAndPostImages" not in info["options"]


def test_create_existing_collection_with_other_options_fails(db):
    db.create_collection("c")
    with pytest.raises(OperationFailure) as error:
        db.command("create", "c", capped=True, size=4096)
    assert error.value.code == 48


def test_drop_rename_and_drop_database(client, db):
    db.a.insert_one({"_id": 1})
    db.a.rename("b")
    assert db.list_collection_names() == ["b"]
    assert db.b.find_one() == {"_id": 1}
    db.c.insert_one({"_id": 2})
    with pytest.raises(OperationFailure) as error:
        db.b.rename("c")
    assert error.value.code == 48
    db.b.rename("c", dropTarget=True)
    assert db.c.find_one() == {"_id": 1}
    db.c.drop()
    db.c.drop()  # dropping a missing collection is not an error
    assert db.list_collection_names() == []
    db.x.insert_one({})
    client.drop_database(db.name)
    assert db.name not in client.list_database_names()


def test_indexes_are_listed_with_the_id_index(db):
    db.c.create_index([("a", 1), ("b", -1)], name="a_b")
    names = {i["name"]: dict(i["key"]) for i in db.c.list_indexes()}
    assert names == {"_id_": {"_id": 1}, "a_b": {"a": 1, "b": -1}}
    db.c.drop_index("a_b")
    assert [i["name"] for i in db.c.list_indexes()] == ["_id_"]


def test_aggregation_stages(db):
    db.c.insert_many([{"_id": i, "g": i % 3, "v": i} for i in range(30)])
    grouped = list(
        db.c.aggregate(
            [
                {"$match": {"v": {"$gte": 3}}},
                {"$group": {"_id": "$g", "n": {"$sum": 1}}},
                {"$sort": {"_id": 1}},
            ]
        )
    )
    assert grouped == [{"_id": 0, "n": 9}, {"_id": 1, "n": 9}, {"_id": 2, "n": 9}]
    page = list(
        db.c.aggregate([{"$sort": {"v": -1}}, {"$skip": 2}, {"$limit": 3}, {"$project": {"_id": 0, "v": 1}}])
    )
    assert page == [{"v": 27}, {"v": 26}, {"v": 25}]
    assert list(db.c.aggregate([{"$match": {"g": 1}}, {"$count": "n"}])) == [{"n": 10}]
    sample = list(db.c.aggregate([{"$sample": {"size": 7}}]))
    assert len(sample) == 7 and len({d["_id"] for d in sample}) == 7


def test_bucket_auto_on_id_splits_into_ordered_ranges(db):
    db.c.insert_many([{"_id": i} for i in range(100)])
    buckets = list(db.c.aggregate([{"$bucketAuto": {"groupBy": "$_id", "buckets": 4}}]))
    assert [b["_id"] for b in buckets] == [
        {"min": 0, "max": 25},
        {"min": 25, "max": 50},
        {"min": 50, "max": 75},
        {"min": 75, "max": 99},
    ]
    assert [b["count"] for b in buckets] == [25, 25, 25, 25]


def test_coll_stats_and_collstats_stage(db):
    db.c.insert_many([{"_id": i, "pad": "x" * 100} for i in range(50)])
    stats = db.command("collStats", "c")
    assert stats["count"] == 50
    assert stats["size"] >= 50 * 100
    assert stats["avgObjSize"] == stats["size"] // 50
    assert stats["storageSize"] > 0
    stage = list(db.c.aggregate([{"$collStats": {"storageStats": {}, "count": {}}}]))
    assert len(stage) == 1
    assert stage[0]["storageStats"]["count"] == 50
    assert stage[0]["count"] == 50
    assert stage[0]["ns"] == f"{db.name}.c"


def test_data_size_counts_a_key_range(db):
    db.c.insert_many([{"_id": i, "pad": "y" * 50} for i in range(100)])
    whole = db.command("dataSize", f"{db.name}.c")
    ranged = db.command("dataSize", f"{db.name}.c", keyPattern={"_id": 1}, min={"_id": 10}, max={"_id": 20})
    assert whole["numObjects"] == 100
    assert ranged["numObjects"] == 10
    assert 0 < ranged["size"] < whole["size"]


def test_split_vector_on_id(db):
    db.c.insert_many([{"_id": i, "pad": "z" * 1000} for i in range(3000)])
    size = db.command("collStats", "c")["size"]
    result = db.command("splitVector", f"{db.name}.c", keyPattern={"_id": 1}, maxChunkSizeBytes=size // 4)
    keys = [k["_id"] for k in result["splitKeys"]]
    assert keys == sorted(keys)
    # Splits every maxChunkSize / (2 * avgObjSize) documents: about 8 chunks for a quarter of the data.
    assert 6 <= len(keys) <= 9
    objects = db.command(
        "splitVector",
        f"{db.name}.c",
        keyPattern={"_id": 1},
        maxChunkSizeBytes=1024 * 1024 * 64,
        maxChunkObjects=500,
    )
    assert objects["splitKeys"] == []  # all data fits in one chunk: no split
    small = db.command(
        "splitVector", f"{db.name}.c", keyPattern={"_id": 1}, maxChunkSizeBytes=size, maxChunkObjects=1000
    )
    assert [k["_id"] for k in small["splitKeys"]] == [1000, 2001]
    with pytest.raises(OperationFailure) as error:
        db.command("splitVector", f"{db.name}.c", keyPattern={"nope": 1}, maxChunkSizeBytes=1024)
    assert error.value.code == 27


def test_chunk_ranges_with_min_and_max_keys_cover_every_document(db):
    db.c.insert_many([{"_id": i} for i in range(50)])
    bounds = [MinKey(), 10, 30, MaxKey()]
    total = 0
    for low, high in zip(bounds, bounds[1:]):
        total += db.c.count_documents({"_id": {"$gte": low, "$lt": high}})
    assert total == 50
