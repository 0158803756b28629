"""A Spark JVM (local[2]) in the test process, for application runs that need no spark-submit of
their own: each run then starts its SparkContext in about a second."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def package_logger_kept() -> Iterator[None]:
    """Put the handlers, level and propagation of the package's logger back as they were at the
    start (an application's runtime points the logger at stderr, as in a Spark driver)."""
    package_logger = logging.getLogger("airflow_provider_mongocdc")
    saved = package_logger.handlers[:], package_logger.level, package_logger.propagate
    try:
        yield
    finally:
        package_logger.handlers[:], package_logger.level, package_logger.propagate = saved


@contextmanager
def local_spark_jvm(app_name: str) -> Iterator[None]:
    """A Spark JVM for the block: started by a SparkSession (stopped again at once; the JVM stays
    up for the applications' own sessions), shut down at the end."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.stop()
    gateway = SparkContext._gateway
    try:
        with package_logger_kept():
            yield
    finally:
        if SparkContext._gateway is gateway:  # (another fixture may have reused and ended it)
            if SparkContext._active_spark_context is not None:
                SparkContext._active_spark_context.stop()
            gateway.shutdown()
            SparkContext._gateway = SparkContext._jvm = None
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes
        gateway.proc.wait(timeout=60)
