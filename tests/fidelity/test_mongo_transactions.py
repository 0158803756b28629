"""Multi-document transactions and retryable writes through pymongo sessions."""

from __future__ import annotations

import time

import pytest
from bson import Int64
from pymongo import MongoClient
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern
from pymongo.write_concern import WriteConcern

pytestmark = pytest.mark.fidelity


def test_writes_are_visible_only_after_commit(client, db):
    db.c.insert_one({"_id": 0})
    seen_outside = []

    def callback(session):
        db.c.insert_one({"_id": 1}, session=session)
        db.c.update_one({"_id": 0}, {"$set": {"in_txn": True}}, session=session)
        seen_outside.append(db.c.find_one({"_id": 1}))
        seen_outside.append(db.c.find_one({"_id": 0}))
        # Inside the transaction its own writes are visible.
        assert db.c.find_one({"_id": 1}, session=session) == {"_id": 1}

    with client.start_session() as session:
        session.with_transaction(
            callback, read_concern=ReadConcern("snapshot"), write_concern=WriteConcern("majority")
        )
    assert seen_outside == [None, {"_id": 0}]
    assert db.c.find_one({"_id": 1}) == {"_id": 1}
    assert db.c.find_one({"_id": 0}) == {"_id": 0, "in_txn": True}


def test_abort_discards_writes_and_emits_no_events(client, db):
    db.c.insert_one({"_id": 0})
    with db.c.watch(max_await_time_ms=200) as stream:
        with client.start_session() as session:
            session.start_transaction()
            db.c.insert_one({"_id": "aborted"}, session=session)
            session.abort_transaction()
        db.c.insert_one({"_id": "after"})
        event = None
        deadline = time.monotonic() + 120
        while event is None and time.monotonic() < deadline:
            event = stream.try_next()
    assert db.c.find_one({"_id": "aborted"}) is None
    assert event is not None, "no change event arrived within 120 s"
    assert event["documentKey"] == {"_id": "after"}


def test_snapshot_read_and_write_conflict(client, db):
    db.c.insert_one({"_id": 1, "v": 0})
    with client.start_session() as session:
        session.start_transaction(read_concern=ReadConcern("snapshot"))
        assert db.c.find_one({"_id": 1}, session=session)["v"] == 0
        db.c.update_one({"_id": 1}, {"$set": {"v": 1}})  # outside the transaction
        assert db.c.find_one({"_id": 1}, session=session)["v"] == 0  # the snapshot is stable
        with pytest.raises(OperationFailure) as error:
            db.c.update_one({"_id": 1}, {"$set": {"v": 2}}, session=session)
        assert error.value.code == 112
        assert error.value.has_error_label("TransientTransactionError")
        with pytest.raises(OperationFailure) as aborted:
            session.commit_transaction()
        assert aborted.value.code == 251
    assert db.c.find_one({"_id": 1})["v"] == 1


def test_with_transaction_retries_a_transient_conflict(client, db):
    db.c.insert_one({"_id": 1, "v": 0})
    attempts = []

    def callback(session):
        attempts.append(1)
        db.c.find_one({"_id": 1}, session=session)
        if len(attempts) == 1:
            db.c.update_one({"_id": 1}, {"$inc": {"v": 10}})  # a concurrent writer
        db.c.update_one({"_id": 1}, {"$inc": {"v": 1}}, session=session)

    with client.start_session() as session:
        session.with_transaction(callback)
    assert len(attempts) == 2
    assert db.c.find_one({"_id": 1})["v"] == 11


def test_commands_not_allowed_in_a_transaction(client, db):
    db.c.insert_one({"_id": 1})
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as error:
            db.command("count", "c", session=session)
        assert error.value.code in (263, 50851)
        session.abort_transaction()


def test_commit_is_retryable_and_idempotent(client, db):
    with client.start_session() as session:
        session.start_transaction()
        db.c.insert_one({"_id": 1}, session=session)
        session.commit_transaction()
        session.commit_transaction()  # committing again returns the same outcome
    assert db.c.count_documents({}) == 1


def test_retried_write_with_the_same_txn_number_is_applied_once(mongodb_uri, db):
    # A client of its own: the session's server-side txnNumber jumps ahead of pymongo's counter.
    with MongoClient(mongodb_uri) as own, own.start_session() as session:
        own_db = own[db.name]
        command = {"insert": "c", "documents": [{"_id": 1}], "txnNumber": Int64(1_000_000)}
        first = own_db.command(dict(command), session=session)
        again = own_db.command(dict(command), session=session)
        assert first["n"] == 1 and again["n"] == 1 and "writeErrors" not in again
        with pytest.raises(OperationFailure) as error:
            own_db.command(
                {"insert": "c", "documents": [{"_id": 2}], "txnNumber": Int64(999_999)}, session=session
            )
        assert error.value.code == 225
    assert db.c.count_documents({}) == 1


def test_snapshot_reads_see_the_data_of_their_cluster_time(mongodb_uri, db, recorder):
    db.c.insert_one({"_id": 1, "x": 11})
    with (
        MongoClient(mongodb_uri, event_listeners=[recorder]) as mongo,
        mongo.start_session(snapshot=True) as session,
    ):
        coll = mongo[db.name].c
        assert coll.find_one({"_id": 1}, session=session) == {"_id": 1, "x": 11}
        db.c.update_one({"_id": 1}, {"$inc": {"x": 1}})
        db.c.insert_one({"_id": 2, "x": 22})
        # Later reads of the session read at the cluster time of its first one.
        assert list(coll.find(session=session)) == [{"_id": 1, "x": 11}]
        assert coll.distinct("x", session=session) == [11]
        assert coll.count_documents({}, session=session) == 1
        with pytest.raises(OperationFailure) as error:
            coll.insert_one({"_id": 3}, session=session)
    assert error.value.code == 72  # InvalidOptions: no snapshot writes outside a transaction
    assert db.c.count_documents({}) == 2
    first_find = next(reply for name, reply in recorder.replies if name == "find")
    at = first_find["cursor"]["atClusterTime"]
    later = [c for name, c in recorder.commands if name in ("find", "distinct", "aggregate")][1:]
    assert later and all(c["readConcern"] == {"level": "snapshot", "atClusterTime": at} for c in later)


def test_catalog_writes_in_a_transaction_on_an_existing_collection(client, db):
    db.c.insert_one({"_id": 1})
    with client.start_session() as session:
        session.start_transaction()
        with pytest.raises(OperationFailure) as create:
            db.create_collection("c", session=session)
        session.abort_transaction()
        session.start_transaction()
        with pytest.raises(OperationFailure) as index:
            db.c.create_index("a", session=session)
        session.abort_transaction()
    assert create.value.code == 48  # NamespaceExists (outside a transaction: accepted, a no-op)
    assert index.value.code == 263  # OperationNotSupportedInTransaction
    assert index.value.details["errmsg"] == (
        f"Cannot create new indexes on existing collection {db.name}.c in a multi-document transaction."
    )


def test_explain_validate_and_local_sessions(client, db):
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    explained = db.c.find({"_id": 1}).explain()
    assert explained["queryPlanner"]["namespace"] == f"{db.name}.c"
    assert explained["executionStats"]["nReturned"] == 1
    validated = db.validate_collection("c")
    assert validated["valid"] is True and validated["nrecords"] == 2
    with client.start_session() as session:
        db.c.find_one(session=session)
        listed = list(db.aggregate([{"$listLocalSessions": {}}]))
        assert session.session_id["id"] in [doc["_id"]["id"] for doc in listed]
