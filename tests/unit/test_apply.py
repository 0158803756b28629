"""The Delta apply's logic (core/apply) without servers: what a record of a topic says, the rows a
batch folds it into (last event per key in Kafka order, deletes, updates without a document,
transactions), the re-snapshot sweep's generations, the declared columns, and the settings."""

from __future__ import annotations

import datetime
import json
from decimal import Decimal

import pytest
from bson import Decimal128, Int64, ObjectId, Timestamp, json_util

from airflow_provider_mongocdc.core.apply.batch import Batch, Row
from airflow_provider_mongocdc.core.apply.events import ChangeEvent, Changes, EventReader
from airflow_provider_mongocdc.core.apply.layout import DeclaredColumn, TableLayout
from airflow_provider_mongocdc.core.apply.patch import Patcher
from airflow_provider_mongocdc.core.apply.settings import DeltaSettings
from airflow_provider_mongocdc.core.apply.snapshots import (
    BLOCKING,
    INC_CANCELLED,
    INC_DONE,
    INC_RUNNING,
    INCREMENTAL,
    NONE,
    SnapshotStatus,
    SnapshotTracker,
)
from airflow_provider_mongocdc.core.apply.state import TableState, check_owner, generation_app_id
from airflow_provider_mongocdc.core.apply.values import Misfits, column_values, convert
from airflow_provider_mongocdc.core.base.errors import ConfigError, EventFormatError, TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position, SnapshotState

pytestmark = pytest.mark.unit

TOPIC = "shop.inventory.customers"
NS = {"db": "inventory", "coll": "customers"}


def builder(**props) -> EventBuilder:
    config = ConnectorConfig.from_properties({"topic.prefix": "shop", **props})
    return EventBuilder(config, replica_set="rs0", clock=lambda: 1_700_000_000_000)


def change(operation: str, _id, txn: int | None = None, **extra) -> dict:
    base = {
        "_id": {"_data": "82650000000000000001"},
        "operationType": operation,
        "clusterTime": Timestamp(1_700_000_000, 7),
        "wallTime": datetime.datetime(2023, 11, 14, 22, 13, 20, 42000),
        "ns": NS,
        "documentKey": {"_id": _id},
    }
    if txn is not None:
        base.update(lsid={"id": ObjectId("65500000000000000000000a")}, txnNumber=Int64(txn))
    base.update(extra)
    return base


class Topic:
    """The records of one topic partition, as the connector's event builder writes them."""

    def __init__(self, **props):
        self.builder = builder(**props)
        self.records: list[tuple[bytes | None, bytes | None]] = []

    def add(self, records) -> None:
        for record in records:
            if record.topic == TOPIC:
                self.records.append((record.key, record.value))

    def insert(self, document, txn=None):
        self.add(self.builder.build_change(change("insert", document["_id"], txn, fullDocument=document)))

    def update(self, document, txn=None, **description):
        extra = {"fullDocument": document} if document is not None else {}
        description = {"updatedFields": {}, "removedFields": [], "truncatedArrays": [], **description}
        _id = document["_id"] if document is not None else description.pop("_id")
        self.add(
            self.builder.build_change(change("update", _id, txn, updateDescription=description, **extra))
        )

    def delete(self, _id, txn=None):
        self.add(self.builder.build_change(change("delete", _id, txn)))

    def read(self, document, last=False, incremental=False):
        self.add(
            self.builder.build_snapshot(
                document, "inventory", "customers", last=last, position=Timestamp(1_700_000_000, 1),
                incremental=incremental,
            )
        )  # fmt: skip

    def events(self) -> list[ChangeEvent]:
        reader = EventReader(TOPIC)
        return [reader.read(0, offset, key, value) for offset, (key, value) in enumerate(self.records)]


def fold(events, state=None, bases=None, tracker=None) -> Batch:
    state = state or TableState(TOPIC)
    batch = Batch(state, tracker or SnapshotTracker(state.generation, state.pending), Patcher(), lambda keys: {
        key: doc for key, doc in (bases or {}).items() if key in keys
    })  # fmt: skip
    batch.prepare(events)
    for event in events:
        batch.add(event)
    return batch


def live(batch: Batch) -> dict:
    return {key: json.loads(row.document) for key, row in batch.rows.items() if not row.deleted}


# -- records --------------------------------------------------------------------------------------------
def test_snapshot_reads_say_which_snapshot_they_belong_to():
    topic = Topic()
    topic.read({"_id": 1})
    topic.read({"_id": 2}, last=True)
    topic.read({"_id": 3}, incremental=True)
    assert [(e.op, e.snapshot, e.key) for e in topic.events()] == [
        ("r", "true", "1"),
        ("r", "last", "2"),
        ("r", "incremental", "3"),
    ]


def test_an_event_of_the_connector_is_read_with_and_without_schemas():
    for schemas in (True, False):
        topic = Topic(**{"value.converter.schemas.enable": schemas, "key.converter.schemas.enable": schemas})
        topic.insert({"_id": 7, "name": "Anne"})
        (event,) = topic.events()
        assert (event.key, event.op, json.loads(event.document)) == ("7", "c", {"_id": 7, "name": "Anne"})
        assert event.ts_us == 1_700_000_000_042_000 and event.ord == 7 and event.txn is None


def test_a_delete_and_its_tombstone_both_delete_the_key():
    topic = Topic()
    topic.delete(ObjectId("596e275826f08b2730779e1f"))
    events = topic.events()
    assert [(e.op, e.document) for e in events] == [("d", None), ("d", None)]
    assert {e.key for e in events} == {'{"$oid": "596e275826f08b2730779e1f"}'}


def test_a_record_that_is_no_change_event_is_an_error_naming_where_it_is():
    reader = EventReader("shop.x.y")
    with pytest.raises(EventFormatError) as raised:
        reader.read(2, 41, b'{"id": "1"}', b'{"status": "BEGIN", "id": "x"}')
    text = str(raised.value)
    assert "offset 41 of partition 2 of the topic 'shop.x.y'" in text and "op None" in text
    assert "Fix: apply only the topics of a MongoDB connector" in text
    with pytest.raises(EventFormatError, match="has no 'id'"):
        reader.read(0, 0, b'{"serverName": "shop"}', b'{"ts_ms": 1}')
    with pytest.raises(EventFormatError, match="not JSON"):
        reader.read(0, 0, b'{"id": "1"}', b"\x00\x01avro")
    with pytest.raises(EventFormatError, match="Debezium 1.x"):
        reader.read(0, 0, b'{"id": "1"}', b'{"op": "u", "source": {}, "patch": "{}", "filter": "{}"}')


class _Message:
    """A Kafka record as the apply reads it (offset, key, value, timestamp)."""

    def __init__(self, offset, key, value, stamp=0):
        self._fields = offset, key, value, stamp

    def offset(self):
        return self._fields[0]

    def key(self):
        return self._fields[1]

    def value(self):
        return self._fields[2]

    def timestamp(self):
        return 1, self._fields[3]


def test_payloads_decoded_by_their_used_fields_read_as_whole_payloads_do(monkeypatch):
    records = []
    for schemas in (True, False):
        topic = Topic(**{"value.converter.schemas.enable": schemas, "key.converter.schemas.enable": schemas})
        topic.insert({"_id": 1, "name": "Anne"})
        topic.update({"_id": 1, "name": "Bea"}, txn=3)
        topic.update(None, _id=1, updatedFields={"name": "Cy"})
        topic.delete(ObjectId("596e275826f08b2730779e1f"))
        topic.read({"_id": 2}, last=True)
        topic.read({"_id": 3}, incremental=True)
        records += topic.records
    odd = [  # values outside the used fields' types: read as whole payloads, as before
        (
            b'{"id": "1"}',
            b'{"op": "u", "after": "{}", "source": {"ord": 1.5, "ts_ms": 7, "lsid": {"id": 1}, "txnNumber": 2}}',
        ),
        (b'{"id": "2"}', b'{"op": "u", "updateDescription": [1], "source": {"ts_us": true, "snapshot": 0}}'),
        (
            b'{"id": "3"}',
            b'{"op": "r", "after": "{}", "source": {"snapshot": "false"}, "updateDescription": null}',
        ),
    ]
    records += odd

    def read_all():
        reader = EventReader(TOPIC)
        return [reader.read(0, offset, key, value) for offset, (key, value) in enumerate(records)]

    typed = read_all()
    assert EventReader(TOPIC).read_all(0, [_Message(n, *record) for n, record in enumerate(records)]) == typed
    monkeypatch.setattr(EventReader, "_typed", staticmethod(lambda *args: None))
    assert typed == read_all()
    assert [e.op for e in typed[:7]] == ["c", "u", "u", "d", "d", "r", "r"]
    assert typed[2].document is None and isinstance(typed[2].update, dict)
    assert typed[-3].ord is None and typed[-3].txn == "{'id': 1}:2" and typed[-3].ts_us == 7000


def test_records_whose_schema_differs_from_the_first_are_read_right():
    """The payload is cut where the first record's schema ended; a later record of another schema,
    even one holding a "payload" key just there, gives the event its payload says."""

    def record(schema: str, payload: dict) -> bytes:
        return (
            '{"schema":' + schema + ',"payload":' + json.dumps(payload, separators=(",", ":")) + "}"
        ).encode()

    def value(doc_id: int) -> dict:
        return {"op": "c", "after": json.dumps({"_id": doc_id}), "source": {"ts_ms": doc_id, "ord": 1}}

    first = '{"type":"struct","name":"a.Envelope"}'
    at = len('{"schema":') + len(first) + 1  # where the first record's "payload": starts
    same_size = '{"type":"struct","name":"b.Envelope"}'
    head = '{"parameters":{"'
    pad = at - len('{"schema":') - len(head) - len('":0,')
    trap = head + "p" * pad + '":0,"payload":{"op":"d","source":{}}},"type":"struct"}'
    assert record(trap, value(3)).find(b'"payload":') == at  # the trap is where the cut is made
    key = b'{"schema":{"type":"string"},"payload":{"id":"%d"}}'
    reader = EventReader(TOPIC)
    events = [
        reader.read(0, offset, key % doc_id, record(schema, value(doc_id)))
        for offset, (schema, doc_id) in enumerate([(first, 1), (same_size, 2), (trap, 3), ('{"x":1}', 4)])
    ]
    assert [(e.key, e.op, json.loads(e.document), e.ts_us) for e in events] == [
        (str(n), "c", {"_id": n}, n * 1000) for n in (1, 2, 3, 4)
    ]
    schemas = [(first, 1), (same_size, 2), (trap, 3), ('{"x":1}', 4)]
    messages = [_Message(n, key % i, record(schema, value(i))) for n, (schema, i) in enumerate(schemas)]
    assert EventReader(TOPIC).read_all(0, messages) == events


def messages(records, first=0) -> list[_Message]:
    return [_Message(first + n, key, value) for n, (key, value) in enumerate(records)]


@pytest.mark.parametrize("schemas", [True, False])
def test_a_fetch_of_plain_changes_reads_as_columns_holding_what_its_events_hold(schemas):
    topic = Topic(**{"value.converter.schemas.enable": schemas, "key.converter.schemas.enable": schemas})
    topic.insert({"_id": 1, "name": "Anne"})
    topic.update({"_id": 1, "name": "Bea"}, txn=3)  # a change in a transaction
    topic.delete(ObjectId("596e275826f08b2730779e1f"))  # its delete and its tombstone
    topic.insert({"_id": "x", "tags": ["a", "b"]})
    plain = topic.records + [  # read whole (ord not an integer), still a plain update
        (b'{"id": "1"}', b'{"op": "u", "after": "{}", "source": {"ord": 1.5, "ts_ms": 7}}'),
    ]
    changes = EventReader(TOPIC).read_changes(0, messages(plain))
    assert isinstance(changes, Changes) and len(changes) == len(plain)
    assert changes.events() == EventReader(TOPIC).read_all(0, messages(plain))
    assert changes.ops == ["c", "u", "d", "d", "c", "u"] and changes.txns[1] is not None
    assert changes.documents[2:4] == [None, None] and changes.ts_us[-1] == 7000

    # A fetch with anything else (a snapshot read, an update without its document) reads as events.
    for other in ("read", "bare update"):
        mixed = Topic(**{"value.converter.schemas.enable": schemas, "key.converter.schemas.enable": schemas})
        mixed.insert({"_id": 1})
        if other == "read":
            mixed.read({"_id": 2}, last=True)
        else:
            mixed.update(None, _id=1, updatedFields={"name": "Cy"})
        mixed.insert({"_id": 3})
        read = EventReader(TOPIC).read_changes(0, messages(mixed.records))
        assert isinstance(read, list) and read == EventReader(TOPIC).read_all(0, messages(mixed.records))

    # A record that is no change event is the same error either way, wherever it is in the fetch.
    bad = topic.records[:2] + [(b'{"id": "9"}', b'{"op": "x", "source": {}}')]
    with pytest.raises(EventFormatError, match="offset 2 of partition 0") as columns:
        EventReader(TOPIC).read_changes(0, messages(bad))
    with pytest.raises(EventFormatError) as events:
        EventReader(TOPIC).read_all(0, messages(bad))
    assert str(columns.value) == str(events.value)


def test_runs_of_changes_fold_as_their_events_do():
    """Runs of plain changes kept as columns, between events folded one by one (an update without
    a document needs the row a run folded), commit what the events alone commit."""
    topic = Topic()
    topic.insert({"_id": 1, "v": 1})
    topic.insert({"_id": 2, "v": 1})
    topic.update({"_id": 1, "v": 2}, txn=4)
    topic.delete(2)  # and its tombstone
    first_run = len(topic.records)
    topic.update(None, _id=1, updatedFields={"w": 1})  # applied to the document the run folded
    topic.insert({"_id": 5, "v": 1})
    middle = len(topic.records)
    topic.insert({"_id": 2, "v": 3})  # a deleted key back
    topic.update({"_id": 5, "v": 2})
    topic.insert({"_id": 6, "v": 1})
    topic.delete(6)
    records = topic.records
    everything = fold(topic.events())

    reader = EventReader(TOPIC)
    runs = fold([])
    run = reader.read_changes(0, messages(records[:first_run]))
    assert isinstance(run, Changes)
    runs.add_changes(run)
    assert runs.runs and not runs.rows  # kept as columns
    events = reader.read_changes(0, messages(records[first_run:middle], first_run))
    assert isinstance(events, list)  # the update without a document
    runs.prepare(events)
    runs.add_all(events)
    assert not runs.runs and set(runs.rows) == {"1", "2", "5"}  # the run's rows were folded first
    last = reader.read_changes(0, messages(records[middle:], middle))
    assert isinstance(last, Changes)
    runs.add_changes(last)

    def table(batch: Batch) -> dict:
        commit = batch.commit(TableLayout(), 5, Misfits())
        names = list(commit.columns)
        rows = {row[0]: row[1:] for row in zip(*(commit.columns[name] for name in names))}
        assert len(rows) == commit.rows
        return {"rows": rows, "deletes": commit.deletes, "versions": commit.versions}

    assert table(runs) == table(everything)
    assert live(everything) == {
        "1": {"_id": 1, "v": 2, "w": 1},
        "2": {"_id": 2, "v": 3},
        "5": {"_id": 5, "v": 2},
    }
    assert json.loads(table(runs)["rows"]["1"][0]) == {"_id": 1, "v": 2, "w": 1}
    assert (runs.events, runs.ops, runs.positions, runs.last_txn) == (
        everything.events,
        everything.ops,
        everything.positions,
        everything.last_txn,
    )
    assert runs.all_rows() == everything.rows


# -- batches ------------------------------------------------------------------------------------------
def test_the_last_event_per_key_wins_in_kafka_order_and_deletes_remove_rows():
    topic = Topic()
    topic.insert({"_id": 1, "v": 1})
    topic.insert({"_id": 2, "v": 1})
    topic.update({"_id": 1, "v": 2})
    topic.delete(2)
    topic.insert({"_id": 3, "v": 1})
    topic.update({"_id": 3, "w": 9})  # a replace: the whole document
    batch = fold(topic.events())
    assert live(batch) == {"1": {"_id": 1, "v": 2}, "3": {"_id": 3, "w": 9}}
    assert batch.rows["2"].deleted and batch.events == 7 and batch.positions == {0: 7}
    commit = batch.commit(TableLayout(), 5, Misfits())
    assert commit.rows == 3 and commit.deletes == 1
    assert commit.versions == {"mongocdc:shop.inventory.customers:0": 7, generation_app_id(TOPIC): 0,
                               "mongocdc:shop.inventory.customers:snapshot-pending": 0}  # fmt: skip


def test_an_update_without_a_document_is_applied_to_the_one_the_table_holds():
    topic = Topic(**{"capture.mode": "change_streams"})
    topic.update(None, _id=1, updatedFields={"a.b": 5, "tags.1": "z"}, removedFields=["gone"])
    topic.update(None, _id=1, truncatedArrays=[{"field": "tags", "newSize": 1}])
    topic.update(None, _id=9, updatedFields={"x": 1})  # a document the table does not hold
    held = {"1": '{"_id": 1,"a": {"b": 1,"c": 2},"tags": ["x", "y"],"gone": true}'}
    batch = fold(topic.events(), bases=held)
    assert live(batch) == {"1": {"_id": 1, "a": {"b": 5, "c": 2}, "tags": ["x"]}}
    assert batch.unknown_updates == 1


def test_a_batch_ends_only_between_mongodb_transactions():
    topic = Topic()
    topic.insert({"_id": 1}, txn=5)
    topic.insert({"_id": 2}, txn=5)
    topic.insert({"_id": 3})
    first, second, third = topic.events()
    batch = fold([first])
    assert first.txn and first.txn == second.txn
    assert not batch.at_boundary(second)  # inside transaction 5
    batch.add(second)
    assert batch.at_boundary(third)


# -- the re-snapshot sweep ------------------------------------------------------------------------------
def read(key, offset, snapshot="true") -> ChangeEvent:
    return ChangeEvent(str(key), "r", json.dumps({"_id": key}), 0, offset, snapshot=snapshot)


def insert(key, offset) -> ChangeEvent:
    return ChangeEvent(str(key), "c", json.dumps({"_id": key}), 0, offset)


def test_a_completed_snapshot_sweeps_rows_it_did_not_read_that_did_not_change_since():
    # Rows 1..3 exist (generation 1); a gap: 2 is deleted without an event; a re-snapshot reads 1 and
    # 3, then a change follows (the snapshot completed).
    state = TableState(TOPIC, version=4, positions={0: 10}, generation=1)
    tracker = SnapshotTracker(state.generation, state.pending)
    batch = fold([read(1, 10), read(3, 11), insert(4, 12)], state=state, tracker=tracker)
    assert tracker.generation == 2 and tracker.pending == NONE and tracker.sweep == 2
    assert {key: row.generation for key, row in batch.rows.items()} == {"1": 2, "3": 2, "4": 2}
    assert batch.commit(TableLayout(), 1, Misfits()).sweep == 2  # the table's row 2 (generation 1) goes


def test_rows_of_a_batch_written_before_a_snapshot_began_are_swept_with_it():
    tracker = SnapshotTracker()
    batch = fold([insert(1, 0), insert(2, 1), read(1, 2), read(3, 3, "last")], tracker=tracker)
    assert tracker.sweep == 1 and tracker.completed == 1
    assert sorted(live(batch)) == ["1", "3"] and batch.rows["2"].deleted


def test_a_snapshot_spread_over_runs_completes_by_the_offsets_topic_only_when_it_stood_still():
    tracker = SnapshotTracker()
    fold([read(1, 0), read(2, 1)], tracker=tracker)
    assert tracker.pending == BLOCKING and tracker.sweep is None
    running = SnapshotStatus(True, "unknown", ("a",))
    done = SnapshotStatus(False, "unknown", ("b",))
    tracker.at_range_end(running, done)  # a snapshot moved while the topic was read
    assert tracker.pending == BLOCKING and tracker.sweep is None
    tracker.at_range_end(running, running)
    assert tracker.pending == BLOCKING
    tracker.at_range_end(done, done)
    assert tracker.pending == NONE and tracker.sweep == 1
    tracker = SnapshotTracker()
    fold([read(1, 0)], tracker=tracker)
    tracker.at_range_end(None, None)  # no offsets topic (Debezium's topics): it waits for a change
    assert tracker.pending == BLOCKING


def test_an_incremental_snapshot_completes_when_the_offsets_topic_says_its_collection_is_done():
    started = {0: 1}  # the topic's end when the snapshot started: its events lie from offset 1 on
    tracker = SnapshotTracker()
    tracker.arm(SnapshotStatus(False, INC_RUNNING, (1,), started), {0: 0})
    fold([insert(1, 0), read(1, 1, "incremental"), insert(5, 2), read(2, 3, "incremental")], tracker=tracker)
    assert tracker.pending == INCREMENTAL and tracker.sweep is None  # changes interleave
    assert tracker.began == {0: 1}
    running = SnapshotStatus(False, INC_RUNNING, (1,), started)
    tracker.at_range_end(running, running)
    assert tracker.pending == INCREMENTAL
    done = SnapshotStatus(False, INC_DONE, (2,), started)
    tracker.at_range_end(done, SnapshotStatus(False, INC_DONE, (2,), started, settled=False))
    assert tracker.pending == INCREMENTAL  # a transaction open on the offsets topic: the next run
    tracker.at_range_end(done, done)
    assert tracker.sweep == 1 and tracker.pending == NONE
    tracker = SnapshotTracker()
    fold([read(1, 0, "incremental")], tracker=tracker)
    tracker.at_range_end(
        SnapshotStatus(False, INC_CANCELLED, (3,)), SnapshotStatus(False, INC_CANCELLED, (3,))
    )
    assert tracker.pending == NONE and tracker.sweep is None  # filtered or stopped: nothing swept


def test_a_change_that_dropped_a_chunks_read_begins_the_generation_and_is_never_swept():
    """DBLog's rule: a document changed between a chunk's read and its high watermark has its read
    dropped, and its change comes before the chunk's reads in the topic. The generation begins
    where the snapshot started (the topic's end then, recorded by the window), so that change's row
    is of the new generation; a chunk whose reads were all dropped changes nothing of that."""
    state = TableState(TOPIC, version=3, positions={0: 10}, generation=1)
    started = SnapshotStatus(False, INC_RUNNING, ("r",), {0: 12})
    tracker = SnapshotTracker(state.generation, state.pending)
    tracker.arm(started, state.positions)
    # 10, 11: changes before the snapshot; 12: a change of 7 whose read was dropped (first chunk,
    # all of its reads dropped); 13: a change of 8 (second chunk), then the second chunk's read of 9.
    events = [insert(1, 10), insert(2, 11), insert(7, 12), insert(8, 13), read(9, 14, "incremental")]
    batch = fold(events, state=state, tracker=tracker)
    assert {key: row.generation for key, row in batch.rows.items()} == {
        "1": 1,
        "2": 1,
        "7": 2,
        "8": 2,
        "9": 2,
    }
    done = SnapshotStatus(False, INC_DONE, ("d",), {0: 12})
    batch.complete_at_end(done, done)
    assert tracker.sweep == 2
    # The batch's own rows of the old generation go with the table's (1 and 2 were not read): the
    # rows changed since the snapshot started stay.
    assert sorted(live(batch)) == ["7", "8", "9"]
    assert batch.commit(TableLayout(), 1, Misfits()).sweep == 2

    # A table that reaches the snapshot's start only after it completed (it lagged, or is new)
    # begins there too; one already past it does not wait for it.
    for positions, armed in (({0: 12}, True), ({0: 0}, True), ({0: 13}, False)):
        lagging = SnapshotTracker(1, NONE)
        lagging.arm(done, positions)
        assert (lagging.armed is not None) is armed, positions
    running = SnapshotTracker(2, INCREMENTAL, {0: 12})
    running.arm(done, {0: 5})
    assert running.armed is None  # the generation under way is the snapshot's


def test_a_generation_begun_after_the_snapshot_started_sweeps_nothing():
    """A table that learnt of the snapshot only at its first read (the start was not recorded, or
    not seen) cannot tell the changes that dropped reads from older rows: nothing is swept."""
    tracker = SnapshotTracker(1, NONE)
    batch = fold([insert(7, 12), read(9, 14, "incremental")], tracker=tracker)
    assert tracker.began == {0: 13}  # the position before its first read
    for start in ({0: 12}, None):
        done = SnapshotStatus(False, INC_DONE, ("d",), start)
        tracked = SnapshotTracker(tracker.generation, tracker.pending, dict(tracker.began))
        tracked.at_range_end(done, done)
        assert tracked.sweep is None and tracked.pending == NONE
        assert "nothing swept" in tracked.notes[-1]
    assert sorted(live(batch)) == ["7", "9"]


def test_a_completion_learnt_at_the_range_end_sweeps_the_batchs_own_older_rows():
    state = TableState(TOPIC, version=3, positions={0: 0}, generation=0, pending=BLOCKING, began={0: 0})
    tracker = SnapshotTracker(state.generation, state.pending, dict(state.began))
    # A blocking snapshot under way from an earlier run (generation 0 began there); this run holds
    # a row of generation 0 and the snapshot's other reads, then the offsets topic shows it done.
    stale = Batch(state, tracker, Patcher(), lambda keys: {})
    stale.rows["5"] = Row("c", '{"_id": 5}', 0, 0, None, None, None, -1, False)
    stale.add_all([read(1, 1), read(2, 2)])
    done = SnapshotStatus(False, "unknown", ("b",))
    stale.complete_at_end(done, done)
    assert tracker.sweep == 0 and stale.rows["5"].deleted and sorted(live(stale)) == ["1", "2"]


def test_a_transaction_is_never_split_at_a_delete_or_its_tombstone():
    """A delete's tombstone carries no lsid/txnNumber: it is no boundary, and the transaction goes
    on after it."""
    topic = Topic()
    topic.delete(1, txn=9)  # a delete event and its tombstone
    topic.update({"_id": 2, "v": 1}, txn=9)
    topic.insert({"_id": 4}, txn=9)
    topic.insert({"_id": 5})
    delete, tombstone, update, insert_4, insert_5 = topic.events()
    assert tombstone.tombstone and tombstone.txn is None and delete.txn == update.txn
    batch = fold([delete])
    assert not batch.at_boundary(tombstone)
    batch.add(tombstone)
    assert not batch.at_boundary(update)  # still transaction 9
    batch.add(update)
    batch.add(insert_4)
    assert batch.at_boundary(insert_5)
    # The tombstone keeps the delete's row: its source time and transaction, in both folds.
    row = batch.rows["1"]
    assert row.deleted and row.txn == delete.txn and row.ts_us == delete.ts_us
    run = EventReader(TOPIC).read_changes(0, messages(topic.records))
    assert isinstance(run, Changes) and run.tombstones == [1]
    runs = fold([])
    runs.add_changes(run)
    assert runs.last_txn is None  # the last event (5) is in no transaction
    (columns,) = [changes for changes, _ in runs.runs]
    assert columns.txns[1] == delete.txn and columns.ts_us[1] == delete.ts_us


def test_the_offsets_topic_status_of_a_collection():
    partition = OffsetPartition("shop", "rs0")
    start = Position(cluster_time=Timestamp(1, 1))

    def status(**incremental):
        state = OffsetState(snapshot=SnapshotState("completed", "s1", start), incremental=incremental or None)
        return SnapshotStatus.of({partition: state}, lambda ns: "shop." + ns, TOPIC)

    assert status().blocking_running is False and status().incremental == "unknown"
    assert status(id="i", status="running", current="inventory.customers").incremental == INC_RUNNING
    assert status(id="i", status="running", done=["inventory.customers"]).incremental == INC_DONE
    filtered = status(
        id="i", status="completed", done=["inventory.customers"], filters={"inventory.customers": "{}"}
    )
    assert filtered.incremental == INC_CANCELLED
    assert status(id="i", status="stopped", pending=["inventory.customers"]).incremental == INC_CANCELLED
    running = OffsetState(snapshot=SnapshotState("in_progress", "s2", start))
    assert SnapshotStatus.of({partition: running}, lambda ns: ns, TOPIC).blocking_running


# -- the layout ----------------------------------------------------------------------------------------------
def test_declared_columns_take_fitting_values_and_count_the_others():
    settings = DeltaSettings.from_mapping(
        {
            "location": "/data",
            "columns": {
                "inventory.customers": {
                    "total": "double",
                    "customer.name": "string",
                    "n": "integer",
                    "price": "decimal(6,2)",
                    "when": "timestamp",
                    "big": "bigint",
                    "first_tag": {"field": "tags.0", "type": "string"},
                }
            },
        }
    )
    layout = settings.layout("inventory.customers")
    assert [c.name for c in layout.declared] == [
        "total",
        "customer_name",
        "n",
        "price",
        "when",
        "big",
        "first_tag",
    ]
    document = {
        "_id": 1,
        "total": 3,
        "customer": {"name": "Anne"},
        "n": Int64(2**40),
        "price": Decimal128("12.345"),
        "when": datetime.datetime(2024, 1, 2, 3, 4, 5),
        "big": Int64(7),
        "tags": ["a"],
    }
    text = json_util.dumps(document)
    misfits = Misfits()
    values = column_values(layout, "1", text, misfits)
    assert values[:2] == [3.0, "Anne"] and values[2] is None and values[3] is None
    assert values[4] == datetime.datetime(2024, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    assert values[5:] == [7, "a"]
    assert misfits.counts == {"n": 1, "price": 1}
    (line_n, line_price) = misfits.describe(layout.declared)
    assert line_n.startswith("1 value(s) of n did not fit the column n (integer) and stay in _doc only")
    fits = convert(DeclaredColumn("p", "p", "decimal(6,2)"), Decimal128("1234.5"))
    assert fits == (True, Decimal("1234.50"))
    assert convert(DeclaredColumn("p", "p", "decimal(6,2)"), Decimal128("12345.5"))[0] is False


def test_bad_settings_are_one_error_in_words():
    with pytest.raises(ConfigError, match="the type 'varchar' is unknown.*Fix: declare e.g."):
        DeltaSettings.from_mapping({"location": "/d", "columns": {"a.b": {"x": "varchar"}}})
    with pytest.raises(ConfigError, match="'_op' cannot be a column name"):
        DeltaSettings.from_mapping({"location": "/d", "columns": {"a.b": {"_op": "string"}}})
    with pytest.raises(ConfigError, match="'location' is missing"):
        DeltaSettings.from_mapping({"columns": {}})
    with pytest.raises(ConfigError, match="holds credentials"):
        DeltaSettings.from_mapping({"location": "s3://key:secret@bucket/x"})
    with pytest.raises(ConfigError, match="unknown key"):
        DeltaSettings.from_mapping({"location": "/d", "vacuum": True})
    with pytest.raises(ConfigError, match="compact_every must be a duration"):
        DeltaSettings.from_mapping({"location": "/d", "compact_every": "soon"})
    settings = DeltaSettings.from_mapping(
        {"location": "abfss://container@account.dfs.core.windows.net/cdc/", "compact_every": None}
    )
    assert (
        settings.table_uri("shop", "orders")
        == "abfss://container@account.dfs.core.windows.net/cdc/shop/orders"
    )
    assert settings.compact_every_s is None and settings.vacuum_every_s == 86400.0
    assert DeltaSettings.from_mapping(settings.to_json()) == settings


def test_a_table_written_by_something_else_is_refused():
    with pytest.raises(TableError) as raised:
        check_owner("/d/shop/orders", TOPIC, 3, lambda app_id: None, "sales orders")
    assert "was not written by the apply of the topic" in str(raised.value)
    assert "sales orders" in str(raised.value)
    check_owner("/d/shop/orders", TOPIC, None, lambda app_id: None, "")  # no table yet
    check_owner(
        "/d/shop/orders", TOPIC, 3, lambda app_id: 1 if app_id == generation_app_id(TOPIC) else None, ""
    )


@pytest.mark.parametrize("retention", ["30m", "59m", 3599, "0s", 0])
def test_a_vacuum_retention_under_an_hour_is_refused_in_words(retention):
    with pytest.raises(ConfigError) as raised:
        DeltaSettings.from_mapping({"location": "/d", "vacuum_retention": retention})
    text = str(raised.value)
    assert f"'delta': 'vacuum_retention' must be at least 1 hour, got {retention!r}" in text, text
    assert "Fix: give 1h or more" in text and "null to switch vacuuming off" in text, text


def test_a_vacuum_retention_of_an_hour_or_more_is_kept_and_null_switches_vacuuming_off():
    assert DeltaSettings.from_mapping({"location": "/d"}).vacuum_retention_s == 7 * 86400.0
    for retention, seconds in (("1h", 3600.0), ("90m", 5400.0), (3600, 3600.0)):
        kept = DeltaSettings.from_mapping({"location": "/d", "vacuum_retention": retention})
        assert kept.vacuum_retention_s == seconds
    off = DeltaSettings.from_mapping({"location": "/d", "vacuum_retention": None})
    assert off.vacuum_retention_s is None and off.vacuum_every_s is None
    assert DeltaSettings.from_mapping(off.to_json()) == off
    never = DeltaSettings.from_mapping({"location": "/d", "vacuum_every": None})
    assert never.vacuum_every_s is None and never.vacuum_retention_s == 7 * 86400.0


def test_an_update_without_a_document_is_applied_to_a_document_holding_any_date():
    """Dates before year 1 or after 9999 (the connector writes them as they are) in the document the
    table holds, or in the update, are kept as they are: the apply does not stop on them."""
    held = (
        '{"_id": 1, "d": {"$date": {"$numberLong": "-62135596800001"}}, '
        '"e": {"$date": {"$numberLong": "253402300800000"}}}'
    )
    for mode in ("strict", "relaxed", "canonical"):
        update = {"updatedFields": {"v": 1, "w": {"$date": {"$numberLong": "-62135596800001"}}}}
        patched = json_util.loads(Patcher(mode).apply(held, update), json_options=json_util.JSONOptions(
            datetime_conversion=json_util.DatetimeConversion.DATETIME_AUTO
        ))  # fmt: skip
        assert patched["v"] == 1 and int(patched["d"]) == int(patched["w"]) == -62135596800001, mode
        assert int(patched["e"]) == 253402300800000, mode


def test_fail_on_misfit_names_the_tables_that_refuse_misfits():
    settings = DeltaSettings.from_mapping({"location": "/data", "fail_on_misfit": ["shop.orders"]})
    assert settings.refuses_misfits("shop.orders") and not settings.refuses_misfits("shop.customers")
    assert DeltaSettings.from_mapping({"location": "/data", "fail_on_misfit": True}).refuses_misfits("a.b")
    assert not DeltaSettings.from_mapping({"location": "/data"}).refuses_misfits("a.b")
    assert DeltaSettings.from_mapping(settings.to_json()) == settings
    with pytest.raises(ConfigError, match="'fail_on_misfit' must be true, false or a list"):
        DeltaSettings.from_mapping({"location": "/data", "fail_on_misfit": "orders"})
