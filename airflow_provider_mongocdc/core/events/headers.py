"""Debezium's context headers: four Kafka headers on every data record and tombstone.

Debezium 3.x's ``EventDispatcher`` adds them when ``extended.headers.enabled`` is true (its
default), from ``DebeziumHeaderProducer.contextHeaders()``, in this order; Kafka Connect's
``SimpleHeaderConverter`` writes each string value as its UTF-8 bytes:

- ``__debezium.context.connectorLogicalName``: the logical name, ``topic.prefix``;
- ``__debezium.context.taskId``: the task's id, ``"0"`` (the MongoDB connector runs one task,
  whose ``mongodb.task.id`` is never set: its default 0);
- ``__debezium.context.connectorName``: the connector plug-in's name, ``"mongodb"``
  (``MongoDbConnectorConfig.getConnectorName()`` is ``Module.name()``, not Kafka Connect's
  ``name`` of the connector);
- ``__debezium.context.runId``: a UUID version 7 made when the task starts (``UUIDUtils``), the
  same on every record of that run. Here a run is one snapshot or window application (all its
  chunks and streams share it); the next run, or a retry, has a new one.

Heartbeats and transaction BEGIN/END records carry none, as Debezium's (they do not go through
the dispatcher's data-record receivers).
"""

from __future__ import annotations

import secrets
import time
import uuid

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.envelope import CONNECTOR

PREFIX = "__debezium.context."
CONNECTOR_LOGICAL_NAME = PREFIX + "connectorLogicalName"
TASK_ID = PREFIX + "taskId"
CONNECTOR_NAME = PREFIX + "connectorName"
RUN_ID = PREFIX + "runId"
# CdcSourceTaskContext.getTaskId() of the MongoDB connector's one task.
TASK = "0"

Headers = tuple[tuple[str, bytes], ...]


def new_run_id(now_ms: int | None = None) -> str:
    """A run id as Debezium's ``UUIDUtils.generateNewUUID()`` makes it: a UUID version 7 (48 bits
    of epoch milliseconds, 12 and 62 random bits), so that later runs sort after earlier ones."""
    millis = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    most = ((millis << 16) | (secrets.randbits(64) & 0x0FFF) | 0x7000) & 0xFFFFFFFFFFFFFFFF
    least = (secrets.randbits(64) & 0x3FFFFFFFFFFFFFFF) | 0x8000000000000000
    return str(uuid.UUID(int=(most << 64) | least))


def context_headers(config: ConnectorConfig, run_id: str) -> Headers:
    """The headers of a data record or tombstone of the run ``run_id`` (none when
    ``extended.headers.enabled`` is false)."""
    if not config.extended_headers_enabled:
        return ()
    return (
        (CONNECTOR_LOGICAL_NAME, config.topic_prefix.encode()),
        (TASK_ID, TASK.encode()),
        (CONNECTOR_NAME, CONNECTOR.encode()),
        (RUN_ID, run_id.encode()),
    )
