"""Fixtures of the fault-injection suite."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_provider_mongocdc.core.jobspec import JobSpec
from tests.spark_jvm import local_spark_jvm, package_logger_kept


@pytest.fixture(scope="session")
def spark_jvm():
    """A Spark JVM (local[2]) in the test process, for runs that need no spark-submit of their own
    (re-runs after a fault, bad-input runs): each run starts its SparkContext in about a second
    instead of launching spark-submit. Stopped at the end of the session."""
    with local_spark_jvm("mongocdc-faults"):
        yield


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
        with package_logger_kept():
            code = runtime.run(
                application, jobs[application], ["--job-spec", str(spec), "--result", str(result)]
            )
        outcome = json.loads(result.read_text())
        assert (code == 0) == (outcome["status"] == "ok"), (code, outcome)
        return outcome

    return run
