"""CRUD, cursors, catalog commands and BSON ordering, as a pymongo user sees them."""

from __future__ import annotations

import datetime

import pytest
from bson import Decimal128, Int64, MaxKey, MinKey, ObjectId, Timestamp
from pymongo import ASCENDING, DESCENDING, ReturnDocument
from pymongo.errors import BulkWriteError, DuplicateKeyError, OperationFailure
from pymongo.read_concern import ReadConcern

pytestmark = pytest.mark.fidelity


def test_insert_find_and_default_natural_order(db):
    db.c.insert_many([{"_id": i, "v": i * 10} for i in (3, 1, 2)])
    assert [d["_id"] for d in db.c.find()] == [3, 1, 2]
    assert db.c.find_one({"_id": 2}) == {"_id": 2, "v": 20}


def test_missing_id_is_generated_and_put_first(db):
    result = db.c.insert_one({"a": 1})
    doc = db.c.find_one()
    assert isinstance(result.inserted_id, ObjectId)
    assert list(doc) == ["_id", "a"]


def test_duplicate_key_error_shape(db):
    db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError) as error:
        db.c.insert_one({"_id": 1})
    assert error.value.code == 11000
    assert (
        "E11000 duplicate key error collection: " + db.name + ".c index: _id_ dup key: { _id: 1 }"
        in error.value.details["errmsg"]
    )
    with pytest.raises(BulkWriteError) as bulk:
        db.c.insert_many([{"_id": 2}, {"_id": 1}, {"_id": 3}])
    assert bulk.value.details["nInserted"] == 1
    assert bulk.value.details["writeErrors"][0]["index"] == 1
    with pytest.raises(BulkWriteError) as bulk:
        db.c.insert_many([{"_id": 4}, {"_id": 1}, {"_id": 5}], ordered=False)
    assert bulk.value.details["nInserted"] == 2


def test_numbers_of_different_types_are_the_same_id(db):
    db.c.insert_one({"_id": 1})
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": 1.0})
    with pytest.raises(DuplicateKeyError):
        db.c.insert_one({"_id": Int64(1)})
    assert db.c.find_one({"_id": Decimal128("1")}) == {"_id": 1}


def test_update_operators(db):
    db.c.insert_one({"_id": 1, "n": 1, "tags": ["a"], "gone": True, "sub": {"x": 1}})
    result = db.c.update_one(
        {"_id": 1}, {"$set": {"sub.y": 2}, "$inc": {"n": 5}, "$push": {"tags": "b"}, "$unset": {"gone": ""}}
    )
    assert (result.matched_count, result.modified_count) == (1, 1)
    assert db.c.find_one() == {"_id": 1, "n": 6, "tags": ["a", "b"], "sub": {"x": 1, "y": 2}}
    noop = db.c.update_one({"_id": 1}, {"$set": {"n": 6}})
    assert (noop.matched_count, noop.modified_count) == (1, 0)


def test_pipeline_update(db):
    db.c.insert_one({"_id": 1, "a": 2, "b": 3})
    db.c.update_one({"_id": 1}, [{"$set": {"sum": {"$add": ["$a", "$b"]}}}, {"$unset": "b"}])
    assert db.c.find_one() == {"_id": 1, "a": 2, "sum": 5}


def test_upsert_and_multi_update(db):
    result = db.c.update_one({"_id": 7, "k": "x"}, {"$set": {"v": 1}}, upsert=True)
    assert result.upserted_id == 7
    assert db.c.find_one({"_id": 7}) == {"_id": 7, "k": "x", "v": 1}
    db.c.insert_many([{"_id": i, "g": "even" if i % 2 == 0 else "odd"} for i in range(10, 20)])
    many = db.c.update_many({"g": "even"}, {"$set": {"seen": True}})
    assert many.matched_count == 5 and many.modified_count == 5
    assert db.c.count_documents({"seen": True}) == 5


def test_replace_keeps_id_and_rejects_id_change(db):
    db.c.insert_one({"_id": 1, "a": 1})
    db.c.replace_one({"_id": 1}, {"b": 2})
    assert db.c.find_one() == {"_id": 1, "b": 2}
    with pytest.raises(OperationFailure) as error:
        db.c.replace_one({"_id": 1}, {"_id": 2, "b": 3})
    assert error.value.code == 66


def test_delete_one_and_many(db):
    db.c.insert_many([{"_id": i, "g": i % 3} for i in range(9)])
    assert db.c.delete_one({"g": 1}).deleted_count == 1
    assert db.c.delete_many({"g": 2}).deleted_count == 3
    assert db.c.count_documents({}) == 5


def test_find_one_and_modify_variants(db):
    db.c.insert_many([{"_id": i, "n": i} for i in range(3)])
    before = db.c.find_one_and_update({"_id": 1}, {"$inc": {"n": 10}})
    assert before == {"_id": 1, "n": 1}
    after = db.c.find_one_and_update(
        {"_id": 1}, {"$inc": {"n": 10}}, return_document=ReturnDocument.AFTER, projection={"_id": 0}
    )
    assert after == {"n": 21}
    removed = db.c.find_one_and_delete({}, sort=[("n", DESCENDING)])
    assert removed == {"_id": 1, "n": 21}
    replaced = db.c.find_one_and_replace(
        {"_id": 9}, {"x": 1}, upsert=True, return_document=ReturnDocument.AFTER
    )
    assert replaced == {"_id": 9, "x": 1}


def test_find_sort_skip_limit_projection_and_batches(db, mongodb_uri, recorder):
    db.c.insert_many([{"_id": i, "v": i % 7, "w": i} for i in range(250)])
    docs = list(
        db.c.find({"v": {"$gte": 3}}, {"w": 1})
        .sort([("v", DESCENDING), ("_id", ASCENDING)])
        .skip(5)
        .limit(20)
    )
    assert len(docs) == 20
    assert all(set(d) == {"_id", "w"} for d in docs)
    assert [d["_id"] for d in docs[:3]] == sorted(d["_id"] for d in docs[:3])
    from pymongo import MongoClient

    with MongoClient(mongodb_uri, event_listeners=[recorder]) as listened:
        coll = listened[db.name].c
        assert len(list(coll.find().batch_size(40))) == 250
        assert len(list(coll.find().limit(7).batch_size(3))) == 7
    finds = [c for name, c in recorder.commands if name == "find"]
    get_mores = [c for name, c in recorder.commands if name == "getMore"]
    assert finds[0]["batchSize"] == 40
    # 250 documents by 40: the first batch, then 6 getMores; limit 7 by 3: the first batch, then 2.
    assert len(get_mores) == 6 + 2


def test_find_hint_on_id_and_bad_hint(db):
    db.c.insert_many([{"_id": i} for i in range(5)])
    assert len(list(db.c.find({"_id": {"$gt": 1}}).hint([("_id", 1)]))) == 3
    with pytest.raises(OperationFailure) as error:
        list(db.c.find().hint("no_such_index"))
    assert error.value.code == 2


def test_counts(db):
    db.c.insert_many([{"_id": i, "g": i % 2} for i in range(31)])
    assert db.c.count_documents({}) == 31
    assert db.c.count_documents({"g": 1}) == 15
    assert db.c.count_documents({}, skip=10, limit=5) == 5
    assert db.c.estimated_document_count() == 31
    assert db.missing.count_documents({}) == 0
    assert db.missing.estimated_document_count() == 0
    assert sorted(db.c.distinct("g")) == [0, 1]


def test_bson_type_order_on_id_ranges(db):
    oid = ObjectId()
    when = datetime.datetime(2024, 1, 1)
    ids = [
        MinKey(),
        None,
        -5,
        1,
        2.5,
        Decimal128("3"),
        "a",
        "b",
        {"k": 1},
        b"bin",
        oid,
        False,
        True,
        when,
        MaxKey(),
    ]
    db.c.insert_many([{"_id": value} for value in ids])
    ascending = [d["_id"] for d in db.c.find().sort("_id", 1)]
    assert ascending[0] == MinKey() and ascending[-1] == MaxKey()
    assert ascending[1] is None
    assert ascending[2:6] == [-5, 1, 2.5, Decimal128("3")]
    assert ascending[6:8] == ["a", "b"]
    assert ascending[ascending.index(oid) + 1] is False
    # Comparison operators stay inside their type bracket ...
    numbers = [d["_id"] for d in db.c.find({"_id": {"$gte": 0, "$lt": 100}})]
    assert sorted(numbers, key=lambda n: float(str(n))) == [1, 2.5, Decimal128("3")]
    assert [d["_id"] for d in db.c.find({"_id": {"$gt": "a"}})] == ["b"]
    # ... except MinKey and MaxKey, which bound every bracket.
    assert db.c.count_documents({"_id": {"$gte": MinKey()}}) == len(ids)
    assert db.c.count_documents({"_id": {"$lt": MaxKey()}}) == len(ids) - 1
    assert db.c.count_documents({"_id": {"$gte": MinKey(), "$lt": 2}}) == 2


def test_a_read_after_a_cluster_time_the_server_has_not_reached_is_refused(client, db):
    db.items.insert_one({"_id": 1})
    with client.start_session(causal_consistency=True) as session:
        db.items.find_one({}, session=session)
        reached = session.cluster_time["clusterTime"]
        session.advance_operation_time(Timestamp(reached.time + 3600, 0))
        with pytest.raises(OperationFailure) as raised:
            db.items.with_options(read_concern=ReadConcern("majority")).find_one({}, session=session)
    assert raised.value.code == 72
    assert "afterClusterTime value must not be greater than the current clusterTime" in str(raised.value)
