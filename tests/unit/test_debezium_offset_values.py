"""Debezium MongoDB offset values read and written without a broker: both resume token forms, the
cluster time inside a token, positions without a token, refused snapshot offsets."""

from __future__ import annotations

import base64

import bson
import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.offsets.debezium import DebeziumOffset, debezium_value
from airflow_provider_mongocdc.core.offsets.model import Position, token_cluster_time

# A MongoDB 7 resume token: key-string type 130 (0x82), then the cluster time 1693491634:1.
TOKEN = {"_data": "8264F0A1B2000000012B022C0100296E5A1004"}
TIME = Timestamp(1693491634, 1)


def _entry(value: dict) -> DebeziumOffset:
    return DebeziumOffset("inventory", {"server_id": "shop"}, value)


def test_the_cluster_time_is_read_from_the_token_as_debezium_reads_it():
    assert token_cluster_time(TOKEN) == TIME
    assert token_cluster_time({"_data": "00"}) is None


@pytest.mark.parametrize(
    "stored, token_format",
    [(base64.b64encode(bson.encode(TOKEN)).decode(), "base64"), (TOKEN["_data"], "hex")],
)
def test_both_token_forms_give_the_same_position(stored, token_format):
    entry = _entry({"sec": TIME.time, "ord": TIME.inc, "resume_token": stored})
    assert entry.token_format == token_format
    assert entry.position() == Position(TOKEN, TIME)


def test_a_token_without_sec_takes_the_token_time_and_a_time_without_token_starts_there():
    # Debezium writes sec=-1/ord=-1 for a position known only by its token (SourceInfo.noEvent).
    stored = base64.b64encode(bson.encode(TOKEN)).decode()
    assert _entry({"sec": -1, "ord": -1, "resume_token": stored}).position() == Position(TOKEN, TIME)
    assert _entry({"sec": 100, "ord": 2}).position() == Position(cluster_time=Timestamp(100, 2))


def test_debezium_value_round_trips():
    assert debezium_value(Position(TOKEN)) == {
        "sec": TIME.time,
        "ord": TIME.inc,
        "resume_token": base64.b64encode(bson.encode(TOKEN)).decode(),
    }
    assert _entry(debezium_value(Position(TOKEN, TIME))).position() == Position(TOKEN, TIME)
    assert debezium_value(Position(cluster_time=Timestamp(5, 6))) == {"sec": 5, "ord": 6}


@pytest.mark.parametrize(
    "value, message",
    [
        ({"sec": 100, "ord": 1, "initsync": True}, "during its initial snapshot"),
        ({"sec": -1, "ord": -1}, "holds no position"),
        (
            {
                "sec": 9,
                "ord": 1,
                "incremental_snapshot_collections": '[{"incremental_snapshot_collections_id": '
                '"shop.orders"}]',
            },
            "during an incremental snapshot",
        ),
        ({"sec": 100, "ord": 1, "resume_token": 42}, "unreadable resume_token"),
    ],
)
def test_offsets_without_a_usable_position_are_refused(value, message):
    with pytest.raises(OffsetError, match=message) as raised:
        _entry(value).position()
    assert "'inventory'" in str(raised.value) and raised.value.fix


def test_stored_offsets_read_both_token_forms():
    from airflow_provider_mongocdc.core.offsets.model import OffsetState

    hex_form = OffsetState.from_json({"sec": TIME.time, "ord": TIME.inc, "resume_token": TOKEN["_data"]})
    b64 = base64.b64encode(bson.encode(TOKEN)).decode()
    base64_form = OffsetState.from_json({"sec": TIME.time, "ord": TIME.inc, "resume_token": b64})
    assert hex_form.position == base64_form.position == Position(TOKEN, TIME)
    assert hex_form.to_json()["resume_token"] == TOKEN["_data"]  # still written as _data
