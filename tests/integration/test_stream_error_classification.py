"""The window's classification of change-stream errors (core/mongo/stream_errors.py), checked against the
errors MongoDB (the simulator) answers: labelled as MongoDB's ErrorLabelBuilder labels them, from
the product's own stream (core/mongo/change_stream.open_stream).

The classification decides what a window does: re-open the stream (transient), fail with a
re-snapshot fix (history lost), fail with the offset repair (unusable position) or fail the window.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import open_stream
from airflow_provider_mongocdc.core.mongo.stream_errors import (
    is_history_lost,
    is_transient,
    is_unusable_position,
)
from airflow_provider_mongocdc.core.offsets.model import Position

pytestmark = pytest.mark.integration


def _config(unique_name: str) -> ConnectorConfig:
    return ConnectorConfig.from_properties(
        {"topic.prefix": unique_name, "collection.include.list": f"{unique_name[:40]}\\..*"}
    )


@contextmanager
def _fail_point(client: MongoClient, name: str, mode, **data):
    client.admin.command("configureFailPoint", name, mode=mode, data=data)
    try:
        yield
    finally:
        client.admin.command("configureFailPoint", name, mode="off")


def _stream_error(
    client: MongoClient, config: ConnectorConfig, collection, position=None
) -> OperationFailure:
    """The error the product's stream raises once a change is written (pymongo's own resume
    included)."""
    with pytest.raises(OperationFailure) as error:
        with open_stream(client, config, position, max_await_time_ms=200) as stream:
            collection.insert_one({})
            for _ in range(600):  # a bound only: each try_next waits up to 200 ms
                stream.try_next()
    return error.value


def test_a_get_more_failing_before_its_cursor_is_checked_out_is_transient_by_its_code(
    mongodb_uri, unique_name
):
    # failCommand fails the getMore before its cursor is checked out: MongoDB adds no
    # ResumableChangeStreamError, so pymongo does not resume. The window still re-opens the stream
    # from its own position for the change streams specification's resumable codes. (A getMore
    # failing after checkout carries the label and pymongo resumes it by itself:
    # test_stream_window_faults.py.)
    config = _config(unique_name)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        collection = client[unique_name[:40]].items
        with _fail_point(client, "failCommand", {"times": 1}, failCommands=["getMore"], errorCode=6):
            error = _stream_error(client, config, collection)
    assert error.code == 6 and not error.has_error_label("ResumableChangeStreamError")
    assert is_transient(error) and not is_history_lost(error) and not is_unusable_position(error)


def test_a_get_more_failing_without_a_resumable_code_fails_the_window(mongodb_uri, unique_name):
    config = _config(unique_name)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        collection = client[unique_name[:40]].items
        with _fail_point(client, "failGetMoreAfterCursorCheckout", {"times": 1}, errorCode=2):
            error = _stream_error(client, config, collection)
    assert error.code == 2 and not error.has_error_label("ResumableChangeStreamError")
    assert not is_transient(error) and not is_history_lost(error) and not is_unusable_position(error)


def test_the_change_stream_aggregate_failing_resumably_is_transient(mongodb_uri, unique_name):
    # The aggregate that opens the stream: labelled ResumableChangeStreamError too (pymongo retries
    # the read once).
    config = _config(unique_name)
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        with _fail_point(client, "failCommand", {"times": 2}, failCommands=["aggregate"], errorCode=6):
            with pytest.raises(OperationFailure) as error:
                open_stream(client, config, max_await_time_ms=200)
    assert error.value.has_error_label("ResumableChangeStreamError")
    assert is_transient(error.value)


@pytest.mark.simulator_only
def test_a_purged_resume_point_is_history_lost_not_transient(mongosim, unique_name):
    sim = mongosim()
    config = _config(unique_name)
    with sim.client() as client:
        collection = client[unique_name[:40]].items
        with open_stream(client, config, max_await_time_ms=200) as stream:
            collection.insert_one({"_id": 0})
            change = None
            for _ in range(600):  # a bound only
                change = stream.try_next()
                if change is not None:
                    break
        assert change is not None
        collection.insert_many([{"_id": n} for n in range(1, 50)])
        sim.set_oplog_retention(max_entries=5)
        position = Position(dict(change["_id"]), change["clusterTime"])
        with pytest.raises(OperationFailure) as error:
            open_stream(client, config, position, max_await_time_ms=200)
    assert error.value.code == 286 and error.value.has_error_label("NonResumableChangeStreamError")
    assert is_history_lost(error.value) and not is_transient(error.value)
