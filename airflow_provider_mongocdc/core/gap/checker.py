"""Oplog gaps: whether a connector's stored resume points are still in the oplog, and for how long.

For each offset partition the check opens the connector's change stream at the stored position
(MongoDB's ``ChangeStreamHistoryLost`` is the evidence of a gap) and, where ``local.oplog.rs`` can
be read (through mongos: on each shard, contacted directly), compares the stored cluster time with
the oldest oplog entry and estimates the headroom. Connection errors and elections are never gaps
(:class:`~airflow_provider_mongocdc.core.base.errors.ConnectionFailedError`: retry); a stored position MongoDB refuses as invalid
(260, 280) is not a gap either (:class:`~airflow_provider_mongocdc.core.base.errors.OffsetError`: repair the offset).

One implementation, two drivers: :func:`~airflow_provider_mongocdc.core.gap.protocol.check_gaps` decides every step without I/O;
:class:`GapChecker` performs its operations with pymongo's synchronous API (the sensor's poke,
first contact retried per ``connect.*``), :class:`AsyncGapChecker` with its asyncio API (the
trigger; first contact tried once, the next poll is the retry). The rules and their reasons:
docs/design.md, "Oplog gap detection".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import KW_ONLY, dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.protocol import (
    SHARD_PROBE_TIMEOUT_MS,
    Command,
    Connect,
    FindAll,
    FindOne,
    Operation,
    ReadStream,
    adrive,
    check_gaps,
    drive,
)
from airflow_provider_mongocdc.core.gap.report import (
    GapReport,
)
from airflow_provider_mongocdc.core.mongo.change_stream import (
    open_stream,
    stream_pipeline,
    watch_options,
    watch_target,
)
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails, connect
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState


@dataclass
class _Driver:
    """What both drivers hold: the connector, how to reach its deployment, the check to run."""

    config: ConnectorConfig
    details: MongoConnectionDetails
    _: KW_ONLY
    connector: str | None = None
    shard_timeout_ms: int = SHARD_PROBE_TIMEOUT_MS

    def _exchange(self, states: Mapping[OffsetPartition, OffsetState], offsets_topic: str | None):
        return check_gaps(
            self.config,
            self.details,
            states,
            connector=self.connector,
            offsets_topic=offsets_topic,
            shard_timeout_ms=self.shard_timeout_ms,
        )


@dataclass(kw_only=True)
class GapChecker(_Driver):
    """Check a connector's partitions with pymongo's synchronous API.

    :param config: the connector configuration.
    :param details: how to reach the captured deployment (its shards are reached with the same
        credentials).
    :param policy: retries of the first contact (default: the connector's ``connect.*``); a shard
        read only for its oplog is tried once.
    """

    policy: BackoffPolicy | None = None

    def __post_init__(self) -> None:
        self.policy = self.policy or BackoffPolicy.from_config(self.config)

    def check(
        self, states: Mapping[OffsetPartition, OffsetState], *, offsets_topic: str | None = None
    ) -> GapReport:
        """Check every partition of the connector in ``states`` (all of an offsets topic is fine)."""
        clients: list[Any] = []

        def perform(operation: Operation) -> Any:
            if isinstance(operation, Connect):
                policy = self.policy
                if not operation.retry:
                    policy = BackoffPolicy(policy.initial_delay_ms, policy.max_delay_ms, 0)
                clients.append(connect(operation.details, policy))
                return clients[-1]
            if isinstance(operation, Command):
                return operation.client[operation.database].command(operation.name, operation.value)
            if isinstance(operation, FindOne):
                collection = operation.client[operation.database][operation.collection]
                return collection.find_one(operation.filter, operation.projection, sort=operation.sort)
            if isinstance(operation, FindAll):
                return list(operation.client[operation.database][operation.collection].find())
            if isinstance(operation, ReadStream):
                with open_stream(
                    operation.client,
                    operation.config,
                    operation.position,
                    max_await_time_ms=operation.max_await_time_ms,
                ) as stream:
                    stream.try_next()
                return None
            raise TypeError(f"unknown operation {operation!r}")

        try:
            return drive(self._exchange(states, offsets_topic), perform)
        finally:
            for client in clients:
                client.close()


class AsyncGapChecker(_Driver):
    """:class:`GapChecker` on pymongo's asyncio API (``AsyncMongoClient``), for triggers.

    Clients are created without a first contact: the first operation is the contact, bounded by
    the server selection timeout, and tried once (the trigger's next poll is the retry).
    """

    @staticmethod
    def _client(details: MongoConnectionDetails):
        from pymongo import AsyncMongoClient

        host, kwargs = details.client_arguments()
        return AsyncMongoClient(host, **kwargs)

    async def check(
        self, states: Mapping[OffsetPartition, OffsetState], *, offsets_topic: str | None = None
    ) -> GapReport:
        """Check every partition of the connector in ``states`` (all of an offsets topic is fine)."""
        clients: list[Any] = []

        async def perform(operation: Operation) -> Any:
            if isinstance(operation, Connect):
                clients.append(self._client(operation.details))
                return clients[-1]
            if isinstance(operation, Command):
                return await operation.client[operation.database].command(operation.name, operation.value)
            if isinstance(operation, FindOne):
                collection = operation.client[operation.database][operation.collection]
                return await collection.find_one(operation.filter, operation.projection, sort=operation.sort)
            if isinstance(operation, FindAll):
                return await operation.client[operation.database][operation.collection].find().to_list()
            if isinstance(operation, ReadStream):
                config = operation.config
                options = watch_options(
                    config, operation.position, max_await_time_ms=operation.max_await_time_ms
                )
                stream = await watch_target(operation.client, config).watch(
                    stream_pipeline(config), **options
                )
                async with stream:
                    await stream.try_next()
                return None
            raise TypeError(f"unknown operation {operation!r}")

        try:
            return await adrive(self._exchange(states, offsets_topic), perform)
        finally:
            for client in clients:
                await client.close()
