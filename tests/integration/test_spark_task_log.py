"""The task log of a window run through MongoStreamWindowOperator (spark-submit, local[2], the real
Kafka broker): Spark's own lines at WARN from the driver JVM's start on, the provider's progress
lines kept; ``spark_log_level="INFO"`` gives Spark's INFO lines back."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient
from structlog.testing import capture_logs

from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from tests.integration.window_helpers import connector, insert_at, next_second, pass_second, seed_offset

pytestmark = pytest.mark.integration

# Spark's log4j pattern (its defaults and the provider's file): "26/11/24 14:15:31 INFO SparkContext: ..."
SPARK_LINE = re.compile(r"^\d\d/\d\d/\d\d \d\d:\d\d:\d\d (?P<level>[A-Z]+) [\w$.]+: ")
# The provider's progress lines (Python logging of spark_apps/ and core/, see spark_apps/runtime.py).
PROGRESS = (
    "INFO airflow_provider_mongocdc.stream_window: Window of ",
    "INFO airflow_provider_mongocdc.core.window.stream_window: ",
)


def _task_log(entries: list[dict]) -> list[str]:
    """What the task log holds of the run: the lines the operator and the Spark hook log through
    Airflow's (structlog) task logger; the hook logs every line spark-submit prints."""
    return [line for entry in entries for line in str(entry.get("event", "")).splitlines()]


@pytest.mark.parametrize("spark_log_level", ["default", "INFO"])
def test_window_task_log_holds_our_progress_lines_and_no_spark_info(
    spark_log_level, mongodb_uri, kafka_bootstrap, unique_name, monkeypatch
):
    db_name = f"tasklog_{unique_name[-8:]}"  # unique_name ends with a random suffix
    kafka = {"bootstrap.servers": kafka_bootstrap}
    props = connector(unique_name, db_name)
    seed_offset(mongodb_uri, kafka, props)
    for conn_id, fields in (
        ("log_mongo", {"conn_type": "mongocdc", "host": mongodb_uri}),
        ("log_kafka", {"conn_type": "mongocdc_kafka", "extra": kafka}),
        ("log_spark", {"conn_type": "spark", "host": "local[2]"}),
    ):
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        client[db_name].items.insert_many([{"_id": n} for n in range(2)])
        end = next_second(insert_at(client[db_name].items, {"_id": 2}))
        pass_second(client, end, f"{db_name}_m")

    level = {} if spark_log_level == "default" else {"spark_log_level": spark_log_level}
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config=props,
        mongo_conn_id="log_mongo",
        kafka_conn_id="log_kafka",
        spark_conn_id="log_spark",
        conf={"spark.ui.enabled": "false"},
        **level,
    )
    with capture_logs() as entries:
        summary = operator.execute({"data_interval_end": datetime.fromtimestamp(end.time, timezone.utc)})
    assert summary["events"] == 3 and summary["reached_end"] is True, summary

    lines = _task_log(entries)
    assert any("Spark-Submit cmd" in line for line in lines), "the Spark hook's lines were not captured"
    spark_lines = [line for line in lines if SPARK_LINE.match(line)]
    spark_info = [line for line in spark_lines if SPARK_LINE.match(line)["level"] == "INFO"]
    progress = [line for line in lines if any(marker in line for marker in PROGRESS)]
    assert progress, "the provider's progress lines are missing from the task log:\n" + "\n".join(lines[-80:])
    if spark_log_level == "default":
        assert not spark_info, (
            f"{len(spark_info)} of Spark's INFO lines in the task log ({len(lines)} lines), e.g.:\n"
            + "\n".join(spark_info[:15])
        )
    else:  # Spark's INFO back, from the JVM's start on
        assert any("Running Spark version" in line for line in spark_info), "\n".join(lines[-80:])
        assert len(spark_info) > 20, f"only {len(spark_info)} INFO lines of Spark's with spark_log_level=INFO"
