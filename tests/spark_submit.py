"""spark-submit as the tests run it: local[2] without the web UI or the console progress bar, the
command line of a mongocdc Spark application, and what a finished run reports."""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_provider_mongocdc.core.jobspec import read_result
from airflow_provider_mongocdc.operators.base import application_path
from airflow_provider_mongocdc.operators.spark_options import DRIVER_JVM_OPTIONS

SPARK_ARGS = [
    "--master",
    "local[2]",
    "--conf",
    "spark.ui.enabled=false",
    "--conf",
    "spark.ui.showConsoleProgress=false",
]


def submit_env() -> dict[str, str]:
    """The environment of a spark-submit run: the driver JVM started as the operators start it
    (``DRIVER_JVM_OPTIONS`` in ``SPARK_SUBMIT_OPTS``: its C1 compiler only, no performance-data
    file), so that a test's run costs what a deployed run costs."""
    env = dict(os.environ)
    env["SPARK_SUBMIT_OPTS"] = " ".join(
        filter(None, (env.get("SPARK_SUBMIT_OPTS"), *DRIVER_JVM_OPTIONS.values()))
    )
    return env


def app_command(spark_submit: str, application: str, spec: Path, result: Path) -> list[str]:
    """The spark-submit command line of the application ``application`` (``snapshot``,
    ``stream_window``...) with its job spec and result files."""
    return [
        spark_submit,
        *SPARK_ARGS,
        application_path(application),
        "--job-spec",
        str(spec),
        "--result",
        str(result),
    ]


@dataclass
class AppRun:
    """A spark-submit run of a mongocdc application."""

    returncode: int | None
    output: str
    result: dict[str, Any] | None
    seconds: float

    @property
    def summary(self) -> dict[str, Any]:
        assert self.returncode == 0 and self.result and self.result.get("status") == "ok", self.describe()
        return self.result["summary"]

    @property
    def failed(self) -> bool:
        return (
            self.returncode not in (0, None) and bool(self.result) and self.result.get("status") == "failed"
        )

    def describe(self) -> str:
        return f"exit {self.returncode}, result {self.result}\n{self.output[-6000:]}"


def run_app(spark_submit: str, application: str, spec: Path, result: Path, *, timeout: float) -> AppRun:
    """Run the application to its end (at most ``timeout`` seconds)."""
    began = time.monotonic()
    done = subprocess.run(
        app_command(spark_submit, application, spec, result),
        capture_output=True,
        text=True,
        timeout=timeout,
        env=submit_env(),
    )
    return AppRun(done.returncode, done.stdout + done.stderr, read_result(result), time.monotonic() - began)
