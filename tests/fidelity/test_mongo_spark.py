"""A spark-submit job (local[2]) whose executors read from MongoDB with pymongo."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.spark_submit import SPARK_ARGS, submit_env

pytestmark = [pytest.mark.fidelity, pytest.mark.integration]

JOB = Path(__file__).parent / "spark_jobs" / "mongo_range_count_job.py"


def test_spark_executors_read_ranges_with_pymongo(spark_submit, mongodb_uri, db):
    db.items.insert_many([{"_id": i, "payload": "p" * 64} for i in range(5000)])
    bounds = [0, 1000, 2500, 4000, 5000]
    env = submit_env()
    env["MONGOCDC_JOB_MONGODB_URI"] = mongodb_uri
    result = subprocess.run(
        [
            spark_submit,
            *SPARK_ARGS,
            "--conf",
            "spark.sql.shuffle.partitions=2",
            str(JOB),
            db.name,
            "items",
            ",".join(map(str, bounds)),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    assert json.loads(lines["RANGE_COUNTS"]) == [1000, 1500, 1500, 1000]
    assert mongodb_uri not in " ".join(result.args)
