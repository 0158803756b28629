"""The Kafka writer: a transactional producer that commits events and their offsets atomically.

A transaction holds a batch of change events AND the offset record(s) that cover them, so a
read_committed consumer sees both or neither. Whatever happens, an offset is never committed past
an undelivered event: any failed delivery aborts the transaction and raises
:class:`DeliveryError` (or :class:`OversizeEventError`). Retriable errors are retried a bounded
number of times; a fatal one (``_FENCED``: a newer producer took the same ``transactional.id``)
leaves the producer unusable. The producer configuration is the Kafka connection's librdkafka
configuration plus the writer's own settings. Secrets are never logged: use :func:`redact_config`
to show a configuration. librdkafka's error kinds: docs/design.md, "Writing to Kafka".

:class:`TransactionalWriter` controls the transactions (begin, send, flush, commit, abort) over
two parts: the producer's lifecycle, fencing and retried operations
(:class:`~airflow_provider_mongocdc.core.kafka.producer.TransactionalProducer`) and the records
sent with the account of their delivery
(:class:`~airflow_provider_mongocdc.core.kafka.delivery.Deliveries`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from airflow_provider_mongocdc.core.base.errors import DeliveryError, MongoCdcError
from airflow_provider_mongocdc.core.kafka.client import _kafka_call, _unwrap, producer_config, redact_config
from airflow_provider_mongocdc.core.kafka.delivery import Deliveries, RecordLike, TransactionStats
from airflow_provider_mongocdc.core.kafka.producer import TransactionalProducer

log = logging.getLogger(__name__)


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
        self._in_transaction = False
        self._producer = TransactionalProducer(
            self._config, transactional_id, int(self._config.get("message.max.bytes", 1_000_000))
        )
        self._deliveries = Deliveries(self._producer, queue_full_timeout_s, self._abort_quietly)
        log.log(
            log_level,
            "Kafka writer %s: initialising transactions (config %s)",
            transactional_id,
            redact_config(self._config),
        )
        self._producer.retrying(
            "initialise transactions", self._producer.producer.init_transactions, init_timeout_s
        )

    # -- properties --
    @property
    def config(self) -> dict[str, Any]:
        """The producer configuration with secrets redacted."""
        return redact_config(self._config)

    @property
    def max_message_bytes(self) -> int:
        return self._producer.max_message_bytes

    @property
    def in_transaction(self) -> bool:
        return self._in_transaction

    @property
    def stats(self) -> TransactionStats:
        """What the current (or last) transaction sent."""
        return self._deliveries.stats

    # -- transaction control --
    def begin(self) -> None:
        """Start a transaction."""
        self._producer.check_usable()
        if self._in_transaction:
            raise DeliveryError(
                "A Kafka transaction is already open on this writer",
                cause="begin() was called twice without commit() or abort()",
                fix="commit or abort the open transaction first",
            )
        self._deliveries.reset()
        try:
            _kafka_call(self._producer.producer.begin_transaction)
        except KafkaException as error:
            raise self._producer.failure("start a transaction", _unwrap(error)) from None
        self._in_transaction = True

    def send(self, records: Iterable[RecordLike]) -> int:
        """Queue records in the open transaction; returns how many were queued.

        A record larger than the producer accepts, or any delivery already reported failed,
        aborts the transaction and raises.
        """
        self._check_open()
        deliveries = self._deliveries
        count = 0
        for record in records:
            deliveries.produce(record)
            count += 1
        deliveries.poll(0)
        deliveries.raise_on_failed()
        return count

    def flush(self, timeout_s: float = 60.0) -> None:
        """Wait until every queued record is delivered (still uncommitted); raise on failures."""
        self._check_open()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                remaining = _kafka_call(self._producer.producer.flush, max(0.0, deadline - time.monotonic()))
            except KafkaException as error:
                raise self._deliveries.aborted("deliver the transaction's events", _unwrap(error)) from None
            if remaining == 0 or time.monotonic() >= deadline:
                break
        self._deliveries.raise_on_failed()
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
        self.flush(timeout_s=max(1.0, self._producer.transaction_timeout_s))

        def failed(kafka_error: KafkaError | None) -> None:
            if kafka_error is not None and kafka_error.txn_requires_abort():
                self._abort_quietly()
            self._in_transaction = False

        # Bounded by the transaction timeout: past it the broker aborts the transaction itself.
        self._producer.retrying(
            "commit the transaction",
            self._producer.producer.commit_transaction,
            on_failure=failed,
            within_s=max(1.0, self._producer.transaction_timeout_s),
        )
        self._in_transaction = False
        self._deliveries.raise_on_failed(committed=True)
        return self.stats

    def abort(self) -> None:
        """Abort the open transaction: nothing of it becomes visible to read_committed readers."""
        if not self._in_transaction:
            return
        self._in_transaction = False
        producer = self._producer
        if producer.fatal is not None:
            return  # the broker aborts it when the fencing producer initialised, or on timeout
        # Bounded by the transaction timeout: past it the broker aborts the transaction itself.
        timeout = min(30.0, max(1.0, producer.transaction_timeout_s))
        # Deliver what was sent first: an abort racing the registration of the transaction's
        # partitions can fail fatally with INVALID_TXN_STATE (confluentinc/librdkafka#4849).
        producer.producer.flush(timeout)
        try:
            _kafka_call(producer.producer.abort_transaction, timeout)
        except KafkaException as error:
            # One attempt only (the brokers may be gone): nothing of the transaction becomes
            # visible either way, since the broker aborts it after transaction.timeout.ms and the
            # next writer with this transactional.id fences it. This producer is not reused.
            kafka_error = _unwrap(error)
            producer.fatal = kafka_error if kafka_error is not None else KafkaError(KafkaError._FAIL)
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
        producer = getattr(self, "_producer", None)
        if producer is not None:
            producer.release()

    def __enter__(self) -> TransactionalWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TransactionalWriter(transactional_id={self.transactional_id!r}, config={self.config!r})"

    # -- internals --
    def _check_open(self) -> None:
        self._producer.check_usable()
        if not self._in_transaction:
            raise DeliveryError(
                "No Kafka transaction is open on this writer",
                cause="send(), flush() or commit() was called before begin()",
                fix="call begin() first (or use `with writer.transaction():`)",
            )

    def _abort_quietly(self) -> None:
        if not self._in_transaction:
            return
        try:
            self.abort()
        except MongoCdcError as error:  # the error that led here is the one to report
            log.warning("Kafka writer %s: abort failed: %s", self.transactional_id, error)
