"""The Spark hook of the provider's operators: apache-airflow-providers-apache-spark's
SparkSubmitHook, with spark-submit tied to the Airflow task process and the JVM's fixed start-up
notice kept out of the task log.

- **spark-submit dies with the task process.** On Linux, spark-submit starts with the parent-death
  signal SIGKILL (``prctl(PR_SET_PDEATHSIG)``, kept across the ``exec`` of spark-submit into the
  driver JVM): when the task process dies without running ``on_kill`` (SIGKILL from Airflow's
  supervisor or the OOM killer), the kernel kills the JVM, and the Python processes the JVM
  started end with it (pyspark's daemon on its closed stdin, its workers on the daemon's SIGHUP,
  the application's driver on its lost gateway). Otherwise a window would go on streaming and
  committing, and a snapshot copying, after Airflow marked the task failed and started its retry.
  spark-submit stays in the task's process group, so a signal to that group reaches it too.
- **Its exit status.** ``exit_code`` keeps spark-submit's exit status (negative: the signal that
  killed the driver JVM), which the operators name in their error when a signal ended it.
- **Known noise.** Spark's launcher always adds ``--add-modules=jdk.incubator.vector`` to the
  JVM's options, and the JVM then prints ``WARNING: Using incubator modules: jdk.incubator.vector``
  to stderr before any Java code runs; no JVM option silences it. The hook leaves such lines
  (``KNOWN_NOISE``) out of the task log; every other line of spark-submit is logged as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook

from airflow_provider_mongocdc.core.base.lifetime import die_with_parent

# Lines of spark-submit's output that say nothing about the run, written whatever it does.
KNOWN_NOISE = re.compile(r"WARNING: Using incubator modules: jdk\.incubator\.vector")


class MongoCdcSparkSubmitHook(SparkSubmitHook):
    """SparkSubmitHook whose spark-submit dies with the task process and whose task log leaves out
    ``KNOWN_NOISE`` (see the module's documentation). Its connection type is the Spark provider's
    ``spark``."""

    @classmethod
    def from_hook(cls, hook: SparkSubmitHook) -> MongoCdcSparkSubmitHook:
        """``hook``, as SparkSubmitOperator built it from the operator's arguments, with this
        class's behaviour (its state is kept as it is)."""
        hook.__class__ = cls
        return hook

    def local_master(self) -> bool:
        """Whether spark-submit runs the application on a ``local`` master (``local``,
        ``local[N]``, ``local[*]``): driver and tasks on this machine, in client deploy mode."""
        return str(self._connection.get("master") or "").startswith("local")

    #: spark-submit's exit status once it ended (``subprocess``'s: negative for a signal), else None.
    exit_code: int | None = None

    def submit(self, application: str = "", **kwargs: Any) -> str | None:
        preexec = die_with_parent()
        if preexec is not None:
            kwargs.setdefault("preexec_fn", preexec)
        try:
            return super().submit(application, **kwargs)
        finally:
            # SparkSubmitHook's Popen of spark-submit (apache-airflow-providers-apache-spark 6.3.4).
            process = getattr(self, "_submit_sp", None)
            self.exit_code = process.returncode if process is not None else None

    def _process_spark_submit_log(self, itr: Iterator[Any]) -> None:
        super()._process_spark_submit_log(line for line in itr if not KNOWN_NOISE.fullmatch(line.strip()))
