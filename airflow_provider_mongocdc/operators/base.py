"""The base of the provider's Spark operators: a SparkSubmitOperator that runs a mongocdc app.

It resolves the MongoDB and Kafka connections on the Airflow worker, validates the connector
configuration before anything is submitted, writes the job spec to an owner-only temporary file
(its path is the only argument on the spark-submit command line), ships the provider's code to
the executors as a zip (``py_files``), and turns the application's result file into the task's
return value (pushed to XCom) or into one clear error. Spark's own logging is kept at
``spark_log_level`` (default WARN) so that the task log holds the provider's progress lines; how
spark-submit's JVM and Spark's logging are configured: operators/spark_options.py.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import zipfile
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.providers.common.compat.sdk import AirflowException
from airflow.sdk import Asset, AssetAlias

import airflow_provider_mongocdc
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.process_death import spark_submit_died
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import SUMMARY_MARKER, JobSpec, read_result
from airflow_provider_mongocdc.lineage import asset_extra, connector_asset, literal_topic_prefix
from airflow_provider_mongocdc.operators.spark_options import SparkSubmitSettings, checked_spark_log_level

PACKAGE_DIR = Path(airflow_provider_mongocdc.__file__).resolve().parent
# The AssetAlias of the tasks whose topic.prefix is templated: each run adds its connector's Asset.
CONNECTOR_ASSET_ALIAS = "mongocdc"
# The templated parameters of every task of a connector (the Spark operators and OplogGapSensor).
CONNECTOR_TEMPLATE_FIELDS = ("connector_config", "mongo_conn_id", "kafka_conn_id")


class ApplicationFailed(Exception):
    """A run that failed for a reason its message gives in words (what failed, the cause and the
    fix): the application's reported error, or a check the operator made before submitting.
    :meth:`MongoCdcSparkSubmitOperator.execute` turns it into the task's error."""


def application_path(name: str) -> str:
    """Path of a Spark application shipped in ``airflow_provider_mongocdc.spark_apps``."""
    return str(resources.files("airflow_provider_mongocdc.spark_apps").joinpath(f"{name}.py"))


def build_code_archive(directory: str | Path) -> str:
    """Zip the provider's Python code (core and Spark apps) for the executors' ``py_files``."""
    target = Path(directory) / f"airflow_provider_mongocdc-{airflow_provider_mongocdc.__version__}.zip"
    apps_dir = Path(application_path("runtime")).parent
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.write(PACKAGE_DIR / "__init__.py", "airflow_provider_mongocdc/__init__.py")
        for source in sorted((PACKAGE_DIR / "core").rglob("*.py")):
            archive.write(source, f"airflow_provider_mongocdc/{source.relative_to(PACKAGE_DIR).as_posix()}")
        for source in sorted(apps_dir.glob("*.py")):
            archive.write(source, f"airflow_provider_mongocdc/spark_apps/{source.name}")
    return str(target)


def decode_connector_config(connector_config: Mapping[str, Any] | str) -> Any:
    """The connector configuration argument as given: a mapping, or the value of its JSON text."""
    if not isinstance(connector_config, str):
        return connector_config
    try:
        return json.loads(connector_config)
    except json.JSONDecodeError as error:
        raise ConfigError(
            "The connector configuration is not valid JSON",
            cause=f"{error.msg} at line {error.lineno} column {error.colno}",
            fix='give a JSON object of Debezium property names, e.g. {"topic.prefix": "shop"}',
        ) from None


def json_object(value: Mapping[str, Any] | str, what: str, fix: str) -> dict[str, Any]:
    """A mapping argument, or its JSON text, as a dict; ``what`` names it in the error."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{what} is not valid JSON",
                cause=f"{error.msg} at line {error.lineno} column {error.colno}",
                fix=fix,
            ) from None
    if not isinstance(value, Mapping):
        raise ConfigError(f"{what} must be a JSON object", cause=f"got {type(value).__name__}", fix=fix)
    return dict(value)


def without_none(value: Any) -> Any:
    """``value`` with the entries of its mappings that are None left out (what a log line shows)."""
    if isinstance(value, Mapping):
        return {key: without_none(item) for key, item in value.items() if item is not None}
    return value


def parse_connector_config(connector_config: Mapping[str, Any] | str) -> ConnectorConfig:
    """Validate the connector configuration given as a mapping or a JSON string."""
    return ConnectorConfig.from_properties(decode_connector_config(connector_config))


class MongoCdcSparkSubmitOperator(SparkSubmitSettings, SparkSubmitOperator):
    """Run one of the provider's Spark applications while holding the connector's lease.
    Subclasses set ``application_name`` and ``lease_kind``.

    :param connector_config: the connector configuration (Debezium property names), a mapping or
        a JSON string. (templated)
    :param mongo_conn_id: the MongoDB connection. (templated)
    :param kafka_conn_id: the Kafka connection (its extra is the librdkafka configuration). (templated)
    :param spark_conn_id: the Spark connection (master URL, deploy mode). Other keyword arguments
        go to SparkSubmitOperator (conf, executor_memory, num_executors, ...).
    :param spark_log_level: the level of Spark's own logging in the driver and the executors
        (default ``WARN``; ``INFO`` gives Spark's usual output back). A ``spark.log.level`` in
        ``conf`` takes precedence. ``None`` leaves Spark's logging to the Spark installation's
        configuration. The provider's progress lines are logged whatever the level.
    """

    application_name: str = ""
    # What the run holds the connector's lease for (core/offsets/lease.py: SNAPSHOT or WINDOW).
    lease_kind: str = ""
    # Whether every successful run updates the connector's Asset (a window always moves the
    # connector on); False: only runs that wrote data (see wrote_data).
    asset_event_on_every_run: bool = True
    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        *CONNECTOR_TEMPLATE_FIELDS,
        "spark_conn_id",
    )
    template_fields_renderers = {"connector_config": "json", "conf": "json"}
    ui_color = "#4fa94d"

    def __init__(
        self,
        *,
        connector_config: Mapping[str, Any] | str,
        mongo_conn_id: str = "mongocdc_default",
        kafka_conn_id: str = "kafka_default",
        spark_conn_id: str = "spark_default",
        name: str | None = None,
        spark_log_level: str | None = "WARN",
        **kwargs: Any,
    ) -> None:
        spark_log_level = checked_spark_log_level(spark_log_level)
        kwargs.setdefault("conn_id", spark_conn_id)
        if "outlets" not in kwargs:
            # The connector's Asset when topic.prefix is known at parse time (not templated) and every
            # run updates it, else an AssetAlias to which a run attaches its connector's Asset.
            prefix = literal_topic_prefix(connector_config) if self.asset_event_on_every_run else None
            kwargs["outlets"] = [connector_asset(prefix) if prefix else AssetAlias(CONNECTOR_ASSET_ALIAS)]
        super().__init__(
            application=application_path(self.application_name),
            name=name or f"mongocdc-{self.application_name}",
            **kwargs,
        )
        self.connector_config = connector_config
        self.mongo_conn_id = mongo_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.spark_conn_id = kwargs["conn_id"]
        self.spark_log_level = spark_log_level

    # -- what subclasses provide -------------------------------------------------------------------
    def job_params(self, context, config: ConnectorConfig) -> dict[str, Any]:
        """Run parameters for the application (window end, collections, ...)."""
        return {}

    def summarize(self, context, summary: dict[str, Any]) -> dict[str, Any]:
        """Post-process the application's summary (log it, add fields) before it goes to XCom."""
        return summary

    def send_metrics(self, config: ConnectorConfig, summary: dict[str, Any]) -> None:
        """Send the run's metrics (airflow_provider_mongocdc.metrics)."""

    def wrote_data(self, summary: dict[str, Any]) -> bool:
        """Whether the run is an update of the connector's Asset (its AssetAlias gets the Asset)."""
        return True

    # -- assets, metrics and lineage of a finished run -----------------------------------------------
    def report_run(self, context, config: ConnectorConfig, summary: dict[str, Any]) -> dict[str, Any]:
        """Metrics, the asset events of the task's Asset outlets (extra: the run's summary) and the
        summary kept for OpenLineage; returns the summary."""
        self._run_summary = summary
        self.send_metrics(config, summary)
        outlet_events = (context or {}).get("outlet_events")
        if outlet_events is not None:
            extra = asset_extra(config, self.application_name, summary)
            for outlet in self.outlets or ():
                if isinstance(outlet, Asset):
                    outlet_events[outlet].extra = extra
                elif isinstance(outlet, AssetAlias) and self.wrote_data(summary):
                    outlet_events[outlet].add(connector_asset(config.topic_prefix), extra=extra)
        return summary

    def get_openlineage_facets_on_complete(self, task_instance):
        """OpenLineage inputs (MongoDB collections read) and outputs (Kafka topics written)."""
        from airflow_provider_mongocdc.lineage import openlineage_facets

        config = parse_connector_config(self.connector_config)
        namespaces = getattr(self, "_lineage_namespaces", None) or self.lineage_namespaces(
            self.mongo_details(), self.kafka_config()
        )
        return openlineage_facets(config, *namespaces, getattr(self, "_run_summary", None))

    @staticmethod
    def lineage_namespaces(mongo: Mapping[str, Any], kafka: Mapping[str, Any]) -> tuple[str, str]:
        from airflow_provider_mongocdc.lineage import kafka_namespace, mongodb_namespace

        return mongodb_namespace(mongo), kafka_namespace(kafka)

    # -- connections -------------------------------------------------------------------------------
    def mongo_details(self) -> dict[str, Any]:
        from airflow_provider_mongocdc.hooks.topology import MongoTopologyHook

        return MongoTopologyHook(mongo_conn_id=self.mongo_conn_id).get_connection_details().to_dict()

    def kafka_config(self) -> dict[str, Any]:
        from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook

        return KafkaConfigHook(kafka_conn_id=self.kafka_conn_id).get_kafka_config()

    # -- the connector's lease ----------------------------------------------------------------------
    def hold_lease(self, context, config: ConnectorConfig, kind: str):
        """Hold the connector's lease (core/offsets/lease.py) for this task while the block runs.

        The lease lasts ``lease_ttl`` (default: the task's execution_timeout, else 2 hours) and is
        renewed every third of it while the task runs. When it is lost (it expired and another task
        took it), the Spark job is killed and the block ends with LeaseLostError. A run without a
        ``lease_kind`` (the Delta apply, which writes no offsets) holds none.
        """
        if not kind:
            return contextlib.nullcontext()
        from airflow_provider_mongocdc.core.offsets.lease import (
            DEFAULT_TTL,
            ConnectorLease,
            as_ttl,
            owner_for_task,
            task_owner,
        )

        ttl = as_ttl(getattr(self, "lease_ttl", None) or self.execution_timeout or DEFAULT_TTL)
        lease = ConnectorLease.for_config(self.kafka_config(), config)
        owner = (
            task_owner(context)
            if context and "ti" in context
            else owner_for_task(self.dag_id, self.task_id, "manual")
        )
        self._lease_lost = None
        return lease.hold(owner, kind, ttl, renew=True, on_lost=self._on_lease_lost)

    def _on_lease_lost(self, error) -> None:
        """Called by the lease keeper's thread: stop the Spark job, which no longer holds the lease."""
        self._lease_lost = error
        if self._spark_job_submitted():  # a job was submitted: kill it
            self.on_kill()

    # -- run ---------------------------------------------------------------------------------------
    def execute(self, context) -> dict[str, Any]:
        config = parse_connector_config(self.connector_config)
        try:
            with self.hold_lease(context, config, self.lease_kind):
                return self.submit(context, config, self.build_spec(context, config))
        except ApplicationFailed as failure:
            # Raised here, without the exceptions that led to it: the message says everything, and
            # the traceback Airflow logs under it holds this one frame of the provider.
            raise AirflowException(str(failure)) from None

    def build_spec(self, context, config: ConnectorConfig) -> JobSpec:
        """The job spec of this run: configuration, connection details and run parameters."""
        spec = JobSpec(
            application=self.application_name,
            connector=config.to_properties(),
            mongo=self.mongo_details(),
            kafka=self.kafka_config(),
            params=self.job_params(context, config),
        )
        self._lineage_namespaces = self.lineage_namespaces(spec.mongo, spec.kafka)  # no credentials
        return spec

    def submit(self, context, config: ConnectorConfig, spec: JobSpec) -> dict[str, Any]:
        """Run the application with ``spec`` through spark-submit; return its summary."""
        with tempfile.TemporaryDirectory(prefix="mongocdc-job-") as tmp:
            spec_path = spec.write(Path(tmp) / "job-spec.json")
            result_path = Path(tmp) / "result.json"
            self.application_args = ["--job-spec", str(spec_path), "--result", str(result_path)]
            archive = build_code_archive(tmp)
            self.py_files = ",".join(p for p in (self.py_files, archive) if p)
            self.conf = {
                "spark.ui.showConsoleProgress": "false",
                **self.spark_log_conf(),
                **(self.conf or {}),
            }
            self._use_rendered_spark_connection()  # the hook built with the arguments set above
            self.log.info(
                "Running %s for %s: %s",
                self.application_name,
                config.in_words(),
                without_none({k: v for k, v in spec.redacted().items() if k != "connector"}),
            )
            try:
                if getattr(self, "_lease_lost", None) is not None:
                    raise self._lease_lost  # the connector's lease was lost before the job started
                with self._driver_jvm_logging(), self._driver_jvm_startup():
                    super().execute(context)
            except Exception as error:
                result = read_result(result_path)
                died = spark_submit_died(self.application_name, result, self._spark_submit_exit_code())
                if died is not None:  # a signal ended the driver JVM: say so, and what to check
                    raise ApplicationFailed(str(died)) from None
                if result and result.get("status") == "failed":
                    raise ApplicationFailed(result["message"]) from None
                raise AirflowException(
                    f"The {self.application_name} Spark application failed before it reported a "
                    f"result ({error}). Cause: see the spark-submit output above. Fix: correct the "
                    "cause and run the task again; nothing past the last committed offset was "
                    "recorded."
                ) from error
            result = read_result(result_path)
        if not result or result.get("status") != "ok":
            raise AirflowException(
                f"The {self.application_name} Spark application ended without a result. Cause: the "
                "driver did not run the mongocdc application (check the spark-submit output). Fix: "
                "run the task again; nothing past the last committed offset was recorded."
            )
        # The summary's JSON is the task's XCom (and at DEBUG, the task log's); the log at INFO
        # holds the readable lines of summarize().
        self.log.debug("%s%s", SUMMARY_MARKER, json.dumps(result["summary"], default=str))
        return self.report_run(context, config, self.summarize(context, result["summary"]))
