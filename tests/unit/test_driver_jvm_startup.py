"""The driver JVM of the operators' spark-submit runs starts with its C1 compiler only and without
performance counters, unless the user set either option."""

from __future__ import annotations

import os

import pytest

from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

pytestmark = pytest.mark.unit


def _opts(monkeypatch, deploy_mode: str | None = None, previous: str | None = None, **kwargs) -> str:
    extra = f', "extra": {{"deploy-mode": "{deploy_mode}"}}' if deploy_mode else ""
    monkeypatch.setenv("AIRFLOW_CONN_JIT_SPARK", f'{{"conn_type": "spark", "host": "local[2]"{extra}}}')
    if previous is None:
        monkeypatch.delenv("SPARK_SUBMIT_OPTS", raising=False)
    else:
        monkeypatch.setenv("SPARK_SUBMIT_OPTS", previous)
    operator = MongoStreamWindowOperator(
        task_id="window", connector_config={"topic.prefix": "shop"}, spark_conn_id="jit_spark", **kwargs
    )
    with operator._driver_jvm_startup():
        opts = os.environ.get("SPARK_SUBMIT_OPTS", "")
    assert os.environ.get("SPARK_SUBMIT_OPTS") == previous, "SPARK_SUBMIT_OPTS not restored after the submit"
    return opts


def test_client_mode_driver_jvm_runs_c1_only_without_perf_data(monkeypatch):
    assert _opts(monkeypatch) == "-XX:TieredStopAtLevel=1 -XX:-UsePerfData"
    assert _opts(monkeypatch, previous="-Dx=1") == "-Dx=1 -XX:TieredStopAtLevel=1 -XX:-UsePerfData"


def test_cluster_mode_and_users_own_settings_are_left_alone(monkeypatch):
    assert _opts(monkeypatch, deploy_mode="cluster") == ""
    assert (
        _opts(monkeypatch, previous="-XX:TieredStopAtLevel=4") == "-XX:TieredStopAtLevel=4 -XX:-UsePerfData"
    )
    assert _opts(monkeypatch, previous="-XX:+UsePerfData") == "-XX:+UsePerfData -XX:TieredStopAtLevel=1"
    both = "-XX:TieredStopAtLevel=4 -XX:+UsePerfData"
    assert _opts(monkeypatch, previous=both) == both
    own = {"SPARK_SUBMIT_OPTS": "-XX:TieredStopAtLevel=4"}
    assert _opts(monkeypatch, env_vars=own) == "-XX:-UsePerfData"
