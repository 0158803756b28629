"""Fault injection as on a mongod with test commands: failCommand, and replSetStepDown with
pymongo's retryable writes and automatic change-stream resume running for real."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
from bson import Int64
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, ConnectionFailure, NotPrimaryError, OperationFailure

from tests.fidelity.streams import next_event

pytestmark = [pytest.mark.fidelity, pytest.mark.faults]


@contextmanager
def fail_point(client, name: str, mode, **data):
    """A server fail point (as on a mongod started with enableTestCommands=1), off at the end."""
    try:
        client.admin.command("configureFailPoint", name, mode=mode, data=data)
    except OperationFailure as error:
        if error.code == 59:
            pytest.skip(
                "the server was not started with enableTestCommands=1 (configureFailPoint unavailable)"
            )
        raise
    try:
        yield
    finally:
        client.admin.command("configureFailPoint", name, mode="off")


def fail_command(client, mode, **data):
    return fail_point(client, "failCommand", mode, **data)


def test_fail_command_times_with_error_code_and_labels(client, db):
    db.c.insert_one({"_id": 1})
    with fail_command(client, {"times": 1}, failCommands=["find"], errorCode=2, errorLabels=["MyLabel"]):
        with pytest.raises(OperationFailure) as error:
            db.c.find_one()
        assert error.value.code == 2
        assert error.value.details["errmsg"] == "Failing command via 'failCommand' failpoint"
        assert error.value.has_error_label("MyLabel")
        assert db.c.find_one() == {"_id": 1}  # only once


def test_retryable_write_after_not_primary_error_is_applied_once(client, db):
    with fail_command(client, {"times": 1}, failCommands=["insert"], errorCode=10107):
        db.c.insert_one({"_id": 1})
    assert db.c.count_documents({}) == 1


def test_retryable_write_after_closed_connection_is_applied_once(client, db):
    with fail_command(client, {"times": 1}, failCommands=["insert"], closeConnection=True):
        db.c.insert_one({"_id": 1})
    assert db.c.count_documents({}) == 1


def test_retryable_read_after_closed_connection(client, db):
    db.c.insert_one({"_id": 1})
    with fail_command(client, {"times": 1}, failCommands=["find"], closeConnection=True):
        assert db.c.find_one() == {"_id": 1}


def test_error_labels_added_by_the_server(client, db, recorder, mongodb_uri):
    with MongoClient(mongodb_uri, retryWrites=False, event_listeners=[recorder]) as no_retry:
        with fail_command(client, {"times": 1}, failCommands=["insert"], errorCode=11602):
            with pytest.raises((OperationFailure, NotPrimaryError, AutoReconnect)):
                no_retry[db.name].c.insert_one({"_id": 1})
    failure = dict(recorder.failures[-1][1])
    assert failure["code"] == 11602
    # Without a txnNumber the write is not retryable: no RetryableWriteError label.
    assert "RetryableWriteError" not in failure.get("errorLabels", [])


def test_app_name_limits_the_fail_point(client, db, mongodb_uri):
    db.c.insert_one({"_id": 1})
    with MongoClient(mongodb_uri, appName="victim", retryReads=False) as victim:
        with fail_command(client, "alwaysOn", failCommands=["find"], errorCode=8, appName="victim"):
            with pytest.raises(OperationFailure):
                victim[db.name].c.find_one()
            assert db.c.find_one() == {"_id": 1}


def test_block_connection_delays_but_answers(client, db):
    db.c.insert_one({"_id": 1})
    with fail_command(client, {"times": 1}, failCommands=["find"], blockConnection=True, blockTimeMS=200):
        assert db.c.find_one() == {"_id": 1}


@pytest.fixture
def stepdown_uri(mongosim):
    """A replica set that may be stepped down: the real one, else a fresh 3-member simulator."""
    real = os.environ.get("MONGOCDC_TEST_MONGODB_URI")
    if real:
        return real
    return mongosim(members=3).uri


def _step_down(client, seconds: int) -> None:
    try:
        client.admin.command({"replSetStepDown": seconds, "secondaryCatchUpPeriodSecs": 0, "force": True})
    except AutoReconnect:
        pass


def test_change_stream_resumes_and_writes_retry_after_step_down(stepdown_uri, db_name, recorder):
    with MongoClient(stepdown_uri, event_listeners=[recorder], serverSelectionTimeoutMS=30000) as mongo:
        coll = mongo[db_name].c
        try:
            with coll.watch(max_await_time_ms=200) as stream:
                coll.insert_one({"_id": 1})
                assert next_event(stream)["documentKey"] == {"_id": 1}
                old_primary = mongo.admin.command("hello")["primary"]
                _step_down(mongo, 10)
                coll.insert_one({"_id": 2})  # retried on the newly elected primary
                assert next_event(stream)["documentKey"] == {"_id": 2}
                new_primary = mongo.admin.command("hello")["primary"]
            assert coll.count_documents({}) == 2
            streams = [
                c
                for name, c in recorder.commands
                if name == "aggregate" and "$changeStream" in c["pipeline"][0]
            ]
            assert len(streams) >= 2, "pymongo should have resumed the change stream with a new aggregate"
            assert "resumeAfter" in streams[-1]["pipeline"][0]["$changeStream"]
            if len(mongo.admin.command("hello")["hosts"]) > 1:
                assert new_primary != old_primary
        finally:
            mongo.drop_database(db_name)


@pytest.mark.simulator_only
def test_single_member_is_primary_again_after_the_step_down_period(mongosim):
    sim = mongosim()
    with sim.client(serverSelectionTimeoutMS=30000) as mongo:
        mongo.db.c.insert_one({"_id": 1})
        with mongo.db.c.watch(max_await_time_ms=200) as stream:
            _step_down(mongo, 2)
            status = mongo.admin.command("replSetGetStatus", read_preference=_secondary_preferred())
            assert status["members"][0]["stateStr"] == "SECONDARY"
            # Waits for the re-election (within the client's server selection timeout), then succeeds.
            mongo.db.c.insert_one({"_id": 2})
            assert next_event(stream)["documentKey"] == {"_id": 2}
        assert mongo.admin.command("replSetGetStatus")["members"][0]["stateStr"] == "PRIMARY"


@pytest.mark.simulator_only
def test_step_down_without_force_on_a_single_member_fails(mongosim):
    sim = mongosim()
    with sim.client() as mongo:
        with pytest.raises(OperationFailure) as error:
            mongo.admin.command({"replSetStepDown": 1, "secondaryCatchUpPeriodSecs": 0})
        assert error.value.code == 262
        assert mongo.admin.command("hello")["isWritablePrimary"] is True


@pytest.mark.simulator_only
def test_step_down_interrupts_open_cursors_with_resumable_label(mongosim, recorder):
    sim = mongosim(members=3)
    with MongoClient(sim.uri, event_listeners=[recorder], serverSelectionTimeoutMS=20000) as mongo:
        coll = mongo.db.c
        with coll.watch(max_await_time_ms=200) as stream:
            stream.try_next()
            _step_down(mongo, 10)
            coll.insert_one({"_id": 1})
            assert next_event(stream)["documentKey"] == {"_id": 1}
    get_more_failures = [f for name, f in recorder.failures if name == "getMore"]
    assert get_more_failures, "the interrupted getMore should have failed"
    assert get_more_failures[0]["code"] == 11602
    assert "ResumableChangeStreamError" in get_more_failures[0]["errorLabels"]


def _secondary_preferred():
    from pymongo import ReadPreference

    return ReadPreference.SECONDARY_PREFERRED


def test_test_commands_are_enabled(client):
    # pymongo's test suite (and any driver's) checks this before using fail points.
    assert client.admin.command("getParameter", "*")["enableTestCommands"] is True


def test_fail_point_after_cursor_checkout_fails_a_change_stream_get_more_resumably(client, db, recorder):
    # MongoDB's failGetMoreAfterCursorCheckout: the getMore fails once its cursor is checked out, so
    # the error is the change stream's own and carries ResumableChangeStreamError for a resumable
    # code; pymongo resumes from its last token.
    with MongoClient(client.address[0], client.address[1], event_listeners=[recorder]) as mongo:
        coll = mongo[db.name].c
        with coll.watch(max_await_time_ms=200) as stream:
            with fail_point(client, "failGetMoreAfterCursorCheckout", {"times": 1}, errorCode=6):
                db.c.insert_one({"_id": 1})
                assert next_event(stream)["documentKey"] == {"_id": 1}
    (failure,) = [f for name, f in recorder.failures if name == "getMore"]
    assert failure["code"] == 6
    assert failure["errmsg"] == "Hit the 'failGetMoreAfterCursorCheckout' failpoint"
    assert failure["errorLabels"] == ["ResumableChangeStreamError"]
    aggregates = [c for name, c in recorder.commands if name == "aggregate"]
    assert len(aggregates) == 2 and "resumeAfter" in aggregates[1]["pipeline"][0]["$changeStream"]


def test_fail_command_on_a_change_stream_get_more_gets_no_resumable_label(client, db):
    # failCommand fails the getMore before its cursor is checked out: MongoDB adds no
    # ResumableChangeStreamError (the change streams spec's "does not resume" case).
    with db.c.watch(max_await_time_ms=200) as stream:
        with fail_command(client, {"times": 1}, failCommands=["getMore"], errorCode=6):
            db.c.insert_one({"_id": 1})
            with pytest.raises(OperationFailure) as error:
                next_event(stream)
    assert error.value.code == 6
    assert not error.value.has_error_label("ResumableChangeStreamError")


def test_fail_command_on_a_change_stream_aggregate_is_labelled_resumable(client, db, mongodb_uri):
    # The aggregate that opens a change stream: ErrorLabelBuilder parses it as a $changeStream and
    # adds ResumableChangeStreamError for a resumable code; not for a plain aggregate.
    with MongoClient(mongodb_uri, retryReads=False) as mongo:
        coll = mongo[db.name].c
        with fail_command(client, {"times": 2}, failCommands=["aggregate"], errorCode=6):
            with pytest.raises(OperationFailure) as stream_error:
                coll.watch()
            with pytest.raises(OperationFailure) as plain_error:
                coll.aggregate([{"$match": {}}])
    assert stream_error.value.details["errorLabels"] == ["ResumableChangeStreamError"]
    assert "errorLabels" not in plain_error.value.details


def test_retryable_write_concern_error_is_labelled_and_the_write_is_retried_once(
    client, db, mongodb_uri, recorder
):
    wce = {"code": 91, "errmsg": "Replication is being shut down"}
    with MongoClient(mongodb_uri, event_listeners=[recorder]) as mongo:
        with fail_command(client, {"times": 1}, failCommands=["insert"], writeConcernError=wce):
            mongo[db.name].c.insert_one({"_id": 1})
    replies = [reply for name, reply in recorder.replies if name == "insert"]
    assert len(replies) == 2  # the write concern error, then the retry
    assert replies[0]["writeConcernError"]["code"] == 91
    assert replies[0]["errorLabels"] == ["RetryableWriteError"]
    assert "writeConcernError" not in replies[1] and replies[1]["n"] == 1
    assert list(db.c.find()) == [{"_id": 1}]


def test_transient_transaction_labels_follow_mongodb_rules(client, db, mongodb_uri):
    db.c.insert_one({"_id": 0})
    with MongoClient(mongodb_uri, retryWrites=False) as mongo, mongo.start_session() as session:
        coll = mongo[db.name].c
        # A statement of a transaction failing with a retriable code (HostUnreachable).
        session.start_transaction()
        with fail_command(client, {"times": 1}, failCommands=["insert"], errorCode=6):
            with pytest.raises(OperationFailure) as statement_error:
                coll.insert_one({"_id": 1}, session=session)
        session.abort_transaction()
        # commitTransaction failing with NoSuchTransaction: the whole transaction may be retried.
        session.start_transaction()
        coll.insert_one({"_id": 2}, session=session)
        with fail_command(client, {"times": 1}, failCommands=["commitTransaction"], errorCode=251):
            with pytest.raises(OperationFailure) as commit_error:
                session.commit_transaction()
    assert statement_error.value.details["errorLabels"] == ["TransientTransactionError"]
    assert commit_error.value.details["errorLabels"] == ["TransientTransactionError"]


def test_killing_a_session_aborts_its_open_transaction(client, db):
    # killSessions (and killAllSessions, which pymongo's test runner sends before each test) abort
    # the sessions' transactions. Only this test's session is killed: the server may be shared.
    db.c.insert_one({"_id": 0})
    with client.start_session() as session:
        session.start_transaction()
        db.c.insert_one({"_id": 1}, session=session)
        client.admin.command("killSessions", [session.session_id])
        with pytest.raises(OperationFailure) as error:
            session.commit_transaction()
    assert error.value.code == 251  # NoSuchTransaction
    assert list(db.c.find()) == [{"_id": 0}]


def test_topology_version_only_on_not_primary_errors(client, db, mongodb_uri, recorder):
    # mongod adds its topologyVersion to NotPrimaryError replies; to shutdown errors only in quiesce
    # mode (appendErrorLabelsAndTopologyVersion), so a driver does not take ShutdownInProgress for a
    # stale error and clears its pool.
    with MongoClient(mongodb_uri, retryReads=False, event_listeners=[recorder]) as mongo:
        coll = mongo[db.name].c
        for code in (91, 10107):
            with fail_command(client, {"times": 1}, failCommands=["find"], errorCode=code):
                with pytest.raises((OperationFailure, AutoReconnect)):
                    coll.find_one()
    shutdown, not_primary = [f for name, f in recorder.failures if name == "find"]
    assert shutdown["code"] == 91 and "topologyVersion" not in shutdown
    assert not_primary["code"] == 10107 and "topologyVersion" in not_primary


def test_write_fail_point_closing_the_connection_keeps_the_write_and_the_retry_applies_it_once(
    client, db, mongodb_uri, recorder
):
    with MongoClient(mongodb_uri, event_listeners=[recorder]) as mongo:
        with fail_point(client, "onPrimaryTransactionalWrite", {"times": 1}):
            mongo[db.name].c.insert_one({"_id": 1})
    assert [name for name, _ in recorder.failures] == ["insert"]  # the closed connection
    assert len([name for name, _ in recorder.replies if name == "insert"]) == 1
    assert list(db.c.find()) == [{"_id": 1}]


def test_write_fail_point_failing_before_commit_writes_nothing(client, db):
    with fail_point(client, "onPrimaryTransactionalWrite", "alwaysOn", failBeforeCommitExceptionCode=1):
        with pytest.raises(ConnectionFailure):
            db.c.insert_one({"_id": 1})
    assert db.c.count_documents({}) == 0
    # Configured again without data, the fail point has none: it closes the connection only.
    with fail_point(client, "onPrimaryTransactionalWrite", {"times": 1}):
        db.c.insert_one({"_id": 2})
    assert list(db.c.find()) == [{"_id": 2}]


def test_retried_write_runs_only_the_statements_not_yet_executed(client, db, mongodb_uri):
    db.c.insert_many([{"_id": 0, "n": 0}, {"_id": 1, "n": 0}])
    updates = [{"q": {"_id": i}, "u": {"$inc": {"n": 1}}} for i in (0, 1)]
    command = {"update": "c", "updates": updates, "txnNumber": Int64(1)}
    with MongoClient(mongodb_uri) as own, own.start_session() as session:
        own_db = own[db.name]
        # The second statement fails before it is written; the first stays written.
        with fail_point(
            client,
            "onPrimaryTransactionalWrite",
            {"skip": 1},
            closeConnection=False,
            failBeforeCommitExceptionCode=1,
        ):
            first = own_db.command(dict(command), session=session)
        again = own_db.command(dict(command), session=session)
    assert first["nModified"] == 1 and [e["index"] for e in first["writeErrors"]] == [1]
    assert first["writeErrors"][0]["code"] == 1
    assert again["nModified"] == 2 and "writeErrors" not in again
    assert list(db.c.find(sort=[("_id", 1)])) == [{"_id": 0, "n": 1}, {"_id": 1, "n": 1}]
