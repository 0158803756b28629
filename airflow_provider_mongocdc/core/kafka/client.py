"""librdkafka settings shared by the writer, the admin calls and the readers: the producer's
defaults and required settings, secret-safe display, and how confluent-kafka reports errors."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from airflow_provider_mongocdc.core.base.errors import ConfigError


class LibrdkafkaLog(logging.LoggerAdapter):
    """The ``logger`` of the provider's Kafka clients: librdkafka's lines, which confluent-kafka
    logs as ``log(level, "%s [%s] %s", facility, client name, text)``, in the logger
    ``airflow_provider_mongocdc.librdkafka``.

    librdkafka warns about a transactional producer's id request that it retries by itself
    (``GETPID ... Failed to acquire transactional PID from broker ...: retrying``): on a Kafka
    cluster's first transactional producer ("Coordinator load in progress", while the broker
    creates ``__transaction_state``), and while a new writer fences a killed one ("another
    concurrent operation on the same transaction"). Both pass within seconds; they are logged at
    DEBUG. When the retries never succeed, the writer's ``init_transactions`` times out and fails
    with an error in words (core/writer.py).
    """

    def log(self, level: int, msg: object, *args: Any, **kwargs: Any) -> None:
        if level >= logging.WARNING and _retried_by_librdkafka(args):
            level = logging.DEBUG
        super().log(level, msg, *args, **kwargs)


def _retried_by_librdkafka(args: tuple[Any, ...]) -> bool:
    """Whether confluent-kafka's arguments of a librdkafka line are a retried producer id request."""
    return len(args) == 3 and args[0] == "GETPID" and str(args[2]).endswith(": retrying")


librdkafka_log = LibrdkafkaLog(logging.getLogger("airflow_provider_mongocdc.librdkafka"))

# Throughput defaults for CDC batches; the Kafka connection's config and the caller's
# producer_config override them.
DEFAULT_PRODUCER_CONFIG: dict[str, Any] = {
    "linger.ms": 20,
    "batch.size": 1_000_000,
    "compression.type": "lz4",
    # A transaction can hold a whole snapshot chunk; the broker caps this with
    # transaction.max.timeout.ms (default 15 minutes).
    "transaction.timeout.ms": 600_000,
    "message.max.bytes": 1_000_000,
}
# Settings exactly-once delivery depends on: never overridden.
REQUIRED_PRODUCER_CONFIG: dict[str, Any] = {"enable.idempotence": True, "acks": "all"}

_ACCEPTED_REQUIRED_VALUES = {"enable.idempotence": ("true",), "acks": ("all", "-1")}
_SECRET_WORDS = ("password", "secret", "token", "jaas", "key.pem", "credentials", "keystore.key")


# -- configuration ---------------------------------------------------------------------------------
def is_secret_key(key: str) -> bool:
    lowered = key.lower()
    return any(word in lowered for word in _SECRET_WORDS)


def redact_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of a librdkafka configuration that is safe to print or log."""
    return {
        key: ("***" if is_secret_key(str(key)) and value not in (None, "") else value)
        for key, value in config.items()
        if not callable(value)
    }


def producer_config(
    kafka_config: Mapping[str, Any], transactional_id: str, overrides: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The configuration of a transactional producer: defaults < connection < overrides < required."""
    if not transactional_id:
        raise ConfigError(
            "The Kafka writer needs a transactional.id",
            cause="an empty transactional.id was given",
            fix="pass a stable id, the same for every run of the same connector task",
        )
    config: dict[str, Any] = dict(DEFAULT_PRODUCER_CONFIG)
    config.update(kafka_config)
    config.update(overrides or {})
    for key, required in REQUIRED_PRODUCER_CONFIG.items():
        given = config.get(key)
        if given is not None and str(given).lower() not in _ACCEPTED_REQUIRED_VALUES[key]:
            raise ConfigError(
                f"The Kafka producer setting {key}={given!r} is not allowed",
                cause=f"exactly-once delivery needs {key}={required}",
                fix=f"remove {key} from the Kafka connection's config",
            )
        config[key] = required
    config["transactional.id"] = transactional_id
    if not config.get("bootstrap.servers"):
        raise ConfigError(
            "The Kafka configuration has no bootstrap.servers",
            cause="the Kafka connection's librdkafka config lacks bootstrap.servers",
            fix='add "bootstrap.servers": "host1:9092,host2:9092" to the Kafka connection',
        )
    return config


def _unwrap(error: BaseException) -> KafkaError | None:
    """The KafkaError behind a confluent-kafka exception.

    confluent-kafka raises ``KafkaException(KafkaError)``; when a fatal error occurs while it runs
    a callback it can surface as ``SystemError`` whose ``__cause__`` is the KafkaException.
    """
    if isinstance(error, KafkaException) and error.args and isinstance(error.args[0], KafkaError):
        return error.args[0]
    cause = getattr(error, "__cause__", None)
    if isinstance(error, SystemError) and cause is not None:
        return _unwrap(cause)
    return None


def _kafka_call(function, *args, **kwargs):
    """Call a librdkafka operation; any failure comes out as KafkaException(KafkaError)."""
    try:
        return function(*args, **kwargs)
    except SystemError as error:
        # confluent-kafka reports some fatal errors raised inside its callbacks this way.
        kafka_error = _unwrap(error) or KafkaError(KafkaError._FAIL, f"librdkafka call failed: {error}")
        raise KafkaException(kafka_error) from None


# -- readers -----------------------------------------------------------------------------------------
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
