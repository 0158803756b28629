"""Incremental snapshot requests: the trigger form's modes and filters, the request's life cycle
(start, stop, replacement), the chunk queries over mixed _id types, and the documents read again
when a change without the document dropped their rows."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from bson import json_util
from bson.codec_options import CodecOptions
from bson.json_util import CANONICAL_JSON_OPTIONS
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.snapshot.incremental import (
    COMPLETED,
    RUNNING,
    STOPPED,
    IncrementalProgress,
    IncrementalRequest,
    reconcile,
)
from airflow_provider_mongocdc.core.window.incremental import (
    IncrementalChunk,
    after_chunk,
    after_query,
    key_bytes,
)
from airflow_provider_mongocdc.core.window.summary import describe_incremental
from airflow_provider_mongocdc.operators.base import parse_connector_config
from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator, merged_request

pytestmark = pytest.mark.unit

CONFIG = '{"topic.prefix": "shop", "collection.include.list": "shop\\\\..*"}'


def decide(monkeypatch, gap: bool = False, **kwargs):
    operator = MongoResnapshotOperator(task_id="resnapshot", connector_config=CONFIG, **kwargs)
    found = SimpleNamespace(
        gap=gap, describe=lambda: "rs0 purged", to_dict=lambda: {"gap_partitions": ["rs0"]}
    )
    monkeypatch.setattr(operator, "check_gap", lambda config: found)
    return operator.decide(parse_connector_config(CONFIG))


def test_incremental_mode_takes_collections_and_a_filter_per_collection(monkeypatch):
    decision = decide(
        monkeypatch,
        mode="incremental",
        collections=["shop.orders"],
        filters='{"shop.orders": {"status": "open"}}',
    )
    assert decision["mode"] == "incremental" and decision["collections"] == ["shop.orders"]
    assert decision["filters"] == {"shop.orders": {"status": "open"}}
    assert decision["reset_offset"] is False


def test_incremental_mode_after_an_oplog_gap_becomes_a_blocking_gap_resnapshot(monkeypatch):
    decision = decide(monkeypatch, gap=True, mode="incremental")
    assert decision["mode"] == "gap" and decision["reset_offset"] is True and decision["filters"] == {}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "manual", "filters": {"shop.orders": {"a": 1}}}, "Filters apply to mode incremental only"),
        ({"mode": "stop", "collections": ["shop.orders"]}, "Mode stop ends the whole running"),
        ({"mode": "incremental", "filters": "[1, 2]"}, "Filters must be a JSON object"),
        ({"mode": "incremental", "filters": "{not json"}, "Filters is not valid JSON"),
        ({"mode": "incremental", "filters": {"orders": {}}}, "`orders` is not `<database>.<collection>`"),
        ({"mode": "incremental", "filters": {"shop.orders": "{bad"}}, "The filter of shop.orders is not"),
        ({"mode": "incremental", "filters": {"shop.orders": [1]}}, "must be a query document"),
        ({"mode": "sometimes"}, "Unknown re-snapshot mode"),
    ],
)
def test_form_mistakes_are_refused_in_words(monkeypatch, kwargs, message):
    with pytest.raises(ConfigError) as raised:
        decide(monkeypatch, **kwargs)
    assert message in str(raised.value)


def test_a_filter_must_name_a_requested_collection():
    with pytest.raises(ConfigError, match="not among the collections to copy"):
        IncrementalRequest.new(["shop.orders"], {"shop.customers": {"vip": True}})


def test_stop_mode_is_a_decision_without_a_gap_check(monkeypatch):
    operator = MongoResnapshotOperator(task_id="resnapshot", connector_config=CONFIG, mode="stop")
    monkeypatch.setattr(operator, "check_gap", lambda config: pytest.fail("stop must not check the oplog"))
    assert operator.decide(parse_connector_config(CONFIG))["mode"] == "stop"


def resolve(names):
    return list(names) or ["shop.customers", "shop.orders"]


def test_a_new_request_starts_with_its_collections_and_every_captured_one_when_empty():
    request = IncrementalRequest.new([], reason="all")
    progress = reconcile(None, request, resolve)
    assert progress.status == RUNNING and progress.pending == ("shop.customers", "shop.orders")
    assert progress.request_id == request.request_id
    assert reconcile(progress, request, resolve) is progress  # the same request goes on


def test_a_stop_request_ends_the_running_snapshot_and_a_new_request_replaces_it():
    first = IncrementalRequest.new(["shop.orders"])
    progress = reconcile(None, first, resolve)
    stopped = reconcile(progress, first.stopped(), resolve)
    assert stopped.status == STOPPED and stopped.message == "stopped on request"
    second = IncrementalRequest.new(["shop.customers"])
    replaced = reconcile(progress, second, resolve)
    assert replaced.request_id == second.request_id and replaced.pending == ("shop.customers",)
    # A stop of a request this partition never started changes nothing.
    assert reconcile(None, first.stopped(), resolve) is None


def test_a_request_for_no_collection_completes_at_once():
    progress = reconcile(None, IncrementalRequest.new([]), lambda names: [])
    assert progress.status == COMPLETED and progress.message == "no collection to copy"


def test_progress_survives_its_stored_json():
    progress = IncrementalProgress(
        "incremental-1", pending=("shop.a",), current="shop.b", last_key='{"$numberInt": "5"}', documents=7
    )
    assert IncrementalProgress.from_json(progress.to_json()) == progress


def test_a_new_request_while_one_runs_copies_both():
    running = IncrementalProgress(
        "incremental-1", pending=("shop.orders",), filters={"shop.orders": '{"a": 1}'}
    )
    merged = merged_request(["shop.customers"], {}, "more", running)
    assert merged.collections == ("shop.customers", "shop.orders")
    assert merged.filters == {"shop.orders": '{"a": {"$numberInt": "1"}}'}
    # A running copy of every collection stays a copy of every collection.
    everything = IncrementalProgress("incremental-2", pending=())
    assert merged_request(["shop.customers"], {}, "", everything).collections == ()


def test_chunk_queries_follow_the_bson_order_across_id_types():
    assert after_query(5, 90) == {"_id": {"$gt": 5, "$lte": 90}}
    oid = ObjectId()
    assert after_query(5, oid) == {
        "$expr": {"$and": [{"$gt": ["$_id", {"$literal": 5}]}, {"$lte": ["$_id", {"$literal": oid}]}]}
    }
    assert after_query(None, oid) == {"$expr": {"$lte": ["$_id", {"$literal": oid}]}}


def test_a_gap_resnapshot_that_moves_the_offset_ends_a_running_incremental_snapshot():
    from airflow_provider_mongocdc.core.offsets.model import OffsetState
    from airflow_provider_mongocdc.core.snapshot.incremental import superseded_incremental

    running = IncrementalProgress("incremental-1", pending=("shop.orders",), documents=12)
    state = superseded_incremental(OffsetState(incremental=running.to_json()), "20261124T000000Z-abcd")
    ended = IncrementalProgress.from_json(state.incremental)
    assert ended.status == STOPPED and ended.documents == 12
    assert ended.message == "superseded by the blocking snapshot 20261124T000000Z-abcd"
    completed = OffsetState(incremental=running.finish(COMPLETED).to_json())
    assert superseded_incremental(completed, "x") is completed


def _change(operation: str, key, **extra) -> dict:
    return {
        "operationType": operation,
        "ns": {"db": "shop", "coll": "orders"},
        "documentKey": {"_id": key},
        **extra,
    }


def _chunk(keys, *, rereads=(), exhausted=True) -> IncrementalChunk:
    options = CodecOptions()
    rows = {key_bytes(key, options): {"_id": key} for key in keys}
    last = None if rereads else json_util.dumps(max(keys), json_options=CANONICAL_JSON_OPTIONS)
    return IncrementalChunk("shop.orders", rows, last, exhausted, Timestamp(9, 1), options, rereads=rereads)


@pytest.mark.parametrize(
    ("properties", "change", "omitted"),
    [
        ({"capture.mode": "change_streams"}, _change("update", 1, updateDescription={}), True),
        ({}, _change("update", 1, fullDocument={"_id": 1}), False),
        ({}, _change("update", 1, fullDocument=None), True),  # the lookup found nothing
        ({"event.format": "oplog"}, _change("update", 1, fullDocument={"_id": 1}), True),
        ({"capture.mode": "change_streams"}, _change("replace", 1, fullDocument={"_id": 1}), False),
        ({}, _change("insert", 1, fullDocument={"_id": 1}), False),
        ({"skipped.operations": "c"}, _change("insert", 1, fullDocument={"_id": 1}), True),
        ({"capture.mode": "change_streams"}, _change("delete", 1), False),
    ],
)
def test_events_that_do_not_carry_the_document_a_change_leaves(properties, change, omitted):
    config = ConnectorConfig.from_properties({"topic.prefix": "shop", **properties})
    assert EventBuilder(config).omits_document(change) is omitted


def test_rows_dropped_for_update_deltas_are_read_again_before_the_snapshot_completes():
    chunk = _chunk([1, 2, 3, 4, 5])
    chunk.apply(_change("update", 1), omitted=True)  # a delta: to read again
    chunk.apply(_change("update", 2), omitted=True)
    chunk.apply(_change("replace", 2))  # ... unless a later change carries the document
    chunk.apply(_change("update", 3), omitted=True)
    chunk.apply(_change("delete", 3))  # ... or deletes it
    chunk.apply(_change("update", 4))  # a full document
    chunk.apply(_change("update", 9), omitted=True)  # not a row of this chunk
    assert sorted(chunk.rows) == [key_bytes(5, CodecOptions())] and chunk.dropped == 4
    running = IncrementalProgress("incremental-1", current="shop.orders", max_key='{"$numberInt": "5"}')

    progress = after_chunk(running, chunk, len(chunk.rows))

    # The collection's range is done, but the snapshot is not: key 1 waits to be read again.
    assert progress.status == RUNNING and progress.current is None and progress.done == ("shop.orders",)
    assert progress.reread == {"shop.orders": ('{"$numberInt": "1"}',)}
    assert progress.collections_left == ("shop.orders",)
    assert "1 document(s) to read again" in progress.describe()
    assert IncrementalProgress.from_json(progress.to_json()) == progress  # committed with the chunk

    again = _chunk([1], rereads=progress.reread["shop.orders"])
    completed = after_chunk(progress, again, len(again.rows))
    assert completed.status == COMPLETED and completed.reread == {} and completed.documents == 2
    # A re-read row dropped again for another delta stays queued.
    dropped_again = _chunk([1], rereads=progress.reread["shop.orders"])
    dropped_again.apply(_change("update", 1), omitted=True)
    still = after_chunk(progress, dropped_again, len(dropped_again.rows))
    assert still.status == RUNNING and still.reread == progress.reread


def test_the_task_log_line_names_the_snapshot_its_collection_documents_and_status():
    running = {
        "id": "incremental-1",
        "chunks": 2,
        "documents": 20,
        "status": "running",
        "left": ["shop.orders", "shop.customers"],
        "reread": 3,
        "total_documents": 120,
        "finished_earlier": False,
    }
    assert describe_incremental(running) == (
        "Incremental snapshot incremental-1: running, collection shop.orders, then shop.customers; "
        "120 documents so far (20 in 2 chunk(s) in this window); 3 document(s) to read again"
    )
    many = {**running, "left": [f"shop.c{n}" for n in range(9)], "reread": 0}
    assert "collection shop.c0, then shop.c1, shop.c2, shop.c3, shop.c4, shop.c5 and 3 more;" in (
        describe_incremental(many)
    )
    completed = {**running, "status": "completed", "left": [], "done": ["shop.orders"], "reread": 0}
    assert describe_incremental(completed) == (
        "Incremental snapshot incremental-1: completed, 1 collection(s) copied (shop.orders); "
        "120 documents (20 in 2 chunk(s) in this window)"
    )
    stopped = {**completed, "status": "stopped", "message": "stopped on request", "chunks": 0, "documents": 0}
    assert describe_incremental(stopped).startswith(
        "Incremental snapshot incremental-1: stopped (stopped on request)"
    )
    # Nothing to say when there is none, or it ended in an earlier window.
    assert describe_incremental(None) is None
    assert describe_incremental({**completed, "finished_earlier": True}) is None
