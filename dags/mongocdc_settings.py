"""Settings shared by the example DAGs (``mongocdc_hourly``, ``mongocdc_resnapshot``,
``mongocdc_watchdog``). The DAGs are configured without code changes:

Connector configuration (Debezium property names, JSON)
    The Airflow Variable ``mongocdc_connector_config``, or else the environment variable
    ``MONGOCDC_CONNECTOR_CONFIG``. Read when a task runs (through the macro
    ``mongocdc_connector_config()`` in the templated fields), never while Airflow parses the DAG
    files.
Connection ids
    ``mongocdc_default`` (MongoDB), ``kafka_default`` (Kafka) and ``spark_default`` (Spark), each
    overridable by the Variables ``mongocdc_mongo_conn_id``, ``mongocdc_kafka_conn_id`` and
    ``mongocdc_spark_conn_id`` (macro ``mongocdc_conn_id("mongo" | "kafka" | "spark")``).
The connector's pool
    Snapshot, re-snapshot and window tasks run in the pool ``mongocdc_<topic.prefix>`` with one
    slot, so that they queue one after the other (the connector lease then guarantees it even
    outside these DAGs). A task's pool is fixed when Airflow parses the DAG file, when Variables
    are not read: the name comes from the environment variable ``MONGOCDC_POOL``, else from the
    ``topic.prefix`` in ``MONGOCDC_CONNECTOR_CONFIG``, else ``mongocdc_default``. Create it once::

        airflow pools set mongocdc_<topic.prefix> 1 "MongoDB CDC connector <topic.prefix>: one snapshot or window at a time"

    Without the pool Airflow does not run the tasks: the scheduler logs that the pool does not
    exist and the UI shows a DAG warning naming it.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from typing import Any

CONNECTOR_CONFIG_VARIABLE = "mongocdc_connector_config"
CONNECTOR_CONFIG_ENV = "MONGOCDC_CONNECTOR_CONFIG"
POOL_ENV = "MONGOCDC_POOL"
DEFAULT_CONN_IDS = {"mongo": "mongocdc_default", "kafka": "kafka_default", "spark": "spark_default"}
RESNAPSHOT_DAG_ID = "mongocdc_resnapshot"
TAGS = ["mongocdc", "example"]

# How long each kind of task may run. The connector's lease lasts as long and is renewed every
# third of it while the task runs: a killed task's lease frees itself after this time at most.
WINDOW_TIMEOUT = timedelta(minutes=55)
SNAPSHOT_TIMEOUT = timedelta(hours=6)


def connector_config() -> str:
    """The connector configuration as JSON (Variable, else environment variable)."""
    from airflow.sdk import Variable

    value: Any = Variable.get(CONNECTOR_CONFIG_VARIABLE, default=None)
    if value in (None, ""):
        value = os.environ.get(CONNECTOR_CONFIG_ENV)
    if value in (None, ""):
        from airflow_provider_mongocdc.core.errors import ConfigError

        raise ConfigError(
            "The example DAGs have no connector configuration",
            cause=f"neither the Airflow Variable {CONNECTOR_CONFIG_VARIABLE!r} nor the environment "
            f"variable {CONNECTOR_CONFIG_ENV} is set",
            fix=f"airflow variables set {CONNECTOR_CONFIG_VARIABLE} "
            '\'{"topic.prefix": "shop", "collection.include.list": "shop\\\\..*"}\'',
        )
    return value if isinstance(value, str) else json.dumps(value)


def conn_id(kind: str) -> str:
    """The connection id for ``mongo``, ``kafka`` or ``spark`` (Variable, else the default)."""
    from airflow.sdk import Variable

    return Variable.get(f"mongocdc_{kind}_conn_id", default=None) or DEFAULT_CONN_IDS[kind]


def pool() -> str:
    """The connector's pool (parse time: environment only, see the module documentation)."""
    if os.environ.get(POOL_ENV):
        return os.environ[POOL_ENV]
    try:
        prefix = json.loads(os.environ.get(CONNECTOR_CONFIG_ENV) or "{}").get("topic.prefix")
    except (ValueError, AttributeError):
        prefix = None
    return f"mongocdc_{prefix}" if prefix else "mongocdc_default"


def gap_run_id(report: Any) -> str:
    """The run id of the re-snapshot of a gap: the same lost positions give the same id, so the
    watchdog triggers one re-snapshot per gap however often it finds it."""
    if isinstance(report, str):
        report = json.loads(report)
    positions = []
    for partition in report.get("partitions") or []:
        if partition.get("status") == "gap":
            ts = partition.get("stored_cluster_time") or {}
            positions.append(f"{partition['partition']}-{ts.get('t', 'x')}.{ts.get('i', 'x')}")
    return f"gap__{report.get('connector')}__{'_'.join(positions) or 'unknown'}"


# Macros for the templated fields: resolved when the task runs.
MACROS = {
    "mongocdc_connector_config": connector_config,
    "mongocdc_conn_id": conn_id,
    "mongocdc_gap_run_id": gap_run_id,
}


def spark_conn_id(operator_class) -> str:
    """The Spark connection id argument for ``operator_class``: the Variable-driven template when
    the operator renders its ``spark_conn_id``, else the default connection id."""
    if "spark_conn_id" in getattr(operator_class, "template_fields", ()):
        return "{{ mongocdc_conn_id('spark') }}"
    return DEFAULT_CONN_IDS["spark"]


def connector_arguments(operator_class) -> dict[str, Any]:
    """The templated connector, connection and pool arguments of the provider's operators."""
    arguments = {
        "connector_config": "{{ mongocdc_connector_config() }}",
        "mongo_conn_id": "{{ mongocdc_conn_id('mongo') }}",
        "kafka_conn_id": "{{ mongocdc_conn_id('kafka') }}",
    }
    if operator_class is not None and hasattr(operator_class, "application_name"):
        arguments["spark_conn_id"] = spark_conn_id(operator_class)
        arguments["pool"] = pool()
    return arguments
