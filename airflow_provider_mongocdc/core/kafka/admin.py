"""Kafka topics: create the missing ones (idempotent) and read a topic's partitions and configs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from airflow_provider_mongocdc.core.base.errors import ConnectionFailedError, DeliveryError
from airflow_provider_mongocdc.core.kafka.client import (
    DEFAULT_PRODUCER_CONFIG,
    REQUIRED_PRODUCER_CONFIG,
    _unwrap,
    librdkafka_log,
)

log = logging.getLogger("airflow_provider_mongocdc.core.kafka.writer")


@dataclass(frozen=True)
class TopicSpec:
    """A topic to create when missing. ``-1`` means the broker's default."""

    name: str
    num_partitions: int = -1
    replication_factor: int = -1
    config: Mapping[str, str] = field(default_factory=dict)


def admin_client(kafka_config: Mapping[str, Any]) -> AdminClient:
    settings = {
        key: value
        for key, value in kafka_config.items()
        if key not in DEFAULT_PRODUCER_CONFIG
        and key not in REQUIRED_PRODUCER_CONFIG
        and key
        not in (
            "transactional.id",
            "group.id",
            "isolation.level",
            "enable.auto.commit",
            "auto.offset.reset",
            "enable.partition.eof",
        )
    }
    settings["logger"] = librdkafka_log
    return AdminClient(settings)


def ensure_topics(
    kafka_config: Mapping[str, Any], topics: Iterable[TopicSpec], timeout_s: float = 30.0
) -> dict[str, str]:
    """Create the topics that do not exist yet; returns ``{name: "created" | "exists"}``.

    Idempotent: a topic created concurrently by someone else counts as existing.
    """
    specs = list(topics)
    if not specs:
        return {}
    admin = admin_client(kafka_config)
    try:
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise _admin_unreachable(kafka_config, _unwrap(error)) from None
    result: dict[str, str] = {}
    missing = []
    for spec in specs:
        if spec.name in metadata.topics and metadata.topics[spec.name].error is None:
            result[spec.name] = "exists"
        else:
            missing.append(spec)
    if not missing:
        return result
    futures = admin.create_topics(
        [
            NewTopic(
                spec.name,
                num_partitions=spec.num_partitions,
                replication_factor=spec.replication_factor,
                config={key: str(value) for key, value in spec.config.items()},
            )
            for spec in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            result[name] = "created"
            log.info("Created Kafka topic %s", name)
        except KafkaException as error:
            kafka_error = _unwrap(error)
            if kafka_error is not None and kafka_error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                result[name] = "exists"
                continue
            raise DeliveryError(
                f"Could not create Kafka topic {name!r}",
                cause=f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error),
                fix="create the topic yourself, or grant the Kafka principal CREATE on the cluster or topic",
            ) from None
    _await_listed(admin, [name for name, outcome in result.items() if outcome == "created"], timeout_s)
    return result


def _await_listed(admin: AdminClient, names: list[str], timeout_s: float) -> None:
    """Wait until the brokers' metadata lists the created topics: a KRaft controller answers
    CreateTopics once the topic is in its log, and a broker's metadata follows a moment later, so a
    describe or a produce right after creation could otherwise find no topic. Bounded by
    ``timeout_s``; past it the caller goes on (the topic exists; the next request will see it)."""
    deadline = time.monotonic() + timeout_s
    waiting = set(names)
    while waiting and time.monotonic() < deadline:
        try:
            topics = admin.list_topics(timeout=max(0.1, deadline - time.monotonic())).topics
        except KafkaException:
            return
        waiting = {name for name in waiting if name not in topics or topics[name].error is not None}
        if waiting:
            time.sleep(0.05)


def describe_topic(
    kafka_config: Mapping[str, Any], topic: str, timeout_s: float = 30.0
) -> tuple[int, dict[str, str]] | None:
    """``(partition count, {config name: value})`` of a topic, or None when it does not exist."""
    admin = admin_client(kafka_config)
    try:
        # All topics: asking for one topic would auto-create it on brokers that allow that.
        metadata = admin.list_topics(timeout=timeout_s)
    except KafkaException as error:
        raise _admin_unreachable(kafka_config, _unwrap(error)) from None
    info = metadata.topics.get(topic)
    if info is None or info.error is not None:
        return None
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    future = admin.describe_configs([resource], request_timeout=timeout_s)[resource]
    try:
        entries = future.result(timeout=timeout_s)
    except KafkaException as error:
        kafka_error = _unwrap(error)
        raise DeliveryError(
            f"Could not read the configuration of Kafka topic {topic!r}",
            cause=f"{kafka_error.name()}: {kafka_error.str()}" if kafka_error else str(error),
            fix="grant the Kafka principal DESCRIBE_CONFIGS on the topic",
        ) from None
    return len(info.partitions), {name: entry.value for name, entry in entries.items()}


def _admin_unreachable(kafka_config: Mapping[str, Any], error: KafkaError | None) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"Could not reach the Kafka brokers at {kafka_config.get('bootstrap.servers')!r}",
        cause=f"{error.name()}: {error.str()}" if error else "no answer",
        fix="check bootstrap.servers and the security settings of the Kafka connection, and that "
        "the brokers run",
    )


def end_offsets(
    kafka_config: Mapping[str, Any], topics: Iterable[str], timeout_s: float = 30.0
) -> dict[str, dict[int, int]]:
    """Where each of ``topics`` ends: the next offset of each partition (its high watermark, open
    transactions' records included). A topic that does not exist has no partitions (``{}``)."""
    wanted = sorted(set(topics))
    if not wanted:
        return {}
    admin = admin_client(kafka_config)
    try:
        # All topics: asking for one topic would auto-create it on brokers that allow that.
        metadata = admin.list_topics(timeout=timeout_s)
        present = {
            name: sorted(metadata.topics[name].partitions)
            for name in wanted
            if name in metadata.topics and metadata.topics[name].error is None
        }
        ends: dict[str, dict[int, int]] = {name: {} for name in wanted}
        asked = {
            TopicPartition(name, partition): OffsetSpec.latest()
            for name, partitions in present.items()
            for partition in partitions
        }
        if asked:
            futures = admin.list_offsets(
                asked, isolation_level=IsolationLevel.READ_UNCOMMITTED, request_timeout=timeout_s
            )
            for part, future in futures.items():
                ends[part.topic][part.partition] = future.result().offset
    except KafkaException as error:
        raise _admin_unreachable(kafka_config, _unwrap(error)) from None
    return ends
