"""The operator that runs one bounded change-stream window (``spark_apps/stream_window.py``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.offsets.lease import WINDOW, task_owner
from airflow_provider_mongocdc.core.window.params import OpenSettings, WindowParams, parse_time
from airflow_provider_mongocdc.core.window.summary import describe_window, position_words
from airflow_provider_mongocdc.operators.base import MongoCdcSparkSubmitOperator, parse_connector_config


def window_end_for(context: Any, now: datetime | None = None) -> datetime:
    """The window end of a task run: the data interval's end, or now when that lies in the future
    or when the run has no data interval (a manual run of an unscheduled DAG)."""
    now = (now or datetime.now(timezone.utc)).astimezone(timezone.utc)
    end = context.get("data_interval_end") if context is not None else None
    if end is None:
        return now
    end = parse_time(end)
    return now if end > now else end


class MongoStreamWindowOperator(MongoCdcSparkSubmitOperator):
    """Capture the changes from the stored offset up to the end of the data interval.

    Every change of the captured collections before the window end becomes a Debezium-compatible
    event in Kafka; the events and the new offset are committed together, exactly once. The
    window end is the run's ``data_interval_end``, or now when that lies in the future (or the run
    has none). A snapshot must have run first (MongoSnapshotOperator). Returns (and pushes to
    XCom) the window's summary: events by operation and collection, transactions, bytes, start
    and end positions per stream, lag percentiles (processing time minus cluster time, ms),
    duration and batches committed.

    :param idle_timeout: seconds the window waits for a change or cluster-time progress (default
        30, at least 20: an idle MongoDB moves its cluster time with a no-op every 10 s). When
        the server's cluster time does not reach the window end (which lies in the past) within
        it, the task commits what it read and fails with ``WindowEndNotReachedError``'s message;
        Airflow's retry continues from the committed offset. (templated)
    :param max_duration: seconds after which the window stops at the next point between
        transactions, storing its position (default 3600). (templated)
    :param lease_ttl: how long the lease lasts if this task dies without releasing it (default:
        the task's execution_timeout, else 2 hours).
    :param stream_in_driver: where a window of ONE stream (one replica set, or a sharded cluster
        read through mongos) runs it: ``"auto"`` (default) in the application's Python driver when
        the Spark master is ``local[...]``, else in a Spark task; ``True`` always in the driver
        (the machine running spark-submit then reads MongoDB and writes Kafka); ``False`` always
        in a Spark task. In the driver the window starts no SparkContext and no Python worker
        (seconds and CPU-seconds less per window). Windows of several streams (one per shard)
        always run one Spark task per stream.
    :param open_window: make the window an open one: it reads on past its end while changes keep
        coming, commits at least every ``commit_interval`` (default 1 s) and closes when no change
        came for ``idle`` (default 30 s) or after ``max_open`` (default 50 min). A mapping of these
        keys (durations as seconds or texts like ``"30s"``, ``"50min"``; each optional), ``True``
        for the defaults, or None (default): a bounded window, which ends at its window end.
    :param tables: the connector's tables (the ``tables`` object of
        :class:`~airflow_provider_mongocdc.operators.table_apply.MongoTableApplyOperator`): with an
        open window, the tables follow the topics while it is open (a pass whenever a topic moved,
        at most every ``follow_every``, default 5 s; ``null`` switches it off), and the apply after the
        window finds little left. None (default): the tables are applied after the window only.
    Other parameters: see :class:`MongoCdcSparkSubmitOperator` (``connector_config``,
    ``mongo_conn_id``, ``kafka_conn_id``, ``spark_conn_id`` and SparkSubmitOperator's).
    """

    application_name = "stream_window"
    lease_kind = WINDOW
    template_fields: Sequence[str] = (
        *MongoCdcSparkSubmitOperator.template_fields,
        "idle_timeout",
        "max_duration",
    )

    def __init__(
        self,
        *,
        idle_timeout: float | None = None,
        max_duration: float | None = None,
        lease_ttl: timedelta | None = None,
        stream_in_driver: bool | str = "auto",
        open_window: Mapping[str, Any] | bool | None = None,
        tables: Mapping[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        if stream_in_driver not in (True, False, "auto"):
            raise ConfigError(
                f"stream_in_driver {stream_in_driver!r} is not one of True, False, 'auto'",
                fix="leave the default 'auto' (in the driver on a local Spark master), or pass True or False",
            )
        # Checked here, when the DAG is parsed: every bad value at once.
        self.open_window = OpenSettings.from_entry(open_window).to_entry() if open_window else None
        self.tables = TableSettings.from_mapping(tables).to_json() if tables is not None else None
        super().__init__(**kwargs)
        self.idle_timeout = idle_timeout
        self.max_duration = max_duration
        self.lease_ttl = lease_ttl
        self.stream_in_driver = stream_in_driver

    def job_params(self, context, config: ConnectorConfig) -> dict[str, Any]:
        params = {"window_end": iso_z(window_end_for(context))}
        if self.idle_timeout is not None:
            params["idle_timeout_s"] = float(self.idle_timeout)
        if self.max_duration is not None:
            params["max_duration_s"] = float(self.max_duration)
        params["stream_in_driver"] = self._stream_in_driver()
        if context and "ti" in context:  # its retries count what its earlier tries committed
            params["task_run"] = task_owner(context)
        if self.open_window is not None:
            params.update(OpenSettings.from_entry(self.open_window).to_params())
            settings = TableSettings.from_mapping(self.tables) if self.tables is not None else None
            if settings is not None and settings.follow_every_s is not None:
                from airflow_provider_mongocdc.operators.table_apply import connection_options

                params["follow_delta"] = {
                    "tables": settings.to_json(),
                    "storage_options": connection_options(settings),
                    "every": settings.follow_every_s,
                }
        # Validate here, before anything is submitted.
        WindowParams.from_params(params, config)
        return params

    def _stream_in_driver(self) -> bool:
        """stream_in_driver, with "auto" resolved from the Spark connection's master."""
        if self.stream_in_driver != "auto":
            return bool(self.stream_in_driver)
        self._use_rendered_spark_connection()  # templated by now: the hook reads the rendered connection
        return self._get_hook().local_master()

    def send_metrics(self, config: ConnectorConfig, summary: dict[str, Any]) -> None:
        from airflow_provider_mongocdc.metrics import window_metrics

        window_metrics(config.topic_prefix, summary)

    def summarize(self, context, summary: dict[str, Any]) -> dict[str, Any]:
        config = parse_connector_config(self.connector_config)
        for line in describe_window(summary, config.in_words()):
            self.log.info("%s", line)
        if summary.get("status") == "skipped":
            return summary
        for partition in summary.get("partitions", []):
            if not partition.get("reached_end"):
                self.log.warning(
                    "Stream window of %s, stream %s: stopped before the window end (%s); the next "
                    "window continues from %s",
                    config.in_words(),
                    partition.get("partition"),
                    partition.get("stop_reason"),
                    position_words(partition.get("end_position")),
                )
        return summary
