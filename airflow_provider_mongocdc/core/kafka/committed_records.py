"""Reading a Kafka topic's committed records: the offsets topic, and Kafka Connect's.

A ``read_committed`` consumer without a consumer group reads every partition of the topic from
the beginning to the end offsets seen when the read started (the last stable offset). A missing
topic reads as empty; an unreadable one fails, never reads as empty (that would start over).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from airflow_provider_mongocdc.core.base.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.kafka.client import (
    DEFAULT_PRODUCER_CONFIG,
    REQUIRED_PRODUCER_CONFIG,
    librdkafka_log,
)

log = logging.getLogger("airflow_provider_mongocdc.core.offsets.store")  # logged as the offsets' lines

CONSUMER_ONLY = {
    "enable.auto.commit": False,
    "isolation.level": "read_committed",
    "enable.partition.eof": True,
    "auto.offset.reset": "earliest",
    "allow.auto.create.topics": False,
    "fetch.wait.max.ms": 50,  # end of partition is noticed sooner
}
NOT_FOR_CONSUMERS = (
    set(DEFAULT_PRODUCER_CONFIG)
    | set(REQUIRED_PRODUCER_CONFIG)
    | {
        "transactional.id",
        "transaction.timeout.ms",
        "linger.ms",
        "queue.buffering.max.ms",
        "batch.num.messages",
        "delivery.timeout.ms",
        "message.timeout.ms",
        "retries",
        "queue.buffering.max.messages",
        "queue.buffering.max.kbytes",
        "partitioner",
        "request.required.acks",
        "compression.codec",
        "max.in.flight.requests.per.connection",
        "max.in.flight",
    }
)


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


def consumer_config(kafka_config: Mapping[str, Any]) -> dict[str, Any]:
    """A reader's settings: the connection's, without the producer's, plus read_committed."""
    config = {
        key: value
        for key, value in kafka_config.items()
        if key not in NOT_FOR_CONSUMERS and not callable(value)
    }
    config.update(CONSUMER_ONLY)
    # Never joins or commits to this group: it only satisfies the client.
    config["group.id"] = f"mongocdc-offsets-reader-{uuid.uuid4().hex}"
    config["logger"] = librdkafka_log
    return config


def read_committed(
    kafka_config: Mapping[str, Any], topic: str, read_timeout_s: float
) -> list[tuple[bytes | None, bytes | None]]:
    """Every committed ``(key, value)`` record of ``topic``, oldest first."""
    deadline = time.monotonic() + read_timeout_s
    consumer = Consumer(consumer_config(kafka_config))
    try:
        ends = _end_offsets(consumer, kafka_config, topic, read_timeout_s, deadline)
        if not ends:
            return []
        consumer.assign([TopicPartition(topic, pid, -2) for pid in ends])  # -2: beginning
        return _read_to_ends(consumer, kafka_config, topic, ends, read_timeout_s, deadline)
    finally:
        consumer.close()


def _end_offsets(
    consumer: Consumer, kafka_config: Mapping[str, Any], topic: str, read_timeout_s: float, deadline: float
) -> dict[int, int]:
    """The last stable offset of each partition of ``topic`` that holds records (none when the
    topic does not exist)."""
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
        if high > 0:
            ends[partition_id] = high  # the last stable offset (read_committed)
    return ends


def _read_to_ends(
    consumer: Consumer,
    kafka_config: Mapping[str, Any],
    topic: str,
    ends: dict[int, int],
    read_timeout_s: float,
    deadline: float,
) -> list[tuple[bytes | None, bytes | None]]:
    """The records of the assigned partitions up to their ``ends``."""
    records: list[tuple[bytes | None, bytes | None]] = []
    pending = set(ends)
    while pending:
        if time.monotonic() >= deadline:
            raise OffsetError(
                f"Could not read the offsets topic {topic!r} to its end within {read_timeout_s:g} s",
                cause=f"partitions {sorted(pending)} still had records to read",
                fix="check that the Kafka brokers are reachable and healthy, then retry",
            )
        message = consumer.poll(0.5)
        if message is None:
            continue
        pid = message.partition()
        if message.error():
            if _at_end(message, ends, kafka_config, topic):
                pending.discard(pid)
            continue
        if pid not in pending:
            continue
        if message.offset() < ends[pid]:
            records.append((message.key(), message.value()))
        if message.offset() + 1 >= ends[pid]:
            pending.discard(pid)
    return records


def _at_end(message: Message, ends: dict[int, int], kafka_config: Mapping[str, Any], topic: str) -> bool:
    """Whether an error message is the end of its partition at its last stable offset; an error
    that forbids reading raises, any other is logged (the consumer recovers by itself)."""
    code = message.error().code()
    if code == KafkaError._PARTITION_EOF:
        return message.offset() >= ends.get(message.partition(), 0)
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
