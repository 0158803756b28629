"""The Airflow adapters without a server: the oplog gap trigger survives Airflow's storage and holds
no secret, the operators' templated fields render as a task run renders them, the extra link opens
the re-snapshot DAG, and ``core`` stays free of Airflow and Spark."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pendulum
import pytest
from airflow.models.trigger import Trigger
from airflow.sdk import DAG
from airflow.sdk.exceptions import TaskDeferred
from airflow.sdk.module_loading import import_string
from airflow.sdk.types import TaskInstanceKey

from airflow_provider_mongocdc.core.base.dag_ids import RESNAPSHOT
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.links import ResnapshotTriggerLink
from airflow_provider_mongocdc.operators.base import parse_connector_config
from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator
from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator
from airflow_provider_mongocdc.sensors.oplog_gap import OplogGapSensor
from airflow_provider_mongocdc.triggers.oplog_gap import OplogGapTrigger

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
MONGO_PASSWORD = "mongo-pw-5f1c9e"
KAFKA_PASSWORD = "kafka-pw-77ab02"
JAAS_PASSWORD = "jaas-pw-3d8e41"


# -- the trigger -----------------------------------------------------------------------------------


@pytest.fixture
def secret_connections(monkeypatch):
    """MongoDB and Kafka connections with passwords, as a secrets backend (environment) holds them."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_GAP_MONGO",
        json.dumps(
            {"conn_type": "mongocdc", "host": "rs0/h1:27017", "login": "cdc", "password": MONGO_PASSWORD}
        ),
    )
    monkeypatch.setenv(
        "AIRFLOW_CONN_GAP_KAFKA",
        json.dumps(
            {
                "conn_type": "mongocdc_kafka",
                "login": "cdc",
                "password": KAFKA_PASSWORD,
                "extra": {"bootstrap.servers": "b1:9092", "sasl.mechanism": "PLAIN"},
            }
        ),
    )


def deferred_trigger(connector_config) -> OplogGapTrigger:
    """The trigger a deferrable OplogGapSensor hands to the triggerer."""
    sensor = OplogGapSensor(
        task_id="detect_gap",
        connector_config=connector_config,
        mongo_conn_id="gap_mongo",
        kafka_conn_id="gap_kafka",
        deferrable=True,
        poke_interval=timedelta(minutes=3),
        headroom_warning=timedelta(hours=2),
        connector="shop-connector",
    )
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({})
    return deferred.value.trigger


CONFIG = {"topic.prefix": "shop", "collection.include.list": "shop\\.orders", "heartbeat.interval.ms": 5000}


def test_trigger_rebuilt_from_what_airflow_stores_is_the_same(secret_connections):
    trigger = deferred_trigger(CONFIG)
    classpath, kwargs = trigger.serialize()
    # What Airflow does: the trigger row keeps the classpath and the kwargs (serde, then Fernet);
    # the triggerer imports the classpath and calls it with the stored kwargs.
    stored = Trigger.encrypt_kwargs(kwargs)
    rebuilt = import_string(classpath)(**Trigger._decrypt_kwargs(stored))
    assert type(rebuilt) is OplogGapTrigger
    assert rebuilt.serialize() == (classpath, kwargs)
    assert json.loads(json.dumps(kwargs)) == kwargs, "the trigger's kwargs are not plain JSON"
    assert kwargs["poll_interval"] == 180.0 and kwargs["headroom_warning"] == 7200.0
    assert (kwargs["mongo_conn_id"], kwargs["kafka_conn_id"]) == ("gap_mongo", "gap_kafka")
    assert ConnectorConfig.from_properties(kwargs["connector_config"]) == ConnectorConfig.from_properties(
        CONFIG
    )


def test_trigger_kwargs_hold_no_secret(secret_connections):
    # A Debezium configuration copied from Kafka Connect may carry Kafka credentials in properties
    # the connector accepts and ignores (producer.override.*): they must not reach the trigger
    # table of Airflow's database.
    config = {
        **CONFIG,
        "producer.override.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
        f'required username="cdc" password="{JAAS_PASSWORD}";',
    }
    _, kwargs = deferred_trigger(config).serialize()
    text = json.dumps(kwargs)
    for secret in (MONGO_PASSWORD, KAFKA_PASSWORD, JAAS_PASSWORD):
        assert secret not in text, f"a secret is in the trigger's stored kwargs: {text}"
    assert ConnectorConfig.from_properties(kwargs["connector_config"]) == ConnectorConfig.from_properties(
        CONFIG
    )


def test_sensor_refuses_to_defer_with_credentials_in_the_configuration(secret_connections):
    with pytest.raises(ConfigError, match="mongodb.password") as refused:
        deferred_trigger({**CONFIG, "mongodb.password": MONGO_PASSWORD})
    assert MONGO_PASSWORD not in str(refused.value)


# -- templated fields --------------------------------------------------------------------------------

DATA_INTERVAL_END = pendulum.datetime(2024, 5, 1, 13, 0, tz="UTC")


def context(**params) -> dict:
    """The parts of a task's context the templates below use."""
    return {
        "ds": "2024-05-01",
        "ds_nodash": "20240501",
        "data_interval_end": DATA_INTERVAL_END,
        "params": params,
        "dag_run": SimpleNamespace(conf={"force": "true"}, run_id="manual__2024-05-01"),
        "run_id": "manual__2024-05-01",
    }


SPARK_FIELDS = {
    # SparkSubmitOperator's templated fields, as a DAG might set them.
    "conf": ({"spark.app.tag": "{{ ds }}"}, {"spark.app.tag": "2024-05-01"}),
    "files": ("{{ params.dir }}/a.txt", "/opt/cdc/a.txt"),
    "py_files": ("{{ params.dir }}/lib.zip", "/opt/cdc/lib.zip"),
    "jars": ("{{ params.dir }}/x.jar", "/opt/cdc/x.jar"),
    "driver_class_path": ("{{ params.dir }}/cp", "/opt/cdc/cp"),
    "packages": ("org.example:pkg:{{ params.version }}", "org.example:pkg:1.2"),
    "exclude_packages": ("org.example:old:{{ params.version }}", "org.example:old:1.2"),
    "keytab": ("{{ params.dir }}/cdc.keytab", "/opt/cdc/cdc.keytab"),
    "principal": ("cdc/{{ params.env }}@EXAMPLE", "cdc/prod@EXAMPLE"),
    "proxy_user": ("cdc_{{ params.env }}", "cdc_prod"),
    "name": ("mongocdc-{{ ds_nodash }}", "mongocdc-20240501"),
    "application_args": (["--day", "{{ ds }}"], ["--day", "2024-05-01"]),
    "env_vars": ({"RUN_DAY": "{{ ds }}"}, {"RUN_DAY": "2024-05-01"}),
    "post_submit_commands": (["echo {{ run_id }}"], ["echo manual__2024-05-01"]),
    "properties_file": ("{{ params.dir }}/spark.conf", "/opt/cdc/spark.conf"),
}
CONNECTOR_FIELDS = {
    "connector_config": (
        {"topic.prefix": "{{ params.prefix }}", "collection.include.list": "{{ params.db }}\\.orders"},
        {"topic.prefix": "shop", "collection.include.list": "shop\\.orders"},
    ),
    "mongo_conn_id": ("mongo_{{ params.env }}", "mongo_prod"),
    "kafka_conn_id": ("kafka_{{ params.env }}", "kafka_prod"),
    "spark_conn_id": ("spark_{{ params.env }}", "spark_prod"),
}
PARAMS = {"dir": "/opt/cdc", "version": "1.2", "env": "prod", "prefix": "shop", "db": "shop"}


def render(operator) -> None:
    """Render the operator's templated fields as a task run does (its DAG's Jinja environment)."""
    operator.render_template_fields(context(**PARAMS))


def assert_rendered(operator, fields: dict) -> None:
    templated = set(operator.template_fields)
    for name, (_, expected) in fields.items():
        assert name in templated, f"{type(operator).__name__}.{name} is not a templated field"
        assert getattr(operator, name) == expected, f"{type(operator).__name__}.{name} rendered wrong"


def test_template_fields_are_listed_once():
    # Airflow renders a field once per listing: a field listed twice renders its own output again.
    for cls in (MongoSnapshotOperator, MongoStreamWindowOperator, MongoResnapshotOperator, OplogGapSensor):
        fields = list(cls.template_fields)
        assert len(fields) == len(set(fields)), f"{cls.__name__} lists a templated field twice: {fields}"


def test_snapshot_operator_renders_every_templated_field():
    fields = {
        **SPARK_FIELDS,
        **CONNECTOR_FIELDS,
        "collections": ("{{ params.db }}.orders,{{ params.db }}.customers", "shop.orders,shop.customers"),
        "force": ("{{ dag_run.conf.get('force', False) }}", "true"),
        "reset_offset": ("{{ params.reset | default('false') }}", "false"),
    }
    with DAG("snapshot_templates", schedule=None):
        operator = MongoSnapshotOperator(task_id="snapshot", **{k: v for k, (v, _) in fields.items()})
    application = operator.application
    render(operator)
    assert_rendered(operator, fields)
    assert operator.application == application
    untemplated = set(operator.template_fields) - set(fields) - {"application"}
    assert not untemplated, f"templated fields without a rendering check: {untemplated}"
    config = parse_connector_config(operator.connector_config)
    assert config.topic_prefix == "shop"
    assert operator.job_params(context(), config) == {
        "collections": ["shop.customers", "shop.orders"],  # sorted
        "force": True,
        "reset_offset": False,
    }


def test_stream_window_operator_renders_every_templated_field():
    fields = {
        **SPARK_FIELDS,
        **CONNECTOR_FIELDS,
        "idle_timeout": ("{{ params.idle }}", "45"),
        "max_duration": ("{{ params.idle * 20 }}", "900"),
    }
    with DAG("window_templates", schedule=None):
        operator = MongoStreamWindowOperator(task_id="window", **{k: v for k, (v, _) in fields.items()})
    operator.render_template_fields(context(**PARAMS, idle=45))
    assert_rendered(operator, fields)
    untemplated = set(operator.template_fields) - set(fields) - {"application"}
    assert not untemplated, f"templated fields without a rendering check: {untemplated}"
    config = parse_connector_config(operator.connector_config)
    assert operator.job_params(context(), config) == {
        "window_end": iso_z(DATA_INTERVAL_END),
        "idle_timeout_s": 45.0,
        "max_duration_s": 900.0,
        "stream_in_driver": False,  # no spark_prod connection: SparkSubmitHook's master is yarn
    }


# (master, stream_in_driver setting) -> whether the one stream runs in the driver
WHERE_THE_STREAM_RUNS = {
    ("local[2]", "auto"): True,
    ("local[*]", "auto"): True,
    ("spark://spark-master:7077", "auto"): False,
    ("yarn", "auto"): False,
    ("local[2]", False): False,
    ("spark://spark-master:7077", True): True,
}


@pytest.mark.parametrize(
    ("master", "setting", "in_driver"), [(*case, runs) for case, runs in WHERE_THE_STREAM_RUNS.items()]
)
def test_stream_window_runs_its_one_stream_in_the_driver_on_a_local_master(
    monkeypatch, master, setting, in_driver
):
    monkeypatch.setenv("AIRFLOW_CONN_WHERE_SPARK", json.dumps({"conn_type": "spark", "host": master}))
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config={"topic.prefix": "shop"},
        spark_conn_id="where_spark",
        stream_in_driver=setting,
    )
    params = operator.job_params(context(), parse_connector_config(operator.connector_config))
    assert params["stream_in_driver"] is in_driver


def test_stream_in_driver_takes_true_false_or_auto():
    with pytest.raises(ConfigError, match="stream_in_driver 'yes' is not one of True, False, 'auto'"):
        MongoStreamWindowOperator(
            task_id="window", connector_config={"topic.prefix": "shop"}, stream_in_driver="yes"
        )


def test_stream_window_operator_makes_an_open_window_with_its_settings():
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config={"topic.prefix": "shop"},
        stream_in_driver=True,
        open_window={"idle": "20s", "commit_interval": 0.5},
    )
    params = operator.job_params(context(), parse_connector_config(operator.connector_config))
    assert (params["open_idle_s"], params["max_open_s"], params["commit_interval_s"]) == (20.0, 3000.0, 0.5)
    bounded = MongoStreamWindowOperator(task_id="window", connector_config={"topic.prefix": "shop"})
    assert "open_idle_s" not in bounded.job_params(
        context(), parse_connector_config(bounded.connector_config)
    )
    with pytest.raises(ConfigError, match="2 values are not valid: 1\\) idle must be a duration"):
        MongoStreamWindowOperator(
            task_id="window",
            connector_config={"topic.prefix": "shop"},
            open_window={"idle": "x", "max_open": 0},
        )


def test_resnapshot_operator_renders_like_the_example_dag():
    # The example DAG mongocdc_resnapshot renders natively so that the trigger form's list and the
    # watchdog's gap report stay a list and an object.
    report = {"connector": "shop", "gap_partitions": ["rs0"], "detected_at": "2024-05-01T12:00:00Z"}
    fields = {
        **CONNECTOR_FIELDS,
        "collections": ("{{ params.collections }}", []),
        "reason": ("{{ params.reason }} ({{ run_id }})", "oplog gap (manual__2024-05-01)"),
        "mode": ("{{ params.mode }}", "gap"),
        "gap_report": ("{{ dag_run.conf.get('gap_report') if dag_run.conf else None }}", report),
    }
    with DAG("resnapshot_templates", schedule=None, render_template_as_native_obj=True):
        operator = MongoResnapshotOperator(task_id="resnapshot", **{k: v for k, (v, _) in fields.items()})
    ctx = context(**PARAMS, collections=[], reason="oplog gap", mode="gap")
    ctx["dag_run"] = SimpleNamespace(conf={"gap_report": report})
    operator.render_template_fields(ctx)
    assert_rendered(operator, fields)
    decision = operator.decide(parse_connector_config(operator.connector_config))
    assert decision["mode"] == "gap" and decision["reset_offset"] is True
    assert decision["gap_partitions"] == ["rs0"] and decision["collections"] == []


def test_resnapshot_operator_renders_chosen_collections():
    fields = {
        "collections": ("{{ params.collections }}", ["shop.orders", "shop.customers"]),
        "mode": ("{{ params.mode }}", "manual"),
        "spark_conn_id": ("{{ params.spark_conn_id }}", "spark_{{ ds }}"),
    }
    with DAG("resnapshot_collections", schedule=None, render_template_as_native_obj=True):
        operator = MongoResnapshotOperator(
            task_id="resnapshot", connector_config=CONFIG, **{k: v for k, (v, _) in fields.items()}
        )
    # A value that itself looks like a template is data once rendered: Jinja renders a field once.
    operator.render_template_fields(
        context(collections=["shop.orders", "shop.customers"], mode="manual", spark_conn_id="spark_{{ ds }}")
    )
    assert_rendered(operator, fields)


def test_sensor_renders_its_templated_fields():
    fields = {
        "connector_config": ('{"topic.prefix": "{{ params.prefix }}"}', '{"topic.prefix": "shop"}'),
        "mongo_conn_id": ("mongo_{{ params.env }}", "mongo_prod"),
        "kafka_conn_id": ("kafka_{{ params.env }}", "kafka_prod"),
    }
    with DAG("sensor_templates", schedule=None):
        sensor = OplogGapSensor(task_id="detect_gap", **{k: v for k, (v, _) in fields.items()})
    render(sensor)
    assert_rendered(sensor, fields)
    assert set(sensor.template_fields) == set(fields)
    assert sensor.properties() == {"topic.prefix": "shop"}


# -- the extra link --------------------------------------------------------------------------------


def example_dag_ids() -> list[str]:
    """The ids of the example DAGs (dags/), as Airflow's DagBag loads them."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(str(REPO / "dags"))
    assert not bag.import_errors, bag.import_errors
    return bag.dag_ids


def links(sensor) -> dict[str, str]:
    """The sensor's extra links, computed as the task runner does when the task ends."""
    key = TaskInstanceKey(
        dag_id="mongocdc_watchdog", task_id=sensor.task_id, run_id="scheduled__x", try_number=1
    )
    return {link.name: link.get_link(operator=sensor, ti_key=key) for link in sensor.operator_extra_links}


@pytest.mark.parametrize(
    ("base_url", "prefix"),
    [
        ("http://localhost:8080", "http://localhost:8080"),
        ("https://airflow.example.com/cdc/", "https://airflow.example.com/cdc"),
    ],
)
def test_extra_link_opens_the_resnapshot_dag(monkeypatch, base_url, prefix):
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", base_url)
    sensor = OplogGapSensor(task_id="detect_gap", connector_config=CONFIG)
    name = ResnapshotTriggerLink.name
    assert RESNAPSHOT in example_dag_ids()
    assert links(sensor) == {name: f"{prefix}/dags/{RESNAPSHOT}"}
    other = OplogGapSensor(
        task_id="detect_gap", connector_config=CONFIG, resnapshot_dag_id="orders_resnapshot"
    )
    assert links(other) == {name: f"{prefix}/dags/orders_resnapshot"}


# -- core stays free of Airflow and Spark ------------------------------------------------------------


def test_core_imports_neither_airflow_nor_pyspark():
    script = textwrap.dedent(
        """
        import importlib, json, pkgutil, sys
        import airflow_provider_mongocdc.core as core
        names = [core.__name__] + [m.name for m in pkgutil.walk_packages(core.__path__, core.__name__ + ".")]
        for name in names:
            importlib.import_module(name)
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("airflow", "pyspark"))
        print(json.dumps({"modules": names, "loaded": loaded}))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=dict(os.environ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert "airflow_provider_mongocdc.core.events.builder" in result["modules"], result["modules"]
    assert not result["loaded"], f"importing airflow_provider_mongocdc.core loads {result['loaded'][:10]}"


def test_an_open_windows_tables_follow_its_topics_with_the_connections_storage_options(monkeypatch):
    monkeypatch.setenv(
        "AIRFLOW_CONN_LAKE", json.dumps({"conn_type": "aws", "login": "key-id", "password": "s3cret"})
    )
    delta = {"location": "s3://lake/cdc", "conn_id": "lake", "follow_every": "2s"}
    operator = MongoStreamWindowOperator(
        task_id="window",
        connector_config={"topic.prefix": "shop"},
        stream_in_driver=True,
        open_window=True,
        tables=delta,
    )
    params = operator.job_params(context(), parse_connector_config(operator.connector_config))
    follow = params["follow_delta"]
    assert follow["every"] == 2.0 and follow["tables"]["location"] == "s3://lake/cdc"
    assert follow["storage_options"]["AWS_SECRET_ACCESS_KEY"] == "s3cret"  # in the job spec file only
    for kept_off in (
        MongoStreamWindowOperator(  # a bounded window: the apply after it
            task_id="window", connector_config={"topic.prefix": "shop"}, stream_in_driver=True, tables=delta
        ),
        MongoStreamWindowOperator(  # following switched off
            task_id="window",
            connector_config={"topic.prefix": "shop"},
            stream_in_driver=True,
            open_window=True,
            tables={**delta, "follow_every": None},
        ),
    ):
        assert "follow_delta" not in kept_off.job_params(
            context(), parse_connector_config(kept_off.connector_config)
        )
