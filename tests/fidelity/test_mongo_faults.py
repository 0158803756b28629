"""Fault injection as on a mongod with test commands: failCommand, and replSetStepDown with
pymongo's retryable writes and automatic change-stream resume running for real."""

from __future__ import annotations

import os
from contextlib import contextmanager

import pytest
from pymongo import MongoClient
from pymongo.errors import AutoReconnect, NotPrimaryError, OperationFailure

from tests.fidelity.streams import next_event

pytestmark = [pytest.mark.fidelity, pytest.mark.faults]


@contextmanager
def fail_command(client, mode, **data):
    try:
        client.admin.command("configureFailPoint", "failCommand", mode=mode, data=data)
    except OperationFailure as error:
        if error.code == 59 or "configureFailPoint" in str(error):
            pytest.skip(
                "the server was not started with enableTestCommands=1 (configureFailPoint unavailable)"
            )
        raise
    try:
        yield
    finally:
        client.admin.command("configureFailPoint", "failCommand", mode="off")


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
