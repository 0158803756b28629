"""spark-submit entry point of a bounded change-stream window.

    spark-submit stream_window.py --job-spec PATH [--result PATH]

The driver lists the deployment's change streams (one, or one per shard replica set with
``mongodb.connection.mode=replica_set``), checks that each can start from its stored offset (clear
errors before any task runs), runs one Spark task per stream (``core.window.stream_window.run_stream_tasks``) and
merges their summaries. With the ``stream_in_driver`` parameter (the operator sets it for one
stream on a local master), a window of one stream runs it in this driver process instead,
without starting the SparkContext. A cluster time that stalled before a window end in the past fails the run
with ``WindowEndNotReachedError`` once every stream has committed what it read. The job spec's
``params``: ``window_end`` (ISO-8601, required), ``idle_timeout_s``, ``max_duration_s``,
``poll_ms``, ``commit_interval_s``, ``stream_in_driver``, and for an open window ``open_idle_s`` and
``max_open_s`` (:class:`~airflow_provider_mongocdc.core.window.params.WindowParams`). Connection
details travel to the tasks inside the task closure, never through Spark's configuration or
environment. Reasons: docs/design.md, "Stream windows".
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.lifetime import die_with_parent
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.headers import new_run_id
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.window.errors import end_not_reached_error
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_stream_tasks
from airflow_provider_mongocdc.core.window.streams import check_offsets, plan_streams
from airflow_provider_mongocdc.core.window.summary import empty_summary, merge_summaries
from airflow_provider_mongocdc.spark_apps import delta_follow
from airflow_provider_mongocdc.spark_apps.runtime import main

APPLICATION = "stream_window"
log = logging.getLogger("airflow_provider_mongocdc.stream_window")


def job(spark: Any, spec: JobSpec) -> dict[str, Any]:
    started = time.monotonic()
    config = ConnectorConfig.from_properties(spec.connector)
    params = WindowParams.from_params(spec.params, config)
    targets = plan_streams(
        connection_details(spec.mongo, config), config, policy=BackoffPolicy.from_config(config)
    )
    starts = check_offsets(config, spec.kafka, targets)
    if all(position is None for position in starts.values()):
        log.info("Streaming disabled by snapshot.mode=initial_only for %s", config.in_words())
        return merge_summaries(
            [empty_summary(target.partition, params) for target in targets],
            params.window_end,
            time.monotonic() - started,
        )
    log.info(
        "%s of %s %s %s over %d stream(s): %s",
        "Open window" if params.open else "Window",
        config.in_words(),
        "from" if params.open else "up to",  # an open window reads on past its end
        iso_z(params.window_end),
        len(targets),
        ", ".join(t.partition for t in targets),
    )
    # Incremental snapshot chunks are de-duplicated against the one stream of the connector.
    # One run id for the events of every stream of this run (Debezium's runId header).
    params = dataclasses.replace(params, incremental_snapshots=len(targets) == 1, run_id=new_run_id())
    # The streams run side by side and their writers were taken over above (check_offsets): each
    # waits for its siblings' commits under way on the offsets topic rather than fence them.
    task = functools.partial(
        run_stream_tasks,
        connector=config.to_properties(),
        kafka=dict(spec.kafka),
        params=params.to_params(),
        streams=[target.partition for target in targets],
    )
    checked = time.monotonic()
    jobs = [target.to_json() for target in targets]
    # An open window's tables follow its topics while it is open (spark_apps/delta_follow.py).
    follower = delta_follow.start(spec) if params.open_idle_s is not None else None
    try:
        if len(targets) == 1 and params.stream_in_driver:
            summaries, phases = run_in_driver(task, jobs)
        else:
            summaries, phases = run_in_spark_tasks(spark, task, jobs)
    finally:
        tables = follower.stop() if follower is not None else None
    phases = {"driver_checks": round(checked - started, 3), **phases}
    summary = merge_summaries(summaries, params.window_end, time.monotonic() - started)
    if tables is not None:
        summary["tables"] = tables
    # Driver phases in wall seconds (each stream's own phases are in its partitions[].phases_s).
    summary["phases_s"] = phases
    error = end_not_reached_error(summary, params)
    if error is not None:
        for item in summary["partitions"]:
            log.warning(
                "Window of %s, stream %s: %s, %d events committed, offset %s",
                config.in_words(),
                item["partition"],
                item["stop_reason"],
                item["events"],
                item["end_position"],
            )
        raise error
    return summary


def run_in_driver(task: Callable[[list[str]], Any], jobs: list[str]) -> tuple[list[Any], dict[str, float]]:
    """One stream, run here: no SparkContext, no Python worker (docs/design.md, "Stream windows").
    This process now dies with the JVM that started it: it no longer waits on the Py4J gateway,
    through which it would notice the JVM's death."""
    tie = die_with_parent(os.getppid())
    if tie is not None:
        tie()
    started = time.monotonic()
    summaries = list(task(jobs))
    return summaries, {"in_driver": round(time.monotonic() - started, 3)}


def run_in_spark_tasks(
    spark: Any, task: Callable[[list[str]], Any], jobs: list[str]
) -> tuple[list[Any], dict[str, float]]:
    """One Spark task per stream; their summaries."""
    started = time.monotonic()
    context = spark.sparkContext  # the JVM's SparkContext and the Py4J gateway's use start here
    spark_started = time.monotonic()
    summaries = context.parallelize(jobs, len(jobs)).mapPartitions(task).collect()
    return summaries, {
        "spark_start": round(spark_started - started, 3),
        "tasks": round(time.monotonic() - spark_started, 3),
    }


if __name__ == "__main__":
    main(APPLICATION, job)
