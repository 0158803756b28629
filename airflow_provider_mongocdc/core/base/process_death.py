"""Which process of a Spark application died, in one sentence, and what to check.

A snapshot or window runs in up to three kinds of processes: the driver JVM (spark-submit's Java
process, which in client deploy mode starts the application's Python driver), executor JVMs
(the driver JVM itself on a ``local`` master) and pyspark workers (the Python processes that run
the tasks). When one of them dies (killed by a signal, the kernel's out-of-memory killer among
them, or crashed), what reaches the application is no error of the connector but a lost Py4J
connection (``ConnectionRefusedError: [Errno 111] Connection refused``) or Spark's report of the
failed job, a ``Py4JJavaError`` of thousands of characters. :func:`process_death` recognises them
from the error's type and text (no Spark import) and says which process died, with its signal or
exit code when known; :func:`exit_text` words an exit status; :func:`driver_jvm_died` is the
error of a driver JVM whose exit status spark-submit's caller saw.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.errors import SparkProcessDiedError

# The Python driver lost its Py4J connection to the JVM (py4j 0.10.9 and the socket errors under it).
_GATEWAY_TYPES = {"ConnectionRefusedError", "ConnectionResetError", "BrokenPipeError", "Py4JNetworkError"}
_GATEWAY_TEXTS = (
    "Answer from Java side is empty",
    "Error while receiving",
    "Error while sending",
    "An error occurred while trying to connect to the Java server",
)
# Spark's report of a pyspark worker that ended without an answer (PythonRunner, Spark 3.x and 4.x).
_WORKER_CRASHED = "Python worker exited unexpectedly (crashed)"
_FATAL_PYTHON = re.compile(r"Fatal Python error: ([^\n]+)")
# Spark's report of an executor JVM lost while it ran a task (TaskSetManager, ExecutorLossReason).
_EXECUTOR_LOST = re.compile(r"ExecutorLostFailure \(([^)]*)\)(?: Reason: ([^\n]*))?")
_EXIT_CODE = re.compile(r"(?:exit code|exited with code|exitCode[=:]?)\s*(-?\d+)", re.IGNORECASE)
_RERUN = "run the task again: it continues from the last committed offset or chunk"


def exit_text(returncode: int) -> str:
    """How a process ended, from its exit status as ``subprocess`` reports it (a negative number:
    the signal that killed it) or as a shell does (128 + the signal)."""
    if returncode < 0:
        return f"was killed by signal {-returncode} ({_signal_name(-returncode)})"
    if returncode > 128 and _signal_name(returncode - 128, None):
        number = returncode - 128
        return f"exited with code {returncode} (killed by signal {number}, {_signal_name(number)})"
    return f"exited with code {returncode}"


def _name(application: str) -> str:
    """An application's name in words (``stream_window``: stream window)."""
    return application.replace("_", " ")


def killed(returncode: int) -> bool:
    """Whether an exit status says a signal ended the process."""
    return returncode < 0 or (returncode > 128 and _signal_name(returncode - 128, None) is not None)


def _signal_name(number: int, default: str | None = "an unknown signal") -> str | None:
    try:
        return signal.Signals(number).name
    except ValueError:
        return default


def driver_jvm_died(
    application: str, returncode: int | None = None, detail: str | None = None
) -> SparkProcessDiedError:
    """The driver JVM (spark-submit's Java process) died while ``application`` ran."""
    how = exit_text(returncode) if returncode is not None else "died"
    return SparkProcessDiedError(
        f"The {_name(application)}'s Spark driver JVM (the spark-submit process) {how} while the application ran",
        cause=detail,
        fix="check the memory of the machine that ran spark-submit and its kernel log (dmesg names the "
        "processes the out-of-memory killer ended), and spark.driver.memory; then " + _RERUN,
    )


def python_worker_died(application: str, detail: str | None = None) -> SparkProcessDiedError:
    """A pyspark worker died while it ran one of ``application``'s tasks (Spark does not report
    its signal or exit code)."""
    return SparkProcessDiedError(
        f"A pyspark worker (the Python process running a Spark task of the {_name(application)}) died; Spark "
        "reports no signal or exit code for it (a signal such as the out-of-memory killer's SIGKILL, "
        "or a crash)",
        cause=detail,
        fix="check the executor machine's memory and kernel log (dmesg), spark.executor.memory and "
        "spark.executor.pyspark.memory (spark.python.worker.faulthandler.enabled=true shows a crash's "
        "Python traceback); then " + _RERUN,
    )


def executor_died(application: str, reason: str, returncode: int | None) -> SparkProcessDiedError:
    """An executor JVM was lost while it ran one of ``application``'s tasks."""
    how = exit_text(returncode) if returncode is not None else "was lost"
    return SparkProcessDiedError(
        f"A Spark executor JVM running a task of the {_name(application)} {how}",
        cause=f"Spark: {reason}" if reason else None,
        fix="check the executor's memory (spark.executor.memory, spark.executor.memoryOverhead), its "
        "log and its machine's kernel log (dmesg); then " + _RERUN,
    )


def process_death(
    application: str,
    error_type: str,
    text: str,
    *,
    through_gateway: bool = False,
    jvm_returncode: int | None = None,
) -> SparkProcessDiedError | None:
    """The error naming the process whose death ``application``'s error (its type's name and its
    text) reports, or None when it reports none. ``through_gateway``: the error was raised by a
    call to the JVM through Py4J (a socket error there means the JVM is gone, elsewhere it does
    not); ``jvm_returncode``: the driver JVM's exit status when this process knows it (the JVM
    is its child)."""
    if (error_type in _GATEWAY_TYPES and (through_gateway or error_type.startswith("Py4J"))) or (
        error_type.startswith("Py4J") and any(marker in text for marker in _GATEWAY_TEXTS)
    ):
        first_line = text.strip().splitlines()[0] if text.strip() else ""
        return driver_jvm_died(
            application,
            jvm_returncode,
            f"the application lost its connection to the JVM ({error_type}: {first_line[:200]})",
        )
    if _WORKER_CRASHED in text:
        fatal = _FATAL_PYTHON.search(text)
        detail = f"Spark: {_WORKER_CRASHED}" + (
            f"; Fatal Python error: {fatal.group(1).strip()}" if fatal else ""
        )
        return python_worker_died(application, detail)
    lost = _EXECUTOR_LOST.search(text)
    if lost:
        reason = " ".join(part.strip() for part in lost.groups() if part)
        code = _EXIT_CODE.search(reason)
        return executor_died(application, reason[:300], int(code.group(1)) if code else None)
    return None


def spark_submit_died(
    application: str, result: Mapping[str, Any] | None, returncode: int | None
) -> SparkProcessDiedError | None:
    """The error of a run whose spark-submit (the driver JVM, in client deploy mode) a signal
    ended (``returncode``, as its caller saw it), unless the application reported an error of
    its own first (``result``: its result file); None when no signal ended it."""
    if returncode is None or not killed(returncode):
        return None
    if (
        result
        and result.get("status") == "failed"
        and result.get("error_type") != SparkProcessDiedError.__name__
    ):
        return None
    return driver_jvm_died(application, returncode, (result or {}).get("cause"))
