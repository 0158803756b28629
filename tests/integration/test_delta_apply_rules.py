"""The Delta apply's rules where a table could lose or mix up rows, with the real Kafka broker, the
MongoDB simulator (or MONGOCDC_TEST_MONGODB_URI) and delta-rs; each table read back by deltalake's
own reader and compared with MongoDB.

- an incremental re-snapshot whose chunks lose reads to changes (DBLog's rule), completed in a later
  apply run, sweeps only rows it did not read whose last change came before it began;
- a backlog larger than ``max_batch_events`` lands each MongoDB transaction in one commit, wherever
  the topic's fetches end and whatever its deletes' tombstones carry;
- an apply that read everything is nothing behind;
- a topic deleted and created again stops its table with one error in words, and
  ``mongocdc tables reset-positions`` goes on from the new topic;
- a column declared again is filled again from ``_doc``.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime, timezone

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from pymongo import MongoClient

from airflow_provider_mongocdc.core.apply import run as apply_run
from airflow_provider_mongocdc.core.apply.topics import read_range
from airflow_provider_mongocdc.core.base.errors import TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from tests.integration.delta_helpers import (
    FORMATS,
    apply,
    apply_commits,
    connector,
    mongo_documents,
    recorded,
    snapshot,
    table_documents,
    table_rows,
    table_version,
    window,
)
from tests.integration.window_helpers import end_after_insert, seed_offset

pytestmark = pytest.mark.integration


def window_to(uri: str, kafka: dict, props: dict, end) -> dict:
    """A window ending at ``end`` (a cluster time the server has passed), in this process."""
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60)
    return run_window(target, config, kafka, params)


def topic_records(bootstrap: str, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    """``(offset, key, value)`` of every committed record of partition 0 of ``topic``."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "unused",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        }
    )
    try:
        _low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=30)
        consumer.assign([TopicPartition(topic, 0, 0)])
        found = []
        while True:
            message = consumer.poll(10)
            assert message is not None, f"{topic}: no record within 10 s"
            if message.error() is not None:
                break  # the partition's end
            found.append((message.offset(), message.key(), message.value()))
            if message.offset() + 1 >= high:
                break
        return found
    finally:
        consumer.close()


# Iceberg with change_streams events: tests/faults/test_kill9_delta_resnapshots.py (odd trials).
@pytest.mark.parametrize(
    ("capture_mode", "table_format"),
    [
        ("change_streams_update_full", "delta"),
        ("change_streams", "delta"),
        ("change_streams_update_full", "iceberg"),
    ],
)
def test_an_incremental_resnapshot_sweeps_no_row_changed_after_it_began(
    capture_mode, table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    marker_db = f"{unique_name}_m"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(30)])
    # One chunk of 10 per window: the snapshot spans three windows and three applies.
    props = connector(
        unique_name,
        database,
        **{
            "capture.mode": capture_mode,
            "incremental.snapshot.chunk.size": 10,
            "incremental.snapshot.window.max.documents": 10,
        },
    )
    delta = {"location": str(tmp_path / "lake"), "format": table_format}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"

    # History lost: two documents deleted, and the stored position moved past their deletes (the
    # ghosts the re-snapshot is asked to repair).
    items.delete_many({"_id": {"$in": [14, 25]}})
    store, partition = seed_offset(mongodb_uri, kafka, props)
    request = IncrementalRequest.new([f"{database}.items"])
    store.write_incremental_request(partition.connector, partition.server_id, request.to_json())

    # Every document of the first chunk changes after the window's end, before it runs: the window
    # streams those changes up to the chunk's high watermark and drops every read of the chunk.
    end = end_after_insert(client[marker_db]["markers"], {"at": 0}, marker_db)
    for key in range(10):
        items.update_one({"_id": key}, {"$set": {"v": 1}})
    first = window_to(mongodb_uri, kafka, props, end)
    assert first["incremental_snapshot"]["dropped"] == 10, first["incremental_snapshot"]
    apply(kafka, props, delta)
    end = end_after_insert(client[marker_db]["markers"], {"at": 1}, marker_db)
    items.update_one({"_id": 12}, {"$set": {"v": 2}})  # dropped from the second chunk
    window_to(mongodb_uri, kafka, props, end)
    apply(kafka, props, delta)
    # The last chunk, and with capture.mode=change_streams the re-reads of the documents whose
    # dropped reads no update event carried whole: windows and applies until it completes.
    for _ in range(8):
        last = window(mongodb_uri, kafka, props, marker_db)
        if last["incremental_snapshot"]["status"] == "completed":
            break
        apply(kafka, props, delta)
    assert last["incremental_snapshot"]["status"] == "completed", last["incremental_snapshot"]

    applied = apply(kafka, props, delta)  # the completion: the sweep

    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    (items_summary,) = applied["tables"]
    assert items_summary["rows_swept"] == 2 and items_summary["snapshot"]["completed"] == 1, items_summary


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_backlog_larger_than_a_batch_lands_each_transaction_in_one_commit(
    table_format, monkeypatch, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri)
    items = client[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(40)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    # Transactions that begin with a delete (its tombstone carries no lsid/txnNumber), between
    # plain changes.
    for round_ in range(8):
        base = round_ * 4
        with client.start_session() as session, session.start_transaction():
            items.delete_one({"_id": base}, session=session)
            items.update_one({"_id": base + 1}, {"$set": {"v": round_ + 10}}, session=session)
            items.insert_one({"_id": 100 + round_}, session=session)
        items.update_one({"_id": base + 2}, {"$set": {"v": -1}})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    topic = f"{unique_name}.{database}.items"
    transactions: dict[str, set[int]] = {}  # the offsets of each transaction's events
    txn = None
    for offset, _key, value in topic_records(kafka_bootstrap, topic):
        if value is not None:  # else a tombstone: of the delete before it
            source = json.loads(value)["payload"]["source"]
            txn = f"{source['lsid']}:{source['txnNumber']}" if source.get("lsid") else None
        if txn is not None:
            transactions.setdefault(txn, set()).add(offset)
    assert len(transactions) == 8

    # Fetches of 5 records: batches fill at a fetch's last event, inside transactions too.
    monkeypatch.setattr(apply_run, "read_range", functools.partial(read_range, chunk=5))
    for limit in (3, 4, 5) if table_format == "delta" else (4,):
        lake = tmp_path / f"lake{limit}"
        summary = apply(
            kafka, props, {"location": str(lake), "max_batch_events": limit, "format": table_format}
        )
        table = lake / database / "items"
        assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
        assert summary["behind"] == 0, summary
        commits = apply_commits(table)
        assert len(commits) > 8, commits
        ranges = [
            range(commit["mongocdc.from"]["0"], commit["mongocdc.positions"]["0"]) for commit in commits
        ]
        for txn, offsets in transactions.items():
            holding = {index for index, span in enumerate(ranges) for offset in offsets if offset in span}
            assert len(holding) == 1, f"max_batch_events {limit}: transaction {txn} in commits {holding}"
        # Each version holds each transaction whole: its rows share the transaction's _txn.
        rows = {row["_id"]: row for row in table_rows(table)}
        assert rows["100"]["_txn"] and rows["100"]["_txn"] == rows["1"]["_txn"]


@pytest.mark.parametrize("table_format", FORMATS)
def test_an_apply_that_read_everything_is_nothing_behind(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    MongoClient(mongodb_uri)[database].items.insert_many([{"_id": n} for n in range(8)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)  # 8 reads in one Kafka transaction, then its commit marker
    delta = {"location": str(tmp_path / "lake"), "format": table_format, "max_batch_events": 4}

    first = apply(kafka, props, delta)  # the last batch fills exactly at the topic's last event

    assert first["behind"] == 0 and first["events"] == 8, first
    table = tmp_path / "lake" / database / "items"
    version = table_version(table)
    again = apply(kafka, props, delta)
    assert again["commits"] == 0 and again["behind"] == 0 and table_version(table) == version


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_topic_created_again_stops_its_table_in_words_until_its_positions_are_reset(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path, capsys
):
    from airflow_provider_mongocdc.cli import run as cli

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(20)])
    props = connector(unique_name, database)
    delta = {"location": str(tmp_path / "lake"), "format": table_format}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"
    version = table_version(table)
    topic = f"{unique_name}.{database}.items"

    def recreate() -> None:
        admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
        admin.delete_topics([topic])[topic].result(30)
        for _ in range(300):  # until the brokers no longer list it
            if topic not in admin.list_topics(timeout=10).topics:
                break
        else:
            raise AssertionError(f"{topic} still listed after its deletion")

    # Created again, shorter than the table's position (a snapshot of fewer documents).
    recreate()
    items.delete_many({"_id": {"$gte": 5}})
    snapshot(mongodb_uri, kafka, props, force=True, reset_offset=True)
    with pytest.raises(TableError) as raised:
        apply(kafka, props, delta)
    text = str(raised.value)
    assert (
        f"The table at {table if table_format == 'delta' else f'iceberg://mongocdc/{database}/items'} holds "
        f"the changes of the topic {topic!r} up to offset 21 of partition 0" in text
    )
    assert "now ends at 6 in partition 0" in text and "created again" in text
    assert "mongocdc tables reset-positions" in text
    assert table_version(table) == version  # nothing changed

    # Created again, longer than the table's position: the topic's identity tells.
    recreate()
    items.insert_many([{"_id": n, "v": 1} for n in range(5, 40)])
    snapshot(mongodb_uri, kafka, props, force=True, reset_offset=True)
    with pytest.raises(TableError, match="it is another topic under the same name"):
        apply(kafka, props, delta)
    assert table_version(table) == version

    assert cli(["tables", "reset-positions", "--table", str(table), "--topic", topic, "--format", table_format,
                "--bootstrap-servers", kafka_bootstrap]) == 2  # fmt: skip
    assert "without --yes" in capsys.readouterr().err
    assert cli(["tables", "reset-positions", "--table", str(table), "--topic", topic, "--format", table_format,
                "--bootstrap-servers", kafka_bootstrap, "--yes"]) == 0  # fmt: skip
    reset = json.loads(capsys.readouterr().out)
    assert reset["positions_before"] == {"0": 21} and reset["positions"] == {"0": 0}, reset
    assert table_version(table) == version + 1

    summary = apply(kafka, props, delta)
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
    assert summary["behind"] == 0, summary


@pytest.mark.parametrize("table_format", FORMATS)
def test_a_column_declared_again_is_filled_again_from_the_documents(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "price": n} for n in range(6)])
    props = connector(unique_name, database)
    lake = {"location": str(tmp_path / "lake"), "format": table_format}
    declared = {**lake, "columns": {f"{database}.items": {"price": "long"}}}
    snapshot(mongodb_uri, kafka, props)
    apply(kafka, props, declared)
    table = tmp_path / "lake" / database / "items"

    items.update_many({"_id": {"$lt": 3}}, {"$set": {"price": 100}})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    undeclared = apply(kafka, props, lake)  # the column stays, null in the rows written now
    assert any("no longer declared" in note for t in undeclared["tables"] for note in t["notes"])
    assert {row["_id"]: row["price"] for row in table_rows(table)}["0"] is None

    summary = apply(kafka, props, declared)  # declared again: filled again from _doc

    assert summary["events"] == 0
    prices = {row["_id"]: row["price"] for row in table_rows(table)}
    assert prices == {str(n): (100 if n < 3 else n) for n in range(6)}, prices
    notes = [note for t in summary["tables"] for note in t["notes"]]
    assert any("declared again" in note for note in notes), notes


@pytest.mark.parametrize("table_format", FORMATS)
def test_misfits_are_counted_per_run_and_in_total_and_a_table_may_refuse_them(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    from bson import Decimal128

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many(
        [{"_id": n, "total": Decimal128(f"{n}.5"), "points": 2**31 + n if n < 2 else n} for n in range(6)]
    )
    props = connector(unique_name, database)
    delta = {
        "location": str(tmp_path / "lake"),
        "format": table_format,
        "columns": {f"{database}.items": {"total": "double", "points": "integer"}},
    }
    snapshot(mongodb_uri, kafka, props)
    first = apply(kafka, props, delta)
    table = tmp_path / "lake" / database / "items"
    topic = f"{unique_name}.{database}.items"

    # Decimal128 into double is a conversion; values above 2^31 do not fit an integer.
    rows = {row["_id"]: row for row in table_rows(table)}
    assert rows["3"]["total"] == 3.5 and rows["0"]["points"] is None and rows["3"]["points"] == 3
    (summary,) = first["tables"]
    assert summary["misfits"]["points"]["count"] == 2 and summary["misfits"]["points"]["total"] == 2
    assert "total" not in summary["misfits"], summary["misfits"]
    items.update_one({"_id": 4}, {"$set": {"points": "many"}})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    (second,) = apply(kafka, props, delta)["tables"]
    assert second["misfits"]["points"] == {"count": 1, "example": "_id 4: str 'many'", "total": 3}
    # What the page reads: the table's own record.
    assert recorded(table, f"mongocdc:{topic}:misfits:points") == 3
    assert recorded(table, f"mongocdc:{topic}:misfits-last:points") == 1

    # fail_on_misfit: the first misfit fails the apply, naming it; nothing is applied.
    items.update_one({"_id": 5}, {"$set": {"points": 2**40}})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    version = table_version(table)
    with pytest.raises(TableError) as raised:
        apply(kafka, props, {**delta, "fail_on_misfit": [f"{database}.items"]})
    text = str(raised.value)
    assert "The value of points of the document _id 5 does not fit the column points (integer)" in text
    assert "int 1099511627776" in text and "nothing of this batch was applied" in text
    assert table_version(table) == version


@pytest.mark.parametrize("table_format", FORMATS)
def test_two_applies_racing_on_one_table_leave_each_key_once(
    table_format, mongodb_uri, kafka_bootstrap, unique_name, tmp_path
):
    import threading

    database = f"{unique_name}_db"
    kafka = {"bootstrap.servers": kafka_bootstrap}
    items = MongoClient(mongodb_uri)[database].items
    items.insert_many([{"_id": n, "v": 0} for n in range(300)])
    props = connector(unique_name, database)
    snapshot(mongodb_uri, kafka, props)
    items.update_many({"_id": {"$lt": 150}}, {"$inc": {"v": 1}})
    items.delete_many({"_id": {"$gte": 280}})
    window(mongodb_uri, kafka, props, f"{unique_name}_markers")
    delta = {"location": str(tmp_path / "lake"), "format": table_format, "max_batch_events": 40}
    outcomes: list[object] = []

    def race() -> None:
        try:
            outcomes.append(apply(kafka, props, delta))
        except TableError as error:  # the one that lost a commit to the other: nothing of it applied
            outcomes.append(error)

    racers = [threading.Thread(target=race) for _ in range(2)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(timeout=600)
    assert len(outcomes) == 2, outcomes
    for outcome in outcomes:
        if isinstance(outcome, TableError):
            assert "Another writer committed" in str(outcome), str(outcome)
    apply(kafka, props, delta)  # whatever a loser left: the next run
    table = tmp_path / "lake" / database / "items"
    ids = [row["_id"] for row in table_rows(table)]
    assert len(ids) == len(set(ids)), "a key is in the table twice"
    assert table_documents(table) == mongo_documents(mongodb_uri, database, "items")
