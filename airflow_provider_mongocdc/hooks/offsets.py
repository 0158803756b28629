"""Airflow hook for a connector's offsets: show them, reset them, move them, import them from or
export them to a Debezium MongoDB connector's Kafka Connect offsets topic.

``reset``, ``set_position``, ``import_debezium`` and ``export_debezium`` hold the connector's
lease (kind ``offsets``, see :mod:`airflow_provider_mongocdc.core.offsets.lease`) for the change: a
running window or snapshot would overwrite it when it commits, so they raise ``LeaseHeldError``
naming the holder while one runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseHook
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.offsets.debezium import DebeziumOffset
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook


class OffsetStoreHook(BaseHook):
    """The offsets of the connector ``topic_prefix``, in ``offsets_topic`` (default
    ``<topic_prefix>.offsets``) on the Kafka cluster of ``kafka_conn_id``.

    :param kafka_conn_id: a Kafka connection (type ``mongocdc_kafka`` or ``kafka``).
    :param topic_prefix: the connector's ``topic.prefix`` (the offsets' ``server_id``).
    :param offsets_topic: the connector's ``offset.storage.topic``, when set.
    :param connector: Kafka Connect connector name in the offset keys (default: ``topic_prefix``).
    """

    conn_name_attr = "kafka_conn_id"
    default_conn_name = KafkaConfigHook.default_conn_name
    hook_name = "MongoDB CDC offsets"

    def __init__(
        self,
        kafka_conn_id: str = default_conn_name,
        topic_prefix: str | None = None,
        offsets_topic: str | None = None,
        connector: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not topic_prefix:
            raise ConfigError(
                "OffsetStoreHook needs the connector's topic.prefix",
                fix="pass topic_prefix=<the connector's topic.prefix>",
            )
        self.kafka_conn_id = kafka_conn_id
        self.topic_prefix = topic_prefix
        self.offsets_topic = offsets_topic or f"{topic_prefix}.offsets"
        self.connector = connector
        self._store: OffsetStore | None = None

    @classmethod
    def from_config(cls, config, kafka_conn_id: str = default_conn_name) -> OffsetStoreHook:
        """A hook for a ConnectorConfig's topic.prefix and offset.storage.topic."""
        return cls(kafka_conn_id, config.topic_prefix, config.offsets_topic)

    @property
    def store(self) -> OffsetStore:
        if self._store is None:
            kafka_config = KafkaConfigHook(self.kafka_conn_id).get_kafka_config()
            self._store = OffsetStore(kafka_config, self.offsets_topic)
        return self._store

    def get_conn(self) -> OffsetStore:
        return self.store

    def partition(self, rs: str) -> OffsetPartition:
        """The offset partition of replica set ``rs`` (or ``cluster``) of this connector."""
        return OffsetPartition(self.topic_prefix, rs, self.connector)

    def read(self, rs: str) -> OffsetState | None:
        return self.store.read(self.partition(rs))

    def show(self, rs: str | None = None) -> dict[str, Any]:
        """The connector's committed offsets (one partition or all), JSON-serialisable."""
        shown = self.store.show(self.topic_prefix, rs, self.connector)
        shown["topic_prefix"] = self.topic_prefix
        return shown

    def reset(self, rs: str) -> tuple[OffsetState | None, None]:
        """Delete the offset (and snapshot chunk markers) of ``rs``; returns ``(before, None)``.
        Raises ``LeaseHeldError`` while a window or snapshot of the connector runs."""
        with self._lease("reset"):
            return self.store.reset(self.partition(rs)), None

    def set_position(
        self, rs: str, *, resume_token: Mapping[str, Any] | None = None, cluster_time: Timestamp | None = None
    ) -> tuple[OffsetState | None, OffsetState]:
        """Move ``rs`` to a resume token and/or cluster time; returns ``(before, after)``.
        Raises ``LeaseHeldError`` while a window or snapshot of the connector runs."""
        with self._lease("set_position"):
            return self.store.set_position(self.partition(rs), Position(resume_token, cluster_time))

    def import_debezium(
        self, rs: str, connect_offsets_topic: str, debezium_connector: str | None = None
    ) -> tuple[DebeziumOffset, OffsetState | None, OffsetState]:
        """Move ``rs`` to the position a Debezium MongoDB connector stored in the Kafka Connect
        offsets topic ``connect_offsets_topic`` (connector ``debezium_connector``, or the only one
        whose server_id is this topic prefix); returns ``(the Debezium entry, before, after)``.
        Raises ``LeaseHeldError`` while a window or snapshot of the connector runs."""
        with self._lease("import_debezium"):
            return self.store.import_debezium(self.partition(rs), connect_offsets_topic, debezium_connector)

    def export_debezium(
        self, rs: str, connect_offsets_topic: str, debezium_connector: str
    ) -> tuple[OffsetState, bytes, bytes]:
        """Write ``rs``'s position into the Kafka Connect offsets topic as Debezium 3.x's offset of
        connector ``debezium_connector``; returns ``(our state, key, value)``. Raises
        ``LeaseHeldError`` while a window or snapshot of the connector runs."""
        with self._lease("export_debezium"):
            return self.store.export_debezium(self.partition(rs), connect_offsets_topic, debezium_connector)

    def _lease(self, action: str):
        """The connector's lease, held for an offsets change."""
        from airflow_provider_mongocdc.core.offsets.lease import (
            OFFSETS,
            OFFSETS_TTL,
            ConnectorLease,
            offsets_owner,
        )

        lease = ConnectorLease(self.store.kafka_config, self.topic_prefix, self.offsets_topic)
        return lease.hold(offsets_owner(action, tool="OffsetStoreHook"), OFFSETS, OFFSETS_TTL)
