"""The change stream pipeline of the Debezium 3.x cursor settings, stage by stage (as Debezium's
ChangeStreamPipelineFactory builds it), their validation, and fragment reassembly."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError, MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.filters import Filters
from airflow_provider_mongocdc.core.mongo.change_stream import (
    SplitEventStream,
    merge_fragments,
    start_op_time,
    stream_pipeline,
)

USER = {"$match": {"fullDocument.region": "EU"}}


def config(**props) -> ConnectorConfig:
    return ConnectorConfig.from_properties({"topic.prefix": "p", **props})


def test_pipeline_order_follows_cursor_pipeline_order():
    pipeline = '[{"$match": {"fullDocument.region": "EU"}}]'
    internal = Filters(config()).change_stream_match()
    assert stream_pipeline(config()) == [internal]
    assert stream_pipeline(config(**{"cursor.pipeline": pipeline})) == [internal, USER]
    first = config(**{"cursor.pipeline": pipeline, "cursor.pipeline.order": "user_first"})
    assert stream_pipeline(first) == [USER, internal]
    only = config(**{"cursor.pipeline": pipeline, "cursor.pipeline.order": "user_only"})
    assert stream_pipeline(only) == [USER]


def test_size_stage_first_and_split_stage_last():
    skip = config(
        **{
            "cursor.pipeline": '{"$match": {"a": 1}}',
            "cursor.oversize.handling.mode": "skip",
            "cursor.oversize.skip.threshold": 100,
        }
    )
    size, internal, user = stream_pipeline(skip)
    assert size["$match"]["$and"][0] == {"$expr": {"$lte": [{"$bsonSize": "$fullDocument"}, 100]}}
    assert size["$match"]["$and"][1] == {"$expr": {"$lte": [{"$bsonSize": "$fullDocumentBeforeChange"}, 100]}}
    assert user == {"$match": {"a": 1}}
    split = config(**{"cursor.oversize.handling.mode": "split", "cursor.pipeline.order": "user_only"})
    assert stream_pipeline(split) == [{"$changeStreamSplitLargeEvent": {}}]


def test_our_oversize_name_is_an_alias_of_debeziums():
    aliased = config(**{"event.oversize.handling.mode": "skip"})
    assert aliased.event_oversize_handling_mode == "skip"
    assert any("cursor.oversize.handling.mode" in w for w in aliased.warnings)
    assert aliased.to_properties()["cursor.oversize.handling.mode"] == "skip"


@pytest.mark.parametrize(
    "props, text",
    [
        ({"cursor.pipeline": "[{"}, "cursor.pipeline"),
        ({"cursor.pipeline": '[{"a": 1}]'}, "array of aggregation stages"),
        ({"cursor.pipeline.order": "last"}, "internal_first"),
        ({"cursor.oversize.handling.mode": "truncate"}, "split"),
        ({"capture.start.op.time": -2}, "capture.start.op.time"),
    ],
)
def test_invalid_values_are_refused(props, text):
    with pytest.raises(ConfigError) as info:
        config(**props)
    assert text in str(info.value)


def test_capture_start_op_time_is_a_bson_timestamp_as_one_long():
    assert start_op_time(config()) is None
    assert start_op_time(config(**{"capture.start.op.time": (1700000000 << 32) | 7})) == Timestamp(
        1700000000, 7
    )


def test_fragments_merge_as_debezium_does():
    fragments = [
        {"_id": {"_data": "A0"}, "splitEvent": {"fragment": 1, "of": 2}, "operationType": "update", "ns": 1},
        {"_id": {"_data": "A1"}, "splitEvent": {"fragment": 2, "of": 2}, "fullDocument": {"a": 1}},
    ]
    merged = merge_fragments(fragments)
    assert merged == {"_id": {"_data": "A1"}, "operationType": "update", "ns": 1, "fullDocument": {"a": 1}}
    assert "splitEvent" not in merged


class _Scripted:
    """A change stream that returns scripted changes (None: an empty batch), with the resume
    token pymongo would report after each."""

    def __init__(self, script):
        self.script = list(script)
        self.resume_token = {"_data": "START"}
        self.alive = True

    def try_next(self):
        change = self.script.pop(0)
        if change is not None:
            self.resume_token = change["_id"]
        return change

    def close(self):
        self.alive = False


def _fragment(n: int, of: int, **fields):
    return {"_id": {"_data": f"E{n}"}, "splitEvent": {"fragment": n, "of": of}, **fields}


def test_split_stream_never_reports_a_position_inside_an_event():
    before = {"_id": {"_data": "B"}, "operationType": "insert"}
    stream = SplitEventStream(
        _Scripted([before, _fragment(1, 2, operationType="update"), None, _fragment(2, 2, fullDocument={})])
    )
    assert stream.try_next() == before
    assert stream.resume_token == {"_data": "B"}
    # The first fragment arrived, then an empty batch: the position stays at the whole event before.
    assert stream.try_next() is None
    assert stream.resume_token == {"_data": "B"}
    merged = stream.try_next()
    assert merged == {"_id": {"_data": "E2"}, "operationType": "update", "fullDocument": {}}
    assert stream.resume_token == {"_data": "E2"}


def test_split_stream_fails_on_a_missing_fragment():
    stream = SplitEventStream(_Scripted([_fragment(1, 3), _fragment(3, 3)]))
    with pytest.raises(MongoCdcError) as info:
        stream.try_next()
    assert "missing a fragment" in str(info.value) and "after fragment 1 of 3" in str(info.value)
