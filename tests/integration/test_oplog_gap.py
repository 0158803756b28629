"""OplogGapSensor (poke, reschedule mode) and OplogGapTrigger (asyncio) against the MongoDB
simulator (or MONGOCDC_TEST_MONGODB_URI's replica set for what needs no simulator command) and the
real Kafka broker."""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timezone

import pytest
from airflow.sdk.exceptions import AirflowRescheduleException, TaskDeferred
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams, end_timestamp
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import plan_streams
from airflow_provider_mongocdc.links import ResnapshotTriggerLink
from airflow_provider_mongocdc.triggers.oplog_gap import OplogGapTrigger, event_error
from tests.integration.oplog_gap_helpers import first_event, sensor
from tests.integration.window_helpers import pass_second

pytestmark = [pytest.mark.integration, pytest.mark.simulator_only]


class FirstTry:
    """The task instance as BaseSensorOperator.execute asks it in reschedule mode."""

    def get_first_reschedule_date(self, context):
        return None


def completed_snapshot(client: MongoClient, config: ConnectorConfig) -> OffsetState:
    """The offset a completed snapshot leaves: its recorded start position."""
    return OffsetState().snapshot_started("s1", current_position(client, config), 0).snapshot_completed()


def test_quiet_window_is_no_gap_and_a_purged_position_is_found_by_poke_and_trigger(
    mongosim, kafka_bootstrap, gap_connections, unique_name, capsys
):
    sim = mongosim("replset")
    ids = gap_connections(sim.uri)
    props = {"topic.prefix": unique_name, "collection.include.list": "shop\\.orders"}
    config = ConnectorConfig.from_properties(props)
    kafka = {"bootstrap.servers": kafka_bootstrap}
    client = MongoClient(sim.uri)
    client.shop.orders.insert_many([{"_id": i, "n": i} for i in range(5)])
    store = OffsetStore(kafka, config.offsets_topic)
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, completed_snapshot(client, config))

    # A quiet hour: a window with no change of a captured collection moves the offset to its end.
    # The end is taken first, then an uncaptured write moves the cluster time past it, so the
    # window need not wait for MongoDB's next periodic no-op (every 10 s).
    end = datetime.now(timezone.utc)
    pass_second(client, end_timestamp(end), "other")
    (target,) = plan_streams(MongoConnectionDetails(connection_string=sim.uri), config)
    summary = run_window(target, config, kafka, WindowParams(end))
    assert summary["events"] == 0 and summary["reached_end"]

    quiet = sensor(props, ids, headroom_warning=10**9)
    capsys.readouterr()
    assert quiet.poke({}).is_done is False
    # Below headroom_warning: a warning before any data is lost (the task log is on stdout).
    logged = capsys.readouterr().out
    assert "warning" in logged and "below the headroom warning of 1000000000 s" in logged
    with pytest.raises(AirflowRescheduleException):
        quiet.execute({"ti": FirstTry()})
    report = quiet.check()
    (check,) = report.checks
    assert (check.status, check.stream) == ("ok", "resumable")
    assert check.headroom_seconds is not None and check.headroom_seconds >= 0
    no_gap = asyncio.run(OplogGapTrigger(props, ids["mongo"], ids["kafka"]).check_once())
    assert no_gap.gap is False and no_gap.checks[0].status == "ok"

    # Retention drops the stored position.
    client.shop.orders.insert_many([{"_id": 100 + i} for i in range(30)])
    sim.set_oplog_retention(max_entries=5)

    report = quiet.execute({"ti": FirstTry()})  # found on the first poke
    assert report["connector"] == unique_name and report["gap"] is True
    assert report["gap_partitions"] == ["rs0"]
    assert datetime.fromisoformat(report["detected_at"].replace("Z", "+00:00")) <= datetime.now(timezone.utc)
    (gap,) = report["partitions"]
    assert gap["status"] == "gap" and gap["stream"] == "history_lost"
    assert gap["stored_time"] and gap["oldest_oplog_time"] and gap["lost_seconds"] >= 0
    assert gap["oldest_oplog_time"] >= gap["stored_time"]
    json.dumps(report)  # XCom and DAG run conf take JSON

    # Deferrable: the sensor hands a trigger to the triggerer, which rebuilds it from its
    # serialized form (no secret in it) and runs it; the sensor resumes with the gap report.
    deferring = sensor(props, ids, deferrable=True, poke_interval=1)
    with pytest.raises(TaskDeferred) as deferred:
        deferring.execute({"ti": FirstTry()})
    assert deferred.value.method_name == "execute_complete"
    path, kwargs = deferred.value.trigger.serialize()
    assert path == "airflow_provider_mongocdc.triggers.oplog_gap.OplogGapTrigger"
    assert set(kwargs) == {
        "connector_config",
        "mongo_conn_id",
        "kafka_conn_id",
        "poll_interval",
        "headroom_warning",
        "connector",
    }
    assert "127.0.0.1" not in json.dumps(kwargs)
    event = first_event(OplogGapTrigger(**kwargs))
    assert event["status"] == "gap"
    assert event["report"]["gap_partitions"] == ["rs0"]
    assert deferring.execute_complete({}, event) == event["report"]

    link = ResnapshotTriggerLink().get_link(quiet, ti_key=None)
    assert link.endswith("/dags/mongocdc_resnapshot")


def test_sharded_cluster_partitions_snapshot_in_progress_and_missing_offsets(
    mongosim, kafka_config, gap_connections, unique_name
):
    sim = mongosim("sharded", shards=2)
    ids = gap_connections(sim.uri)
    client = MongoClient(sim.uri)
    client.shop.orders.insert_many([{"_id": i} for i in range(10)])

    whole = {"topic.prefix": f"{unique_name}_c"}
    per_shard = {"topic.prefix": f"{unique_name}_s", "mongodb.connection.mode": "replica_set"}
    whole_config = ConnectorConfig.from_properties(whole)
    shard_config = ConnectorConfig.from_properties(per_shard)
    OffsetStore(kafka_config, whole_config.offsets_topic).write(
        OffsetPartition(whole_config.topic_prefix, "cluster"), completed_snapshot(client, whole_config)
    )
    shard0 = MongoClient(sim.shard_uris[0])
    shard_store = OffsetStore(kafka_config, shard_config.offsets_topic)
    shard_store.write(
        OffsetPartition(shard_config.topic_prefix, "shard0"),
        OffsetState().snapshot_started("s9", current_position(shard0, shard_config), 1),
    )

    report = sensor(whole, ids).check()
    (cluster,) = report.checks
    assert (cluster.status, cluster.partition.rs) == ("ok", "cluster")
    assert sorted(span.replica_set for span in cluster.spans) == ["shard0", "shard1"]
    assert all(span.readable for span in cluster.spans)

    client.shop.orders.insert_many([{"_id": 100 + i} for i in range(40)])
    sim.set_oplog_retention(max_entries=3)

    report = sensor(whole, ids).execute({"ti": FirstTry()})
    assert report["gap_partitions"] == ["cluster"]
    (gap,) = report["partitions"]
    assert {span["replica_set"] for span in gap["oplogs"]} == {"shard0", "shard1"}

    # Per shard: shard0's snapshot is running (reported, not a gap, though its start is purged);
    # shard1 has no offset at all (nothing to lose).
    per_shard_sensor = sensor(per_shard, ids)
    assert per_shard_sensor.poke({}).is_done is False
    statuses = {check.partition.rs: check for check in per_shard_sensor.check().checks}
    assert statuses["shard0"].status == "snapshot_in_progress"
    assert "no longer in the oplog" in statuses["shard0"].note
    assert statuses["shard1"].status == "no_offset"


def test_connection_errors_are_not_gaps(mongosim, kafka_bootstrap, gap_connections, unique_name):
    sim = mongosim("replset")
    props = {
        "topic.prefix": unique_name,
        "mongodb.server.selection.timeout.ms": 1000,
        "mongodb.connect.timeout.ms": 1000,
        "connect.backoff.initial.delay.ms": 10,
        "connect.backoff.max.delay.ms": 10,
    }
    config = ConnectorConfig.from_properties(props)
    client = MongoClient(sim.uri)
    OffsetStore({"bootstrap.servers": kafka_bootstrap}, config.offsets_topic).write(
        OffsetPartition(unique_name, "rs0"), completed_snapshot(client, config)
    )
    ids = gap_connections(sim.uri)
    sim.stop()

    with pytest.raises(ConnectionFailedError):
        sensor(props, ids, soft_fail=True).execute({"ti": FirstTry()})
    # (Its reconnection attempts, 1 s of server selection each, take a while on a loaded machine.)
    event = first_event(OplogGapTrigger(props, ids["mongo"], ids["kafka"]), timeout=300)
    assert event["status"] == "error" and event["error"] == "ConnectionFailedError"
    with pytest.raises(ConnectionFailedError, match="not a gap"):
        sensor(props, ids, soft_fail=True).execute_complete({}, event)
    assert isinstance(event_error(event), ConnectionFailedError)


def test_trigger_opens_the_stream_as_the_poke_and_the_window_do(
    mongosim, kafka_bootstrap, gap_connections, unique_name
):
    """The stream check of both the poke and the trigger opens the connector's own stream,
    cursor.pipeline included: a pipeline MongoDB refuses fails both, with the same error."""
    sim = mongosim("replset")
    plain = {"topic.prefix": unique_name}
    client = MongoClient(sim.uri)
    OffsetStore(
        {"bootstrap.servers": kafka_bootstrap}, ConnectorConfig.from_properties(plain).offsets_topic
    ).write(
        OffsetPartition(unique_name, "rs0"),
        completed_snapshot(client, ConnectorConfig.from_properties(plain)),
    )
    ids = gap_connections(sim.uri)
    # $out is not permitted in a change stream: MongoDB refuses to open the stream.
    props = {**plain, "cursor.pipeline": '[{"$out": "elsewhere"}]'}

    with pytest.raises(ConnectionFailedError, match="refused to open the connector's change stream") as poked:
        sensor(props, ids).check()
    trigger = OplogGapTrigger(props, ids["mongo"], ids["kafka"], poll_interval=1)
    with pytest.raises(
        ConnectionFailedError, match="refused to open the connector's change stream"
    ) as checked:
        asyncio.run(trigger.check_once())
    assert checked.value.problem == poked.value.problem and checked.value.cause == poked.value.cause
    event = first_event(trigger, timeout=120)
    assert event["status"] == "error" and event["error"] == "ConnectionFailedError", event
    assert event["problem"] == poked.value.problem
