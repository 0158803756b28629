"""Sending records in a transaction, with the account of their delivery.

:class:`Deliveries` is the part of
:class:`~airflow_provider_mongocdc.core.kafka.writer.TransactionalWriter` that queues records on
the producer (waiting for room when its local queue is full, refusing a record larger than the
producer's ``message.max.bytes``), counts what the open transaction sent
(:class:`TransactionStats`) and turns a failed delivery into the error to raise. Whatever fails,
the writer's transaction is aborted first (``abort``, given by the writer): an offset is never
committed past an undelivered event.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from confluent_kafka import KafkaError, KafkaException

from airflow_provider_mongocdc.core.base.errors import DeliveryError, MongoCdcError
from airflow_provider_mongocdc.core.kafka.client import _kafka_call, _unwrap
from airflow_provider_mongocdc.core.kafka.producer import TransactionalProducer, describe_key


class RecordLike(Protocol):
    """Anything with ``topic``, ``key`` and ``value``, and optionally ``headers`` (name and bytes
    pairs; ``core.events.schema.Record`` is one)."""

    topic: str
    key: bytes | str | None
    value: bytes | str | None


def _as_bytes(data: bytes | str | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


@dataclass
class FailedDelivery:
    topic: str
    key: bytes | None
    size: int
    error: KafkaError

    def describe(self) -> str:
        return f"topic {self.topic!r}, key {describe_key(self.key)}: {self.error.name()} ({self.error.str()})"


@dataclass
class TransactionStats:
    """What the current (or last) transaction sent."""

    produced: int = 0
    delivered: int = 0
    failed: list[FailedDelivery] = field(default_factory=list)
    bytes: int = 0
    topics: dict[str, int] = field(default_factory=dict)


class Deliveries:
    """Queues records on ``producer`` and accounts for their delivery (:attr:`stats`, one
    :class:`TransactionStats` per transaction: :meth:`reset` starts the next). ``abort`` aborts
    the writer's open transaction (quietly): it runs before any error is raised."""

    def __init__(
        self, producer: TransactionalProducer, queue_full_timeout_s: float, abort: Callable[[], None]
    ):
        self.producer = producer
        self.queue_full_timeout_s = queue_full_timeout_s
        self.abort = abort
        self.stats = TransactionStats()
        self.callback = self._on_delivery  # bound once: produce() runs per record

    def reset(self) -> None:
        self.stats = TransactionStats()

    def _on_delivery(self, error: KafkaError | None, message) -> None:
        if error is None:
            self.stats.delivered += 1
            return
        self.stats.failed.append(
            FailedDelivery(
                message.topic(), message.key(), len(message.value() or b"") + len(message.key() or b""), error
            )
        )

    def aborted(self, what: str, error: KafkaError | None) -> MongoCdcError:
        """Abort the open transaction, then the error for the failure (the fatal one if any)."""
        self.abort()
        producer = self.producer
        return producer.failure(what, producer.fatal if producer.fatal is not None else error)

    def produce(self, record: RecordLike) -> None:
        """Queue one record (runs once per record: no work beyond what delivery and the
        statistics need)."""
        topic = record.topic
        key = record.key
        value = record.value
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key)
        if value is not None and type(value) is not bytes:
            value = _as_bytes(value)
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        producer = self.producer
        if size > producer.max_message_bytes:
            self.abort()
            raise producer.oversize(topic, key, size, "the producer's message.max.bytes")
        headers = getattr(record, "headers", None)
        deadline = None
        while True:
            try:
                if headers:
                    producer.producer.produce(  # type: ignore[union-attr]
                        topic, value=value, key=key, headers=list(headers), on_delivery=self.callback
                    )
                else:
                    producer.producer.produce(topic, value=value, key=key, on_delivery=self.callback)  # type: ignore[union-attr]
                break
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                if deadline is None:
                    deadline = time.monotonic() + self.queue_full_timeout_s
                elif time.monotonic() >= deadline:
                    self.abort()
                    raise DeliveryError(
                        "The Kafka producer queue stayed full; the transaction was aborted",
                        cause=f"no room for new events within {self.queue_full_timeout_s:g} s",
                        fix="check that the Kafka brokers are reachable and keep up, then re-run",
                    ) from None
                self.poll(0.5)
            except (KafkaException, SystemError) as error:
                # As _kafka_call: confluent-kafka reports some fatal errors as SystemError.
                kafka_error = _unwrap(error)
                if kafka_error is None and isinstance(error, SystemError):
                    kafka_error = KafkaError(KafkaError._FAIL, f"librdkafka call failed: {error}")
                if kafka_error is not None and kafka_error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self.abort()
                    raise producer.oversize(topic, key, size, "the producer's message.max.bytes") from None
                raise self.aborted(f"queue an event for topic {topic!r}", kafka_error) from None
        stats = self.stats
        stats.produced += 1
        stats.bytes += size
        topics = stats.topics
        topics[topic] = topics.get(topic, 0) + 1

    def poll(self, timeout: float) -> None:
        """Serve delivery reports for up to ``timeout`` seconds."""
        try:
            _kafka_call(self.producer.producer.poll, timeout)  # type: ignore[union-attr]
        except KafkaException as error:
            raise self.aborted("deliver the transaction's events", _unwrap(error)) from None

    def raise_on_failed(self, committed: bool = False) -> None:
        """Raise when a delivery failed (aborting the transaction first, unless ``committed``)."""
        if not self.stats.failed:
            return
        first = self.stats.failed[0]
        if not committed:
            self.abort()
        too_large = [
            failed for failed in self.stats.failed if failed.error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        ]
        if too_large:
            # The broker rejects a whole batch: name its largest event.
            biggest = max(too_large, key=lambda failed: failed.size)
            raise self.producer.oversize(
                biggest.topic,
                biggest.key,
                biggest.size,
                "the topic's max.message.bytes or the broker's message.max.bytes",
            )
        raise self._delivery_failed(first)

    def _delivery_failed(self, first: FailedDelivery) -> DeliveryError:
        failed = len(self.stats.failed)
        code = first.error.code()
        if code in (KafkaError.UNKNOWN_TOPIC_OR_PART, KafkaError._UNKNOWN_TOPIC):
            fix = (
                f"create topic {first.topic!r} (or let the connector create its topics, or enable "
                "the broker's auto.create.topics.enable), then re-run"
            )
        elif code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
            fix = f"grant the Kafka principal WRITE on topic {first.topic!r}, then re-run"
        elif code == KafkaError._MSG_TIMED_OUT:
            fix = "check that the Kafka brokers are reachable (or raise delivery.timeout.ms), then re-run"
        else:
            fix = "check the Kafka brokers and topic settings, then re-run"
        return DeliveryError(
            f"Kafka did not accept {failed} of {self.stats.produced} events of the transaction; it "
            "was aborted and the offset not advanced",
            cause=first.describe(),
            fix=fix + "; the run continues from the last committed offset",
        )
