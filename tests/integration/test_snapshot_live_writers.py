"""A snapshot's readers of the offsets topic never fence a live chunk writer of their own run.

The chunk tasks of a snapshot run side by side; each reads the offsets topic when it starts (which
chunks are committed) and again before each chunk, while a sibling may be in the middle of a
commit: its chunk marker sent, its transaction open until the brokers have every event of the
chunk. The driver reads the markers every few seconds to log the progress meanwhile. A commit
slower than the readers' settle time (here shortened) is waited for by the tasks and only observed
by the progress: the sibling is not taken over and its commit succeeds. The waits are on
conditions (a reader has settled once past its settle time), never on fixed times.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import Observe, TakeOver, chunk_transactional_id
from airflow_provider_mongocdc.core.snapshot import run as snapshot_run
from devtools.kafka.reading import read_topic
from tests.integration.snapshot_helpers import mongo_details, payloads, seed, snapshot_connector
from tests.settled_offsets import READ_TIMEOUT_S

pytestmark = pytest.mark.integration

# Far below the product's 15 s, so that a sibling's commit is "slow" at once.
SHORT_SETTLE_S = 0.5


@pytest.fixture
def short_settle(monkeypatch) -> None:
    """The runs' readers settle after SHORT_SETTLE_S."""
    for_connector = OffsetStore.for_connector.__func__

    def shortly_settled(cls, kafka_config, connector_config, **kwargs):
        return for_connector(cls, kafka_config, connector_config, **{"settle_s": SHORT_SETTLE_S, **kwargs})

    monkeypatch.setattr(OffsetStore, "for_connector", classmethod(shortly_settled))


def watch_settle(monkeypatch, cls, event: threading.Event | None = None) -> threading.Event:
    """``event``, set once a reader settling with ``cls`` has waited for an open transaction and
    decided what to do with it (whatever it decided, and also when it raised)."""
    event = event or threading.Event()
    settle = cls.settle

    def watched(self, *args, **kwargs):
        try:
            return settle(self, *args, **kwargs)
        finally:
            event.set()

    monkeypatch.setattr(cls, "settle", watched)
    return event


def _replica_set(uri: str) -> str:
    with MongoClient(uri) as client:
        return client.admin.command("hello")["setName"]


def _snapshot(mongosim, kafka_bootstrap, unique_name):
    sim = mongosim()
    database = f"{unique_name}_db"
    with MongoClient(sim.uri) as client:
        ids = seed(client, database, {"customers": 120, "orders": 80})
    kafka = {"bootstrap.servers": kafka_bootstrap}
    spec = JobSpec(
        "snapshot", snapshot_connector(unique_name, database, 40), mongo_details(sim.uri), kafka, {}
    )
    return spec, database, ids, _replica_set(sim.uri)


def _assert_each_document_once(kafka_bootstrap, prefix, database, ids) -> None:
    for name, expected in ids.items():
        got = payloads(read_topic(kafka_bootstrap, f"{prefix}.{database}.{name}"))
        assert len(got) == len(expected), f"{name}: {len(got)} events for {len(expected)} documents"


class SiblingsOneAfterTheOther:
    """``ChunkTasks`` as threads: in the first run (the regular chunks, two groups), the second
    group starts once the first group's first chunk is in the middle of its commit."""

    def __init__(self, opened: threading.Event) -> None:
        self.opened = opened
        self.runs = 0

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        self.runs += 1
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            first = pool.submit(copy, groups[0])
            if self.runs == 1 and len(groups) > 1:
                assert self.opened.wait(READ_TIMEOUT_S), "the first chunk never began to commit"
            rest = [pool.submit(copy, group) for group in groups[1:]]
            return [first.result()] + [future.result() for future in rest]


def test_a_chunk_task_waits_for_a_sibling_chunks_slow_commit_and_does_not_fence_it(
    mongosim, kafka_bootstrap, unique_name, short_settle, monkeypatch
):
    spec, database, ids, _rs = _snapshot(mongosim, kafka_bootstrap, unique_name)
    settled = watch_settle(monkeypatch, TakeOver)
    opened = threading.Event()
    slow: list[str] = []
    commit = TransactionalWriter.commit

    def slowly(self, records=()):
        chunk_writer = self.transactional_id.startswith(f"mongocdc-{unique_name}-snapshot-")
        if not chunk_writer or self.transactional_id.endswith("-snapshot-control") or slow:
            return commit(self, records)
        # The first chunk's commit under way: its marker on the broker, its transaction open
        # until a sibling's reader has found it open past the settle time.
        slow.append(self.transactional_id)
        self.send(records)
        self.flush()
        settled.clear()
        opened.set()
        assert settled.wait(READ_TIMEOUT_S), "no sibling's reader found the chunk's transaction open"
        return commit(self)  # raises when the sibling's reader took this writer over

    monkeypatch.setattr(TransactionalWriter, "commit", slowly)

    summary = snapshot_run.run_snapshot(spec, SiblingsOneAfterTheOther(opened))

    assert slow, "no chunk commit was slowed"
    assert summary["action"] == "snapshot" and summary["documents"] == 200, summary
    assert summary["chunks_copied"] == summary["chunks"], summary
    _assert_each_document_once(kafka_bootstrap, unique_name, database, ids)


class ProbeBeforeCopying:
    """``ChunkTasks`` as threads whose first run first holds a transaction of a chunk writer of
    the connector open on the offsets topic until the driver's progress read has settled it, then
    commits it (which fails if the progress read took the writer over), then copies."""

    def __init__(self, kafka, store: OffsetStore, partition: OffsetPartition, prefix: str, progress):
        self.kafka, self.store, self.partition, self.prefix = kafka, store, partition, prefix
        self.progress = progress
        self.probed = False

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        if not self.probed:
            self.probed = True
            with TransactionalWriter(self.kafka, chunk_transactional_id(self.prefix, "probe", "c0")) as probe:
                probe.begin()
                probe.send([self.store.chunk_record(self.partition, "probe", "c0", {"docs": 0})])
                probe.flush()
                self.progress.clear()
                assert self.progress.wait(READ_TIMEOUT_S), "the progress never read past the transaction"
                probe.commit()  # raises when the progress read took this writer over
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(copy, groups))


def test_the_snapshot_progress_only_observes_a_chunks_open_transaction(
    mongosim, kafka_bootstrap, unique_name, short_settle, monkeypatch
):
    spec, database, ids, rs = _snapshot(mongosim, kafka_bootstrap, unique_name)
    # While the probe is open no chunk task runs: whatever settles it is the driver's progress.
    progress = threading.Event()
    for cls in (Observe, TakeOver):
        watch_settle(monkeypatch, cls, progress)
    kafka = spec.kafka
    store = OffsetStore(kafka, f"{unique_name}.offsets")
    tasks = ProbeBeforeCopying(kafka, store, OffsetPartition(unique_name, rs), unique_name, progress)

    summary = snapshot_run.run_snapshot(spec, tasks)

    assert tasks.probed
    assert summary["action"] == "snapshot" and summary["documents"] == 200, summary
    _assert_each_document_once(kafka_bootstrap, unique_name, database, ids)
