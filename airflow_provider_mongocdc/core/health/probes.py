"""What the MongoDB CDC page reads from Kafka and MongoDB for one connector, with short bounds, and
how long it keeps what it read.

:func:`read_offsets` reads the offsets topic once (positions, incremental snapshot request, lease);
:func:`probe_oplog` runs the gap check the watchdog's OplogGapSensor runs (the same probes: the
change stream opened at each stored position, the oplogs' oldest entries) with one contact attempt
and short timeouts; :func:`count_documents_left` counts what a running incremental snapshot still
has to copy; :func:`count_records` counts the committed records (events) a Delta table is behind its
topic, at most :data:`BEHIND_COUNTED` of them, and :class:`RecordCounts` keeps what it counted, so
that a range is read once. :class:`ReadingCache` keeps each :class:`~airflow_provider_mongocdc.core.health.record.Reading`
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

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.checker import GapChecker
from airflow_provider_mongocdc.core.gap.report import GapReport
from airflow_provider_mongocdc.core.health.record import OffsetsView, Reading, running_incremental, utcnow
from airflow_provider_mongocdc.core.kafka.client import consumer_config
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
# Records counted at most for how far a table is behind its topic: beyond, the page says "more
# than" (a read fetches at most this many records of each partition, and none of a range it
# counted before).
BEHIND_COUNTED = 10_000
# Ranges whose count is kept (the least recently used are dropped).
COUNTS_KEPT = 4096


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


def count_records(
    kafka_config: Mapping[str, Any],
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    limit: int = BEHIND_COUNTED,
    timeout_s: float = KAFKA_TIMEOUT_S,
) -> tuple[int, bool]:
    """The committed records of ``topic`` from ``starts`` up to ``ends`` (exclusive) per partition,
    read_committed (commit markers and aborted records are not counted), and whether that is all of
    them: ``(limit, False)`` when there are more than ``limit``. One consumer reads every partition;
    a read that gets nothing for ``timeout_s`` fails."""
    left = {partition: end for partition, end in ends.items() if starts.get(partition, 0) < end}
    if not left:
        return 0, True
    consumer = Consumer(consumer_config(kafka_config))
    try:
        consumer.assign([TopicPartition(topic, partition, starts.get(partition, 0)) for partition in left])
        counted, deadline = 0, time.monotonic() + timeout_s
        while left:
            if counted > limit:
                return limit, False
            messages = consumer.consume(min(5000, limit + 1 - counted), 0.5)
            if messages:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise _count_error(kafka_config, topic, TimeoutError(f"no record for {timeout_s:g} s"))
            for message in messages:
                partition, error = message.partition(), message.error()
                end = left.get(partition)
                if end is None:
                    continue
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        if message.offset() >= end:
                            _done(consumer, topic, left, partition)
                        continue
                    if error.fatal() or error.code() in (
                        KafkaError.TOPIC_AUTHORIZATION_FAILED,
                        KafkaError._UNKNOWN_TOPIC,
                        KafkaError.UNKNOWN_TOPIC_OR_PART,
                    ):
                        raise _count_error(kafka_config, topic, KafkaException(error))
                    continue
                if message.offset() < end:
                    counted += 1
                if message.offset() + 1 >= end:
                    _done(consumer, topic, left, partition)
            # Past commit markers and aborted records, which the consumer skips silently.
            for position in consumer.position([TopicPartition(topic, partition) for partition in left]):
                if position.partition in left and position.offset >= left[position.partition]:
                    _done(consumer, topic, left, position.partition)
        return (counted, True) if counted <= limit else (limit, False)
    except KafkaException as error:
        raise _count_error(kafka_config, topic, error) from None
    finally:
        consumer.close()


def _done(consumer: Consumer, topic: str, left: dict[int, int], partition: int) -> None:
    """A partition read to its end: no more fetching of it."""
    left.pop(partition, None)
    consumer.pause([TopicPartition(topic, partition)])


def _count_error(kafka_config: Mapping[str, Any], topic: str, error: BaseException) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"Could not count the events of {topic!r} on Kafka at {kafka_config.get('bootstrap.servers')!r}",
        cause=str(error),
        fix="check that the brokers are reachable and that the Kafka principal may READ the connector's "
        "topics; the page reads them again after a minute",
    )


class RecordCounts:
    """:func:`count_records` with what it counted kept per ``(servers, topic, partition, start)``:
    a range counted before is not read again, and one whose end moved on is read from its old end
    only (a table that does not move, on a topic that grows, costs the new records). ``reads`` and
    ``records_read`` say what was read from Kafka."""

    def __init__(self, limit: int = BEHIND_COUNTED, max_entries: int = COUNTS_KEPT):
        self.limit = limit
        self.max_entries = max_entries
        self.reads = 0
        self.records_read = 0
        self._kept: OrderedDict[Hashable, tuple[int, int, bool]] = OrderedDict()  # end, count, all
        self._guard = threading.Lock()

    def count(
        self, kafka_config: Mapping[str, Any], topic: str, starts: Mapping[int, int], ends: Mapping[int, int]
    ) -> tuple[int, bool]:
        """The committed records from ``starts`` to ``ends`` over the partitions, and whether that is
        all of them (False: more than :attr:`limit`)."""
        servers = kafka_config.get("bootstrap.servers")
        total = 0
        for partition, end in sorted(ends.items()):
            start = starts.get(partition, 0)
            if start >= end:
                continue
            key = (servers, topic, partition, start)
            with self._guard:
                kept = self._kept.get(key)
            if kept is not None and kept[0] == end:
                counted, whole = kept[1], kept[2]
            else:
                base, begin = (
                    (kept[1], kept[0]) if kept is not None and kept[2] and kept[0] < end else (0, start)
                )
                more, whole = count_records(
                    kafka_config, topic, {partition: begin}, {partition: end}, max(0, self.limit - base)
                )
                counted = base + more
                with self._guard:
                    self.reads += 1
                    self.records_read += more
                    self._kept[key] = (end, counted, whole)
                    self._kept.move_to_end(key)
                    while len(self._kept) > self.max_entries:
                        self._kept.popitem(last=False)
            total += counted
            if not whole or total > self.limit:
                return self.limit, False
        return total, True


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
