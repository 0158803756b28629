"""Reading a Kafka topic's committed records: the offsets topic, and Kafka Connect's.

A ``read_committed`` consumer without a consumer group reads every partition of the topic from
the beginning to its end: the last stable offset seen when the read started
(:func:`read_committed`), or, with a :class:`Settling` (:func:`read_settled`), past every
transaction that was open there when the read reached it (it waits for them, or takes their
writers over, or says they are open: :mod:`airflow_provider_mongocdc.core.offsets.writers`). A
missing topic reads as empty; an unreadable one fails, never reads as empty (that would start over).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from airflow_provider_mongocdc.core.base.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.kafka.client import consumer_config
from airflow_provider_mongocdc.core.kafka.open_transactions import OpenTransaction, describe_open

log = logging.getLogger("airflow_provider_mongocdc.core.offsets.store")  # logged as the offsets' lines


def check_settings(kafka_config: Mapping[str, Any], topic: str) -> None:
    """Refuse a missing topic name or a Kafka configuration without bootstrap.servers."""
    if not topic:
        raise ConfigError(
            "No offsets topic given",
            fix="set offset.storage.topic, or topic.prefix for <topic.prefix>.offsets",
        )
    if not kafka_config.get("bootstrap.servers"):
        raise ConfigError(
            "The Kafka configuration has no bootstrap.servers",
            fix='add "bootstrap.servers" to the Kafka connection\'s config',
        )


class Settling(Protocol):
    """How a reader deals with transactions open on the topic when it reads (see
    :mod:`airflow_provider_mongocdc.core.offsets.writers`): how long it waits for them to end, and
    what it does with those still open then."""

    wait_s: float

    def settle(self, open_ones: list[OpenTransaction], attempt: int, ended: set[tuple[int, int]]) -> bool:
        """True: wait ``wait_s`` again (``attempt`` counts from 1); False: read what is committed.
        ``ended``: the transactions (partition, start offset) that it ended itself in this read's
        earlier attempts; it adds those it ends now. May raise."""


@dataclass
class CommittedRead:
    """The committed records of a topic, oldest first, and the transactions that were still open
    after them when the read ended (the records after those are not in ``records``)."""

    records: list[tuple[bytes | None, bytes | None]] = field(default_factory=list)
    open_transactions: list[OpenTransaction] = field(default_factory=list)


def read_committed(
    kafka_config: Mapping[str, Any], topic: str, read_timeout_s: float
) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed ``(key, value)`` record of ``topic`` up to its last stable offset, oldest first."""
    return read_settled(kafka_config, topic, read_timeout_s, None).records


def read_settled(
    kafka_config: Mapping[str, Any], topic: str, read_timeout_s: float, settling: Settling | None
) -> CommittedRead:
    """The committed records of ``topic``. Without ``settling``, up to the last stable offsets seen
    when the read started. With it, each partition is read to its end, and while a transaction is
    open there (the end stays below the high watermark) the read waits ``settling.wait_s`` for it
    to end, then asks ``settling`` what to do (wait again, for a live writer or after taking its
    writer over, stop and say it is open, or fail). A read that waits again has ``read_timeout_s``
    for the rest of its reading after each wait."""
    deadline = time.monotonic() + read_timeout_s
    consumer = Consumer(consumer_config(kafka_config))
    try:
        ends = _end_offsets(consumer, kafka_config, topic, read_timeout_s, deadline, settling is not None)
        if not ends:
            return CommittedRead()
        consumer.assign([TopicPartition(topic, pid, -2) for pid in ends])  # -2: beginning
        reader = _Reader(consumer, kafka_config, topic, read_timeout_s, deadline)
        if settling is None:
            reader.read_until(lambda: reader.reached(ends))
            return CommittedRead(reader.records)
        return reader.settled(ends, settling)
    finally:
        consumer.close()


class CommittedFollower:
    """A kept reader of a topic's committed records: each :meth:`read` goes on from where the last
    one stopped, so a reader that reads the same topic every few seconds (the change watcher)
    fetches only what was committed since, from one consumer whose partitions are paused between
    reads (an idle consumer would fetch twenty times a second; a resumed one takes most of a second
    to fetch again, which is the wall time of a read that finds new records). Returns the last
    record per key (what a fold of every record gives: tombstones are kept as ``None`` values),
    with the transactions still open when the read ended, as :func:`read_settled` with
    ``settling`` does. A topic found shorter than where the reader
    stands (deleted and created again) is read again from its beginning."""

    def __init__(
        self, kafka_config: Mapping[str, Any], topic: str, read_timeout_s: float, settling: Settling
    ):
        self.kafka_config = dict(kafka_config)
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self.settling = settling
        self._consumer: Consumer | None = None
        self._watermarks: Consumer | None = None  # read_uncommitted: its queries give high watermarks
        self._reader: _Reader | None = None
        self._latest: dict[bytes | None, bytes | None] = {}

    def read(self) -> CommittedRead:
        deadline = time.monotonic() + self.read_timeout_s
        if self._consumer is None:
            self._consumer = Consumer(consumer_config(self.kafka_config))
            self._watermarks = Consumer(
                {**consumer_config(self.kafka_config), "isolation.level": "read_uncommitted"}
            )
        consumer = self._consumer
        ends = _end_offsets(consumer, self.kafka_config, self.topic, self.read_timeout_s, deadline, True)
        reader = self._reader
        if reader is not None and (
            not ends or any(end < reader.next_offset.get(pid, 0) for pid, end in ends.items())
        ):
            self.close()  # the topic is gone, or is a new one: read it again from the start
            return self.read()
        if not ends:
            return CommittedRead()
        if reader is None:
            reader = self._reader = _Reader(
                consumer, self.kafka_config, self.topic, self.read_timeout_s, deadline
            )
        reader.deadline = deadline
        # The paused consumer's cached high watermarks are old: a transaction opened since the
        # last read is found from the high watermarks as they are now.
        reader.highs = {pid: self._high(pid, deadline) for pid in ends}
        assigned = {part.partition for part in consumer.assignment()}
        new = [TopicPartition(self.topic, pid, -2) for pid in ends if pid not in assigned]  # -2: beginning
        if new:
            consumer.incremental_assign(new)
        partitions = [TopicPartition(self.topic, pid) for pid in sorted(assigned)]
        if partitions:
            consumer.resume(partitions)
        try:
            read = reader.settled(ends, self.settling)
        finally:
            consumer.pause(consumer.assignment())  # no fetching between reads
        for key, value in reader.records:
            self._latest.pop(key, None)  # the newest record last, as in the topic
            self._latest[key] = value
        reader.records.clear()
        return CommittedRead(list(self._latest.items()), read.open_transactions)

    def _high(self, pid: int, deadline: float) -> int:
        try:
            _low, high = self._watermarks.get_watermark_offsets(
                TopicPartition(self.topic, pid), timeout=max(1.0, deadline - time.monotonic()), cached=False
            )
        except KafkaException as error:
            raise unreadable_error(self.kafka_config, self.topic, error) from None
        return high

    def close(self) -> None:
        for consumer in (self._consumer, self._watermarks):
            if consumer is not None:
                consumer.close()
        self._consumer, self._watermarks, self._reader = None, None, None
        self._latest.clear()


class _Reader:
    """The records of the assigned partitions, and where each partition's end was last seen
    (``eof``: the offset the read stopped at, ``high``: the high watermark then)."""

    def __init__(
        self,
        consumer: Consumer,
        kafka_config: Mapping[str, Any],
        topic: str,
        read_timeout_s: float,
        deadline: float,
    ):
        self.consumer = consumer
        self.kafka_config = kafka_config
        self.topic = topic
        self.read_timeout_s = read_timeout_s
        self.deadline = deadline
        self.records: list[tuple[bytes | None, bytes | None]] = []
        self.next_offset: dict[int, int] = {}
        self.eof: dict[int, int] = {}
        self.highs: dict[int, int] = {}  # high watermarks queried for this read (else the cached ones)

    def reached(self, ends: Mapping[int, int]) -> bool:
        """Whether every partition was read to at least its offset in ``ends``."""
        return all(
            max(self.next_offset.get(pid, 0), self.eof.get(pid, 0)) >= end for pid, end in ends.items()
        )

    def high(self, pid: int) -> int:
        """The partition's high watermark at its last fetch (or as queried for this read)."""
        if pid in self.highs:
            return self.highs[pid]
        _low, high = self.consumer.get_watermark_offsets(TopicPartition(self.topic, pid), cached=True)
        return high

    def read_until(self, done, until: float | None = None) -> bool:
        """Poll until ``done()`` (True) or ``until`` (False); the read's deadline raises."""
        while not done():
            now = time.monotonic()
            if until is not None and now >= until:
                return False
            if now >= self.deadline:
                raise OffsetError(
                    f"Could not read the offsets topic {self.topic!r} to its end within {self.read_timeout_s:g} s",
                    cause=f"partitions {sorted(self.eof)} still had records to read",
                    fix="check that the Kafka brokers are reachable and healthy, then retry",
                )
            message = self.consumer.poll(0.1 if until is not None else 0.5)
            if message is None:
                if until is not None:  # aborted records and markers move the position silently
                    for pid in list(self.eof):
                        self.eof[pid] = self.position(pid)
                continue
            pid = message.partition()
            if message.error():
                if _at_end(message, self.kafka_config, self.topic):
                    self.eof[pid] = max(self.eof.get(pid, 0), message.offset())
                continue
            self.records.append((message.key(), message.value()))
            self.next_offset[pid] = message.offset() + 1
        return True

    def held(self) -> dict[int, tuple[int, int]]:
        """The partitions whose end is below their high watermark: ``pid: (end, high)``."""
        found = {}
        for pid, end in self.eof.items():
            position = max(end, self.next_offset.get(pid, 0))
            high = self.high(pid)
            if position < high:
                found[pid] = (position, high)
        return found

    def settled(self, ends: Mapping[int, int], settling: Settling) -> CommittedRead:
        """Read to the ends; then, where a transaction held a partition below its high watermark,
        on past that watermark: wait for the transactions open then to end, or settle them. Those
        opened later are not waited for (what was committed before the read is what it needs)."""
        self.read_until(lambda: all(pid in self.eof for pid in ends) and self.reached(ends))
        targets = {pid: high for pid, (_end, high) in self.held().items()}
        attempt = 0
        ended: set[tuple[int, int]] = set()
        while targets:
            if self.read_until(lambda: self.reached(targets), time.monotonic() + settling.wait_s):
                break
            held = {
                pid: (self.position(pid), high) for pid, high in targets.items() if self.position(pid) < high
            }
            open_ones = describe_open(self.kafka_config, self.topic, held, self.read_timeout_s)
            attempt += 1
            if not settling.settle(open_ones, attempt, ended):
                return CommittedRead(self.records, open_ones)
            # Waiting for a live writer's transaction may take up to its transaction.timeout.ms:
            # the read's own time limit (for the brokers to answer) counts from each wait's end.
            self.deadline = max(self.deadline, time.monotonic() + settling.wait_s + self.read_timeout_s)
        return CommittedRead(self.records)

    def position(self, pid: int) -> int:
        """Where the read of partition ``pid`` stands (past aborted records and markers too)."""
        (found,) = self.consumer.position([TopicPartition(self.topic, pid)])
        return max(found.offset, self.next_offset.get(pid, 0), self.eof.get(pid, 0))


def _end_offsets(
    consumer: Consumer,
    kafka_config: Mapping[str, Any],
    topic: str,
    read_timeout_s: float,
    deadline: float,
    keep_empty: bool = False,
) -> dict[int, int]:
    """The last stable offset of each partition of ``topic`` that holds committed records (every
    partition with ``keep_empty``: a transaction open at its very start leaves it 0); none when the
    topic does not exist."""
    try:
        metadata = consumer.list_topics(timeout=read_timeout_s)
    except KafkaException as error:
        raise unreadable_error(kafka_config, topic, error) from None
    info = metadata.topics.get(topic)
    if info is None or (
        info.error is not None
        and info.error.code() in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC)
    ):
        return {}  # no topic yet: no offsets yet
    if info.error is not None:
        # Never mistake an unreadable topic for an empty one: that would start over.
        raise unreadable_error(kafka_config, topic, KafkaException(info.error))
    ends: dict[int, int] = {}
    for partition_id in sorted(info.partitions):
        try:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, partition_id),
                timeout=max(1.0, deadline - time.monotonic()),
                cached=False,
            )
        except KafkaException as error:
            raise unreadable_error(kafka_config, topic, error) from None
        if high > 0 or keep_empty:
            ends[partition_id] = high  # the last stable offset (read_committed)
    return ends


def _at_end(message: Message, kafka_config: Mapping[str, Any], topic: str) -> bool:
    """Whether an error message is the end of its partition (its offset: where the read stands,
    the last stable offset); an error that forbids reading raises, any other is logged (the
    consumer recovers by itself)."""
    code = message.error().code()
    if code == KafkaError._PARTITION_EOF:
        return True
    if message.error().fatal() or code in (
        KafkaError.TOPIC_AUTHORIZATION_FAILED,
        KafkaError.GROUP_AUTHORIZATION_FAILED,
    ):
        raise unreadable_error(kafka_config, topic, KafkaException(message.error()))
    log.warning("Offsets topic %s: %s", topic, message.error().str())
    return False


def unreadable_error(kafka_config: Mapping[str, Any], topic: str, error: KafkaException) -> OffsetError:
    kafka_error = error.args[0] if error.args and isinstance(error.args[0], KafkaError) else None
    return OffsetError(
        f"Could not read the offsets topic {topic!r} from {kafka_config.get('bootstrap.servers')!r}",
        cause=f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error),
        fix="check bootstrap.servers and the security settings of the Kafka connection, and grant "
        "the Kafka principal READ and DESCRIBE on the offsets topic",
    )
