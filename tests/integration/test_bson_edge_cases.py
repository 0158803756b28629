"""BSON values pymongo cannot decode by default, through a snapshot (spark-submit) and a window.

* Dates outside Python's years 1-9999 (valid in MongoDB: a signed 64-bit count of milliseconds)
  in fields and as ``_id``: the snapshot plans and copies them, the window streams them, and a
  window event writes such a date with the same bytes as the snapshot's read event.
* UUID ``_id`` values read through a connection string with ``uuidRepresentation=standard``: the
  snapshot plans chunk bounds over them and emits one read event per document, keyed as the
  events module keys that ``_id`` (the same key a window event of the document carries).

Runs against the simulator (or MONGOCDC_TEST_MONGODB_URI), the real Kafka broker and spark-submit.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timedelta

import pytest
from bson import json_util
from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.datetime_ms import DatetimeMS
from bson.json_util import JSONOptions
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import SNAPSHOT_COMPLETED, OffsetPartition
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import read_topic
from tests.integration.snapshot_helpers import mongo_details, run_snapshot, snapshot_connector, write_spec
from tests.integration.window_helpers import insert_at, next_second, pass_second, topic_events

pytestmark = pytest.mark.integration

# 10000-01-01T00:00:01Z and one millisecond before 0001-01-01T00:00:00Z: valid BSON dates that
# pymongo's default decoding (datetime.datetime) refuses with InvalidBSON.
AFTER_9999 = DatetimeMS(253_402_300_801_000)
BEFORE_YEAR_1 = DatetimeMS(-62_135_596_800_001)
BEFORE_EPOCH = datetime(1969, 7, 20, 20, 17, 40)  # negative milliseconds, within Python's range

_AUTO = CodecOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)
_DECODE = JSONOptions(datetime_conversion=DatetimeConversion.DATETIME_AUTO)


def _with_option(uri: str, option: str) -> str:
    if "?" in uri:
        return f"{uri}&{option}"
    return f"{uri}?{option}" if uri.count("/") >= 3 else f"{uri}/?{option}"


def _by_key(events) -> dict[str, list]:
    grouped: dict[str, list] = {}
    for event in events:
        grouped.setdefault(event.key["id"], []).append(event)
    return grouped


def test_dates_outside_python_range_in_a_snapshot_and_a_window(
    mongodb_uri, kafka_bootstrap, spark_submit, unique_name, tmp_path
):
    prefix, database = unique_name, unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000, datetime_conversion="DATETIME_AUTO")
    db = client[database]
    db.dates.insert_many(
        [
            {"_id": 1, "at": AFTER_9999, "nested": {"list": [BEFORE_YEAR_1, BEFORE_EPOCH]}},
            {"_id": 2, "at": BEFORE_YEAR_1},
            {"_id": 3, "at": BEFORE_EPOCH},
        ]
    )
    # Date _ids on both sides of Python's range: the planner samples them for chunk bounds.
    date_ids = (
        [DatetimeMS(AFTER_9999._value + n * 1000) for n in range(15)]
        + [DatetimeMS(BEFORE_YEAR_1._value - n * 1000) for n in range(15)]
        + [BEFORE_EPOCH + timedelta(days=n) for n in range(10)]
    )
    db.date_ids.insert_many([{"_id": value, "n": n} for n, value in enumerate(date_ids)])
    props = snapshot_connector(prefix, database, 10)

    # 1. The snapshot: planned over the date _ids, one read event per document.
    spec, result = write_spec(tmp_path, props, mongo_details(mongodb_uri), kafka)
    summary = run_snapshot(spark_submit, spec, result).summary
    assert summary["documents"] == 3 + 40 and summary["chunks"] > 2, summary
    reads = _by_key(topic_events(kafka_bootstrap, f"{prefix}.{database}.dates"))
    assert sorted(reads) == ["1", "2", "3"]
    read_1 = reads["1"][0].payload["after"]
    assert json.loads(read_1) == {
        "_id": 1,
        "at": {"$date": 253_402_300_801_000},
        "nested": {"list": [{"$date": -62_135_596_800_001}, {"$date": -14_182_940_000}]},
    }
    id_reads = topic_events(kafka_bootstrap, f"{prefix}.{database}.date_ids")
    got_ids = sorted(_ms(json_util.loads(event.key["id"], json_options=_DECODE)) for event in id_reads)
    assert got_ids == sorted(_ms(value) for value in date_ids)
    assert all(event.op == "r" for event in id_reads)
    state = OffsetStore(kafka, f"{prefix}.offsets", read_timeout_s=30).read(
        OffsetPartition(prefix, client.admin.command("hello")["setName"])
    )
    assert state.snapshot.status == SNAPSHOT_COMPLETED

    # 2. A window over changes carrying such dates: document 1 deleted and inserted again as it
    # was, document 2 updated with the other date, a new date _id.
    db.dates.delete_one({"_id": 1})
    db.dates.insert_one({"_id": 1, "at": AFTER_9999, "nested": {"list": [BEFORE_YEAR_1, BEFORE_EPOCH]}})
    db.dates.update_one({"_id": 2}, {"$set": {"later": AFTER_9999}})
    last = insert_at(db.date_ids, {"_id": DatetimeMS(AFTER_9999._value + 10**9), "n": 99})
    end = next_second(last)
    pass_second(client, end, f"{database}_m")
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": mongodb_uri}), config)
    window = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=20))
    assert window["reached_end"] is True and window["events"] == 4, window

    changes = _by_key(topic_events(kafka_bootstrap, f"{prefix}.{database}.dates"))
    assert [event.op for event in changes["1"]] == ["r", "d", None, "c"]
    # The window writes the out-of-range dates byte for byte as the snapshot did.
    assert changes["1"][-1].payload["after"] == read_1
    (update,) = [event for event in changes["2"] if event.op == "u"]
    # updatedFields is relaxed extended JSON (Debezium: BsonDocument.toJson()), where a date outside
    # 1970-9999 is a $numberLong; after is strict, where it is a plain number.
    updated = json.loads(update.payload["updateDescription"]["updatedFields"])
    assert json.loads(read_1)["at"] == {"$date": AFTER_9999._value}
    assert updated == {"later": {"$date": {"$numberLong": str(AFTER_9999._value)}}}
    new_id = [
        event for event in topic_events(kafka_bootstrap, f"{prefix}.{database}.date_ids") if event.op == "c"
    ]
    # Keys are relaxed extended JSON too (Debezium 3.x's JsonSerialization.getDocumentId).
    assert [json.loads(event.key["id"]) for event in new_id] == [
        {"$date": {"$numberLong": str(AFTER_9999._value + 10**9)}}
    ]
    client.close()


def _ms(value) -> int:
    return int(value) if isinstance(value, DatetimeMS) else int(DatetimeMS(value))


def test_uuid_ids_with_uuid_representation_standard(
    mongodb_uri, kafka_bootstrap, spark_submit, unique_name, tmp_path
):
    prefix, database = unique_name, unique_name[:40]
    kafka = {"bootstrap.servers": kafka_bootstrap}
    uri = _with_option(mongodb_uri, "uuidRepresentation=standard")
    client = MongoClient(uri, serverSelectionTimeoutMS=20000)
    assert client.codec_options.uuid_representation == UuidRepresentation.STANDARD
    ids = [uuid.uuid4() for _ in range(300)]
    client[database].items.insert_many([{"_id": value, "n": n} for n, value in enumerate(ids)])
    props = snapshot_connector(prefix, database, 50)

    spec, result = write_spec(tmp_path, props, mongo_details(uri), kafka)
    summary = run_snapshot(spark_submit, spec, result).summary
    assert summary["documents"] == 300 and summary["chunks"] > 1, summary

    # One read event per document, each keyed exactly as the events module keys its _id.
    config = ConnectorConfig.from_properties(props)
    builder = EventBuilder(config)
    expected = {builder.build_snapshot({"_id": value}, database, "items")[0].key: value for value in ids}
    records = read_topic(kafka_bootstrap, f"{prefix}.{database}.items")
    assert len(records) == 300
    assert sorted(record.key for record in records) == sorted(expected)
    assert all(json.loads(record.value)["payload"]["op"] == "r" for record in records)

    # A window event of one of these documents carries the same key as its read event.
    changed = ids[123]
    with client.start_session() as session:
        client[database].items.update_one({"_id": changed}, {"$set": {"n": -1}}, session=session)
        end = next_second(session.operation_time)
    pass_second(client, end, f"{database}_m")
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    window = run_window(target, config, kafka, WindowParams(end, idle_timeout_s=20))
    assert window["events"] == 1, window
    updates = [
        record
        for record in read_topic(kafka_bootstrap, f"{prefix}.{database}.items")
        if json.loads(record.value)["payload"]["op"] == "u"
    ]
    assert [expected.get(record.key) for record in updates] == [changed]
    client.close()
