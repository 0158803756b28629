"""A snapshot's records side by side with the ones Debezium 3.6.1's MongoDB connector sends for the
same documents (devtools/interop: Debezium's MongoDbSnapshotRecordEmitter on its snapshot offset,
the headers of its EventDispatcher, Kafka Connect's JsonConverter and SimpleHeaderConverter).

The snapshot runs in this process (core.snapshot.run with chunk tasks as threads) against the
simulator (or MONGOCDC_TEST_MONGODB_URI) and the real Kafka broker, over documents of many BSON
types in several chunks. Every record on the topics is Debezium's record for its document: topic,
key, value (``source.ord`` -1 among the rest) and the four context headers; only this connector's
version, the instants each built its record at and each run's own run id differ
(tests/interop/support.assert_debeziums). With ``extended.headers.enabled=false`` neither has
headers.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
from devtools.kafka.reading import read_topic
from tests.interop.support import IDS, assert_debeziums, fields

pytestmark = pytest.mark.interop


class ThreadChunkTasks:
    """The chunk copies as threads of this process (``ChunkTasks`` without Spark)."""

    def start(self, description: str) -> None:
        pass

    def run(self, copy, groups: list) -> list:
        with ThreadPoolExecutor(max_workers=len(groups)) as pool:
            return list(pool.map(copy, groups))


def _key_text(key: dict) -> str:
    return json.dumps(key, sort_keys=True)


@pytest.mark.parametrize("headers", ["default", "disabled"])
def test_snapshot_records_are_debeziums(headers, harness, mongodb_uri, kafka_bootstrap, unique_name):
    database = unique_name[:40]
    prefix = unique_name
    extra = {} if headers == "default" else {"extended.headers.enabled": "false"}
    props = {
        "topic.prefix": prefix,
        "name": f"{prefix}-connector",  # Kafka Connect's name: no header carries it
        "database.include.list": database,
        "snapshot.chunk.size": 4,
        "snapshot.max.threads": 2,
        **extra,
    }
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[database].things.insert_many([{"_id": value, **fields(n)} for n, value in enumerate(IDS)])
        client[database].other.insert_many([{"_id": n, "n": n} for n in range(6)])
        raw = {
            name: list(
                client[database]
                .get_collection(name, codec_options=CodecOptions(document_class=RawBSONDocument))
                .find()
            )
            for name in ("things", "other")
        }
    before = time.time_ns()
    summary = run_snapshot(
        JobSpec(
            "snapshot", props, {"connection_string": mongodb_uri}, {"bootstrap.servers": kafka_bootstrap}, {}
        ),
        ThreadChunkTasks(),
    )
    after = time.time_ns()
    assert summary["documents"] == len(IDS) + 6 and summary["chunks"] >= 4, summary

    debezium = {"topic.prefix": prefix, **extra}
    run_ids = set()
    compared = 0
    for name, documents in raw.items():
        theirs = {}
        for document in documents:
            (record,) = harness.emit_read(debezium, database, name, document.raw)["records"]
            theirs[_key_text(record["key"])] = document
        ours = read_topic(kafka_bootstrap, f"{prefix}.{database}.{name}")
        assert len(ours) == len(documents)
        for record in ours:
            last = json.loads(record.value)["payload"]["source"]["snapshot"] == "last"
            document = theirs[_key_text(json.loads(record.key))]
            answer = harness.emit_read(debezium, database, name, document.raw, last=last)
            assert answer["ok"], answer
            (expected,) = answer["records"]
            run_ids.add(assert_debeziums(record, expected, (before, after)))
            compared += 1
    assert compared == len(IDS) + 6
    if headers == "default":
        (run_id,) = run_ids  # one run id for every chunk of the run
        assert run_id is not None
    else:
        assert run_ids == {None}
