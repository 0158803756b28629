"""OplogGapSensor: succeeds when a connector's stored resume point is no longer in the oplog.

The gap check (pymongo, confluent_kafka, bson) and its trigger are imported when the sensor runs:
the DAG files import this module at every parse, which needs none of them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.providers.common.compat.sdk import AirflowException, conf
from airflow.sdk import BaseSensorOperator, PokeReturnValue

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.dag_ids import RESNAPSHOT
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.headroom import HEADROOM_WARNING
from airflow_provider_mongocdc.links import ResnapshotTriggerLink
from airflow_provider_mongocdc.metrics import oplog_metrics
from airflow_provider_mongocdc.operators.base import (
    CONNECTOR_TEMPLATE_FIELDS,
    decode_connector_config,
    json_object,
)

if TYPE_CHECKING:
    from airflow_provider_mongocdc.core.gap.report import GapReport


def connector_properties(connector_config: Mapping[str, Any] | str) -> dict[str, Any]:
    """The connector configuration as a dict of properties (from a mapping or a JSON string)."""
    return json_object(
        decode_connector_config(connector_config),
        "The connector configuration",
        'give a JSON object of Debezium property names, e.g. {"topic.prefix": "shop"}',
    )


class OplogGapSensor(BaseSensorOperator):
    """Wait until one of a connector's stored resume points has been purged from the oplog.

    Each poke reads the connector's offsets (every partition of its ``topic.prefix`` in the
    offsets topic) and, for each partition, opens the change stream from the stored position and
    compares the stored cluster time with the oldest oplog entry (see
    :mod:`airflow_provider_mongocdc.core.gap.checker`). When a position is gone the sensor succeeds
    and returns the gap report (pushed to XCom): ``connector``, ``detected_at``, ``gap_partitions``,
    ``lost_seconds`` and, per partition, the stored time, the oldest oplog time, the lost seconds
    and the evidence. Until then it keeps poking, and logs a WARNING for every partition whose
    position would be purged within ``headroom_warning`` at the current oplog rate.

    Connection errors are not gaps: the poke fails (the task's retries apply). Nor is a stored
    resume token MongoDB refuses as invalid (260, 280): the poke fails with an
    :class:`~airflow_provider_mongocdc.core.base.errors.OffsetError` naming the offset and the
    ``mongocdc offsets`` commands that inspect and repair it.

    Through mongos the oplogs are read from the shards directly (same credentials); when the
    shards cannot be reached from the worker only the change stream check applies.

    :param connector_config: the connector configuration (Debezium property names), a mapping or
        a JSON string. (templated)
    :param mongo_conn_id: the MongoDB connection. (templated)
    :param kafka_conn_id: the Kafka connection holding the offsets topic. (templated)
    :param headroom_warning: warn when a stored position would be purged within this time
        (timedelta or seconds; default 6 hours).
    :param connect_max_attempts: reconnection attempts per poke (at most the connector's
        ``connect.max.attempts``); a poke that cannot reach MongoDB fails.
    :param connector: Kafka Connect connector name of the offset keys (default: ``topic.prefix``).
    :param deferrable: wait in the triggerer (:class:`OplogGapTrigger`, pymongo's asyncio API)
        instead of a worker slot; polls every ``poke_interval``.
    :param resnapshot_dag_id: the DAG the extra link opens (default ``mongocdc_resnapshot``).
    """

    template_fields: Sequence[str] = CONNECTOR_TEMPLATE_FIELDS
    template_fields_renderers = {"connector_config": "json"}
    ui_color = "#f0e4d0"
    operator_extra_links = (ResnapshotTriggerLink(),)

    def __init__(
        self,
        *,
        connector_config: Mapping[str, Any] | str,
        mongo_conn_id: str = "mongocdc_default",
        kafka_conn_id: str = "kafka_default",
        headroom_warning: timedelta | float = HEADROOM_WARNING,
        connect_max_attempts: int = 2,
        connector: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        resnapshot_dag_id: str = RESNAPSHOT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.connector_config = connector_config
        self.mongo_conn_id = mongo_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.headroom_warning = (
            headroom_warning
            if isinstance(headroom_warning, timedelta)
            else timedelta(seconds=float(headroom_warning))
        )
        self.connect_max_attempts = connect_max_attempts
        self.connector = connector
        self.deferrable = deferrable
        self.resnapshot_dag_id = resnapshot_dag_id

    # -- the check ---------------------------------------------------------------------------------
    def properties(self) -> dict[str, Any]:
        return connector_properties(self.connector_config)

    def check(self) -> GapReport:
        """One check of every partition of the connector (synchronous)."""
        from airflow_provider_mongocdc.core.gap.checker import GapChecker
        from airflow_provider_mongocdc.core.offsets.store import OffsetStore
        from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook
        from airflow_provider_mongocdc.hooks.topology import MongoTopologyHook

        config = ConnectorConfig.from_properties(self.properties())
        policy = BackoffPolicy(
            config.connect_backoff_initial_delay_ms,
            config.connect_backoff_max_delay_ms,
            min(config.connect_max_attempts, self.connect_max_attempts),
        )
        details = MongoTopologyHook.from_config(config, self.mongo_conn_id).get_connection_details()
        store = OffsetStore(KafkaConfigHook(self.kafka_conn_id).get_kafka_config(), config.offsets_topic)
        contents = store.read_everything()
        report = GapChecker(config, details, policy=policy, connector=self.connector).check(
            contents.states, offsets_topic=store.topic
        )
        self._open_transactions = contents.open_transactions
        return report

    def poke(self, context) -> PokeReturnValue:
        from airflow_provider_mongocdc.core.gap.report import unsure_gap
        from airflow_provider_mongocdc.triggers.oplog_gap import log_report

        report = self.check()
        log_report(self.log, report, self.headroom_warning.total_seconds())
        oplog_metrics(report.connector, report.headroom_seconds, report.gap)
        if report.gap and getattr(self, "_open_transactions", None):
            self.log.warning("%s", unsure_gap(report.connector, self._open_transactions))
            return PokeReturnValue(is_done=False)
        if report.gap:
            self.log.error(
                "Connector %s: the stored resume point of %s is no longer in the oplog; "
                "a re-snapshot is needed (DAG %s)",
                report.connector,
                ", ".join(report.to_dict()["gap_partitions"]),
                self.resnapshot_dag_id,
            )
            return PokeReturnValue(is_done=True, xcom_value=report.to_dict())
        return PokeReturnValue(is_done=False)

    # -- deferrable --------------------------------------------------------------------------------
    def execute(self, context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        from airflow_provider_mongocdc.triggers.oplog_gap import OplogGapTrigger

        # Validate before handing over to the triggerer, so a bad configuration fails here. The
        # trigger gets the canonical properties of the same configuration: the properties the
        # connector ignores (producer.override.* may hold Kafka credentials) are not stored in
        # Airflow's trigger table.
        config = ConnectorConfig.from_properties(self.properties())
        self.defer(
            trigger=OplogGapTrigger(
                config.to_properties(),
                self.mongo_conn_id,
                self.kafka_conn_id,
                poll_interval=self.poke_interval,
                headroom_warning=self.headroom_warning.total_seconds(),
                connector=self.connector,
            ),
            method_name="execute_complete",
            timeout=timedelta(seconds=self.timeout),
        )

    def execute_complete(self, context, event: Mapping[str, Any]) -> dict[str, Any]:
        if event.get("status") == "gap":
            report = event["report"]
            oplog_metrics(report.get("connector") or self.connector or "", None, True)
            self.log.error(
                "Connector %s: the stored resume point of %s is no longer in the oplog; "
                "a re-snapshot is needed (DAG %s)",
                report.get("connector"),
                ", ".join(report.get("gap_partitions") or []),
                self.resnapshot_dag_id,
            )
            return report
        if event.get("status") == "error":
            from airflow_provider_mongocdc.triggers.oplog_gap import event_error

            # A MongoCdcError, not an AirflowException: soft_fail must not turn a failed check
            # into a skipped one.
            raise event_error(event)
        raise AirflowException(f"The oplog gap trigger sent an unknown event: {event!r}")
