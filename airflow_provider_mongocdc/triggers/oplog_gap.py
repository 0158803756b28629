"""The trigger behind the deferrable :class:`~airflow_provider_mongocdc.sensors.oplog_gap.OplogGapSensor`.

Every ``poll_interval`` seconds it checks the connector's stored resume points with pymongo's
asyncio API (:class:`~airflow_provider_mongocdc.core.gap.checker.AsyncGapChecker`), until one of them
is no longer in the oplog. Its serialized arguments hold no secret: the canonical connector
properties and two connection ids, resolved in the triggerer at each poll (docs/design.md).

Events:

``{"status": "gap", "report": {...}}``
    A stored position is gone; the report is :meth:`GapReport.to_dict`.
``{"status": "error", "error": "<MongoCdcError subclass>", "problem": ..., "cause": ..., "fix": ..., "message": ...}``
    The check could not be made, or MongoDB refuses the stored offset as invalid (``OffsetError``).
    Not a gap: the sensor raises the same error (:func:`event_error`); the task's retries apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from airflow.triggers.base import BaseTrigger, TriggerEvent
from pymongo.errors import PyMongoError

from airflow_provider_mongocdc.core.base import errors
from airflow_provider_mongocdc.core.base.errors import ConfigError, ConnectionFailedError, MongoCdcError
from airflow_provider_mongocdc.core.base.redaction import redact_uri
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.checker import AsyncGapChecker
from airflow_provider_mongocdc.core.gap.report import GapReport, unsure_gap
from airflow_provider_mongocdc.core.offsets.store import OffsetStore


def error_event(error: MongoCdcError) -> TriggerEvent:
    return TriggerEvent(
        {
            "status": "error",
            "error": type(error).__name__,
            "problem": error.problem,
            "cause": error.cause,
            "fix": error.fix,
            "message": str(error),
        }
    )


def event_error(event: Mapping[str, Any]) -> MongoCdcError:
    """The error an ``error`` event carries, rebuilt as its :mod:`~.core.base.errors` class."""
    cls = getattr(errors, str(event.get("error")), None)
    if not (isinstance(cls, type) and issubclass(cls, MongoCdcError)):
        cls = MongoCdcError
    return cls(
        event.get("problem") or event.get("message") or "The oplog gap check failed",
        cause=event.get("cause"),
        fix=event.get("fix"),
    )


def log_report(log, report: GapReport, headroom_warning_s: float) -> None:
    """Log a check: each partition at INFO, low headroom as a WARNING, a gap as an ERROR."""
    for check in report.checks:
        log.info(
            "Connector %s, partition %s: %s", report.connector, check.partition.rs, check.note or check.status
        )
    for check in report.low_headroom(headroom_warning_s):
        log.warning(
            "Connector %s, partition %s: the stored position leaves the oplog in about %d s (below "
            "the headroom warning of %d s). Run the windows more often, or enlarge the oplog "
            "(replSetResizeOplog, or oplogMinRetentionHours), before data is lost",
            report.connector,
            check.partition.rs,
            check.headroom_seconds,
            int(headroom_warning_s),
        )
    for note in report.notes:
        log.info("Connector %s: %s", report.connector, note)
    for check in report.gaps:
        log.error(
            "Connector %s, partition %s: OPLOG GAP: %s", report.connector, check.partition.rs, check.note
        )


class OplogGapTrigger(BaseTrigger):
    """Poll until a stored resume point of the connector is no longer in the oplog.

    :param connector_config: the connector configuration (Debezium property names).
    :param mongo_conn_id: the MongoDB connection of the captured deployment.
    :param kafka_conn_id: the Kafka connection holding the offsets topic.
    :param poll_interval: seconds between checks.
    :param headroom_warning: seconds; partitions closer than this to being purged are logged as
        warnings.
    :param connector: Kafka Connect connector name of the offset keys (default: topic.prefix).
    """

    def __init__(
        self,
        connector_config: Mapping[str, Any],
        mongo_conn_id: str,
        kafka_conn_id: str,
        poll_interval: float = 60.0,
        headroom_warning: float = 6 * 3600.0,
        connector: str | None = None,
    ):
        super().__init__()
        self.connector_config = dict(connector_config)
        self.mongo_conn_id = mongo_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.poll_interval = float(poll_interval)
        self.headroom_warning = float(headroom_warning)
        self.connector = connector

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "connector_config": self.connector_config,
                "mongo_conn_id": self.mongo_conn_id,
                "kafka_conn_id": self.kafka_conn_id,
                "poll_interval": self.poll_interval,
                "headroom_warning": self.headroom_warning,
                "connector": self.connector,
            },
        )

    async def check_once(self) -> GapReport:
        """One check of every partition (resolves the connections, reads the offsets)."""
        from airflow_provider_mongocdc.hooks.kafka import kafka_config_from_connection
        from airflow_provider_mongocdc.hooks.topology import details_from_connection

        config = ConnectorConfig.from_properties(self.connector_config)
        mongo_conn = await BaseHook.aget_connection(self.mongo_conn_id)
        details = details_from_connection(
            mongo_conn,
            connect_timeout_ms=config.mongodb_connect_timeout_ms,
            server_selection_timeout_ms=config.mongodb_server_selection_timeout_ms,
        )
        kafka_conn = await BaseHook.aget_connection(self.kafka_conn_id)
        store = OffsetStore(kafka_config_from_connection(kafka_conn), config.offsets_topic)
        # The Kafka client is synchronous: read the offsets in a worker thread, off the event loop.
        contents = await asyncio.to_thread(store.read_everything)
        self._open_transactions = contents.open_transactions
        return await AsyncGapChecker(config, details, connector=self.connector).check(
            contents.states, offsets_topic=store.topic
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        while True:
            try:
                report = await self.check_once()
            except MongoCdcError as error:
                yield error_event(error)
                return
            except AirflowNotFoundException as error:
                yield error_event(
                    ConfigError(str(error), fix="create the connection, or pass the id of an existing one")
                )
                return
            except PyMongoError as error:
                yield error_event(
                    ConnectionFailedError(
                        "The oplog check failed on MongoDB",
                        cause=f"{type(error).__name__}: {redact_uri(str(error))}",
                        fix="this is not a gap: check the MongoDB deployment and the connection; the check "
                        "runs again with the task's next try",
                    )
                )
                return
            log_report(self.log, report, self.headroom_warning)
            if report.gap and getattr(self, "_open_transactions", None):
                self.log.warning("%s", unsure_gap(report.connector, self._open_transactions))
            elif report.gap:
                yield TriggerEvent({"status": "gap", "report": report.to_dict()})
                return
            await asyncio.sleep(self.poll_interval)
