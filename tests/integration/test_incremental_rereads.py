"""Documents an incremental snapshot reads again (capture.mode=change_streams: an update event
carries the change only, so a chunk row the stream changed is read again later) are read in
batches, and a document changed again before each of its re-reads (a hot document) is read again
once per window, not in one-document chunks, each its own Kafka transaction, until the window's
budget runs out.

The phase runs against the simulator (or MONGOCDC_TEST_MONGODB_URI) over a window whose stream,
up to each chunk's high watermark, delivers an update of the hot document and of the first row of
each range chunk (WindowSteps, as the stream window provides them): the rows' drops are those
changes, whatever the machine's speed. Each ``commit_chunk`` is one Kafka transaction of the
real window.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, Position
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalRequest
from airflow_provider_mongocdc.core.window.incremental import IncrementalChunk
from airflow_provider_mongocdc.core.window.incremental_phase import IncrementalPhase
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.summary import StopReason

pytestmark = pytest.mark.integration

HOT = 5
DOCUMENTS = 40
CHUNK = 10


class ChangingStream:
    """The window's steps, with a stream that updates ``hot`` (while ``hot`` is set) and the first
    row of each range chunk before the chunk's high watermark."""

    def __init__(self, client: MongoClient, namespace: str, hot: int | None):
        self.client = client
        self.namespace = namespace
        self.hot = hot
        self.transactions: list[list] = []  # the _ids of each chunk's read events
        self.progress = None  # the progress committed last (the offset's)
        self.position = Position(cluster_time=self._server_time())

    def _server_time(self) -> Timestamp:
        return self.client.admin.command("ping")["operationTime"]

    @property
    def committed_position(self) -> Position:
        return self.position

    def commit(self, position: Position, incremental=None) -> None:
        self.position = position
        self.progress = incremental or self.progress

    def commit_chunk(self, position: Position, records: list, incremental) -> None:
        self.position = position
        self.progress = incremental
        self.transactions.append(records)

    def stream_to(self, chunk: IncrementalChunk) -> tuple[StopReason, Position]:
        database, _, collection = self.namespace.partition(".")
        changed = [] if self.hot is None else [self.hot]
        if not chunk.rereads and chunk.rows:
            changed.append(next(iter(chunk.rows.values()))["_id"])
        for key in changed:
            update = {"operationType": "update", "ns": {"db": database, "coll": collection}}
            chunk.apply({**update, "documentKey": {"_id": key}}, omitted=True)
        self.position = Position(cluster_time=chunk.high_watermark)
        return StopReason.END_REACHED, self.position

    def chunk_events(self, chunk: IncrementalChunk) -> list:
        return [document["_id"] for document in chunk.rows.values()]

    def low_watermark(self) -> Timestamp:
        return self._server_time()

    def topic_ends(self, namespaces: list[str]) -> dict[str, dict[int, int]]:
        return {}  # no topics: the chunks' events are kept here


def _phase(client: MongoClient, config: ConnectorConfig, window: ChangingStream) -> IncrementalPhase:
    params = WindowParams(window_end=datetime.now(timezone.utc))
    scope = StreamScope(
        config, OffsetPartition(config.topic_prefix, "rs0"), "rs0", params, lambda: time.time_ns() // 10**6
    )
    return IncrementalPhase(scope, client, window)


def test_rereads_are_batched_and_a_hot_document_waits_for_the_next_window(mongodb_uri, unique_name):
    database = unique_name[:40]
    namespace = f"{database}.items"
    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": unique_name,
            "collection.include.list": f"{database}\\..*",
            "capture.mode": "change_streams",
            "incremental.snapshot.chunk.size": CHUNK,
            # Long enough for hundreds of one-document chunks: the budget is not what ends the copy.
            "incremental.snapshot.window.budget.ms": 3000,
        }
    )
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000)
    client[database].items.insert_many([{"_id": n, "v": 0} for n in range(DOCUMENTS)])
    request = IncrementalRequest.new([namespace])

    first = ChangingStream(client, namespace, hot=HOT)
    summary = _phase(client, config, first).run(None, request, time.monotonic())

    # Four range chunks, then one re-read chunk of the five rows they dropped: the first row of
    # each range chunk and the hot document; the hot one changed again before its re-read's
    # high watermark and waits for the next window.
    chunks = [sorted(ids) for ids in first.transactions]
    assert chunks == [
        [n for n in range(0, 10) if n not in (0, HOT)],
        list(range(11, 20)),
        list(range(21, 30)),
        list(range(31, 40)),
        [0, 10, 20, 30],
    ], chunks
    assert summary["status"] == "running" and summary["reread"] == 1, summary
    assert summary["chunks"] == 5 and summary["dropped"] == 5 + 1, summary

    # The next window: the document is no longer changing; its re-read completes the snapshot.
    second = ChangingStream(client, namespace, hot=None)
    summary = _phase(client, config, second).run(first.progress.to_json(), request, time.monotonic())
    assert [sorted(ids) for ids in second.transactions] == [[HOT]], second.transactions
    assert summary["status"] == "completed", summary
    emitted = [key for ids in first.transactions + second.transactions for key in ids]
    assert sorted(emitted) == list(range(DOCUMENTS)), "every document read once, whole"
