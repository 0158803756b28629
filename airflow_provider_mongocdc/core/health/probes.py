"""What the MongoDB CDC page reads from Kafka and MongoDB for one connector, with short bounds, and
how long it keeps what it read.

:func:`read_offsets` reads the offsets topic once (positions, incremental snapshot request, lease);
:func:`probe_oplog` runs the gap check the watchdog's OplogGapSensor runs (the same probes: the
change stream opened at each stored position, the oplogs' oldest entries) with one contact attempt
and short timeouts; :func:`count_documents_left` counts what a running incremental snapshot still
has to copy. :class:`ReadingCache` keeps each :class:`~airflow_provider_mongocdc.core.health.record.Reading`
for a short time, so that a page load does not probe MongoDB again, and says how old it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.checker import GapChecker
from airflow_provider_mongocdc.core.gap.report import GapReport
from airflow_provider_mongocdc.core.health.record import OffsetsView, Reading, running_incremental, utcnow
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails, connect
from airflow_provider_mongocdc.core.offsets.lease import ConnectorLease
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.incremental import ChunkReader

# Bounds of one read: a page waits at most about this long for an unreachable server.
KAFKA_TIMEOUT_S = 10.0
MONGO_TIMEOUT_MS = 5_000


def read_offsets(
    kafka_config: Mapping[str, Any], config: ConnectorConfig, timeout_s: float = KAFKA_TIMEOUT_S
) -> OffsetsView:
    """The connector's committed positions, incremental snapshot request and lease, from one read of
    its offsets topic (read_committed, as the connector reads it)."""
    store = OffsetStore(kafka_config, config.offsets_topic, read_timeout_s=timeout_s)
    read = store.read_records()
    lease = ConnectorLease(kafka_config, config.topic_prefix, config.offsets_topic).current(read.records)
    contents = store.read_everything(read.records)
    contents.open_transactions = read.open_transactions
    return OffsetsView.of(contents, lease, config.topic_prefix)


def probe_details(
    details: MongoConnectionDetails, timeout_ms: int = MONGO_TIMEOUT_MS
) -> MongoConnectionDetails:
    """The connection details with the probe's short timeouts."""
    return replace(
        details,
        server_selection_timeout_ms=min(details.server_selection_timeout_ms, timeout_ms),
        connect_timeout_ms=min(details.connect_timeout_ms, timeout_ms),
    )


def probe_oplog(
    config: ConnectorConfig,
    details: MongoConnectionDetails,
    view: OffsetsView,
    timeout_ms: int = MONGO_TIMEOUT_MS,
) -> GapReport:
    """The watchdog's gap check of the connector's stored positions (headroom per partition), one
    contact attempt, bounded by ``timeout_ms`` per server."""
    policy = BackoffPolicy(config.connect_backoff_initial_delay_ms, config.connect_backoff_max_delay_ms, 0)
    checker = GapChecker(
        config, probe_details(details, timeout_ms), policy=policy, shard_timeout_ms=timeout_ms
    )
    return checker.check(view.states, offsets_topic=config.offsets_topic)


def count_documents_left(
    config: ConnectorConfig,
    details: MongoConnectionDetails,
    view: OffsetsView,
    timeout_ms: int = MONGO_TIMEOUT_MS,
) -> dict[str, int] | None:
    """Documents each collection of the running incremental snapshot still has to copy (None when
    none runs)."""
    progress = running_incremental(view)
    if progress is None:
        return None
    client = connect(probe_details(details, timeout_ms), BackoffPolicy(0, 0, 0))
    try:
        return ChunkReader(client, config).documents_left(progress)
    finally:
        client.close()


class ReadingCache:
    """Readings kept for ``ttl_s`` seconds per key; concurrent requests for the same key wait for
    one read. Errors are kept too (an unreachable server is not contacted on every page load)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
    ):
        self.ttl_s = ttl_s
        self.clock = clock
        self.now = now
        self._entries: dict[Hashable, tuple[float, Reading[Any]]] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()

    def get(self, key: Hashable, read: Callable[[], Any], *, refresh: bool = False) -> Reading[Any]:
        """The kept reading of ``key`` while younger than the ttl (unless ``refresh``), else a new one."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            entry = self._entries.get(key)
            if entry is not None and not refresh and self.clock() - entry[0] < self.ttl_s:
                return entry[1]
            started = self.clock()
            reading = Reading.of(read, self.now)
            self._entries[key] = (started, reading)
            return reading
