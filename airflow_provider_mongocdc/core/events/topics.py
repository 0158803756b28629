"""Topic names, as Debezium's default topic naming strategy builds them.

Data: ``<topic.prefix>.<database>.<collection>``; transaction metadata:
``<topic.prefix>.<topic.transaction>``; heartbeats: ``<topic.heartbeat.prefix>.<topic.prefix>``,
or ``topic.heartbeat.name`` when set; offsets: ``offset.storage.topic`` (``<prefix>.offsets``).
The parts are joined with ``topic.delimiter`` (``.``). A character Kafka does not allow in a topic
name becomes ``_``, as in Debezium, and the name is cut to Kafka's 249 characters. Schema names
derived from a topic name are adjusted further (:mod:`airflow_provider_mongocdc.core.events.schema`), so two collections may share one:
docs/design.md, "Events", "Topic and schema names".
"""

from __future__ import annotations

import re

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

MAX_TOPIC_LENGTH = 249
_INVALID = re.compile(r"[^A-Za-z0-9._-]")


def sanitize_topic_name(name: str) -> str:
    """Replace characters Kafka forbids in topic names with ``_`` and cut to 249 characters."""
    cleaned = _INVALID.sub("_", name)
    if cleaned in (".", ".."):
        cleaned = cleaned.replace(".", "_")
    return cleaned[:MAX_TOPIC_LENGTH]


class TopicNamer:
    """The topic names of one connector configuration; data topic names are cached."""

    __slots__ = ("config", "_cache")

    def __init__(self, config: ConnectorConfig):
        self.config = config
        self._cache: dict[tuple[str, str], str] = {}

    def data_topic(self, database: str, collection: str) -> str:
        """The topic of a collection's change events."""
        key = (database, collection)
        topic = self._cache.get(key)
        if topic is None:
            delimiter = self.config.topic_delimiter
            topic = sanitize_topic_name(delimiter.join((self.config.topic_prefix, database, collection)))
            self._cache[key] = topic
        return topic

    @property
    def transaction_topic(self) -> str:
        """The topic of transaction BEGIN/END events."""
        return sanitize_topic_name(
            self.config.topic_delimiter.join((self.config.topic_prefix, self.config.topic_transaction))
        )

    @property
    def heartbeat_topic(self) -> str:
        """The topic of heartbeat events."""
        if self.config.topic_heartbeat_name:
            return self.config.topic_heartbeat_name
        return sanitize_topic_name(
            self.config.topic_delimiter.join((self.config.topic_heartbeat_prefix, self.config.topic_prefix))
        )

    @property
    def offsets_topic(self) -> str:
        """The compacted topic of the connector's offsets."""
        return self.config.offsets_topic
