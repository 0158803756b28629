"""Which Spark process died, in words (core/base/process_death.py), from the errors a run gets
when one dies: the lost Py4J connection of a dead driver JVM, Spark's report of a pyspark worker
that crashed or of a lost executor, and spark-submit's exit status. The processes killed for
real: tests/integration/test_spark_process_death.py.
"""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.base.errors import SparkProcessDiedError
from airflow_provider_mongocdc.core.base.process_death import exit_text, process_death, spark_submit_died

pytestmark = pytest.mark.unit

# The head of Spark 4.2's report of a pyspark worker killed with SIGKILL (8 240 characters in all).
WORKER_CRASHED = (
    "An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
    ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed "
    "1 times, most recent failure: Lost task 0.0 in stage 0.0 (TID 0) (192.0.2.2 executor driver): "
    "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). Consider setting "
    "'spark.sql.execution.pyspark.udf.faulthandler.enabled' or'spark.python.worker.faulthandler.enabled' "
    "configuration to 'true' for the better Python traceback.\n"
    "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator$$anonfun$1.applyOrElse(PythonRunner.scala:704)\n"
    + "\tat scala.runtime.AbstractPartialFunction.apply(AbstractPartialFunction.scala:35)\n" * 120
    + "Caused by: java.io.EOFException\n"
)


def test_exit_statuses_in_words():
    assert exit_text(-9) == "was killed by signal 9 (SIGKILL)"
    assert exit_text(137) == "exited with code 137 (killed by signal 9, SIGKILL)"
    assert exit_text(1) == "exited with code 1"


def test_a_crashed_pyspark_worker_is_one_sentence_not_the_java_report():
    error = process_death("stream_window", "Py4JJavaError", WORKER_CRASHED)
    assert isinstance(error, SparkProcessDiedError)
    text = str(error)
    assert text.startswith(
        "A pyspark worker (the Python process running a Spark task of the stream window) died"
    ), text
    assert "Cause: Spark: Python worker exited unexpectedly (crashed)." in text
    assert "Fix: check the executor machine's memory and kernel log (dmesg)" in text
    assert len(text) < 800 and "\tat " not in text


def test_a_crash_with_the_fault_handler_on_names_the_fatal_error():
    text = WORKER_CRASHED.replace(
        "(crashed).",
        "(crashed): Fatal Python error: Segmentation fault\n\nCurrent thread 0x01 (most recent call first):",
    )
    error = process_death("snapshot", "Py4JJavaError", text)
    assert "Fatal Python error: Segmentation fault" in str(error)


def test_a_lost_gateway_is_the_driver_jvm_with_its_exit_status_when_known():
    error = process_death(
        "snapshot",
        "ConnectionRefusedError",
        "[Errno 111] Connection refused",
        through_gateway=True,
        jvm_returncode=-9,
    )
    assert str(error).startswith(
        "The snapshot's Spark driver JVM (the spark-submit process) was killed by signal 9 (SIGKILL) "
        "while the application ran. Cause: the application lost its connection to the JVM "
        "(ConnectionRefusedError: [Errno 111] Connection refused). Fix: check the memory"
    ), str(error)
    unknown = process_death("snapshot", "Py4JError", "Answer from Java side is empty")
    assert str(unknown).startswith("The snapshot's Spark driver JVM (the spark-submit process) died while")


def test_a_refused_connection_outside_the_gateway_is_not_a_dead_jvm():
    assert process_death("snapshot", "ConnectionRefusedError", "[Errno 111] Connection refused") is None
    assert process_death("snapshot", "ValueError", "bad value") is None


def test_a_lost_executor_with_its_exit_code():
    text = (
        "Job aborted due to stage failure: Task 1 in stage 3.0 failed 4 times, most recent failure: "
        "Lost task 1.3 in stage 3.0 (TID 9) (10.0.0.7 executor 2): ExecutorLostFailure (executor 2 "
        "exited caused by one of the running tasks) Reason: Command exited with code 137\n\tat x"
    )
    error = process_death("snapshot", "Py4JJavaError", text)
    assert str(error).startswith(
        "A Spark executor JVM running a task of the snapshot exited with code 137 (killed by signal 9, "
        "SIGKILL). Cause: Spark: executor 2 exited caused by one of the running tasks Command exited "
        "with code 137. Fix: check the executor's memory"
    ), str(error)


def test_spark_submit_killed_by_a_signal_names_the_driver_jvm():
    lost = {
        "status": "failed",
        "error_type": "SparkProcessDiedError",
        "message": "...",
        "cause": "the application lost its connection to the JVM (ConnectionRefusedError: [Errno 111] "
        "Connection refused)",
    }
    error = spark_submit_died("stream_window", lost, -9)
    assert str(error).startswith(
        "The stream window's Spark driver JVM (the spark-submit process) was killed by signal 9 (SIGKILL)"
    )
    assert spark_submit_died("snapshot", None, 137) is not None  # killed before the application wrote
    # The application's own error stands; an exit without a signal says nothing of a death.
    own = {"status": "failed", "error_type": "OffsetError", "message": "..."}
    assert spark_submit_died("snapshot", own, -9) is None
    assert spark_submit_died("snapshot", None, 1) is None
    assert spark_submit_died("snapshot", None, None) is None
