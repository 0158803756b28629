"""How the provider's operators configure spark-submit's JVM and Spark's logging, and the one place
they touch SparkSubmitOperator's private state.

- **Spark's log level.** ``spark_log_level`` (default WARN) reaches the driver and the executors as
  Spark properties read by spark_apps/runtime.py; in client deploy mode the driver JVM also starts
  with the packaged log4j configuration (``spark-log4j2.properties``) at that level, unless the user
  configured log4j (JVM options, ``SPARK_SUBMIT_OPTS``, or a ``log4j2`` file in the Spark conf
  directory). docs/design.md, "Spark applications".
- **The driver JVM's JIT and performance counters.** In client deploy mode the driver JVM runs
  its C1 compiler only and keeps no performance-data file (``DRIVER_JVM_OPTIONS``), each unless the
  user's ``SPARK_SUBMIT_OPTS`` sets that option (``-XX:TieredStopAtLevel``, ``-XX:±UsePerfData``).
- Both are given through ``SPARK_SUBMIT_OPTS`` while spark-submit runs (``spark_submit_opts``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.hooks.spark_submit import MongoCdcSparkSubmitHook

# Log4j 2 configuration of the driver JVM in client deploy mode (shipped in the wheel).
SPARK_LOG4J2_CONFIG = Path(__file__).resolve().with_name("spark-log4j2.properties")
# The driver JVM of the applications (see SparkSubmitSettings._driver_jvm_startup): its C1 compiler
# only, and no performance counters sampled 20 times a second into an hsperfdata file; each keyed
# by the option's name, which the user's own SPARK_SUBMIT_OPTS may set instead.
DRIVER_JVM_OPTIONS = {"TieredStopAtLevel": "-XX:TieredStopAtLevel=1", "UsePerfData": "-XX:-UsePerfData"}
SPARK_LOG_LEVELS = ("ALL", "DEBUG", "ERROR", "FATAL", "INFO", "OFF", "TRACE", "WARN")
# The levels at which Spark's own report of a failed task (with its Java stack trace) is logged; at
# the others the application's report in words stands alone (spark-log4j2.properties).
SPARK_TASK_FAILURE_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO")


def checked_spark_log_level(spark_log_level: str | None) -> str | None:
    """``spark_log_level`` upper-cased, or None; a level Spark does not know is a ConfigError."""
    if spark_log_level is None:
        return None
    if str(spark_log_level).upper() not in SPARK_LOG_LEVELS:
        raise ConfigError(
            f"spark_log_level {spark_log_level!r} is not a log level of Spark",
            fix=f"use one of {', '.join(SPARK_LOG_LEVELS)}, or None to keep Spark's own configuration",
        )
    return str(spark_log_level).upper()


@contextlib.contextmanager
def spark_submit_opts(options: str) -> Iterator[None]:
    """``options`` appended to ``SPARK_SUBMIT_OPTS`` (the driver JVM's options in client deploy
    mode) while spark-submit runs; the previous value restored afterwards (each Airflow task runs
    in its own process)."""
    previous = os.environ.get("SPARK_SUBMIT_OPTS")
    os.environ["SPARK_SUBMIT_OPTS"] = f"{previous} {options}" if previous else options
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("SPARK_SUBMIT_OPTS", None)
        else:
            os.environ["SPARK_SUBMIT_OPTS"] = previous


class SparkSubmitSettings:
    """The provider's spark-submit settings, mixed into a SparkSubmitOperator (before it in the
    bases): Spark's log level, the driver JVM's log4j configuration and JIT, and the provider's
    Spark hook. The operator sets ``spark_conn_id`` (templated) and ``spark_log_level`` (see
    :func:`checked_spark_log_level`); the rest is SparkSubmitOperator's."""

    spark_conn_id: str
    spark_log_level: str | None
    # SparkSubmitOperator's, read here.
    conf: dict[str, Any] | None
    env_vars: dict[str, Any] | None
    _deploy_mode: str | None

    # -- SparkSubmitOperator's private state (apache-airflow-providers-apache-spark 6.3.4) ---------
    def _use_rendered_spark_connection(self) -> None:
        """The only place the provider writes SparkSubmitOperator's private attributes (checked
        against apache-airflow-providers-apache-spark 6.3.4): ``_conn_id``, which the operator set
        from ``conn_id`` before templates were rendered, becomes the rendered ``spark_conn_id``,
        and ``_hook`` is dropped so that the next ``_get_hook`` builds it from the operator's
        current arguments (conf, py_files, application_args)."""
        self._conn_id = self.spark_conn_id
        self._hook = None

    def _spark_job_submitted(self) -> bool:
        """Whether spark-submit was started (SparkSubmitOperator.execute built its ``_hook``)."""
        return getattr(self, "_hook", None) is not None

    def _spark_submit_exit_code(self) -> int | None:
        """spark-submit's exit status once it ended (MongoCdcSparkSubmitHook.exit_code), else None."""
        return getattr(getattr(self, "_hook", None), "exit_code", None)

    def _get_hook(self) -> MongoCdcSparkSubmitHook:
        """SparkSubmitOperator's hook (built from the operator's arguments) with this provider's
        additions: spark-submit dies with the task process, the JVM's start-up notice stays out of
        the task log (hooks/spark_submit.py)."""
        return MongoCdcSparkSubmitHook.from_hook(super()._get_hook())

    # -- Spark's own logging ------------------------------------------------------------------------
    def _effective_spark_log_level(self) -> str | None:
        """spark_log_level, or the user's spark.log.level (Spark applies it at the SparkContext's start)."""
        if not self.spark_log_level:
            return None
        return str((self.conf or {}).get("spark.log.level") or self.spark_log_level).upper()

    def spark_log_conf(self) -> dict[str, str]:
        """Spark properties that set Spark's log level in the driver and the executors (read by
        spark_apps/runtime.py). Spark's own spark.log.level is not used: the level it sets at the
        SparkContext's start does not reach the executors."""
        level = self._effective_spark_log_level()
        if not level:
            return {}
        return {"spark.mongocdc.log.level": level, "spark.executor.syncLogLevel.enabled": "true"}

    # -- the spark-submit JVM -----------------------------------------------------------------------
    def _submit_env(self) -> Mapping[str, str]:
        """The environment spark-submit runs with: the task's, plus the operator's ``env_vars``."""
        return {**os.environ, **{k: str(v) for k, v in (self.env_vars or {}).items()}}

    def _submit_deploy_mode(self) -> str:
        mode = self._deploy_mode or (self.conf or {}).get("spark.submit.deployMode")
        if not mode:
            try:
                mode = BaseHook.get_connection(self.spark_conn_id).extra_dejson.get("deploy-mode")
            except Exception:  # no such connection: SparkSubmitHook falls back to its defaults
                mode = None
        return str(mode or "client").lower()

    def _users_log4j_config(self) -> bool:
        """Whether the user configured the driver's log4j: JVM options or a conf directory with one."""
        conf: Mapping[str, Any] = self.conf or {}
        env = self._submit_env()
        options = " ".join(
            str(conf.get(key, ""))
            for key in ("spark.driver.extraJavaOptions", "spark.driver.defaultJavaOptions")
        )
        if "log4j" in options or "log4j" in env.get("SPARK_SUBMIT_OPTS", ""):
            return True
        conf_dirs = [env.get("SPARK_CONF_DIR"), env.get("SPARK_HOME") and f"{env['SPARK_HOME']}/conf"]
        return any(d and any(Path(d).glob("log4j2*.*")) for d in conf_dirs if d and Path(d).is_dir())

    @contextlib.contextmanager
    def _driver_jvm_startup(self) -> Iterator[None]:
        """While spark-submit runs (client deploy mode): the driver JVM with its C1 compiler only
        (``-XX:TieredStopAtLevel=1``) and without performance counters (``-XX:-UsePerfData``). The
        JVM of a window or snapshot only ships the tasks and collects their summaries (the Python
        workers read, build and produce), and C2 compiling Spark's start-up code cost half of its
        CPU: an empty window's driver JVM 8 -> 4.5 CPU-s, the whole run 10.3 -> 6.7 CPU-s on 2
        cores. While an open window streams in the Python driver the JVM only waits, and sampling
        its counters into the hsperfdata file 20 times a second was most of that wait's CPU (4.8 ->
        1.8 CPU-s per hour; ``jps`` and ``jstat`` then do not list it). bench/RESULTS.md. Given
        through ``SPARK_SUBMIT_OPTS``, which the JVM reads before ``spark.driver.extraJavaOptions``:
        either option of your own there (or in ``SPARK_SUBMIT_OPTS``) wins."""
        if self._submit_deploy_mode() == "cluster":
            yield
            return
        own = self._submit_env().get("SPARK_SUBMIT_OPTS", "")
        options = " ".join(option for name, option in DRIVER_JVM_OPTIONS.items() if name not in own)
        if not options:
            yield
            return
        with spark_submit_opts(options):
            yield

    @contextlib.contextmanager
    def _driver_jvm_logging(self) -> Iterator[None]:
        """While spark-submit runs: the packaged log4j configuration for the driver JVM (client
        deploy mode only: in cluster mode the spark-submit JVM is a client whose INFO lines the
        Spark hook reads to follow the application)."""
        level = self._effective_spark_log_level()
        if not level or self._submit_deploy_mode() == "cluster" or self._users_log4j_config():
            yield
            return
        failures = "NEUTRAL" if level in SPARK_TASK_FAILURE_LEVELS else "DENY"
        options = (
            f"-Dlog4j2.configurationFile={SPARK_LOG4J2_CONFIG.as_uri()} -Dmongocdc.spark.log.level={level} "
            f"-Dmongocdc.spark.task.failures={failures}"
        )
        with spark_submit_opts(options):
            yield
