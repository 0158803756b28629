"""The Kafka side of the apply: a connector's collection topics, where each partition ends, and
the committed records of a range (``read_committed``, as every consumer of the connector reads).

Where a range ends: each partition's last stable offset when the apply starts. A topic of one
partition (the default) needs nothing more: a Kafka transaction of the connector holds whole
MongoDB transactions. A topic of several partitions is read up to a *quiet* moment, when no
partition had a transaction open and two looks at all of them agreed, so a MongoDB transaction
written to several partitions is never cut where only some of its commit markers are written. The
events of several partitions are merged by record time, each partition's order kept.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

from confluent_kafka import (
    Consumer,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicCollection,
    TopicPartition,
)
from confluent_kafka.admin import OffsetSpec

from airflow_provider_mongocdc.core.apply.events import ChangeEvent, Changes, EventReader
from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError, TableError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.topics import TopicNamer
from airflow_provider_mongocdc.core.kafka.admin import admin_client
from airflow_provider_mongocdc.core.kafka.client import _unwrap, consumer_config

log = logging.getLogger("airflow_provider_mongocdc.apply")
TIMEOUT_S = 30.0
POLL_RECORDS = 5000


@dataclass(frozen=True)
class DataTopic:
    """A collection topic of a connector and the collection it names."""

    topic: str
    database: str
    collection: str

    @property
    def namespace(self) -> str:
        return f"{self.database}.{self.collection}"


def _kafka_error(kafka_config: Mapping[str, Any], what: str, error: BaseException) -> ConnectionFailedError:
    kafka_error = _unwrap(error) if isinstance(error, (KafkaException, SystemError)) else None
    return ConnectionFailedError(
        f"Could not {what} on Kafka at {kafka_config.get('bootstrap.servers')!r}",
        cause=f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error),
        fix="check that the brokers are reachable and that the Kafka principal may DESCRIBE and READ the "
        "connector's topics, then run the task again (the tables stay at their last commit)",
    )


def data_topics(kafka_config: Mapping[str, Any], config: ConnectorConfig) -> list[DataTopic]:
    """The connector's collection topics on the brokers: ``<topic.prefix>.<db>.<collection>``,
    without its transaction, heartbeat and offsets topics."""
    namer = TopicNamer(config)
    delimiter = config.topic_delimiter
    head = config.topic_prefix + delimiter
    own = {namer.transaction_topic, namer.heartbeat_topic, namer.offsets_topic}
    admin = admin_client(kafka_config)
    try:
        names = sorted(admin.list_topics(timeout=TIMEOUT_S).topics)
    except KafkaException as error:
        raise _kafka_error(kafka_config, "list the topics", error) from None
    found = []
    for name in names:
        if not name.startswith(head) or name in own:
            continue
        database, _, collection = name[len(head) :].partition(delimiter)
        if database and collection:
            found.append(DataTopic(name, database, collection))
    return found


def partitions_of(kafka_config: Mapping[str, Any], topic: str) -> list[int]:
    admin = admin_client(kafka_config)
    try:
        info = admin.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
    except KafkaException as error:
        raise _kafka_error(kafka_config, f"describe the topic {topic!r}", error) from None
    if info is None or info.error is not None:
        return []
    return sorted(info.partitions)


def _offsets(admin, topic: str, partitions: list[int], spec: OffsetSpec, isolation) -> dict[int, int]:
    futures = admin.list_offsets(
        {TopicPartition(topic, partition): spec for partition in partitions},
        isolation_level=isolation,
        request_timeout=TIMEOUT_S,
    )
    return {tp.partition: future.result().offset for tp, future in futures.items()}


@dataclass(frozen=True)
class TopicEnds:
    """Where each partition begins (its earliest record) and where the range ends."""

    earliest: dict[int, int]
    ends: dict[int, int]
    quiet: bool = True  # False: no quiet moment was found, ``ends`` are the starts (nothing read)


def topic_ends(
    kafka_config: Mapping[str, Any], topic: str, partitions: list[int], quiet_wait_s: float
) -> TopicEnds:
    """The range's ends: the last stable offsets (see the module's docstring for several partitions)."""
    admin = admin_client(kafka_config)
    try:
        earliest = _offsets(admin, topic, partitions, OffsetSpec.earliest(), IsolationLevel.READ_UNCOMMITTED)
        stable = _offsets(admin, topic, partitions, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
        if len(partitions) <= 1:
            return TopicEnds(earliest, stable)
        deadline = time.monotonic() + quiet_wait_s
        while True:
            high = _offsets(admin, topic, partitions, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
            again = _offsets(admin, topic, partitions, OffsetSpec.latest(), IsolationLevel.READ_COMMITTED)
            if stable == high == again:
                return TopicEnds(earliest, stable)
            if time.monotonic() >= deadline:
                return TopicEnds(earliest, stable, quiet=False)
            time.sleep(0.2)
            stable = again
    except KafkaException as error:
        raise _kafka_error(kafka_config, f"read the end offsets of {topic!r}", error) from None


def first_records(
    kafka_config: Mapping[str, Any], topic: str, starts: Mapping[int, int], ends: Mapping[int, int]
) -> list[ChangeEvent]:
    """The first record of each partition's range, read as events (a topic in another format fails
    here, before any table changes)."""
    found = []
    for partition, start in sorted(starts.items()):
        if start < ends.get(partition, 0):
            events = _partition_events(
                kafka_config, EventReader(topic), topic, partition, start, ends[partition], size=1
            )
            try:
                found.append(next(events))
            except StopIteration:
                pass
            finally:
                events.close()
    return found


def read_range(
    kafka_config: Mapping[str, Any],
    topic: str,
    starts: Mapping[int, int],
    ends: Mapping[int, int],
    chunk: int = POLL_RECORDS,
    changes: bool = False,
) -> Iterator[list[ChangeEvent] | Changes]:
    """The events from ``starts`` up to ``ends`` (exclusive), in chunks of about ``chunk`` events:
    in partition order for one partition, merged by record time for several. With ``changes``, a
    fetch of one partition's plain changes comes as :class:`Changes` (columns)."""
    wanted = {partition: start for partition, start in starts.items() if start < ends.get(partition, 0)}
    if not wanted:
        return
    reader = EventReader(topic)
    if len(wanted) == 1:
        ((partition, start),) = wanted.items()
        yield from _partition_chunks(
            kafka_config, reader, topic, partition, start, ends[partition], chunk, changes
        )
        return
    partitions = [
        _partition_chunks(kafka_config, reader, topic, partition, start, ends[partition], chunk)
        for partition, start in sorted(wanted.items())
    ]
    try:
        streams = [chain.from_iterable(chunks) for chunks in partitions]
        merged = heapq.merge(*streams, key=lambda event: (event.timestamp, event.partition))
        yield from _chunks(merged, chunk)
    finally:  # each partition's consumer closed, also when the read stops early
        for chunks in partitions:
            chunks.close()


def _chunks(events: Iterator[ChangeEvent], size: int) -> Iterator[list[ChangeEvent]]:
    chunk: list[ChangeEvent] = []
    for event in events:
        chunk.append(event)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _partition_events(
    kafka_config: Mapping[str, Any],
    reader: EventReader,
    topic: str,
    partition: int,
    start: int,
    end: int,
    size: int = POLL_RECORDS,
) -> Iterator[ChangeEvent]:
    """One partition's committed events from ``start`` to ``end``, read ``size`` records at a time."""
    chunks = _partition_chunks(kafka_config, reader, topic, partition, start, end, size)
    try:
        for events in chunks:
            yield from events
    finally:
        chunks.close()


def _partition_chunks(
    kafka_config: Mapping[str, Any],
    reader: EventReader,
    topic: str,
    partition: int,
    start: int,
    end: int,
    size: int = POLL_RECORDS,
    changes: bool = False,
) -> Iterator[list[ChangeEvent] | Changes]:
    """One partition's committed events from ``start`` to ``end``, a list per fetch of up to
    ``size`` records (one loop per fetch, not a generator step per record); with ``changes``, a
    fetch of plain changes as :class:`Changes`."""
    consumer = Consumer(consumer_config(kafka_config))
    try:
        consumer.assign([TopicPartition(topic, partition, start)])
        position = start
        idle_deadline = time.monotonic() + TIMEOUT_S * 4
        while position < end:
            messages = consumer.consume(size, 0.5)
            if not messages:
                if time.monotonic() > idle_deadline:
                    raise _kafka_error(
                        kafka_config,
                        f"read partition {partition} of {topic!r} up to offset {end} (stopped at {position})",
                        TimeoutError("no records for two minutes"),
                    )
                continue
            idle_deadline = time.monotonic() + TIMEOUT_S * 4
            last = messages[-1]
            if last.offset() < end and not any(message.error() is not None for message in messages):
                # The common fetch: records only, all before the end.
                events: list[ChangeEvent] | Changes = (
                    reader.read_changes(partition, messages)
                    if changes
                    else reader.read_all(partition, messages)
                )
                position = last.offset() + 1
            else:
                events, reached = _fetched_events(kafka_config, reader, topic, partition, messages, end)
                position = max(position, reached)
            if events:
                yield events
            if position < end:
                # Past aborted records and commit markers, which the consumer skips silently.
                (current,) = consumer.position([TopicPartition(topic, partition)])
                if current.offset >= end:
                    position = end
    finally:
        consumer.close()


def _fetched_events(
    kafka_config: Mapping[str, Any],
    reader: EventReader,
    topic: str,
    partition: int,
    messages: list[Any],
    end: int,
) -> tuple[list[ChangeEvent], int]:
    """The events of a fetch that holds errors (the end of the partition among them) or reaches
    ``end``, one message at a time, and the position they reach."""
    events: list[ChangeEvent] = []
    position = 0
    for message in messages:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                position = max(position, message.offset())
                continue
            if error.fatal() or error.code() in (
                KafkaError.TOPIC_AUTHORIZATION_FAILED,
                KafkaError._UNKNOWN_TOPIC,
                KafkaError.UNKNOWN_TOPIC_OR_PART,
            ):
                raise _kafka_error(kafka_config, f"read {topic!r}", KafkaException(error))
            log.warning("Topic %s: %s", topic, error.str())
            continue
        offset = message.offset()
        if offset >= end:
            position = end
            break
        position = offset + 1
        events.append(reader.read(partition, offset, message.key(), message.value(), message.timestamp()[1]))
    return events, position


@dataclass(frozen=True)
class TopicFacts:
    """What the brokers say of a topic before an apply: its identity and where each partition ends."""

    identity: int | None  # 62 bits of the Kafka topic id (None: the brokers did not say)
    ends: dict[int, int]  # the next offset of each partition (high watermark)


def topic_identity(topic_id: Any) -> int | None:
    """62 bits of a Kafka topic id (a ``confluent_kafka.Uuid``): what a table records of its topic
    (a Delta application transaction holds a non-negative 64-bit number)."""
    if topic_id is None:
        return None
    high, low = topic_id.get_most_significant_bits(), topic_id.get_least_significant_bits()
    identity = (high ^ low) & ((1 << 62) - 1)
    return identity or None  # Kafka's zero id: no id


def topic_facts(kafka_config: Mapping[str, Any], topic: str, partitions: list[int]) -> TopicFacts:
    """The topic's identity and partition ends (one describe and one list of offsets)."""
    admin = admin_client(kafka_config)
    try:
        described = admin.describe_topics(TopicCollection([topic]), request_timeout=TIMEOUT_S)[topic]
        identity = topic_identity(described.result().topic_id)
    except KafkaException as error:
        raise _kafka_error(kafka_config, f"describe the topic {topic!r}", error) from None
    try:
        ends = _offsets(admin, topic, partitions, OffsetSpec.latest(), IsolationLevel.READ_UNCOMMITTED)
    except KafkaException as error:
        raise _kafka_error(kafka_config, f"read the end offsets of {topic!r}", error) from None
    return TopicFacts(identity, ends)


def check_same_topic(
    uri: str,
    topic: str,
    recorded: int | None,
    positions: Mapping[int, int],
    facts: TopicFacts,
    fix: str,
) -> None:
    """Refuse a table whose recorded positions are not in ``topic`` as it is now: the topic has
    another identity than the one recorded, or a partition ends before the table's position (the
    topic was deleted and created again, or lost records). Applying it would skip the new topic's
    records up to the old position, or apply nothing and say the table is up to date."""
    where = ", ".join(f"offset {o} of partition {p}" for p, o in sorted(positions.items())) or "its start"
    topic_end = ", ".join(f"{o} in partition {p}" for p, o in sorted(facts.ends.items())) or "no partition"
    if recorded is not None and facts.identity is not None and recorded != facts.identity:
        cause = "the topic was deleted and created again: it is another topic under the same name"
    else:
        behind = {p: o for p, o in positions.items() if o > facts.ends.get(p, 0)}
        if not behind:
            return
        cause = (
            "the topic ends before the table's position: it was deleted and created again, or its "
            "records were lost (an unclean leader election)"
        )
    raise TableError(
        f"The table at {uri} holds the changes of the topic {topic!r} up to {where}, but the topic "
        f"now ends at {topic_end}",
        cause=f"{cause}; the apply cannot tell which of its records the table holds",
        fix=fix,
    )


class StableEnds:
    """The last stable offset of each partition of topics, asked again and again through one
    admin client (a table follower's check whether a topic moved: one request per look)."""

    def __init__(self, kafka_config: Mapping[str, Any]):
        self.kafka_config = kafka_config
        self._admin = admin_client(kafka_config)
        self._partitions: dict[str, list[int]] = {}

    def __call__(self, topics: list[str]) -> dict[str, dict[int, int]]:
        try:
            missing = [topic for topic in topics if topic not in self._partitions]
            if missing:
                metadata = self._admin.list_topics(timeout=TIMEOUT_S).topics
                for topic in missing:
                    info = metadata.get(topic)
                    if info is not None and info.error is None:
                        self._partitions[topic] = sorted(info.partitions)
            asked = {
                TopicPartition(topic, partition): OffsetSpec.latest()
                for topic in topics
                for partition in self._partitions.get(topic, ())
            }
            ends: dict[str, dict[int, int]] = {topic: {} for topic in topics}
            if asked:
                futures = self._admin.list_offsets(
                    asked, isolation_level=IsolationLevel.READ_COMMITTED, request_timeout=TIMEOUT_S
                )
                for part, future in futures.items():
                    ends[part.topic][part.partition] = future.result().offset
            return ends
        except KafkaException as error:
            raise _kafka_error(
                self.kafka_config, "read the end offsets of the connector's topics", error
            ) from None
