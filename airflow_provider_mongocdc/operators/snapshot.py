"""The operator that runs a snapshot (``spark_apps/snapshot.py``).

What reads MongoDB or Kafka is imported when the task runs: the DAG files import this module at
every parse, which needs neither pymongo nor confluent_kafka.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT
from airflow_provider_mongocdc.operators.base import ApplicationFailed, MongoCdcSparkSubmitOperator


class MongoSnapshotOperator(MongoCdcSparkSubmitOperator):
    """Copy the captured collections to Kafka as read events, then hand over to streaming.

    What runs depends on ``snapshot.mode`` and the stored offsets: ``initial`` (default) copies
    when there is no offset and does nothing once a snapshot completed; ``always`` copies on
    every run and keeps a stored offset that is still in the oplog (so the next window streams
    every change since the previous one, after the read events; without ``force``, this decides
    ``reset_offset``); ``initial_only`` copies like ``initial`` (stream windows then stay idle);
    ``no_data`` records the stream position without copying; ``when_needed`` copies like
    ``initial`` and also when the stored resume point is no longer in the oplog. A snapshot
    interrupted earlier (killed, failed) is resumed: its committed chunks are skipped.

    The copy runs as a Spark job: collections are cut into chunks of about
    ``snapshot.chunk.size`` documents, copied by at most ``snapshot.max.threads`` parallel tasks;
    each chunk's events and its progress marker commit in one Kafka transaction, so every
    document's read event is delivered exactly once. Returns (and pushes to XCom) the summary:
    snapshot id, action and reason, documents per collection, bytes, chunks (copied and skipped as
    already committed), duration, the recorded start position and the resulting offsets.

    The connector's lease (:mod:`airflow_provider_mongocdc.core.offsets.lease`) is held while the snapshot
    runs, so a stream window of the same connector cannot run meanwhile (and a running window
    makes this task fail with LeaseHeldError naming it).

    :param collections: ``["<db>.<collection>", ...]`` (or a comma-separated string) to copy
        instead of every captured collection, e.g. for a re-snapshot of chosen collections.
        Each must be captured by the connector's include/exclude lists. (templated)
    :param force: run a new snapshot even when ``snapshot.mode`` finds nothing to do (a completed
        snapshot or an offset exists). (templated)
    :param reset_offset: whether completing the snapshot moves the streaming offset to the
        position recorded before copying. True (default) for a full or gap-filling snapshot;
        False for a re-snapshot of chosen collections while streaming goes on without a gap.
        (templated)
    :param lease_ttl: how long the connector's lease lasts if this task dies without releasing it
        (a timedelta or seconds; default: the task's ``execution_timeout``, else 2 hours). While
        the task runs the lease is renewed every third of it, so a snapshot may run longer; if a
        renewal finds the lease lost (it expired and another task took it), the Spark job is
        killed and the task fails with ``LeaseLostError``.
    Other parameters: see :class:`MongoCdcSparkSubmitOperator` (``connector_config``,
    ``mongo_conn_id``, ``kafka_conn_id``, ``spark_conn_id`` and SparkSubmitOperator's).
    """

    application_name = "snapshot"
    lease_kind = SNAPSHOT
    # A run with nothing to do (snapshot.mode found a completed snapshot) is no update of the
    # connector's Asset: the outlet is the AssetAlias, given the Asset only when data was copied.
    asset_event_on_every_run = False
    template_fields: Sequence[str] = (
        *MongoCdcSparkSubmitOperator.template_fields,
        "collections",
        "force",
        "reset_offset",
    )

    def __init__(
        self,
        *,
        collections: Sequence[str] | str | None = None,
        force: bool | str = False,
        reset_offset: bool | str = True,
        lease_ttl: timedelta | float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.collections = collections
        self.force = force
        self.reset_offset = reset_offset
        self.lease_ttl = lease_ttl

    def submit(self, context, config: ConnectorConfig, spec: JobSpec) -> dict[str, Any]:
        """Submit the snapshot application, unless ``snapshot.mode`` finds nothing to do (without
        ``force``): most scheduled runs are decided here, without a spark-submit."""
        from airflow_provider_mongocdc.core.snapshot.assessment import nothing_to_do

        if not spec.params.get("force"):
            try:
                summary = nothing_to_do(spec)
            except MongoCdcError as error:  # the same one-line error the application gives
                raise ApplicationFailed(str(error)) from None
            if summary is not None:
                summary = self.summarize(context, summary | {"submitted": False})
                return self.report_run(context, config, summary)
        return super().submit(context, config, spec)

    def job_params(self, context, config: ConnectorConfig) -> dict[str, Any]:
        from airflow_provider_mongocdc.core.snapshot.plan import parse_namespaces

        namespaces = parse_namespaces(self.collections)  # validated before anything is submitted
        return {
            "collections": [f"{db}.{coll}" for db, coll in namespaces] if namespaces else None,
            "force": _as_bool(self.force, "force"),
            "reset_offset": _as_bool(self.reset_offset, "reset_offset"),
        }

    def wrote_data(self, summary: dict[str, Any]) -> bool:
        return summary.get("action") not in ("nothing", "record_position")

    def send_metrics(self, config: ConnectorConfig, summary: dict[str, Any]) -> None:
        from airflow_provider_mongocdc.metrics import snapshot_metrics

        snapshot_metrics(config.topic_prefix, summary)

    def summarize(self, context, summary: dict[str, Any]) -> dict[str, Any]:
        action = summary.get("action")
        if action == "nothing":
            self.log.info("No snapshot needed: %s", summary.get("reason"))
        elif action == "record_position":
            self.log.info("Stream position recorded without copying data (%s)", summary.get("reason"))
        else:
            self.log.info(
                "Snapshot %s %s: %d documents (%s) in %d chunks (%d skipped as already committed), "
                "%d bytes, %.1f s; position recorded before copying: %s",
                summary.get("snapshot_id"),
                "resumed and completed" if summary.get("resumed") else "completed",
                summary.get("documents", 0),
                ", ".join(f"{ns}: {n}" for ns, n in (summary.get("collections") or {}).items()) or "none",
                summary.get("chunks", 0),
                summary.get("chunks_skipped", 0),
                summary.get("bytes", 0),
                summary.get("duration_s", 0.0),
                summary.get("start_position"),
            )
        return summary


def _as_bool(value: Any, name: str) -> bool:
    """A templated boolean parameter; empty (``None``, ``"None"``, ``""``) is false."""
    from airflow_provider_mongocdc.core.snapshot.assessment import bool_param

    empty = value is None or str(value).strip().lower() in ("none", "")
    return bool_param({name: None if empty else value}, name, default=False)
