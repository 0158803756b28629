"""spark-submit entry point of the snapshot: ``snapshot.py --job-spec PATH [--result PATH]``.

The job spec (written by ``MongoSnapshotOperator``) holds the connector configuration, the MongoDB
connection details, the Kafka configuration and the operator's parameters: ``collections``
(``"<db>.<collection>"`` to copy; default every captured collection), ``force`` (snapshot even when
``snapshot.mode`` finds nothing to do; a snapshot in progress is resumed in any case) and
``reset_offset`` (whether completion moves the streaming offset to the position recorded before
copying; default true; ``snapshot.mode=always`` decides it itself without ``force``). The run is
``core.snapshot.run.run_snapshot``: decide per ``snapshot.mode``; record the stream position, plan
the chunks and commit "snapshot started" with the plan; copy the chunks in Spark tasks (here,
``snapshot.max.threads`` at a time), the final chunk last; commit the completed snapshot. Spark
starts only when there are chunks to copy. Reasons: docs/design.md, "Snapshots".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
from airflow_provider_mongocdc.spark_apps.runtime import main

APPLICATION = "snapshot"


class SparkChunkTasks:
    """The chunk copies as Spark tasks: one task per group of chunks."""

    def __init__(self, spark: Any):
        self.spark = spark

    def start(self, description: str) -> None:
        # The JVM and SparkContext start at the first use.
        self.spark.sparkContext.setJobDescription(description)

    def run(
        self, copy: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], groups: list[Any]
    ) -> list[Any]:
        context = self.spark.sparkContext
        return context.parallelize(groups, len(groups)).map(copy).collect()


def job(spark: Any, spec: JobSpec) -> dict[str, Any]:
    return run_snapshot(spec, SparkChunkTasks(spark))


if __name__ == "__main__":
    main(APPLICATION, job)
