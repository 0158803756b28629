"""What every mongocdc Spark application shares: arguments, logging, session, result file.

An application is started as ``spark-submit <app>.py --job-spec PATH [--result PATH]``. The job
spec (see core.jobspec) holds connections and configuration; the result file receives the run
summary, or the error with its cause and fix, which the operator turns into the task's outcome.
Without ``--result`` the summary is printed instead, as one ``MONGOCDC_SUMMARY {...}`` line.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import warnings
from collections.abc import Callable
from typing import Any

from airflow_provider_mongocdc.core.base import errors
from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.base.process_death import process_death
from airflow_provider_mongocdc.core.jobspec import SUMMARY_MARKER, JobSpec, write_failure, write_result

log = logging.getLogger("airflow_provider_mongocdc")
LOG_LEVEL_CONF = "spark.mongocdc.log.level"
PANDAS_WARNING = "PySpark does not yet fully support pandas"


def _resolve_spec_path(path: str) -> str:
    if os.path.exists(path):
        return path
    # Cluster deploy mode: the operator ships the spec with --files; it lands in the working dir.
    try:
        from pyspark import SparkFiles

        shipped = SparkFiles.get(os.path.basename(path))
        if os.path.exists(shipped):
            return shipped
    except Exception:  # no SparkContext yet, or not shipped: fall through to the clear error
        pass
    base = os.path.basename(path)
    return base if os.path.exists(base) else path


def jvm_returncode() -> int | None:
    """The driver JVM's exit status when it has ended and is this process's child (pyspark
    started it: ``python app.py``), else None (under spark-submit the JVM is this driver's parent;
    the operator reports spark-submit's exit status)."""
    try:
        from pyspark import SparkContext

        process = getattr(SparkContext._gateway, "proc", None)
        return process.poll() if process is not None else None
    except Exception:  # no pyspark gateway: nothing known
        return None


def _through_gateway(error: BaseException) -> bool:
    """Whether ``error`` was raised in a call to the JVM through Py4J."""
    traceback = error.__traceback__
    while traceback is not None:
        if "py4j" in traceback.tb_frame.f_code.co_filename.replace("\\", "/").split("/"):
            return True
        traceback = traceback.tb_next
    return False


def spark_process_death(application: str, error: BaseException) -> MongoCdcError | None:
    """The error naming the Spark process whose death ``error`` reports (the driver JVM, an
    executor or a pyspark worker; core/base/process_death.py), or None."""
    return process_death(
        application,
        type(error).__name__,
        str(error),
        through_gateway=_through_gateway(error),
        jvm_returncode=jvm_returncode(),
    )


# "airflow_provider_mongocdc.core.base.errors.ConnectionFailedError: ..." (the traceback's last line).
_TASK_ERROR = re.compile(rf"{re.escape(errors.__name__)}\.(\w+): (.+?)\s*$", re.MULTILINE)


def task_error(error: BaseException) -> MongoCdcError | None:
    """The connector error raised inside a Spark task, recovered from Spark's wrapped exception.

    Spark reports a failed Python task as a Py4J/PythonException whose text holds the worker's
    traceback; its last ``airflow_provider_mongocdc.core.base.errors.X: message`` line is the cause.
    """
    matches = _TASK_ERROR.findall(str(error))
    if not matches:
        return None
    name, message = matches[-1]
    cls = getattr(errors, name, MongoCdcError)
    if not (isinstance(cls, type) and issubclass(cls, MongoCdcError)):
        cls = MongoCdcError
    recovered = cls.__new__(cls)
    MongoCdcError.__init__(recovered, message)
    return recovered


class LazySparkSession:
    """The application's SparkSession, created on first use.

    Checks that need no executors (topology, credentials, offsets) run before it exists, so a
    refused server or a run with nothing to do ends in a second instead of after Spark's start.
    """

    def __init__(self, app_name: str):
        self._app_name = app_name
        self._session = None

    def _get(self):
        if self._session is None:
            from pyspark.sql import SparkSession

            self._session = SparkSession.builder.appName(self._app_name).getOrCreate()
            # The operators' spark_log_level (none: Spark's logging as the installation sets it).
            # Set on the SparkContext, it reaches the executors (spark.executor.syncLogLevel.enabled).
            level = self._session.sparkContext.getConf().get(LOG_LEVEL_CONF, None)
            if level:
                self._session.sparkContext.setLogLevel(level)
        return self._session

    def __getattr__(self, name: str):
        return getattr(self._get(), name)

    def stop(self) -> None:
        if self._session is not None:
            self._session.stop()
            self._session = None


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.handlers[:] = [handler]
    log.setLevel(logging.INFO)
    log.propagate = False
    # pyspark 4.2 warns on every SparkContext start that it "does not yet fully support pandas >=
    # 3.0.0" (its Py4J converters import pyspark.testing.utils, which checks the pandas version).
    # The applications use no pandas API (Python objects in RDDs only): the warning does not
    # concern them, whichever pandas the Airflow worker has.
    warnings.filterwarnings("ignore", message=PANDAS_WARNING, category=FutureWarning)


def run(
    application: str, job: Callable[[Any, JobSpec], dict[str, Any]], argv: list[str] | None = None
) -> int:
    """Run ``job(spark, spec)`` and record its summary or its error; return the exit code."""
    parser = argparse.ArgumentParser(prog=f"{application}.py")
    parser.add_argument("--job-spec", required=True, help="path of the job spec JSON file")
    parser.add_argument("--result", default=None, help="where to write the result JSON")
    args = parser.parse_args(argv)
    configure_logging()

    spark = None
    try:
        spec = JobSpec.read(_resolve_spec_path(args.job_spec))
        prefix = spec.connector.get("topic.prefix") or spec.connector.get("mongodb.name") or "mongocdc"
        spark = LazySparkSession(f"mongocdc-{application}-{prefix}")
        summary = job(spark, spec)
        write_result(args.result, summary)
        if args.result is None:  # run by hand: the summary is its output (the operator reads the file)
            print(SUMMARY_MARKER + json.dumps(summary, default=str), flush=True)
        return 0
    except MongoCdcError as error:
        log.error("%s failed: %s", application, error)
        write_failure(args.result, error)
        return 1
    except Exception as error:  # an unexpected failure still reaches the operator as one message
        recovered = task_error(error)
        died = spark_process_death(application, error) if recovered is None else None
        if recovered is not None:
            log.error("%s failed in a Spark task: %s", application, recovered)
            write_failure(args.result, recovered)
        elif died is not None:
            log.error("%s failed: %s", application, died)
            write_failure(args.result, died)
        else:
            log.exception("%s failed unexpectedly", application)
            write_failure(args.result, error)
        return 1
    finally:
        if spark is not None:
            try:
                spark.stop()
            except Exception as error:  # the JVM is gone (the run's outcome is written): nothing to stop
                log.debug("Stopping Spark failed: %s", error)


def main(application: str, job: Callable[[Any, JobSpec], dict[str, Any]]) -> None:
    sys.exit(run(application, job))
