"""Change streams through pymongo's watch(): event shapes, resume tokens, images, invalidation,
server-side pipelines, postBatchResumeToken, resuming and ChangeStreamHistoryLost."""

from __future__ import annotations

import datetime

import pytest
from bson import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern

from tests.fidelity.streams import next_event

pytestmark = pytest.mark.fidelity


def _drain(stream, count: int) -> list:
    return [next_event(stream) for _ in range(count)]


def test_crud_events_have_mongodb_shape(db):
    with db.c.watch(max_await_time_ms=200) as stream:
        db.c.insert_one({"_id": 1, "a": 1, "tags": ["x"], "gone": 1})
        db.c.update_one(
            {"_id": 1}, {"$set": {"a": 2, "sub.k": 1}, "$unset": {"gone": ""}, "$push": {"tags": "y"}}
        )
        db.c.replace_one({"_id": 1}, {"b": 1})
        db.c.delete_one({"_id": 1})
        insert, update, replace, delete = _drain(stream, 4)
    for event in (insert, update, replace, delete):
        assert set(event["_id"]) == {"_data"} and isinstance(event["_id"]["_data"], str)
        assert isinstance(event["clusterTime"], Timestamp)
        assert isinstance(event["wallTime"], datetime.datetime)
        assert event["ns"] == {"db": db.name, "coll": "c"}
        assert event["documentKey"] == {"_id": 1}
        assert "collectionUUID" not in event and "lsid" not in event and "txnNumber" not in event
    assert insert["operationType"] == "insert"
    assert insert["fullDocument"] == {"_id": 1, "a": 1, "tags": ["x"], "gone": 1}
    assert update["operationType"] == "update" and "fullDocument" not in update
    assert update["updateDescription"] == {
        "updatedFields": {"a": 2, "sub": {"k": 1}, "tags.1": "y"},
        "removedFields": ["gone"],
        "truncatedArrays": [],
    }
    assert replace["operationType"] == "replace" and replace["fullDocument"] == {"_id": 1, "b": 1}
    assert delete["operationType"] == "delete" and "fullDocument" not in delete
    tokens = [e["_id"]["_data"] for e in (insert, update, replace, delete)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 4


def test_nested_update_and_truncated_arrays(db):
    db.c.insert_one({"_id": 1, "doc": {"a": 1, "b": 2}, "arr": [1, 2, 3, 4]})
    with db.c.watch(max_await_time_ms=200) as stream:
        db.c.update_one({"_id": 1}, {"$set": {"doc.a": 5}})
        db.c.update_one({"_id": 1}, [{"$set": {"arr": {"$slice": ["$arr", 2]}}}])
        nested, truncated = _drain(stream, 2)
    assert nested["updateDescription"]["updatedFields"] == {"doc.a": 5}
    assert truncated["updateDescription"]["truncatedArrays"] == [{"field": "arr", "newSize": 2}]


def test_full_document_update_lookup(db):
    db.c.insert_many([{"_id": 1, "v": 0}, {"_id": 2, "v": 0}])
    with db.c.watch(full_document="updateLookup", max_await_time_ms=200) as stream:
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}})
        db.c.update_one({"_id": 2}, {"$inc": {"v": 1}})
        db.c.delete_one({"_id": 2})
        first, second, _ = _drain(stream, 3)
    assert first["fullDocument"] == {"_id": 1, "v": 1}
    assert second["fullDocument"] is None  # looked up after the delete: the document is gone


def test_pre_and_post_images_when_enabled(db):
    db.create_collection("c", changeStreamPreAndPostImages={"enabled": True})
    db.c.insert_one({"_id": 1, "v": 1})
    with db.c.watch(
        full_document="required", full_document_before_change="required", max_await_time_ms=200
    ) as stream:
        db.c.update_one({"_id": 1}, {"$set": {"v": 2}})
        db.c.replace_one({"_id": 1}, {"v": 3})
        db.c.delete_one({"_id": 1})
        update, replace, delete = _drain(stream, 3)
    assert update["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    assert update["fullDocument"] == {"_id": 1, "v": 2}
    assert replace["fullDocumentBeforeChange"] == {"_id": 1, "v": 2}
    assert delete["fullDocumentBeforeChange"] == {"_id": 1, "v": 3}


def test_pre_images_when_not_enabled(db):
    db.c.insert_one({"_id": 1, "v": 1})
    with db.c.watch(
        full_document_before_change="whenAvailable", full_document="whenAvailable", max_await_time_ms=200
    ) as stream:
        db.c.update_one({"_id": 1}, {"$set": {"v": 2}})
        event = next_event(stream)
    assert event["fullDocumentBeforeChange"] is None
    assert event["fullDocument"] is None
    with db.c.watch(full_document_before_change="required", max_await_time_ms=200) as stream:
        db.c.update_one({"_id": 1}, {"$set": {"v": 3}})
        with pytest.raises(OperationFailure) as error:
            next_event(stream)
    assert error.value.code == 47
    assert "pre-image" in error.value.details["errmsg"]


def test_drop_and_rename_invalidate_a_collection_stream(db):
    db.c.insert_one({"_id": 1})
    with db.c.watch(max_await_time_ms=200) as stream:
        db.c.drop()
        drop, invalidate = _drain(stream, 2)
        assert stream.try_next() is None and not stream.alive
    assert drop["operationType"] == "drop" and drop["ns"] == {"db": db.name, "coll": "c"}
    assert invalidate["operationType"] == "invalidate"
    assert set(invalidate) == {"_id", "operationType", "clusterTime", "wallTime"}
    assert invalidate["clusterTime"] == drop["clusterTime"]
    assert invalidate["_id"]["_data"] > drop["_id"]["_data"]
    db.a.insert_one({"_id": 1})
    with db.a.watch(max_await_time_ms=200) as stream:
        db.a.rename("b")
        rename, invalidate = _drain(stream, 2)
    assert rename["operationType"] == "rename"
    assert rename["ns"] == {"db": db.name, "coll": "a"}
    assert rename["to"] == {"db": db.name, "coll": "b"}
    assert invalidate["operationType"] == "invalidate"


def test_drop_database_on_a_database_stream(client, db):
    db.a.insert_one({"_id": 1})
    db.b.insert_one({"_id": 1})
    with db.watch(max_await_time_ms=200) as stream:
        client.drop_database(db.name)
        events = _drain(stream, 4)
    assert [e["operationType"] for e in events] == ["drop", "drop", "dropDatabase", "invalidate"]
    assert sorted(e["ns"]["coll"] for e in events[:2]) == ["a", "b"]
    assert events[2]["ns"] == {"db": db.name}


def test_resume_after_start_after_and_invalidate_rules(db):
    db.c.insert_one({"_id": 0})
    with db.c.watch(max_await_time_ms=200) as stream:
        db.c.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}])
        first = next_event(stream)
    with db.c.watch(resume_after=first["_id"], max_await_time_ms=200) as resumed:
        assert [e["documentKey"]["_id"] for e in _drain(resumed, 2)] == [2, 3]
    with db.c.watch(max_await_time_ms=200) as stream:
        db.c.drop()
        _drop, invalidate = _drain(stream, 2)
    with pytest.raises(OperationFailure) as error:
        db.c.watch(resume_after=invalidate["_id"])
    assert error.value.code == 260
    with db.c.watch(start_after=invalidate["_id"], max_await_time_ms=200) as after:
        db.c.insert_one({"_id": "new"})
        event = next_event(after)
    assert event["operationType"] == "insert" and event["documentKey"] == {"_id": "new"}


def test_start_at_operation_time_is_inclusive(db):
    db.c.insert_one({"_id": "earlier"})
    start = db.command("insert", "c", documents=[{"_id": "first"}])["operationTime"]
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    with db.c.watch(start_at_operation_time=start, max_await_time_ms=200) as stream:
        ids = [e["documentKey"]["_id"] for e in _drain(stream, 3)]
    assert ids == ["first", 1, 2]


def test_server_side_match_and_project(db):
    pipeline = [
        {"$match": {"operationType": "insert", "fullDocument.keep": True}},
        {"$project": {"fullDocument.secret": 0}},
    ]
    with db.c.watch(pipeline, max_await_time_ms=200) as stream:
        db.c.insert_many([{"_id": 1, "keep": False}, {"_id": 2, "keep": True, "secret": "s"}])
        db.c.delete_one({"_id": 2})
        event = next_event(stream)
        assert stream.try_next() is None
    assert event["fullDocument"] == {"_id": 2, "keep": True}
    with db.c.watch([{"$project": {"_id": 0}}], max_await_time_ms=200) as stream:
        db.c.insert_one({"_id": 3})
        with pytest.raises(OperationFailure) as error:
            next_event(stream)
    assert error.value.code == 280


def test_add_fields_in_pipeline(db):
    with db.c.watch(
        [{"$addFields": {"flag": "seen"}}, {"$unset": "wallTime"}], max_await_time_ms=200
    ) as stream:
        db.c.insert_one({"_id": 1})
        event = next_event(stream)
    assert event["flag"] == "seen" and "wallTime" not in event


def test_database_and_cluster_streams(client, db):
    with (
        db.watch(max_await_time_ms=200) as database_stream,
        client.watch([{"$match": {"ns.db": db.name}}], max_await_time_ms=200) as cluster_stream,
    ):
        db.a.insert_one({"_id": 1})
        db.b.insert_one({"_id": 2})
        for stream in (database_stream, cluster_stream):
            events = _drain(stream, 2)
            assert [(e["ns"]["coll"], e["documentKey"]["_id"]) for e in events] == [("a", 1), ("b", 2)]


def test_show_expanded_events_adds_collection_uuid_and_create(db):
    with db.watch(show_expanded_events=True, max_await_time_ms=200) as stream:
        db.c.insert_one({"_id": 1})
        create, insert = _drain(stream, 2)
    uuid = next(db.list_collections())["info"]["uuid"]
    assert create["operationType"] == "create" and create["collectionUUID"] == uuid
    assert insert["collectionUUID"] == uuid


def test_transaction_events_share_cluster_time_in_order(client, db):
    db.c.insert_one({"_id": 0})
    with db.c.watch(max_await_time_ms=200) as stream:
        with client.start_session() as session:
            session.with_transaction(lambda s: [db.c.insert_one({"_id": i}, session=s) for i in (1, 2, 3)])
            lsid = session.session_id
        events = _drain(stream, 3)
    assert [e["documentKey"]["_id"] for e in events] == [1, 2, 3]
    assert len({e["clusterTime"] for e in events}) == 1
    assert all(e["lsid"]["id"] == lsid["id"] and e["txnNumber"] >= 1 for e in events)
    tokens = [e["_id"]["_data"] for e in events]
    assert tokens == sorted(tokens)


def test_post_batch_resume_token_advances_without_matching_events(db):
    with db.quiet.watch(max_await_time_ms=100) as stream:
        assert stream.try_next() is None
        first = stream.resume_token
        db.busy.insert_many([{"_id": i} for i in range(3)])
        assert stream.try_next() is None
        assert stream.try_next() is None
        second = stream.resume_token
    assert second["_data"] > first["_data"]
    # Resuming from the advanced token sees the next change of the quiet collection.
    with db.quiet.watch(resume_after=second, max_await_time_ms=200) as resumed:
        db.quiet.insert_one({"_id": "q"})
        assert next_event(resumed)["documentKey"] == {"_id": "q"}


def test_post_batch_resume_token_is_on_every_reply(mongodb_uri, db, recorder):
    from pymongo import monitoring

    class Replies(monitoring.CommandListener):
        def __init__(self):
            self.cursors = []

        def started(self, event):
            pass

        def succeeded(self, event):
            if event.command_name in ("aggregate", "getMore"):
                self.cursors.append(event.reply["cursor"])

        def failed(self, event):
            pass

    replies = Replies()
    with MongoClient(mongodb_uri, event_listeners=[replies]) as listened:
        coll = listened[db.name].c
        with coll.watch(max_await_time_ms=100) as stream:
            stream.try_next()
            coll.insert_one({"_id": 1})
            next_event(stream)
            stream.try_next()
    assert len(replies.cursors) >= 3
    assert all("postBatchResumeToken" in cursor for cursor in replies.cursors)


@pytest.mark.simulator_only
def test_history_lost_when_retention_dropped_the_resume_point(mongosim):
    sim = mongosim()
    with sim.client() as mongo:
        coll = mongo.db.c
        with coll.watch(max_await_time_ms=200) as stream:
            coll.insert_one({"_id": 0})
            token = next_event(stream)["_id"]
        coll.insert_many([{"_id": i} for i in range(1, 100)])
        sim.set_oplog_retention(max_entries=10)
        with pytest.raises(OperationFailure) as error:
            coll.watch(resume_after=token)
    assert error.value.code == 286
    details = error.value.details
    assert details["codeName"] == "ChangeStreamHistoryLost"
    assert details["errorLabels"] == ["NonResumableChangeStreamError"]
    assert details["errmsg"].endswith(
        "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
    )


@pytest.mark.simulator_only
def test_open_stream_that_falls_off_the_oplog_fails_without_resuming(mongosim, recorder):
    sim = mongosim()
    with MongoClient(sim.uri, event_listeners=[recorder]) as mongo:
        coll = mongo.db.c
        stream = coll.watch(max_await_time_ms=100)
        coll.insert_one({"_id": 0})
        next_event(stream)
        coll.insert_many([{"_id": i} for i in range(1, 50)])
        sim.set_oplog_retention(max_entries=5)
        with pytest.raises(OperationFailure) as error:
            next_event(stream)
        stream.close()
    assert error.value.code == 286
    # pymongo did not try to resume: the only aggregate is the one that opened the stream.
    assert recorder.names().count("aggregate") == 1


@pytest.mark.simulator_only
def test_start_at_operation_time_before_the_oplog(mongosim):
    sim = mongosim()
    with sim.client() as mongo:
        # Roll the oplog past its "initiating set" entry (from which MongoDB resumes any earlier
        # time, see test_mongo_shard_added.py).
        mongo.db.c.insert_many([{"_id": i} for i in range(20)])
        sim.set_oplog_retention(max_entries=5)
        with pytest.raises(OperationFailure) as error:
            mongo.db.c.watch(start_at_operation_time=Timestamp(1, 1))
    assert error.value.code == 286


def test_read_concern_other_than_majority_is_refused(db):
    with pytest.raises(OperationFailure) as error:
        db.get_collection("c", read_concern=ReadConcern("local")).watch()
    assert error.value.code == 72
    assert error.value.details["errmsg"] == (
        "Aggregation stage $changeStream cannot run with a readConcern other than 'majority'. "
        "Current readConcern: local"
    )
    with db.get_collection("c", read_concern=ReadConcern("majority")).watch(max_await_time_ms=200) as stream:
        db.c.insert_one({"_id": 1})
        assert next_event(stream)["documentKey"] == {"_id": 1}


def test_unknown_and_disallowed_stages_after_change_stream(db):
    with pytest.raises(OperationFailure) as unknown:
        db.c.watch([{"$unsupported": "foo"}])
    with pytest.raises(OperationFailure) as disallowed:
        db.c.watch([{"$group": {"_id": None}}])
    assert unknown.value.code == 40324
    assert unknown.value.details["errmsg"] == "Unrecognized pipeline stage name: '$unsupported'"
    assert disallowed.value.code == 20
    assert disallowed.value.details["errmsg"] == "$group is not permitted in a $changeStream pipeline"


def test_project_on_a_dotted_path_builds_an_embedded_document(db):
    pipeline = [{"$project": {"operationType": "insert", "ns.viewOn": "db.coll"}}]
    with db.c.watch(pipeline, max_await_time_ms=200) as stream:
        db.c.insert_one({"_id": 1})
        event = next_event(stream)
    assert set(event) == {"_id", "operationType", "ns"}
    assert event["operationType"] == "insert" and event["ns"] == {"viewOn": "db.coll"}


def test_disambiguated_paths_with_show_expanded_events(db):
    db.c.insert_one({"_id": 1, "a": {"1": 1}, "b": [{"1": 1}], "c": 1})
    with (
        db.c.watch(show_expanded_events=True, max_await_time_ms=200) as expanded,
        db.c.watch(max_await_time_ms=200) as plain,
    ):
        db.c.update_one({"_id": 1}, {"$set": {"a.1": 2, "b.0.1": 2}})
        db.c.update_one({"_id": 1}, {"$set": {"c": 2}})
        ambiguous, unambiguous = _drain(expanded, 2)
        default = next_event(plain)
    assert ambiguous["updateDescription"]["disambiguatedPaths"] == {"a.1": ["a", "1"], "b.0.1": ["b", 0, "1"]}
    assert unambiguous["updateDescription"]["disambiguatedPaths"] == {}
    assert "disambiguatedPaths" not in default["updateDescription"]


@pytest.mark.simulator_only
def test_left_out_features_are_refused_with_mongodb_errors(db):
    db.c.insert_one({"_id": 1})
    for stage in ({"$out": "other"}, {"$merge": {"into": "other"}}):
        with pytest.raises(OperationFailure) as error:
            list(db.c.aggregate([stage]))
        assert error.value.code == 40324
        assert error.value.details["errmsg"] == f"Unrecognized pipeline stage name: '{next(iter(stage))}'"
    with pytest.raises(OperationFailure) as view:
        db.create_collection("v", viewOn="c", pipeline=[])
    assert view.value.code == 40415
    assert view.value.details["errmsg"] == "BSON field 'create.viewOn' is an unknown field."
