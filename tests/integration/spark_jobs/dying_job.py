"""spark-submit job: a mongocdc application (``spark_apps/runtime.run``, as the snapshot's) whose
work kills one of its Spark processes with SIGKILL, as the kernel's out-of-memory killer would:
with the job spec's parameter ``kill`` ``worker``, the pyspark worker running its task; with
``driver``, the driver JVM (spark-submit's Java process, this Python driver's parent), before its
next call to Spark.

Usage: spark-submit dying_job.py --job-spec PATH --result PATH
"""

import os
import signal
import sys
import time

from airflow_provider_mongocdc.spark_apps.runtime import run


def kill_this_worker(_rows):
    os.kill(os.getpid(), signal.SIGKILL)
    yield 0


def job(spark, spec):
    context = spark.sparkContext
    if spec.params["kill"] == "worker":
        context.parallelize([0], 1).mapPartitions(kill_this_worker).collect()
    else:
        jvm = os.getppid()
        os.kill(jvm, signal.SIGKILL)
        deadline = time.monotonic() + 120
        while os.getppid() == jvm and time.monotonic() < deadline:  # until this driver is orphaned
            time.sleep(0.05)
        context.parallelize([0], 1).collect()
    return {}


if __name__ == "__main__":
    sys.exit(run("snapshot", job))
