"""The fixed CPU of a tables follower's pass (bench (n)): a table's apply when nothing new came, 20
times in one warm process under cProfile.

    python -m bench.follow_pass [delta|iceberg]
"""

import cProfile
import pstats
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path

from airflow_provider_mongocdc.core.apply.settings import TableSettings
from airflow_provider_mongocdc.core.apply.snapshots import StatusReader
from airflow_provider_mongocdc.core.apply.topics import data_topics
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.snapshot.run import run_snapshot
from airflow_provider_mongocdc.spark_apps.delta_apply import job as delta_apply_job
from airflow_provider_mongocdc.spark_apps.table_tasks import apply_table_task, table_task
from bench.follow import COLLECTION, DATABASE, _Tasks
from bench.services import Services


def cpu():
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime


def main(fmt: str) -> None:
    with Services() as services:
        prefix = f"prof{uuid.uuid4().hex[:8]}"
        lake = Path(tempfile.mkdtemp()) / "lake"
        kafka = services.kafka
        props = {"topic.prefix": prefix, "collection.include.list": f"{DATABASE}{prefix}\\..*"}
        items = services.client()[f"{DATABASE}{prefix}"][COLLECTION]
        items.insert_many([{"_id": f"seed{n}", "v": n} for n in range(5000)])
        run_snapshot(
            JobSpec("snapshot", props, {"connection_string": services.mongodb_uri}, kafka, {}), _Tasks()
        )
        tables = {"location": str(lake), "format": fmt}
        delta_apply_job(None, JobSpec("delta_apply", props, {}, kafka, {"tables": tables, "in_driver": True}))
        config = ConnectorConfig.from_properties(props)
        topic = data_topics(kafka, config)[0]
        task = table_task(props, kafka, TableSettings.from_mapping(tables).to_json(), {}, topic)
        status = StatusReader(kafka, config)
        for _ in range(3):
            apply_table_task(task, status=status)
        n = 20
        c0, w0 = cpu(), time.monotonic()
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(n):
            apply_table_task(task, status=status)
        prof.disable()
        print(
            f"{fmt}: empty pass {1000 * (cpu() - c0) / n:.1f} ms CPU, {1000 * (time.monotonic() - w0) / n:.1f} ms wall"
        )
        pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
        status.close()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "delta")
