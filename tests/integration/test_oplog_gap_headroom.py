"""The gap verdict and the headroom estimate, from oplog facts (no server needed)."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.plan import Layout, Probe, layout_from_hello, plan_probes
from airflow_provider_mongocdc.core.gap.report import HISTORY_LOST, RESUMABLE, GapReport, assess
from airflow_provider_mongocdc.core.mongo.oplog_span import OplogSpan
from airflow_provider_mongocdc.core.mongo.topology import ShardAddress
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position

pytestmark = pytest.mark.unit

HOUR = 3600
PARTITION = OffsetPartition("shop", "rs0")


def span(oldest: int, newest: int, **stats) -> OplogSpan:
    return OplogSpan("rs0", Timestamp(oldest, 1), Timestamp(newest, 1), **stats)


def at(seconds: int) -> OffsetState:
    return OffsetState(position=Position(cluster_time=Timestamp(seconds, 1)))


def probe(state: OffsetState | None) -> Probe:
    return Probe(PARTITION, state, None, (None,))


def test_a_full_oplog_purges_the_position_as_time_passes():
    full = span(10_000, 10_000 + 24 * HOUR, size_bytes=1000, max_size_bytes=1000)
    # The position is 1 hour newer than the oldest entry: one more hour of writes purges it.
    assert full.headroom_seconds(Timestamp(10_000 + HOUR, 5)) == HOUR


def test_an_oplog_that_is_not_full_first_fills_at_the_observed_rate():
    half = span(10_000, 10_000 + 10 * HOUR, size_bytes=500, max_size_bytes=1000)
    assert half.fill == 0.5
    # 10 hours of writes filled half of it: 10 more hours fill it, then 1 hour purges the position.
    assert half.headroom_seconds(Timestamp(10_000 + HOUR, 1)) == 11 * HOUR
    by_count = span(10_000, 10_000 + 10 * HOUR, size_bytes=1, max_size_bytes=1000, count=80, max_count=100)
    assert by_count.fill == 0.8  # the fuller of bytes and documents
    unknown_size = span(10_000, 10_000 + 10 * HOUR)
    assert unknown_size.headroom_seconds(Timestamp(10_000 + HOUR, 1)) == HOUR  # assumed full
    assert OplogSpan("rs0", error="not authorized").headroom_seconds(Timestamp(1, 1)) is None


def test_verdicts():
    oplog = [span(10_000, 20_000, size_bytes=1, max_size_bytes=1)]
    ok = assess(probe(at(15_000)), oplog, RESUMABLE)
    assert (ok.status, ok.headroom_seconds, ok.lost_seconds) == ("ok", 5_000, None)

    gone = assess(probe(at(9_000)), oplog, HISTORY_LOST, "error 286")
    assert (gone.status, gone.lost_seconds, gone.headroom_seconds) == ("gap", 1_000, None)
    assert "error 286" in gone.note
    # MongoDB's stream check decides when it ran, the oplog comparison where none ran; without a
    # readable oplog the lost time is unknown.
    assert assess(probe(at(9_000)), oplog, RESUMABLE).status == "ok"
    assert assess(probe(at(9_000)), oplog).status == "gap"
    blind = assess(probe(at(9_000)), [OplogSpan("rs0", error="not authorized")], HISTORY_LOST, "286")
    assert (blind.status, blind.lost_seconds) == ("gap", None)

    assert assess(probe(None), oplog).status == "no_offset"
    assert assess(probe(OffsetState()), oplog).status == "no_position"
    running = OffsetState().snapshot_started("s1", Position(cluster_time=Timestamp(9_000, 1)), 4)
    in_progress = assess(probe(running), oplog)
    assert in_progress.status == "snapshot_in_progress" and in_progress.lost_seconds == 1_000

    report = GapReport("shop", (ok, gone))
    assert report.gap and report.to_dict()["gap_partitions"] == ["rs0"]
    assert report.to_dict()["lost_seconds"] == 1_000
    assert report.low_headroom(6_000) == [ok] and report.low_headroom(5_000) == []
    assert GapReport("shop", (ok,)).gap is False


def test_partitions_follow_the_connection_mode():
    shards = [{"_id": "a", "host": "rsA/h1:1"}, {"_id": "b", "host": "rsB/h2:1"}]
    cluster = layout_from_hello({"msg": "isdbgrid"}, shards)
    assert cluster == Layout(
        "sharded", shards=(ShardAddress("a", "rsA/h1:1"), ShardAddress("b", "rsB/h2:1")), via="mongos"
    )
    whole = ConnectorConfig.from_properties({"topic.prefix": "shop"})
    per_shard = ConnectorConfig.from_properties(
        {"topic.prefix": "shop", "mongodb.connection.mode": "replica_set"}
    )
    (probe_cluster,) = plan_probes(cluster, whole, {})
    assert (probe_cluster.partition.rs, probe_cluster.stream_via, probe_cluster.oplogs) == (
        "cluster",
        None,
        ("rsA", "rsB"),
    )
    assert [(p.partition.rs, p.stream_via, p.oplogs) for p in plan_probes(cluster, per_shard, {})] == [
        ("rsA", "rsA", ("rsA",)),
        ("rsB", "rsB", ("rsB",)),
    ]
    other_connector = {OffsetPartition("other", "rs0"): at(1)}
    assert [
        p.partition.rs for p in plan_probes(layout_from_hello({"setName": "rs0"}), whole, other_connector)
    ] == ["rs0"]
