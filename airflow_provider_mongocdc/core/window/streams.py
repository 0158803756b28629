"""The change streams of a stream window, and where each starts.

A window belongs to one *stream*: the whole deployment (through mongos, or the replica set itself;
offset partition ``cluster`` or the replica set's name) or, with
``mongodb.connection.mode=replica_set`` on a sharded cluster, one shard's replica set (offset
partition named after it). :func:`plan_streams` lists them; :func:`starting_position` is where a
stream's window starts (its committed offset), or why it cannot.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import OffsetError, TopologyError
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import ConnectionMode, SnapshotMode
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails, connection_details
from airflow_provider_mongocdc.core.mongo.topology import SHARDED, discover
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_COMPLETED,
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
)
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.offsets.writers import take_over, window_transactional_id


@dataclass(frozen=True)
class StreamTarget:
    """One change stream of a window: its offset partition (``rs``), the ``source.rs`` its events
    carry, and how to connect (the fields of :class:`~airflow_provider_mongocdc.core.mongo.connection.MongoConnectionDetails`)."""

    partition: str
    replica_set: str
    mongo: Mapping[str, Any]

    def details(self) -> MongoConnectionDetails:
        return connection_details(self.mongo)

    def to_json(self) -> dict[str, Any]:
        return {"partition": self.partition, "replica_set": self.replica_set, "mongo": dict(self.mongo)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StreamTarget:
        return cls(data["partition"], data["replica_set"], dict(data["mongo"]))


def plan_streams(
    details: MongoConnectionDetails, config: ConnectorConfig, *, policy: BackoffPolicy | None = None
) -> list[StreamTarget]:
    """The change streams of a window: one for the deployment, or one per shard replica set
    (``mongodb.connection.mode=replica_set`` on a sharded cluster)."""
    topology = discover(details, policy=policy or BackoffPolicy.from_config(config))
    if topology.kind == SHARDED and config.mongodb_connection_mode == ConnectionMode.REPLICA_SET:
        return [
            StreamTarget(rs.name, rs.name, details.for_replica_set(rs.name, rs.hosts).to_dict())
            for rs in topology.replica_sets
        ]
    if topology.kind == SHARDED and topology.via == "config_server":
        raise TopologyError(
            "The MongoDB connection points at the config server replica set of a sharded cluster",
            cause="with mongodb.connection.mode=sharded the change stream is opened through mongos; "
            "a change stream on the config servers shows no data changes",
            fix="connect to the mongos routers, or set mongodb.connection.mode=replica_set to read "
            "each shard's replica set",
        )
    (partition,) = topology.partitions(config.mongodb_connection_mode)
    return [StreamTarget(partition, partition, details.to_dict())]


def offset_partition(config: ConnectorConfig, partition: str) -> OffsetPartition:
    return OffsetPartition(config.topic_prefix, partition)


# -- where a window starts ---------------------------------------------------------------------------
def starting_position(
    state: OffsetState | None, config: ConnectorConfig, partition: OffsetPartition, topic: str
) -> Position | None:
    """Where the window of ``partition`` starts, or None when ``snapshot.mode=initial_only``
    disables streaming. Raises :class:`OffsetError` when it cannot start."""
    where = f"{partition.describe()} in the offsets topic {topic!r}"
    if state is not None and state.snapshot.status == SNAPSHOT_IN_PROGRESS:
        started = state.snapshot.started_at
        raise OffsetError(
            f"A snapshot of {partition.describe()} is in progress (snapshot "
            f"{state.snapshot.snapshot_id}{', started ' + iso_z(started) if started else ''}); the "
            "stream window did not start",
            cause="a window and a snapshot of the same connector never run at the same time: "
            "streaming starts from the position the snapshot hands over when it completes",
            fix="wait for the snapshot to complete, or, if it was interrupted, run the snapshot "
            "again (it skips its finished chunks); then run the window",
        )
    if (
        config.snapshot_mode == SnapshotMode.INITIAL_ONLY
        and state is not None
        and state.snapshot.status == SNAPSHOT_COMPLETED
    ):
        return None
    if state is None or state.position is None:
        raise OffsetError(
            f"No stored offset for {where}; the stream window did not start",
            cause="streaming continues from the position a snapshot records, and no snapshot "
            "has run for this connector and replica set (or its offset was reset)",
            fix="run the snapshot first: MongoSnapshotOperator, or the snapshot task of the "
            "hourly DAG, which runs before the window",
        )
    return state.position


def check_offsets(
    config: ConnectorConfig, kafka_config: Mapping[str, Any], targets: Iterable[StreamTarget]
) -> dict[str, Position | None]:
    """Check, before any task starts, that every stream can start (same rules as the window).

    Every stream's window writer is taken over first: a transaction that a killed stream left open
    on the offsets topic is ended before anything reads it, so no stream starts from an offset
    older than its last committed one, and no writer of the killed run can commit any more. It is
    also why the run's streams, once started, wait for each other's transactions on the offsets
    topic instead of taking them over (``run_window(..., streams=...)``): none of them can then be
    a dead predecessor's, so each is a live sibling's commit under way."""
    targets = list(targets)
    take_over(kafka_config, [window_transactional_id(config.topic_prefix, t.partition) for t in targets])
    store = OffsetStore.for_connector(kafka_config, config)
    states = store.read_all()
    result: dict[str, Position | None] = {}
    for target in targets:
        partition = offset_partition(config, target.partition)
        result[target.partition] = starting_position(states.get(partition), config, partition, store.topic)
    return result
