"""What the gap check looks at: the deployment's layout (a replica set, or a sharded cluster and its
shards) and, for each of the connector's offset partitions, a :class:`Probe` naming the stream
to open and the oplogs to read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.errors import TopologyError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.config.enums import ConnectionMode
from airflow_provider_mongocdc.core.mongo.topology import CLUSTER_PARTITION, ShardAddress
from airflow_provider_mongocdc.core.offsets.model import (
    SNAPSHOT_IN_PROGRESS,
    OffsetPartition,
    OffsetState,
    Position,
)

# Kinds of deployment as far as the gap check is concerned.
REPLICA_SET, SHARDED = "replica_set", "sharded"


@dataclass(frozen=True)
class Layout:
    """What the connection points at: a replica set, or a sharded cluster and its shards."""

    kind: str
    replica_set: str | None = None
    shards: tuple[ShardAddress, ...] = ()
    via: str = "replica_set"  # "replica_set", "mongos" or "config_server"

    def partition_names(self, connection_mode: str) -> list[str]:
        """The connector's offset partitions (as the window and snapshot applications name them)."""
        if self.kind == REPLICA_SET:
            return [self.replica_set]
        if connection_mode == ConnectionMode.REPLICA_SET:
            return [shard.replica_set for shard in self.shards]
        return [CLUSTER_PARTITION]

    def shard(self, replica_set: str) -> ShardAddress | None:
        return next((shard for shard in self.shards if shard.replica_set == replica_set), None)


def layout_from_hello(
    hello: Mapping[str, Any], shards: Iterable[Mapping[str, Any]] = (), where: str = "the configured MongoDB"
) -> Layout:
    """The layout from a ``hello`` answer (and ``listShards``/``config.shards`` documents)."""
    if hello.get("msg") == "isdbgrid" or (hello.get("setName") and hello.get("configsvr")):
        addresses = tuple(ShardAddress(str(doc["_id"]), str(doc["host"])) for doc in shards)
        if not addresses:
            raise TopologyError(
                f"The sharded cluster behind {where} has no shards",
                fix="add a shard (sh.addShard) before capturing",
            )
        return Layout(
            SHARDED, shards=addresses, via="mongos" if hello.get("msg") == "isdbgrid" else "config_server"
        )
    if hello.get("setName"):
        return Layout(REPLICA_SET, replica_set=str(hello["setName"]))
    raise TopologyError(
        f"{where} is a standalone MongoDB server, which has no oplog",
        cause="a standalone server has no oplog, so there is no resume point to check",
        fix="capture a replica set or a sharded cluster",
    )


@dataclass(frozen=True)
class Probe:
    """The checks one partition needs: a stream check through ``stream_via`` (None: the configured
    deployment; a shard's replica set name: that shard) and the oplogs of ``oplogs`` (replica
    set names; None: the configured replica set)."""

    partition: OffsetPartition
    state: OffsetState | None
    stream_via: str | None
    oplogs: tuple[str | None, ...]

    @property
    def position(self) -> Position | None:
        if self.state is None:
            return None
        if self.state.snapshot.status == SNAPSHOT_IN_PROGRESS:
            return self.state.snapshot.start
        return self.state.position

    @property
    def checks_stream(self) -> bool:
        return (
            self.state is not None
            and self.state.position is not None
            and self.state.snapshot.status != SNAPSHOT_IN_PROGRESS
        )


def connector_states(
    states: Mapping[OffsetPartition, OffsetState], config: ConnectorConfig, connector: str | None = None
) -> dict[OffsetPartition, OffsetState]:
    """The stored states of the connector ``config.topic_prefix`` (Kafka Connect connector name
    ``connector``, default the topic prefix), from everything in an offsets topic."""
    name = connector or config.topic_prefix
    return {
        partition: state
        for partition, state in states.items()
        if partition.server_id == config.topic_prefix and partition.connector_name == name
    }


def plan_probes(
    layout: Layout,
    config: ConnectorConfig,
    states: Mapping[OffsetPartition, OffsetState],
    connector: str | None = None,
) -> list[Probe]:
    """One probe per partition the connector has (from the layout) or has stored."""
    mine = connector_states(states, config, connector)
    by_name = {partition.rs: (partition, state) for partition, state in mine.items()}
    names = list(dict.fromkeys([*layout.partition_names(config.mongodb_connection_mode), *sorted(by_name)]))
    probes = []
    for name in names:
        partition, state = by_name.get(name, (OffsetPartition(config.topic_prefix, name, connector), None))
        if layout.kind == REPLICA_SET:
            stream_via, oplogs = None, (None,)
        elif name == CLUSTER_PARTITION:
            stream_via, oplogs = None, tuple(shard.replica_set for shard in layout.shards)
        elif layout.shard(name) is not None:
            stream_via, oplogs = name, (name,)
        else:  # a stored partition the deployment no longer has (a removed shard)
            stream_via, oplogs = "", ()
        probes.append(Probe(partition, state, stream_via, oplogs))
    return probes
