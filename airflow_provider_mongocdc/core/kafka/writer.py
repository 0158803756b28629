"""The Kafka writer: a transactional producer that commits events and their offsets atomically.

A transaction holds a batch of change events AND the offset record(s) that cover them, so a
read_committed consumer sees both or neither. Whatever happens, an offset is never committed past
an undelivered event: any failed delivery aborts the transaction and raises
:class:`DeliveryError` (or :class:`OversizeEventError`). Retriable errors are retried a bounded
number of times; a fatal one (``_FENCED``: a newer producer took the same ``transactional.id``)
leaves the producer unusable. The producer configuration is the Kafka connection's librdkafka
configuration plus the writer's own settings. Secrets are never logged: use :func:`redact_config`
to show a configuration. librdkafka's error kinds: docs/design.md, "Writing to Kafka".
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import KafkaError, KafkaException, Producer

from airflow_provider_mongocdc.core.base.errors import (
    ConfigError,
    ConnectionFailedError,
    DeliveryError,
    MongoCdcError,
    OversizeEventError,
)
from airflow_provider_mongocdc.core.kafka.admin import (  # noqa: F401  (re-exported)
    TopicSpec,
    admin_client,
    describe_topic,
    ensure_topics,
)
from airflow_provider_mongocdc.core.kafka.client import (  # noqa: F401  (re-exported)
    _ACCEPTED_REQUIRED_VALUES,
    DEFAULT_PRODUCER_CONFIG,
    REQUIRED_PRODUCER_CONFIG,
    _kafka_call,
    _unwrap,
    is_secret_key,
    librdkafka_log,
    producer_config,
    redact_config,
)

log = logging.getLogger(__name__)

_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
OPERATION_RETRIES = 3


class RecordLike(Protocol):
    """Anything with ``topic``, ``key`` and ``value`` (``core.events.Record`` is one)."""

    topic: str
    key: bytes | str | None
    value: bytes | str | None


def _describe_key(key: bytes | str | None, limit: int = 200) -> str:
    if key is None:
        return "<no key>"
    text = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else str(key)
    return text if len(text) <= limit else text[:limit] + "..."


def _as_bytes(data: bytes | str | None) -> bytes | None:
    if data is None or isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    return str(data).encode("utf-8")


# -- delivery tracking -----------------------------------------------------------------------------
@dataclass
class FailedDelivery:
    topic: str
    key: bytes | None
    size: int
    error: KafkaError

    def describe(self) -> str:
        return (
            f"topic {self.topic!r}, key {_describe_key(self.key)}: {self.error.name()} ({self.error.str()})"
        )


@dataclass
class TransactionStats:
    """What the current (or last) transaction sent."""

    produced: int = 0
    delivered: int = 0
    failed: list[FailedDelivery] = field(default_factory=list)
    bytes: int = 0
    topics: dict[str, int] = field(default_factory=dict)


# -- the writer ------------------------------------------------------------------------------------
class TransactionalWriter:
    """A transactional producer with a stable ``transactional.id``.

    Creating it calls ``init_transactions``: an older producer with the same id is fenced and its
    open transaction aborted. Then, for each batch::

        writer.begin()
        writer.send(events)
        writer.commit([offset_record])      # or writer.abort()

    or ``with writer.transaction(): writer.send(...)`` (commits on success, aborts on error).
    Its start is logged (with the configuration, secrets redacted) at ``log_level``.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        transactional_id: str,
        *,
        overrides: Mapping[str, Any] | None = None,
        init_timeout_s: float = 60.0,
        queue_full_timeout_s: float = 300.0,
        log_level: int = logging.INFO,
    ):
        self.transactional_id = transactional_id
        self._config = producer_config(kafka_config, transactional_id, overrides)
        self._max_message_bytes = int(self._config.get("message.max.bytes", 1_000_000))
        self._queue_full_timeout_s = queue_full_timeout_s
        self._fatal: KafkaError | None = None
        self._in_transaction = False
        self.stats = TransactionStats()
        settings = dict(self._config)
        settings["error_cb"] = self._on_error
        settings["logger"] = librdkafka_log
        try:
            self._producer = Producer(settings)
        except KafkaException as error:
            raise ConfigError(
                "The Kafka producer configuration is invalid",
                cause=str(_unwrap(error) or error),
                fix="correct the Kafka connection's librdkafka config",
            ) from None
        self._delivery_callback = self._on_delivery  # bound once: produce() runs per record
        log.log(
            log_level,
            "Kafka writer %s: initialising transactions (config %s)",
            transactional_id,
            redact_config(self._config),
        )
        self._retrying("initialise transactions", self._producer.init_transactions, init_timeout_s)

    # -- properties --
    @property
    def config(self) -> dict[str, Any]:
        """The producer configuration with secrets redacted."""
        return redact_config(self._config)

    @property
    def max_message_bytes(self) -> int:
        return self._max_message_bytes

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    # -- callbacks --
    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self._fatal = error
            log.error("Kafka writer %s: fatal error %s", self.transactional_id, error.str())
        else:
            log.warning("Kafka writer %s: %s", self.transactional_id, error.str())

    def _on_delivery(self, error: KafkaError | None, message) -> None:
        if error is None:
            self.stats.delivered += 1
            return
        self.stats.failed.append(
            FailedDelivery(
                message.topic(), message.key(), len(message.value() or b"") + len(message.key() or b""), error
            )
        )

    # -- transaction control --
    def begin(self) -> None:
        """Start a transaction."""
        self._check_usable()
        if self._in_transaction:
            raise DeliveryError(
                "A Kafka transaction is already open on this writer",
                cause="begin() was called twice without commit() or abort()",
                fix="commit or abort the open transaction first",
            )
        self.stats = TransactionStats()
        try:
            _kafka_call(self._producer.begin_transaction)
        except KafkaException as error:
            raise self._failure("start a transaction", _unwrap(error)) from None
        self._in_transaction = True

    def send(self, records: Iterable[RecordLike]) -> int:
        """Queue records in the open transaction; returns how many were queued.

        A record larger than the producer accepts, or any delivery already reported failed,
        aborts the transaction and raises.
        """
        self._check_open()
        count = 0
        for record in records:
            self._produce(record)
            count += 1
        self._poll(0)
        self._raise_on_failed_deliveries()
        return count

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued record is delivered (still uncommitted); raise on failures."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                remaining = _kafka_call(self._producer.flush, max(0.0, deadline - time.monotonic()))
            except KafkaException as error:
                raise self._aborted("deliver the transaction's events", _unwrap(error)) from None
            if remaining == 0 or time.monotonic() >= deadline:
                break
        self._raise_on_failed_deliveries()
        if remaining:
            self._abort_quietly()
            raise DeliveryError(
                f"{remaining} events were not delivered to Kafka within {timeout_s:g} s; the "
                "transaction was aborted and the offset not advanced",
                cause="the brokers did not acknowledge the events in time",
                fix="check that the Kafka brokers are up and reachable, then re-run; the run "
                "continues from the last committed offset",
            )

    def commit(self, records: Iterable[RecordLike] = ()) -> TransactionStats:
        """Send ``records`` (typically the offset record), deliver everything, commit.

        Returns the statistics of the committed transaction.
        """
        self._check_open()
        self.send(records)
        # commit_transaction flushes by itself; checking deliveries first gives a precise error.
        self.flush(timeout_s=max(1.0, int(self._config["transaction.timeout.ms"]) / 1000.0))

        def failed(kafka_error: KafkaError | None) -> None:
            if kafka_error is not None and kafka_error.txn_requires_abort():
                self._abort_quietly()
            self._in_transaction = False

        self._retrying("commit the transaction", self._producer.commit_transaction, on_failure=failed)
        self._in_transaction = False
        self._raise_on_failed_deliveries(committed=True)
        return self.stats

    def abort(self) -> None:
        """Abort the open transaction: nothing of it becomes visible to read_committed readers."""
        if not self._in_transaction:
            return
        self._in_transaction = False
        if self._fatal is not None:
            return  # the broker aborts it when the fencing producer initialised, or on timeout
        # Bounded by the transaction timeout: past it the broker aborts the transaction itself.
        timeout = min(30.0, max(1.0, int(self._config["transaction.timeout.ms"]) / 1000.0))
        # Deliver what was sent first: an abort racing the registration of the transaction's
        # partitions can fail fatally with INVALID_TXN_STATE (confluentinc/librdkafka#4849).
        self._producer.flush(timeout)
        try:
            _kafka_call(self._producer.abort_transaction, timeout)
        except KafkaException as error:
            # One attempt only (the brokers may be gone): nothing of the transaction becomes
            # visible either way, since the broker aborts it after transaction.timeout.ms and the
            # next writer with this transactional.id fences it. This producer is not reused.
            kafka_error = _unwrap(error)
            self._fatal = kafka_error if kafka_error is not None else KafkaError(KafkaError._FAIL)
            log.warning(
                "Kafka writer %s: could not abort the transaction (%s); the broker aborts it "
                "after transaction.timeout.ms",
                self.transactional_id,
                kafka_error.str() if kafka_error is not None else error,
            )

    @contextmanager
    def transaction(self) -> Iterator[TransactionalWriter]:
        """``with writer.transaction(): writer.send(...)``: commit on success, abort on error."""
        self.begin()
        try:
            yield self
        except BaseException:
            self._abort_quietly()
            raise
        if self._in_transaction:
            self.commit()

    def close(self) -> None:
        """Abort an open transaction and release the producer."""
        if self._in_transaction:
            self._abort_quietly()
        producer, self._producer = getattr(self, "_producer", None), None
        if producer is not None:
            try:
                with warnings.catch_warnings():
                    # close() tries to abort an open transaction and warns when it cannot (fenced).
                    warnings.simplefilter("ignore", RuntimeWarning)
                    producer.purge()
                    if self._fatal is None:
                        # close() aborts an open transaction without a time limit; a producer in
                        # a fatal state (fenced, or its abort failed) is dropped instead.
                        producer.close()
            except (KafkaException, SystemError, RuntimeError):
                pass

    def __enter__(self) -> TransactionalWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TransactionalWriter(transactional_id={self.transactional_id!r}, config={self.config!r})"

    # -- internals --
    def _check_usable(self) -> None:
        if self._producer is None:
            raise DeliveryError("The Kafka writer is closed", fix="create a new writer")
        if self._fatal is not None:
            raise self._failure("use the producer", self._fatal)

    def _check_open(self) -> None:
        self._check_usable()
        if not self._in_transaction:
            raise DeliveryError(
                "No Kafka transaction is open on this writer",
                cause="send(), flush() or commit() was called before begin()",
                fix="call begin() first (or use `with writer.transaction():`)",
            )

    def _produce(self, record: RecordLike) -> None:
        # Runs once per record: no work beyond what delivery and the statistics need.
        topic = record.topic
        key = record.key
        value = record.value
        if key is not None and type(key) is not bytes:
            key = _as_bytes(key)
        if value is not None and type(value) is not bytes:
            value = _as_bytes(value)
        size = (len(value) if value is not None else 0) + (len(key) if key is not None else 0)
        if size > self._max_message_bytes:
            self._abort_quietly()
            raise self._oversize(topic, key, size, "the producer's message.max.bytes")
        deadline = None
        while True:
            try:
                self._producer.produce(topic, value=value, key=key, on_delivery=self._delivery_callback)
                break
            except BufferError:
                # The local queue is full: serve delivery reports until there is room.
                if deadline is None:
                    deadline = time.monotonic() + self._queue_full_timeout_s
                elif time.monotonic() >= deadline:
                    self._abort_quietly()
                    raise DeliveryError(
                        "The Kafka producer queue stayed full; the transaction was aborted",
                        cause=f"no room for new events within {self._queue_full_timeout_s:g} s",
                        fix="check that the Kafka brokers are reachable and keep up, then re-run",
                    ) from None
                self._poll(0.5)
            except (KafkaException, SystemError) as error:
                # As _kafka_call: confluent-kafka reports some fatal errors as SystemError.
                kafka_error = _unwrap(error)
                if kafka_error is None and isinstance(error, SystemError):
                    kafka_error = KafkaError(KafkaError._FAIL, f"librdkafka call failed: {error}")
                if kafka_error is not None and kafka_error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
                    self._abort_quietly()
                    raise self._oversize(topic, key, size, "the producer's message.max.bytes") from None
                raise self._aborted(f"queue an event for topic {topic!r}", kafka_error) from None
        stats = self.stats
        stats.produced += 1
        stats.bytes += size
        topics = stats.topics
        topics[topic] = topics.get(topic, 0) + 1

    def _poll(self, timeout: float) -> None:
        try:
            _kafka_call(self._producer.poll, timeout)
        except KafkaException as error:
            raise self._aborted("deliver the transaction's events", _unwrap(error)) from None

    def _aborted(self, what: str, error: KafkaError | None):
        """Abort the open transaction, then the error for the failure (the fatal one if any)."""
        self._abort_quietly()
        return self._failure(what, self._fatal if self._fatal is not None else error)

    def _raise_on_failed_deliveries(self, committed: bool = False) -> None:
        if not self.stats.failed:
            return
        first = self.stats.failed[0]
        if not committed:
            self._abort_quietly()
        too_large = [
            failed for failed in self.stats.failed if failed.error.code() == KafkaError.MSG_SIZE_TOO_LARGE
        ]
        if too_large:
            # The broker rejects a whole batch: name its largest event.
            biggest = max(too_large, key=lambda failed: failed.size)
            raise self._oversize(
                biggest.topic,
                biggest.key,
                biggest.size,
                "the topic's max.message.bytes or the broker's message.max.bytes",
            )
        raise self._delivery_failed(first)

    def _abort_quietly(self) -> None:
        if not self._in_transaction:
            return
        try:
            self.abort()
        except MongoCdcError as error:  # the error that led here is the one to report
            log.warning("Kafka writer %s: abort failed: %s", self.transactional_id, error)

    def _retrying(self, what: str, function, *args: Any, on_failure=None) -> None:
        """Call a transactional operation, again after a retriable error (a bounded number of
        times); ``on_failure(kafka_error)`` runs before the failure is raised."""
        attempts = 0
        while True:
            try:
                _kafka_call(function, *args)
                return
            except KafkaException as error:
                kafka_error = _unwrap(error)
                if (
                    kafka_error is not None
                    and kafka_error.retriable()
                    and not kafka_error.fatal()
                    and attempts < OPERATION_RETRIES
                ):
                    attempts += 1
                    log.warning(
                        "Kafka writer %s: could not %s (%s), retrying",
                        self.transactional_id,
                        what,
                        kafka_error.str(),
                    )
                    continue
                if on_failure is not None:
                    on_failure(kafka_error)
                raise self._failure(what, kafka_error) from None

    def _failure(self, what: str, error: KafkaError | None):
        """The MongoCdcError for a failed transactional operation."""
        if error is None:
            return DeliveryError(
                f"The Kafka writer could not {what}", fix="check the Kafka brokers and re-run"
            )
        if error.fatal():
            self._fatal = error
        if error.code() in _FENCED_CODES or (error.fatal() and "fenced" in error.str().lower()):
            self._fatal = error
            return DeliveryError(
                f"This Kafka writer (transactional.id {self.transactional_id!r}) was fenced by a newer "
                "writer with the same transactional.id; its transaction was aborted and nothing it "
                "sent since its last commit is visible",
                cause="another run of the same task started (a retry or a duplicate run) and took "
                "over, or the broker aborted the transaction after transaction.timeout.ms: "
                f"{error.str()}",
                fix="nothing to repair: the newer run continues from the last committed offset. If "
                "runs overlap unexpectedly, make sure one run per connector task at a time",
            )
        if error.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            return ConnectionFailedError(
                f"The Kafka writer could not {what}: the brokers did not answer",
                cause=f"{error.name()}: {error.str()}",
                fix="check bootstrap.servers and the security settings of the Kafka connection, and "
                "that the brokers run; the run continues from the last committed offset",
            )
        if error.code() in (
            KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED,
            KafkaError.TOPIC_AUTHORIZATION_FAILED,
            KafkaError.CLUSTER_AUTHORIZATION_FAILED,
        ):
            return DeliveryError(
                f"The Kafka writer may not {what}",
                cause=f"{error.name()}: {error.str()}",
                fix="grant the Kafka principal WRITE and DESCRIBE on the transactional id "
                f"{self.transactional_id!r} and WRITE on the connector's topics",
            )
        if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            return self._oversize("?", None, 0, "the topic's max.message.bytes")
        kind = "fatal" if error.fatal() else "abortable" if error.txn_requires_abort() else "error"
        return DeliveryError(
            f"The Kafka writer could not {what}; the transaction was aborted and the offset not advanced",
            cause=f"{error.name()} ({kind}): {error.str()}",
            fix="check the Kafka brokers and the connection settings, then re-run; the run "
            "continues from the last committed offset",
        )

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

    def _oversize(self, topic: str, key: bytes | None, size: int, limit: str) -> OversizeEventError:
        return OversizeEventError(
            f"The change event for key {_describe_key(key)} on topic {topic!r} is {size} bytes, more "
            f"than Kafka accepts; the transaction was aborted and the offset not advanced",
            cause=f"the limit is {limit} (producer message.max.bytes={self.max_message_bytes})",
            fix="raise message.max.bytes in the Kafka connection's config, max.message.bytes on the "
            "topic and message.max.bytes on the brokers, or leave the large fields out of the "
            "captured documents (field.exclude.list)",
        )
