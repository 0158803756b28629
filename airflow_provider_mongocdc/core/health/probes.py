"""What the MongoDB CDC page reads from Kafka and MongoDB for one connector, with short bounds, and
how long it keeps what it read.

:func:`read_offsets` reads the offsets topic once (positions, incremental snapshot request, lease);
:func:`probe_oplog` runs the gap check the watchdog's OplogGapSensor runs (the same probes: the
change stream opened at each stored position, the oplogs' oldest entries) with one contact attempt
and short timeouts; :func:`count_documents_left` counts what a running incremental snapshot still
has to copy. :class:`ReadingCache` keeps each :class:`~airflow_provider_mongocdc.core.health.record.Reading`
for a short time, so that a page load does not probe MongoDB again, and says how old it is; a
refresh takes a reading a few seconds old at most, and concurrent requests share one read.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
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

# A refresh (``?refresh=true``) takes a reading no older than this many seconds: refreshes in a row
# read Kafka and MongoDB once.
REFRESH_S = 5.0
# Readings kept per cache at most (the least recently used are dropped).
MAX_ENTRIES = 256
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
    """Readings kept for ``ttl_s`` seconds per key, at most ``max_entries`` keys (the least
    recently used go first).

    ``refresh`` asks for a reading no older than ``refresh_s`` seconds, not for a new read each
    time: refreshes in a row reuse the reading of the first. One read runs per key at a time
    (single flight): a request that arrives while its key is being read waits for that read and
    takes its result, fresh as it is. Errors are kept too (an unreachable server is not contacted
    on every page load)."""

    def __init__(
        self,
        ttl_s: float,
        *,
        refresh_s: float = REFRESH_S,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = utcnow,
    ):
        self.ttl_s = ttl_s
        self.refresh_s = min(refresh_s, ttl_s)
        self.max_entries = max_entries
        self.clock = clock
        self.now = now
        self._entries: OrderedDict[Hashable, tuple[float, Reading[Any]]] = OrderedDict()
        self._flights: dict[Hashable, _Flight] = {}
        self._guard = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, read: Callable[[], Any], *, refresh: bool = False) -> Reading[Any]:
        """The kept reading of ``key`` while younger than the ttl (``refresh``: than ``refresh_s``),
        else the result of the read under way, else a new one."""
        limit = self.refresh_s if refresh else self.ttl_s
        with self._guard:
            entry = self._entries.get(key)
            if entry is not None and self.clock() - entry[0] < limit:
                self._entries.move_to_end(key)
                return entry[1]
            flight = self._flights.get(key)
            leader = flight is None
            if leader:
                flight = self._flights[key] = _Flight()
        if not leader:
            flight.done.wait()
            return flight.reading
        started = self.clock()
        try:
            flight.reading = Reading.of(read, self.now)
        finally:
            with self._guard:
                if flight.reading is not None:
                    self._entries[key] = (started, flight.reading)
                    self._entries.move_to_end(key)
                    self._forget(started)
                del self._flights[key]
            flight.done.set()
        return flight.reading

    def _forget(self, now: float) -> None:
        """Drop expired readings, then the least recently used ones above ``max_entries``."""
        for key in [key for key, (started, _) in self._entries.items() if now - started >= self.ttl_s]:
            del self._entries[key]
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class _Flight:
    """A read under way: those who wait for it take its reading."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reading: Reading[Any] | None = None
