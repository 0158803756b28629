"""How the operators set Spark's own log level, without running Spark: the Spark properties on the
spark-submit command line, the driver JVM's log4j configuration (client deploy mode only, and only
when the user has none) and the refusal of a level Spark does not know."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.operators.spark_options import SPARK_LOG4J2_CONFIG
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def _operator(**kwargs) -> MongoStreamWindowOperator:
    return MongoStreamWindowOperator(
        task_id="window", connector_config={"topic.prefix": "shop"}, spark_conn_id="log_spark", **kwargs
    )


def _submit_settings(operator, monkeypatch, deploy_mode: str | None = None) -> tuple[list[str], str]:
    """The spark-submit command and SPARK_SUBMIT_OPTS the operator's submit would use."""
    extra = f', "extra": {{"deploy-mode": "{deploy_mode}"}}' if deploy_mode else ""
    monkeypatch.setenv("AIRFLOW_CONN_LOG_SPARK", f'{{"conn_type": "spark", "host": "local[2]"{extra}}}')
    monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    monkeypatch.delenv("SPARK_CONF_DIR", raising=False)
    operator.conf = {
        "spark.ui.showConsoleProgress": "false",
        **operator.spark_log_conf(),
        **(operator.conf or {}),
    }
    operator._use_rendered_spark_connection()
    with operator._driver_jvm_logging():
        opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    assert "SPARK_SUBMIT_OPTS" not in os.environ, "SPARK_SUBMIT_OPTS outlived the submit"
    command = operator._get_hook()._build_spark_submit_command(operator.application)
    return command, opts


def test_default_is_warn_for_driver_jvm_and_executors(monkeypatch):
    command, opts = _submit_settings(_operator(), monkeypatch)
    assert "spark.mongocdc.log.level=WARN" in command
    assert "spark.executor.syncLogLevel.enabled=true" in command
    assert f"-Dlog4j2.configurationFile={SPARK_LOG4J2_CONFIG.as_uri()}" in opts
    assert "-Dmongocdc.spark.log.level=WARN" in opts
    # Spark's report of a failed task left out: the application reports it in words.
    assert "-Dmongocdc.spark.task.failures=DENY" in opts


def test_spark_log_level_info_and_users_spark_log_level(monkeypatch):
    command, opts = _submit_settings(_operator(spark_log_level="info"), monkeypatch)
    assert "spark.mongocdc.log.level=INFO" in command and "-Dmongocdc.spark.log.level=INFO" in opts
    assert "-Dmongocdc.spark.task.failures=NEUTRAL" in opts
    command, opts = _submit_settings(_operator(conf={"spark.log.level": "DEBUG"}), monkeypatch)
    assert "spark.mongocdc.log.level=DEBUG" in command and "-Dmongocdc.spark.log.level=DEBUG" in opts


def test_none_leaves_spark_logging_alone(monkeypatch):
    command, opts = _submit_settings(_operator(spark_log_level=None), monkeypatch)
    assert not any("log.level" in part or "syncLogLevel" in part for part in command), command
    assert opts == ""


def test_cluster_deploy_mode_keeps_the_submit_clients_lines(monkeypatch):
    # The Spark hook follows a cluster-mode driver through the client's INFO lines.
    command, opts = _submit_settings(_operator(), monkeypatch, deploy_mode="cluster")
    assert opts == "" and "spark.mongocdc.log.level=WARN" in command


def test_users_log4j_configuration_is_kept(monkeypatch, tmp_path):
    own = {"spark.driver.extraJavaOptions": "-Dlog4j2.configurationFile=file:/etc/spark/mine.properties"}
    _, opts = _submit_settings(_operator(conf=own), monkeypatch)
    assert opts == ""
    (tmp_path / "log4j2.properties").write_text("rootLogger.level = info\n")
    operator = _operator(env_vars={"SPARK_CONF_DIR": str(tmp_path)})
    _, opts = _submit_settings(operator, monkeypatch)
    assert opts == ""


def test_unknown_level_is_refused():
    with pytest.raises(ConfigError, match="spark_log_level 'LOUD'.*Fix: use one of"):
        _operator(spark_log_level="LOUD")


def test_log4j_configuration_ships_in_the_wheel():
    assert SPARK_LOG4J2_CONFIG.is_file()
    assert "${sys:mongocdc.spark.log.level:-WARN}" in SPARK_LOG4J2_CONFIG.read_text()
    assert "${sys:mongocdc.spark.task.failures:-DENY}" in SPARK_LOG4J2_CONFIG.read_text()
    pyproject = (REPO / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]", 1)[-1].split("\n[", 1)[0]
    assert f'"airflow_provider_mongocdc.operators" = ["{SPARK_LOG4J2_CONFIG.name}"]' in section, section
