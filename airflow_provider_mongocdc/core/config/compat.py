"""Kafka Connect and Debezium properties that mean nothing here: older names accepted with a
deprecation warning (:data:`ALIASES`), properties accepted and ignored with a warning saying why
(ignoring them cannot change the events), and properties refused (ignoring them would silently
change the output or carry a secret)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_mongocdc.core.config.parsing import parse_boolean

# Older names accepted with a deprecation warning: alias -> (canonical name, value transform).
ALIASES: dict[str, tuple[str, Callable[[Any], Any] | None]] = {
    "mongodb.name": ("topic.prefix", None),
    "heartbeat.topics.prefix": ("topic.heartbeat.prefix", None),
    "database.whitelist": ("database.include.list", None),
    "database.blacklist": ("database.exclude.list", None),
    "collection.whitelist": ("collection.include.list", None),
    "collection.blacklist": ("collection.exclude.list", None),
    "field.blacklist": ("field.exclude.list", None),
    "event.oversize.handling.mode": ("cursor.oversize.handling.mode", None),
    "sanitize.field.names": (
        "field.name.adjustment.mode",
        lambda raw: "avro" if parse_boolean(raw) else "none",
    ),
}

# Kafka Connect / Debezium properties that cannot change the events here: accepted, ignored.
IGNORED: dict[str, str] = {
    "tasks.max": "parallelism comes from Spark (snapshot.max.threads) and one stream per replica set",
    "max.queue.size": "events go straight from the change stream to the Kafka transaction; "
    "max.batch.size bounds a batch",
    "max.queue.size.in.bytes": "events go straight from the change stream to the Kafka "
    "transaction; max.batch.size bounds a batch",
    "poll.interval.ms": "windows are scheduled by Airflow",
    "retriable.restart.connector.wait.ms": "retries are Airflow task retries",
    "snapshot.delay.ms": "snapshots are scheduled by Airflow",
    "streaming.delay.ms": "windows are scheduled by Airflow",
    "offset.flush.interval.ms": "offsets are committed with every Kafka transaction",
    "offset.flush.timeout.ms": "offsets are committed with every Kafka transaction",
    "source.struct.version": "the source block is always Debezium's v2 layout",
    "topic.naming.strategy": "topic names follow Debezium's default naming strategy",
    "topic.cache.size": "topic names are cached without a size limit per run",
    "custom.metric.tags": "there are no JMX metrics",
    "notification.enabled.channels": "progress is reported in Airflow task logs",
    "incremental.snapshot.watermarking.strategy": "the watermarks of incremental snapshots are "
    "cluster times read around each chunk: nothing is written to MongoDB",
    "internal.mongodb.allow.offset.invalidation": "offsets are stored by this connector, not "
    "by Kafka Connect",
    "errors.log.enable": "errors are reported in Airflow task logs",
    "errors.log.include.messages": "errors are reported in Airflow task logs",
    "errors.max.retries": "retries are Airflow task retries",
    "errors.retry.delay.max.ms": "retries are Airflow task retries",
    "errors.retry.timeout": "retries are Airflow task retries",
    "errors.tolerance": "failed events always stop the run without moving the offset",
}
IGNORED_PREFIXES: dict[str, str] = {
    "producer.override.": "Kafka producer settings come from the Airflow Kafka connection",
    "consumer.override.": "Kafka consumer settings come from the Airflow Kafka connection",
    "key.converter.": "only key.converter.schemas.enable applies to the JSON output",
    "value.converter.": "only value.converter.schemas.enable applies to the JSON output",
}

_CONNECTION = (
    "set it in the Airflow MongoDB connection (mongo_conn_id) instead, so it never "
    "travels in the connector properties"
)
# Properties whose meaning cannot be honoured: refused, with the reason and what to do.
UNSUPPORTED: dict[str, str] = {
    "mongodb.connection.string": "addresses and credentials are not connector properties; " + _CONNECTION,
    "mongodb.hosts": "addresses are not connector properties; " + _CONNECTION,
    "mongodb.user": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.password": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.authsource": "credentials are not connector properties; " + _CONNECTION,
    "mongodb.authentication.class": "authentication is configured in the Airflow MongoDB connection",
    "transforms": "single message transforms are not available; transform downstream of Kafka",
    "predicates": "single message transforms are not available; transform downstream of Kafka",
    "signal.data.collection": "signals are not available; trigger a re-snapshot (incremental or "
    "blocking) from Airflow",
    "signal.enabled.channels": "signals are not available; trigger a re-snapshot from Airflow",
    "snapshot.mode.custom.name": "custom snapshotters are not available",
    "schema.history.internal": "MongoDB has no schema history",
}
UNSUPPORTED_PREFIXES: dict[str, str] = {
    "mongodb.ssl.": "TLS is configured in the Airflow MongoDB connection",
    "transforms.": "single message transforms are not available; transform downstream of Kafka",
    "predicates.": "single message transforms are not available",
    "signal.": "signals are not available; trigger a re-snapshot from Airflow",
    "snapshot.mode.configuration.based.": "configuration-based snapshots are not available",
    "schema.history.internal.": "MongoDB has no schema history",
}
