"""Fixtures of the fault-injection suite."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mongocdc.core.jobspec import JobSpec


@pytest.fixture(scope="session")
def spark_jvm():
    """A Spark JVM (local[2]) in the test process, for runs that need no spark-submit of their own
    (re-runs after a fault, bad-input runs): each run starts its SparkContext in about a second
    instead of launching spark-submit. Stopped at the end of the session."""
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("mongocdc-faults")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    session.stop()
    gateway = SparkContext._gateway
    package_logger = logging.getLogger("airflow_provider_mongocdc")
    handlers, level, propagate = package_logger.handlers[:], package_logger.level, package_logger.propagate
    try:
        yield
    finally:
        package_logger.handlers[:], package_logger.level, package_logger.propagate = (
            handlers,
            level,
            propagate,
        )
        if SparkContext._gateway is gateway:  # (another suite's fixture may have reused and ended it)
            if SparkContext._active_spark_context is not None:
                SparkContext._active_spark_context.stop()
            gateway.shutdown()
            SparkContext._gateway = SparkContext._jvm = None
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes
        gateway.proc.wait(timeout=60)


@pytest.fixture
def run_in_jvm(spark_jvm, tmp_path):
    """``run_in_jvm(application, connector, mongo, kafka, **params) -> result dict``: a mongocdc
    application run by its own runtime (argument parsing, result file) in the test's Spark JVM."""
    from airflow_provider_mongocdc.spark_apps import runtime
    from airflow_provider_mongocdc.spark_apps import snapshot as snapshot_app
    from airflow_provider_mongocdc.spark_apps import stream_window as window_app

    jobs = {"snapshot": snapshot_app.job, "stream_window": window_app.job}
    counter = [0]

    def run(
        application: str,
        connector: dict[str, Any],
        mongo: dict[str, Any],
        kafka: dict[str, Any],
        **params: Any,
    ) -> dict[str, Any]:
        counter[0] += 1
        spec = JobSpec(application, connector, mongo, kafka, params).write(
            tmp_path / f"jvm-spec-{counter[0]}.json"
        )
        result = Path(tmp_path / f"jvm-result-{counter[0]}.json")
        package_logger = logging.getLogger("airflow_provider_mongocdc")
        saved = package_logger.handlers[:], package_logger.level, package_logger.propagate
        try:  # the runtime points the package's logger at stderr, as in a Spark driver
            code = runtime.run(
                application, jobs[application], ["--job-spec", str(spec), "--result", str(result)]
            )
        finally:
            package_logger.handlers[:], package_logger.level, package_logger.propagate = saved
        outcome = json.loads(result.read_text())
        assert (code == 0) == (outcome["status"] == "ok"), (code, outcome)
        return outcome

    return run
