"""The change stream pipeline of the Debezium 3.x cursor settings, stage by stage (as Debezium's
ChangeStreamPipelineFactory builds it), their validation, and fragment reassembly."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.change_stream import merge_fragments, start_op_time, stream_pipeline
from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.errors import ConfigError
from airflow_provider_mongocdc.core.filters import Filters

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
