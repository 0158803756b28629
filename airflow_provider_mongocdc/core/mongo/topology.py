"""The deployment to capture: a replica set, or a sharded cluster and its shard replica sets.

Discovery asks the server what it is (``hello``), as mongo-connector did with ``isdbgrid`` and
Debezium's MongoDB connector does with its seed addresses:

* ``msg: "isdbgrid"``: a mongos router. Its shards come from ``listShards`` (``_id`` and
  ``host: "rs/host1,host2"``); each shard's replica set is discovered by connecting to it with the
  same credentials.
* ``setName`` with ``configsvr``: the config server replica set of a sharded cluster (how older
  Debezium versions were pointed at a cluster); the shards come from ``config.shards``.
* ``setName``: a replica set. Members and their states come from ``replSetGetStatus`` (or from
  ``hello`` when the user may not run it), the oplog window from ``local.oplog.rs``.
* otherwise: a standalone server, which has no oplog and cannot be captured (TopologyError with
  the fix: convert it to a one-member replica set).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Union

from pymongo import MongoClient
from pymongo.errors import OperationFailure, PyMongoError

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import (
    ConfigError,
    ConnectionFailedError,
    MongoCdcError,
    TopologyError,
)
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.enums import ConnectionMode
from airflow_provider_mongocdc.core.mongo.connection import (
    MongoConnectionDetails,
    connect,
    not_initiated_error,
    standalone_error,
)
from airflow_provider_mongocdc.core.mongo.oplog_span import OplogSpan, ts_json

log = logging.getLogger(__name__)

REPLICA_SET, SHARDED = "replica_set", "sharded"
# The offset partition of a whole-deployment change stream (mongodb.connection.mode=sharded);
# per replica set streams are named after their replica set.
CLUSTER_PARTITION = "cluster"

# client_factory(None) -> a client of the configured deployment;
# client_factory(ShardAddress) -> a client of one shard's replica set.
ClientFactory = Callable[[Union["ShardAddress", None]], MongoClient]


# -- the model --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class OplogWindow(OplogSpan):
    """A replica set's :class:`OplogSpan` as discovery reports it: with the wall-clock times of its
    oldest and newest entries, in discovery's JSON layout. Its ends are None where the oplog is not
    readable (the user may lack the privilege to read ``local.oplog.rs`` or run ``collStats`` on
    it); discovery does not look for the replica set's initiation entry (``starts_at_initiation``
    stays False)."""

    oldest_wall: datetime | None = None
    newest_wall: datetime | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "oldest": ts_json(self.oldest),
            "oldest_time": iso_z(self.oldest_time),
            "newest": ts_json(self.newest),
            "newest_time": iso_z(self.newest_time),
            "oldest_wall": iso_z(self.oldest_wall),
            "newest_wall": iso_z(self.newest_wall),
            "window_seconds": self.window_seconds,
            "size_bytes": self.size_bytes,
            "max_size_bytes": self.max_size_bytes,
        }


@dataclass(frozen=True)
class Member:
    host: str
    state: str
    health: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "state": self.state, "health": self.health}


@dataclass(frozen=True)
class ReplicaSet:
    name: str
    members: tuple[Member, ...]
    primary: str | None
    oplog: OplogWindow

    @property
    def hosts(self) -> list[str]:
        return [member.host for member in self.members if member.state != "ARBITER"]

    @property
    def seed_list(self) -> str:
        """``rs/host1,host2`` (Debezium's mongodb.hosts form)."""
        return f"{self.name}/{','.join(self.hosts)}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "primary": self.primary,
            "members": [member.to_dict() for member in self.members],
            "oplog": self.oplog.to_dict(),
        }


@dataclass(frozen=True)
class ShardAddress:
    """A shard as ``listShards`` names it: ``_id`` and ``host`` = ``"rs/host1:port,host2:port"``."""

    name: str
    host: str

    @property
    def replica_set(self) -> str:
        return self.host.split("/", 1)[0] if "/" in self.host else ""

    @property
    def hosts(self) -> list[str]:
        return [item for item in self.host.split("/", 1)[-1].split(",") if item]


@dataclass(frozen=True)
class Shard:
    name: str
    host: str
    replica_set: ReplicaSet

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "host": self.host, "replica_set": self.replica_set.to_dict()}


@dataclass(frozen=True)
class Topology:
    """What discovery found. ``replica_sets`` holds the replica set, or every shard's."""

    kind: str
    replica_sets: tuple[ReplicaSet, ...]
    shards: tuple[Shard, ...] = ()
    via: str = "replica_set"  # "replica_set", "mongos" or "config_server"
    server_version: str | None = None
    discovered_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    @property
    def replica_set_names(self) -> list[str]:
        return [rs.name for rs in self.replica_sets]

    def replica_set(self, name: str) -> ReplicaSet:
        for rs in self.replica_sets:
            if rs.name == name:
                return rs
        raise TopologyError(
            f"The deployment has no replica set named {name!r}",
            cause=f"it has {', '.join(self.replica_set_names) or 'none'}",
            fix="use one of the discovered replica set names",
        )

    def partitions(self, connection_mode: str = "sharded") -> list[str]:
        """Offset partition names for ``mongodb.connection.mode``: one change stream for the
        deployment (``sharded``, the default) or one per replica set (``replica_set``)."""
        if connection_mode == ConnectionMode.REPLICA_SET or self.kind == REPLICA_SET:
            return self.replica_set_names
        if connection_mode == ConnectionMode.SHARDED:
            return [CLUSTER_PARTITION]
        raise ConfigError(
            f"Unknown mongodb.connection.mode {connection_mode!r}", fix="use sharded or replica_set"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "via": self.via,
            "server_version": self.server_version,
            "discovered_at": iso_z(self.discovered_at),
            "replica_sets": [rs.to_dict() for rs in self.replica_sets],
            "shards": [shard.to_dict() for shard in self.shards],
        }


# -- discovery ---------------------------------------------------------------------------------------
def details_factory(
    details: MongoConnectionDetails,
    policy: BackoffPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> ClientFactory:
    """Clients from connection details: the deployment, or a shard with the same credentials."""

    def factory(shard: ShardAddress | None) -> MongoClient:
        if shard is None:
            return connect(details, policy, sleep=sleep)
        return connect(details.for_replica_set(shard.replica_set, shard.hosts), policy, sleep=sleep)

    return factory


def discover(
    source: MongoConnectionDetails | ClientFactory,
    *,
    policy: BackoffPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> Topology:
    """Discover the deployment behind ``source`` (connection details or a client factory)."""
    factory = details_factory(source, policy, sleep) if isinstance(source, MongoConnectionDetails) else source
    where = source.describe() if isinstance(source, MongoConnectionDetails) else "the configured MongoDB"
    client = factory(None)
    try:
        hello = _command(client, "hello", where)
        version = _server_version(client)
        if hello.get("msg") == "isdbgrid":
            shards = _list_shards(client, where)
            return _sharded(factory, shards, "mongos", version, where)
        if hello.get("setName"):
            if hello.get("configsvr"):
                shards = [ShardAddress(doc["_id"], doc["host"]) for doc in client["config"]["shards"].find()]
                return _sharded(factory, shards, "config_server", version, where)
            return Topology(
                REPLICA_SET, (_replica_set(client, hello, where),), via="replica_set", server_version=version
            )
        address = _address(client, where)
        if hello.get("isreplicaset"):
            raise not_initiated_error(address)
        raise standalone_error(address)
    finally:
        client.close()


def _address(client: MongoClient, fallback: str) -> str:
    try:
        address = client.address
    except PyMongoError:
        address = None
    return f"{address[0]}:{address[1]}" if address else fallback


def _command(client: MongoClient, name: str, where: str, db: str = "admin") -> dict[str, Any]:
    try:
        return client[db].command(name)
    except PyMongoError as error:
        raise _discovery_error(error, name, where) from None


def _discovery_error(error: PyMongoError, command: str, where: str) -> MongoCdcError:
    """A command the server refused (a missing privilege), or a connection lost."""
    if isinstance(error, OperationFailure):
        return TopologyError(
            f"MongoDB at {where} refused {command!r}",
            cause=str(error.details or error),
            fix="grant the connector's user the clusterMonitor role",
        )
    return ConnectionFailedError(
        f"Lost the connection to MongoDB at {where} during discovery",
        cause=str(error),
        fix="check the servers and retry",
    )


def _server_version(client: MongoClient) -> str | None:
    try:
        return client.admin.command("buildInfo").get("version")
    except PyMongoError:
        return None


def _list_shards(client: MongoClient, where: str) -> list[ShardAddress]:
    shards = [
        ShardAddress(doc["_id"], doc["host"]) for doc in _command(client, "listShards", where)["shards"]
    ]
    if not shards:
        raise TopologyError(
            f"The sharded cluster behind {where} has no shards",
            fix="add a shard (sh.addShard) before capturing",
        )
    return shards


def _sharded(
    factory: ClientFactory, addresses: Iterable[ShardAddress], via: str, version: str | None, where: str
) -> Topology:
    shards = []
    for address in addresses:
        if not address.replica_set:
            raise TopologyError(
                f"Shard {address.name!r} ({address.host}) is not a replica set",
                cause="a standalone shard has no oplog, so its changes cannot be captured",
                fix="convert the shard to a replica set (restart it with --replSet and run rs.initiate())",
            )
        client = factory(address)
        try:
            hello = _command(client, "hello", address.host)
            if hello.get("setName") != address.replica_set:
                raise TopologyError(
                    f"Shard {address.name!r} answers as replica set {hello.get('setName')!r}, "
                    f"not {address.replica_set!r}",
                    fix="check the cluster's shard registry (sh.status())",
                )
            shards.append(Shard(address.name, address.host, _replica_set(client, hello, address.host)))
        finally:
            client.close()
    replica_sets = tuple(shard.replica_set for shard in shards)
    return Topology(SHARDED, replica_sets, tuple(shards), via=via, server_version=version)


def _replica_set(client: MongoClient, hello: dict[str, Any], where: str) -> ReplicaSet:
    name = hello["setName"]
    try:
        status = client.admin.command("replSetGetStatus")
        members = tuple(
            Member(
                m["name"],
                m.get("stateStr", "UNKNOWN"),
                None if m.get("health") is None else bool(m["health"]),
            )
            for m in status.get("members", [])
        )
        primary = next((m.host for m in members if m.state == "PRIMARY"), None)
    except OperationFailure as error:
        # Without clusterMonitor: what hello tells (the primary, the others' roles unknown).
        log.info("replSetGetStatus not allowed on %s (%s); member states from hello", where, error.code)
        primary = hello.get("primary")
        members = tuple(
            [Member(host, "PRIMARY" if host == primary else "UNKNOWN") for host in hello.get("hosts", [])]
            + [Member(host, "PASSIVE") for host in hello.get("passives", [])]
            + [Member(host, "ARBITER") for host in hello.get("arbiters", [])]
        )
    return ReplicaSet(name, members, primary, _oplog_window(client, name, where))


def _oplog_window(client: MongoClient, name: str, where: str) -> OplogWindow:
    oplog = client["local"]["oplog.rs"]
    try:
        first = oplog.find_one({}, {"ts": 1, "wall": 1}, sort=[("$natural", 1)])
        last = oplog.find_one({}, {"ts": 1, "wall": 1}, sort=[("$natural", -1)])
    except OperationFailure as error:
        log.info("Cannot read the oplog of %s (%s)", where, error.code)
        return OplogWindow(name)
    size = max_size = None
    try:
        stats = client["local"].command("collStats", "oplog.rs")
        size, max_size = stats.get("size"), stats.get("maxSize")
    except OperationFailure:
        try:
            stats = next(oplog.aggregate([{"$collStats": {"storageStats": {}}}]), {}).get("storageStats", {})
            size, max_size = stats.get("size"), stats.get("maxSize")
        except (OperationFailure, StopIteration):
            pass
    return OplogWindow(
        name,
        oldest=first["ts"] if first else None,
        newest=last["ts"] if last else None,
        size_bytes=int(size) if size is not None else None,
        max_size_bytes=int(max_size) if max_size is not None else None,
        oldest_wall=_aware(first.get("wall")) if first else None,
        newest_wall=_aware(last.get("wall")) if last else None,
    )


def _aware(value: Any) -> datetime | None:
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
