"""Heartbeat events, as Debezium writes them.

With ``heartbeat.interval.ms`` > 0 the streaming reader sends, at most once per interval, a record
to ``__debezium-heartbeat.<topic.prefix>`` (``topic.heartbeat.prefix`` / ``topic.heartbeat.name``)
with key ``{"serverName": <topic.prefix>}`` (schema ``io.debezium.connector.common.ServerNameKey``)
and value ``{"ts_ms": <epoch ms>}`` (schema ``io.debezium.connector.common.Heartbeat``). A
heartbeat travels in the same Kafka transaction as the offset it accompanies, so consumers see
that the connector is alive, and the offset moves on, even when no captured collection changes.
"""

from __future__ import annotations

import time

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.schema import (
    Framing,
    Record,
    compact,
    heartbeat_key_schema,
    heartbeat_value_schema,
)
from airflow_provider_mongocdc.core.events.topics import TopicNamer


class Heartbeat:
    """Builds heartbeat records and decides when one is due."""

    def __init__(self, config: ConnectorConfig, *, namer: TopicNamer | None = None):
        self.config = config
        self.interval_ms = config.heartbeat_interval_ms
        self.topic = (namer or TopicNamer(config)).heartbeat_topic
        key_framing = Framing(heartbeat_key_schema() if config.key_converter_schemas_enable else None)
        self._key = key_framing.wrap(compact({"serverName": config.topic_prefix}).encode())
        self._value_framing = Framing(
            heartbeat_value_schema() if config.value_converter_schemas_enable else None
        )
        self._last_ms: int | None = None

    @property
    def enabled(self) -> bool:
        return self.interval_ms > 0

    def record(self, ts_ms: int | None = None) -> Record:
        """A heartbeat record stamped ``ts_ms`` (now when omitted)."""
        if ts_ms is None:
            ts_ms = time.time_ns() // 1_000_000
        self._last_ms = ts_ms
        return Record(
            self.topic, self._key, self._value_framing.wrap(b'{"ts_ms":' + str(int(ts_ms)).encode() + b"}")
        )

    def due(self, now_ms: int) -> bool:
        """Whether a heartbeat should be sent at ``now_ms`` (never when disabled)."""
        if not self.enabled:
            return False
        return self._last_ms is None or now_ms - self._last_ms >= self.interval_ms

    def maybe(self, now_ms: int) -> Record | None:
        """A heartbeat record when one is due at ``now_ms``, else ``None``."""
        return self.record(now_ms) if self.due(now_ms) else None
