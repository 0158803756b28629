"""MongoDB's rules the gap check follows: which oplog still covers a position, and which refusals
of a change stream mean a purged oplog (no server needed)."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp
from pymongo.errors import NetworkTimeout, OperationFailure

from airflow_provider_mongocdc.core.gap.plan import Probe
from airflow_provider_mongocdc.core.gap.report import assess
from airflow_provider_mongocdc.core.mongo.oplog_span import span_from_documents
from airflow_provider_mongocdc.core.mongo.stream_errors import is_history_lost, is_unusable_position
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position

pytestmark = pytest.mark.unit

HOUR = 3600
INITIATION = {"ts": Timestamp(50_000, 1), "op": "n", "o": {"msg": "initiating set"}}
NEWEST = {"ts": Timestamp(50_000 + HOUR, 1)}
HALF_FULL = {"size": 500, "maxSize": 1000}


def probe(seconds: int, snapshot_running: bool = False) -> Probe:
    position = Position(cluster_time=Timestamp(seconds, 1))
    state = (
        OffsetState().snapshot_started("s1", position, 2)
        if snapshot_running
        else OffsetState(position=position)
    )
    return Probe(OffsetPartition("shop", "cluster"), state, None, ("shard2",))


def test_an_oplog_that_starts_with_the_initiation_covers_any_earlier_position():
    young = span_from_documents("shard2", INITIATION, NEWEST, HALF_FULL)
    assert young.starts_at_initiation and young.covers(Timestamp(1_000, 1))
    # Resumable until the initiation entry rolls off: when the oplog is full, an hour from now.
    assert young.headroom_seconds(Timestamp(1_000, 1)) == HOUR
    check = assess(probe(1_000), [young])
    assert (check.status, check.lost_seconds, check.headroom_seconds) == ("ok", None, HOUR)
    running = assess(probe(1_000, snapshot_running=True), [young])
    assert running.status == "snapshot_in_progress" and "no longer in the oplog" not in running.note

    # Any other first entry (a no-op of another kind, a write) is compared by time.
    for first in (
        {"ts": INITIATION["ts"], "op": "n", "o": {"msg": "periodic noop"}},
        {"ts": INITIATION["ts"], "op": "i", "o": {}},
    ):
        rolled = span_from_documents("shard2", first, NEWEST, HALF_FULL)
        assert not rolled.starts_at_initiation and rolled.covers(Timestamp(1_000, 1)) is False
        assert assess(probe(1_000), [rolled]).status == "gap"
        assert rolled.covers(INITIATION["ts"]) and not rolled.covers(Timestamp(49_999, 9))


def failure(code: int, message: str) -> OperationFailure:
    return OperationFailure(message, code, {"ok": 0, "code": code, "errmsg": message})


def test_only_a_purged_oplog_is_history_lost():
    purged = [
        failure(
            286,
            "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
        ),
        failure(136, "CollectionScan died due to position in capped collection being deleted"),
        failure(
            40576,
            "Resume of change stream was not possible, as the resume point may no longer be in the oplog.",
        ),
    ]
    for error in purged:
        assert is_history_lost(error) and not is_unusable_position(error), error
    unusable = [
        failure(280, 'cannot resume stream; the resume token was not found. {_data: "8263"}'),
        failure(
            260, "Attempting to resume a change stream using 'resumeAfter' is not allowed from an invalidate"
        ),
    ]
    for error in unusable:
        assert is_unusable_position(error) and not is_history_lost(error), error
    # MongoDB 3.6/4.0's "token not found" starts like the purge message but is not one.
    not_found = failure(40585, "resume of change stream was not possible, as the resume token was not found.")
    assert not is_history_lost(not_found)
    assert not is_history_lost(NetworkTimeout("timed out")) and not is_unusable_position(NetworkTimeout("x"))
