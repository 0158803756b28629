"""A Spark process that dies under a run is named in one sentence, with what to check, instead of
``ConnectionRefusedError: [Errno 111] Connection refused`` or Spark's 8 000-character report of
the failed job (``Py4JJavaError``).

A mongocdc application (tests/integration/spark_jobs/dying_job.py, run by spark-submit on
``local[1]``) kills one of its processes with SIGKILL, as the kernel's out-of-memory killer does:

- a pyspark worker: the application's error (its result file, which the operator turns into the
  task's error) says a pyspark worker died and what to check;
- the driver JVM, under the operator: the task's error says the driver JVM was killed by signal 9
  (spark-submit's exit status, which only the operator sees) and what to check.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from airflow_provider_mongocdc.core.jobspec import JobSpec, read_result
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT
from airflow_provider_mongocdc.operators.base import MongoCdcSparkSubmitOperator

pytestmark = pytest.mark.integration

DYING_JOB = Path(__file__).parent / "spark_jobs" / "dying_job.py"
# A task's error in words is one line of a few hundred characters, not Spark's report.
MESSAGE_BOUND = 800


def test_a_killed_pyspark_worker_is_named_with_what_to_check(spark_submit, tmp_path):
    spec = JobSpec("snapshot", {"topic.prefix": "dying"}, {}, {}, {"kill": "worker"})
    spec_path = spec.write(tmp_path / "job-spec.json")
    result_path = tmp_path / "result.json"
    command = [
        spark_submit,
        "--master",
        "local[1]",
        "--conf",
        "spark.ui.enabled=false",
        str(DYING_JOB),
        "--job-spec",
        str(spec_path),
        "--result",
        str(result_path),
    ]
    finished = subprocess.run(command, capture_output=True, text=True, timeout=600)

    result = read_result(result_path)
    assert finished.returncode != 0 and result, finished.stderr[-3000:]
    message = result["message"]
    assert result["error_type"] == "SparkProcessDiedError", message[:3000]
    assert message.startswith(
        "A pyspark worker (the Python process running a Spark task of the snapshot) died; Spark "
        "reports no signal or exit code for it"
    ), message
    assert "Cause: Spark: Python worker exited unexpectedly (crashed)." in message
    assert "Fix: check the executor machine's memory and kernel log (dmesg)" in message
    assert len(message) < MESSAGE_BOUND and "Py4JJavaError" not in message and "\tat " not in message


class DyingApplicationOperator(MongoCdcSparkSubmitOperator):
    """The snapshot operator's base, running dying_job.py, which kills the driver JVM."""

    application_name = "snapshot"
    lease_kind = SNAPSHOT

    def job_params(self, context, config):
        return {"kill": "driver"}


def test_a_killed_driver_jvm_is_named_with_its_signal(
    mongosim, kafka_bootstrap, unique_name, operator_connections
):
    sim = mongosim()
    connections = operator_connections("dying", sim.uri, {"bootstrap.servers": kafka_bootstrap}, "local[1]")
    operator = DyingApplicationOperator(
        task_id="dying", connector_config={"topic.prefix": unique_name}, **connections
    )
    operator.application = str(DYING_JOB)

    with pytest.raises(Exception) as failure:
        operator.execute({})

    message = str(failure.value)
    assert message.startswith(
        "The snapshot's Spark driver JVM (the spark-submit process) was killed by signal 9 (SIGKILL) "
        "while the application ran."
    ), message
    assert "Fix: check the memory of the machine that ran spark-submit and its kernel log" in message
    assert "ConnectionRefusedError: [Errno 111]" not in message.split(" Cause: ")[0]
    assert len(message) < MESSAGE_BOUND, message
