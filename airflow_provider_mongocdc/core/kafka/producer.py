"""The transactional producer's lifecycle: the librdkafka producer of one ``transactional.id``,
whether it is still usable (fenced or otherwise fatal), transactional operations retried a
bounded number of times, and the error, in words, for each failure.

:class:`TransactionalProducer` is the part of
:class:`~airflow_provider_mongocdc.core.kafka.writer.TransactionalWriter` that owns the
``confluent_kafka.Producer``: creating it (an invalid configuration is a ``ConfigError``),
noticing a fatal error (``error_cb``: a newer producer with the same ``transactional.id`` fenced
this one), retrying ``init_transactions`` and ``commit_transaction`` after retriable errors, and
releasing it. librdkafka's error kinds: docs/design.md, "Writing to Kafka".
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer

from airflow_provider_mongocdc.core.base.errors import (
    ConfigError,
    ConnectionFailedError,
    DeliveryError,
    MongoCdcError,
    OversizeEventError,
)
from airflow_provider_mongocdc.core.kafka.client import _kafka_call, _unwrap, librdkafka_log

log = logging.getLogger("airflow_provider_mongocdc.core.kafka.writer")  # logged as the writer's lines

_FENCED_CODES = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
OPERATION_RETRIES = 3


def describe_key(key: bytes | str | None, limit: int = 200) -> str:
    """A record key for a message: its text, cut at ``limit`` characters."""
    if key is None:
        return "<no key>"
    text = key.decode("utf-8", errors="replace") if isinstance(key, bytes) else str(key)
    return text if len(text) <= limit else text[:limit] + "..."


class TransactionalProducer:
    """The librdkafka producer of one ``transactional.id`` and whether it is still usable.

    ``config`` is the complete producer configuration (``producer_config``). A fatal error
    reported by librdkafka, or found by :meth:`failure`, makes the producer unusable
    (:attr:`fatal`); :meth:`check_usable` raises then.
    """

    def __init__(self, config: Mapping[str, Any], transactional_id: str, max_message_bytes: int):
        self.transactional_id = transactional_id
        self.transaction_timeout_s = int(config["transaction.timeout.ms"]) / 1000.0
        self.max_message_bytes = max_message_bytes
        self.fatal: KafkaError | None = None
        settings = dict(config)
        settings["error_cb"] = self._on_error
        settings["logger"] = librdkafka_log
        try:
            self.producer: Producer | None = Producer(settings)
        except KafkaException as error:
            raise ConfigError(
                "The Kafka producer configuration is invalid",
                cause=str(_unwrap(error) or error),
                fix="correct the Kafka connection's librdkafka config",
            ) from None

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.fatal = error
            log.error("Kafka writer %s: fatal error %s", self.transactional_id, error.str())
        else:
            log.warning("Kafka writer %s: %s", self.transactional_id, error.str())

    def check_usable(self) -> None:
        """Raise when the producer was released or is in a fatal state."""
        if self.producer is None:
            raise DeliveryError("The Kafka writer is closed", fix="create a new writer")
        if self.fatal is not None:
            raise self.failure("use the producer", self.fatal)

    def retrying(
        self,
        what: str,
        function: Callable[..., Any],
        *args: Any,
        on_failure: Callable[[KafkaError | None], None] | None = None,
        within_s: float | None = None,
    ) -> None:
        """Call a transactional operation, again after a retriable error (a bounded number of
        times); ``on_failure(kafka_error)`` runs before the failure is raised. With ``within_s``
        every attempt is given what is left of that time as its timeout (librdkafka's own default
        for ``commit_transaction`` is no limit: with the brokers gone it would wait for them), and
        none starts after it."""
        attempts = 0
        deadline = time.monotonic() + within_s if within_s is not None else None
        while True:
            try:
                if deadline is None:
                    _kafka_call(function, *args)
                else:
                    _kafka_call(function, *args, max(0.1, deadline - time.monotonic()))
                return
            except KafkaException as error:
                kafka_error = _unwrap(error)
                if (
                    kafka_error is not None
                    and kafka_error.retriable()
                    and not kafka_error.fatal()
                    and attempts < OPERATION_RETRIES
                    and (deadline is None or time.monotonic() < deadline)
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
                raise self.failure(what, kafka_error) from None

    def release(self) -> None:
        """Drop what is queued and release the producer (a producer in a fatal state is dropped
        without ``close()``, which would wait on its transaction without a time limit)."""
        producer, self.producer = self.producer, None
        if producer is None:
            return
        try:
            with warnings.catch_warnings():
                # close() tries to abort an open transaction and warns when it cannot (fenced).
                warnings.simplefilter("ignore", RuntimeWarning)
                producer.purge()
                if self.fatal is None:
                    # close() aborts an open transaction without a time limit; a producer in
                    # a fatal state (fenced, or its abort failed) is dropped instead.
                    producer.close()
        except (KafkaException, SystemError, RuntimeError):
            pass

    # -- errors in words --
    def failure(self, what: str, error: KafkaError | None) -> MongoCdcError:
        """The MongoCdcError for a failed transactional operation (a fatal ``error`` makes the
        producer unusable)."""
        if error is None:
            return DeliveryError(
                f"The Kafka writer could not {what}", fix="check the Kafka brokers and re-run"
            )
        if error.fatal():
            self.fatal = error
        if error.code() in _FENCED_CODES or (error.fatal() and "fenced" in error.str().lower()):
            self.fatal = error
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
            return self.oversize("?", None, 0, "the topic's max.message.bytes")
        kind = "fatal" if error.fatal() else "abortable" if error.txn_requires_abort() else "error"
        return DeliveryError(
            f"The Kafka writer could not {what}; the transaction was aborted and the offset not advanced",
            cause=f"{error.name()} ({kind}): {error.str()}",
            fix="check the Kafka brokers and the connection settings, then re-run; the run "
            "continues from the last committed offset",
        )

    def oversize(self, topic: str, key: bytes | None, size: int, limit: str) -> MongoCdcError:
        """The error for an event larger than Kafka accepts (``limit`` names the limit)."""
        return OversizeEventError(
            f"The change event for key {describe_key(key)} on topic {topic!r} is {size} bytes, more "
            f"than Kafka accepts; the transaction was aborted and the offset not advanced",
            cause=f"the limit is {limit} (producer message.max.bytes={self.max_message_bytes})",
            fix="raise message.max.bytes in the Kafka connection's config, max.message.bytes on the "
            "topic and message.max.bytes on the brokers, or leave the large fields out of the "
            "captured documents (field.exclude.list)",
        )
