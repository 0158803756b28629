"""Build the hourly, re-snapshot and watchdog DAGs of many connectors from one list.

A DAG file (see ``dags/mongocdc_connectors.py``) calls::

    globals().update(connector_dags(path=Path(__file__).with_name("mongocdc_connectors.json")))

The list is a JSON file, ``{"connectors": [<entry>, ...]}`` (or a bare list of entries); an entry's
keys, their defaults and the DAG ids (:mod:`.core.base.dag_ids`): README, "The example DAGs". A
``config_variable`` is read when a task runs (macro ``mongocdc_connector_config()``); while the DAG
files are parsed only its ``topic.prefix`` is looked at (one topic prefix belongs to one connector,
see :class:`Taken`). An entry that is not valid yields none of its DAGs but a DAG of its own,
``mongocdc_invalid_<name>``, whose name, description and Docs name the entry, the problem and the
fix, and whose one task fails with that message (it runs once by itself). It is no import error on
purpose: Airflow 3.3 marks every DAG of a file with an import error stale (gone from the DAG list,
never scheduled), which would take every other connector's DAGs away. A list file that is not JSON
is an import error: no entry can be read. Missing pools are created by the scheduler plugin
:mod:`airflow_provider_mongocdc.plugins.pools`.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from airflow_provider_mongocdc.connector_values import connection_id, connector_config_json
from airflow_provider_mongocdc.core.base.dag_ids import DEFAULT_NAME, dag_ids
from airflow_provider_mongocdc.core.base.redaction import credential_properties

CONNECTOR_CONFIG_VARIABLE = "mongocdc_connector_config"
POOL_ENV = "MONGOCDC_POOL"
DEFAULT_CONN_IDS = {"mongo": "mongocdc_default", "kafka": "kafka_default", "spark": "spark_default"}
TAGS = ["mongocdc", "example"]
DEFAULT_START_DATE = "2026-01-01"
ENTRY_KEYS = {
    "name",
    "config",
    "config_variable",
    "conn_ids",
    "delta",
    "tables",
    "pool",
    "schedule",
    "watchdog_schedule",
    "start_date",
    "tags",
    "window_schedule",
}

# How long each kind of task may run. The connector's lease lasts as long and is renewed every
# third of it while the task runs: a killed task's lease frees itself after this time at most.
WINDOW_TIMEOUT = timedelta(minutes=55)
SNAPSHOT_TIMEOUT = timedelta(hours=6)
# How long a window task reads at most (it stops between transactions and the next run continues),
# and an open window's longest max_open: its execution_timeout less 5 minutes.
WINDOW_MAX_DURATION_S = WINDOW_TIMEOUT.total_seconds() - 300
# Retries. A failed or killed window is retried soon, from its last commit: Airflow's first retry
# 5 to 10 s after the failure (the delay, plus a share of it that differs per task instance), each
# further one after twice as long, never more than 2 minutes (a task cleared many times). While
# an open window killed with SIGKILL waits for it, the change watcher asks for no other run
# (core/offsets/open_window.py, killed_window_of). The snapshot and the Delta apply keep one retry
# after 2 minutes (the DAG's default_args).
WINDOW_RETRIES = {
    "retries": 4,
    "retry_delay": timedelta(seconds=5),
    "retry_exponential_backoff": 2.0,
    "max_retry_delay": timedelta(minutes=2),
}
DEFAULT_RETRIES = {"retries": 1, "retry_delay": timedelta(minutes=2)}

_NAME = re.compile(r"^[A-Za-z0-9_]+$")
# Airflow's longest DAG id (airflow.sdk.definitions._internal.node.validate_key).
DAG_ID_MAX_LEN = 250
# What Airflow accepts in a DAG id (KEY_REGEX) without a character that would need explaining.
_DAG_ID_PART = re.compile(r"^[A-Za-z0-9_.-]{1,200}$")
INVALID_ENTRY_TASK_ID = "invalid_connector_entry"


class ConnectorEntryError(ValueError):
    """A connector entry of the list is not valid (reported by a DAG of its own, see
    :func:`invalid_entry_dag`), or the list file cannot be read (an import error of the DAG file).
    ``problems``: each bad value's words, when there are several (the message joins them)."""

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = tuple(problems or (message,))

    @classmethod
    def of(cls, problems: list[str]) -> ConnectorEntryError:
        return cls("; ".join(problems), problems)


def fail_with(message: str) -> None:
    """The task of an invalid entry's DAG: fails, without retries, with the entry's message."""
    raise AirflowFailException(message)


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


def entry_label(entry: Any, index: int) -> str:
    """``connector entry #<n>`` and, when it has one, its name: how messages name an entry."""
    name = entry.get("name") if isinstance(entry, Mapping) else None
    if isinstance(name, str) and name:
        return f"connector entry #{index + 1} ({name!r})"
    return f"connector entry #{index + 1}"


def window_schedule(value: Any, label: str) -> tuple[Any, Any, Any]:
    """``(clock, changes, open)`` of an entry's ``window_schedule``: ``{"clock": <cron or preset, or
    seconds>, "changes": {<thresholds>}, "open": {<durations>}}``, a clock or changes or both, and
    optionally open windows. The clock is None without one; the changes are a
    :class:`~airflow_provider_mongocdc.core.watch.settings.WatchSettings`, or None; open is a
    :class:`~airflow_provider_mongocdc.core.window.params.OpenSettings`, or None (bounded windows).
    Every bad value is named at once."""
    from airflow_provider_mongocdc.core.base.errors import MongoCdcError
    from airflow_provider_mongocdc.core.watch.settings import WatchSettings
    from airflow_provider_mongocdc.core.window.params import OpenSettings

    example = '{"clock": "@hourly", "changes": {"min_changes": 1000, "max_delay": "60s"}}'
    if not isinstance(value, Mapping) or not value or set(value) - {"clock", "changes", "open"}:
        raise ConnectorEntryError(
            f"{label}: 'window_schedule' must be an object with 'clock' (a cron expression or "
            f"preset, or seconds), 'changes' (thresholds) or both, and optionally 'open' (open "
            f"windows), e.g. {example}; got {value!r}"
        )
    problems: list[str] = []
    clock = value.get("clock")
    if clock is not None:
        try:
            clock = clock_timetable(clock, label)
        except ConnectorEntryError as error:
            problems.append(str(error))
    changes = None
    if "changes" in value:
        try:
            changes = WatchSettings.from_entry(value["changes"])
        except MongoCdcError as error:
            problems.extend(
                f"{label}: 'window_schedule' 'changes' is not valid: {each}"
                for each in getattr(error, "problems", (error,))
            )
    opened = None
    if "open" in value:
        try:
            opened = OpenSettings.from_entry(value["open"])
        except MongoCdcError as error:
            problems.extend(
                f"{label}: 'window_schedule' 'open' is not valid: {each}"
                for each in getattr(error, "problems", (error,))
            )
        if opened is not None and opened.max_open_s > WINDOW_MAX_DURATION_S:
            problems.append(
                f"{label}: 'window_schedule' 'open' is not valid: max_open ({opened.max_open_s:g} s) is "
                f"longer than the window task may read ({WINDOW_MAX_DURATION_S:g} s, its "
                f"execution_timeout of {WINDOW_TIMEOUT.total_seconds():g} s less 5 minutes). Fix: give "
                f'max_open at most "{WINDOW_MAX_DURATION_S / 60:g}min", or leave it out'
            )
            opened = None
    if problems:
        raise ConnectorEntryError.of(problems)
    if clock is None and changes is None:
        raise ConnectorEntryError(
            f"{label}: 'window_schedule' has neither a clock nor changes, e.g. {example}"
        )
    return clock, changes, opened


# The longest time between two runs a schedule may give in seconds (Airflow adds it to dates).
MAX_SCHEDULE_SECONDS = 366 * 86400
# Schedules Airflow takes as they are (no cron expression).
SCHEDULE_PRESETS = ("@once", "@continuous")


def schedule_value(value: Any, label: str, key: str) -> Any:
    """A schedule of an entry (``schedule``, ``watchdog_schedule``, ``window_schedule``'s
    ``clock``) as the DAG takes it, checked as Airflow would check it when the DAG file is
    processed: seconds between runs (a number above 0, at most a year) as a timedelta, or a cron
    expression or preset (``@hourly``, ``@once``...) as text."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if math.isfinite(value) and 0 < value <= MAX_SCHEDULE_SECONDS:
            return timedelta(seconds=value)
        raise ConnectorEntryError(
            f"{label}: {key} {value!r} is not a number of seconds between runs above 0 and at most "
            f"{MAX_SCHEDULE_SECONDS} (a year); give e.g. 3600, or a cron expression or preset such as "
            '"@hourly"'
        )
    if isinstance(value, str) and value.strip():
        text = value.strip()
        if text in SCHEDULE_PRESETS:
            return text
        from airflow.sdk import CronTriggerTimetable

        try:
            CronTriggerTimetable(text, timezone="UTC").validate()
        except Exception as error:  # AirflowTimetableInvalid, ValueError: the cron parser's own words
            raise ConnectorEntryError(
                f"{label}: {key} {value!r} is not a cron expression or preset: {error}; give e.g. "
                '"@hourly", "*/30 * * * *" or seconds between runs such as 3600'
            ) from None
        return text
    raise ConnectorEntryError(
        f'{label}: {key} must be a cron expression or preset (e.g. "@hourly") or seconds between runs '
        f"(e.g. 3600), got {value!r}"
    )


def clock_timetable(clock: Any, label: str):
    """The timetable of a ``window_schedule`` clock: a cron expression or preset (as a plain
    ``schedule`` string), or seconds between runs."""
    from airflow.sdk import CronTriggerTimetable, DeltaTriggerTimetable

    value = schedule_value(clock, label, "'window_schedule' 'clock'")
    if isinstance(value, timedelta):
        return DeltaTriggerTimetable(value)
    if value in SCHEDULE_PRESETS:
        raise ConnectorEntryError(
            f"{label}: 'window_schedule' 'clock' {clock!r} is not a clock; give a cron expression or "
            'preset such as "@hourly", or seconds between windows'
        )
    return CronTriggerTimetable(value, timezone="UTC")


def _entry_name(entry: Any, label: str) -> str:
    """The entry's ``name``, once the entry is an object of known keys."""
    if not isinstance(entry, Mapping):
        raise ConnectorEntryError(f"{label} must be a JSON object, got {type(entry).__name__}")
    name = entry.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConnectorEntryError(
            f"{label}: 'name' must be letters, digits and _ (it is part of the DAG ids), got {name!r}"
        )
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise ConnectorEntryError(
            f"{label}: unknown key(s) {', '.join(unknown)}; the keys are {', '.join(sorted(ENTRY_KEYS))}"
        )
    return name


def _entry_config(entry: Mapping[str, Any], name: str, label: str) -> tuple[Any, str | None]:
    """``(config, config_variable)``: the inline configuration (validated), else the Variable
    that holds it (``mongocdc_connector_config`` for the connector ``default``)."""
    config = entry.get("config")
    config_variable = entry.get("config_variable")
    if config is not None and config_variable is not None:
        raise ConnectorEntryError(f"{label}: give either 'config' or 'config_variable', not both")
    if config is not None:
        if not isinstance(config, Mapping) or not config.get("topic.prefix"):
            raise ConnectorEntryError(
                f"{label}: 'config' must be a JSON object of Debezium properties with a "
                f'topic.prefix, e.g. {{"topic.prefix": "{name}"}}'
            )
        from airflow_provider_mongocdc.core.base.errors import MongoCdcError
        from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

        try:
            ConnectorConfig.from_properties(dict(config))
        except MongoCdcError as error:
            raise ConnectorEntryError(f"{label}: 'config' is not valid: {error}") from None
        secret = credential_properties(config)
        if secret:
            raise ConnectorEntryError(
                f"{label}: 'config' holds credential properties ({', '.join(secret)}); an inline "
                "configuration is stored in Airflow's serialized DAGs and shown in task details, so it "
                "may not carry a secret. Remove them (credentials belong in the MongoDB and Kafka "
                "connections), or keep the configuration in a Variable ('config_variable')"
            )
    elif config_variable is None:
        config_variable = (
            CONNECTOR_CONFIG_VARIABLE if name == DEFAULT_NAME else f"mongocdc_{name}_connector_config"
        )
    if (
        not isinstance(config_variable, (str, type(None)))
        or config_variable == ""
        or len(config_variable or "") > 250
    ):
        raise ConnectorEntryError(
            f"{label}: 'config_variable' must be a Variable name (at most 250 characters)"
        )
    return config, config_variable


def _entry_conn_ids(entry: Mapping[str, Any], label: str) -> dict[str, str]:
    """The entry's connection ids over ``DEFAULT_CONN_IDS``."""
    conn_ids = entry.get("conn_ids") or {}
    if (
        not isinstance(conn_ids, Mapping)
        or set(conn_ids) - set(DEFAULT_CONN_IDS)
        or not all(isinstance(value, str) and 0 < len(value) <= 250 for value in conn_ids.values())
    ):
        raise ConnectorEntryError(
            f"{label}: 'conn_ids' must be an object with the keys mongo, kafka, spark (connection ids), "
            f"got {conn_ids!r}"
        )
    return {**DEFAULT_CONN_IDS, **conn_ids}


def _entry_pool(entry: Mapping[str, Any], name: str, label: str) -> str:
    """The entry's pool: ``mongocdc_<name>`` (the connector ``default``: ``$MONGOCDC_POOL`` or
    ``mongocdc_default``) unless it names one."""
    pool = entry.get("pool")
    if pool is None:
        pool = os.environ.get(POOL_ENV) or "mongocdc_default" if name == DEFAULT_NAME else f"mongocdc_{name}"
    if not isinstance(pool, str) or not pool or len(pool) > 256:
        raise ConnectorEntryError(
            f"{label}: 'pool' must be a pool name (at most 256 characters), got {pool!r}"
        )
    return pool


def _entry_schedules(entry: Mapping[str, Any], label: str) -> tuple[Any, Any, Any, Any]:
    """``(schedule, changes, open, watchdog_schedule)``: the window DAG's schedule by the clock, by
    changes (a change watcher), or both; open windows or None; the watchdog's. Schedules are checked by one function
    (:func:`schedule_value`): seconds or a cron expression or preset; ``schedule`` may be null."""
    problems: list[str] = []
    schedule = entry.get("schedule", "@hourly")
    changes = opened = None
    if "window_schedule" in entry:
        if "schedule" in entry:
            raise ConnectorEntryError(f"{label}: give either 'schedule' or 'window_schedule', not both")
        try:
            schedule, changes, opened = window_schedule(entry["window_schedule"], label)
        except ConnectorEntryError as error:
            problems.extend(error.problems)
    elif schedule is not None:
        try:
            schedule = schedule_value(schedule, label, "'schedule'")
        except ConnectorEntryError as error:
            problems.extend(error.problems)
    try:
        watchdog = schedule_value(entry.get("watchdog_schedule", 600), label, "'watchdog_schedule'")
    except ConnectorEntryError as error:
        problems.extend(error.problems)
        watchdog = None
    if problems:
        raise ConnectorEntryError.of(problems)
    return schedule, changes, opened, watchdog


def _entry_start_date(entry: Mapping[str, Any], label: str):
    """The entry's ``start_date`` (an ISO 8601 date or date and time, UTC)."""
    import pendulum

    value = entry.get("start_date", DEFAULT_START_DATE)
    try:
        parsed = pendulum.parse(value, tz="UTC", exact=True) if isinstance(value, str) else None
    except Exception:
        parsed = None
    if type(parsed) is pendulum.Date:
        parsed = pendulum.datetime(parsed.year, parsed.month, parsed.day, tz="UTC")
    if not isinstance(parsed, pendulum.DateTime):  # a duration (P1D) or a time of day is no date
        raise ConnectorEntryError(
            f"{label}: 'start_date' must be an ISO 8601 date (e.g. \"2026-01-01\"), got {value!r}"
        )
    return parsed


def _entry_tags(entry: Mapping[str, Any], name: str, label: str) -> list[str]:
    """The DAGs' tags: ``TAGS``, the connector's name (but ``default``'s) and the entry's own."""
    from airflow.sdk.definitions.dag import TAG_MAX_LEN

    tags = entry.get("tags") or []
    if not isinstance(tags, list) or not all(isinstance(tag, str) and tag for tag in tags):
        raise ConnectorEntryError(f"{label}: 'tags' must be a list of strings")
    long = [tag for tag in [name, *tags] if len(tag) > TAG_MAX_LEN]
    if long:
        raise ConnectorEntryError(
            f"{label}: a tag may have at most {TAG_MAX_LEN} characters (Airflow's limit), "
            f"{long[0][:20]!r}... has {len(long[0])}"
            + (" (the connector's name is one of its tags)" if long[0] == name else "")
        )
    return [*TAGS, *([] if name == DEFAULT_NAME else [name]), *tags]


def _entry_ids(name: str, label: str) -> dict[str, str]:
    """The connector's DAG ids, each within Airflow's limit."""
    ids = dag_ids(name)
    longest = max(ids.values(), key=len)
    if len(longest) > DAG_ID_MAX_LEN:
        raise ConnectorEntryError(
            f"{label}: the name has {len(name)} characters, which makes the DAG id {longest[:40]}... "
            f"{len(longest)} characters long; Airflow's limit is {DAG_ID_MAX_LEN}: give a name of at most "
            f"{DAG_ID_MAX_LEN - len(longest) + len(name)} characters"
        )
    return ids


def _entry_delta(entry: Mapping[str, Any], label: str):
    """The entry's table settings (:class:`~airflow_provider_mongocdc.core.apply.settings.TableSettings`),
    or None: the collections kept as tables by a ``delta_apply`` task after each window. ``tables``
    names the format (``"format": "delta"`` or ``"iceberg"``); ``delta`` is the same of Delta tables
    (one of the two keys)."""
    if entry.get("delta") is None and entry.get("tables") is None:
        return None
    from airflow_provider_mongocdc.core.apply.settings import TableSettings
    from airflow_provider_mongocdc.core.base.errors import MongoCdcError

    if entry.get("delta") is not None and entry.get("tables") is not None:
        raise ConnectorEntryError(
            f"{label}: it has both 'delta' and 'tables'; give one of them ('tables' with \"format\": "
            '"delta" or "iceberg", or \'delta\' for Delta tables)'
        )
    key = "tables" if entry.get("tables") is not None else "delta"
    try:
        return TableSettings.from_mapping(entry[key], f"'{key}'", format="delta" if key == "delta" else None)
    except MongoCdcError as error:
        raise ConnectorEntryError(f"{label}: '{key}' is not valid: {error}") from None


class Connector:
    """One validated entry of the connector list, its keys checked one after the other."""

    def __init__(self, entry: Any, index: int):
        self.label = label = entry_label(entry, index)
        self.name = name = _entry_name(entry, label)
        problems: list[str] = []

        def checked(check, *args):
            """``check(*args)``; its problem noted (every key is checked, every problem named)."""
            try:
                return check(*args)
            except ConnectorEntryError as error:
                problems.extend(problem.removeprefix(f"{label}: ") for problem in error.problems)
                return None

        self.dag_ids = checked(_entry_ids, name, label)
        self.config, self.config_variable = checked(_entry_config, entry, name, label) or (None, None)
        self.conn_ids = checked(_entry_conn_ids, entry, label)
        self.pool = checked(_entry_pool, entry, name, label)
        self.schedule, self.changes, self.open, self.watchdog_schedule = checked(
            _entry_schedules, entry, label
        ) or (None, None, None, None)
        self.start_date = checked(_entry_start_date, entry, label)
        self.tags = checked(_entry_tags, entry, name, label)
        self.delta = checked(_entry_delta, entry, label)
        if len(problems) == 1:
            raise ConnectorEntryError(f"{label}: {problems[0]}")
        if problems:
            listed = "; ".join(
                f"{number}) {problem.rstrip('. ')}" for number, problem in enumerate(problems, 1)
            )
            raise ConnectorEntryError(f"{label}: {len(problems)} problems: {listed}")

    # -- run-time macros ---------------------------------------------------------------------------
    def connector_config(self) -> str:
        """The connector configuration as JSON (inline, else the Variable, read at run time)."""
        return connector_config_json(self.name, self.config, self.config_variable)

    def conn_id(self, kind: str) -> str:
        return connection_id(self.name, kind, self.conn_ids[kind])

    @property
    def macros(self) -> dict[str, Any]:
        return {
            "mongocdc_connector_config": self.connector_config,
            "mongocdc_conn_id": self.conn_id,
            "mongocdc_gap_run_id": gap_run_id,
        }

    def arguments(self, operator_class) -> dict[str, Any]:
        """The templated connector, connection and pool arguments of the provider's operators."""
        arguments = {
            "connector_config": "{{ mongocdc_connector_config() }}",
            "mongo_conn_id": "{{ mongocdc_conn_id('mongo') }}",
            "kafka_conn_id": "{{ mongocdc_conn_id('kafka') }}",
        }
        if operator_class is not None and hasattr(operator_class, "application_name"):
            if "spark_conn_id" in getattr(operator_class, "template_fields", ()):
                arguments["spark_conn_id"] = "{{ mongocdc_conn_id('spark') }}"
            else:
                arguments["spark_conn_id"] = self.conn_ids["spark"]
            arguments["pool"] = self.pool
        return arguments

    def describe(self) -> str:
        config = (
            "inline in the connector list"
            if self.config is not None
            else f"the Airflow Variable `{self.config_variable}`"
        )
        return (
            f"**Connector `{self.name}`**: configuration from {config}; connections "
            f"`{self.conn_ids['mongo']}` (MongoDB), `{self.conn_ids['kafka']}` (Kafka), "
            f"`{self.conn_ids['spark']}` (Spark); pool `{self.pool}` (created with one slot when a "
            f"run starts if it does not exist; to size it: `airflow pools set {self.pool} <slots> "
            f'"MongoDB CDC connector {self.name}: one snapshot or window at a time"`).'
        )


def load_connectors(path: str | os.PathLike) -> list[Any]:
    """The entries of the connector list file (JSON)."""
    text = Path(path).read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConnectorEntryError(
            f"The connector list {path} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno}"
        ) from None
    if isinstance(data, Mapping):
        data = data.get("connectors")
    if not isinstance(data, list):
        raise ConnectorEntryError(f'{path}: expected {{"connectors": [...]}} or a JSON list of entries')
    return data


def invalid_dag_id(entry: Any, index: int) -> str:
    """The id of the DAG standing for an invalid entry: ``mongocdc_invalid_<name>``, else
    ``mongocdc_invalid_entry_<n>``."""
    name = entry.get("name") if isinstance(entry, Mapping) else None
    usable = isinstance(name, str) and _DAG_ID_PART.match(name)
    return f"mongocdc_invalid_{name}" if usable else f"mongocdc_invalid_entry_{index + 1}"


def invalid_entry_dag(entry: Any, index: int, error: str, source: str, taken: set[str]):
    """The DAG standing for an invalid entry: named after it (``mongocdc_invalid_<name>``, else
    ``mongocdc_invalid_entry_<n>``; never one of ``taken``), its display name, description and Docs
    say what is wrong and how to fix it, and its one task, run once by itself, fails with that."""
    import pendulum
    from airflow.providers.standard.operators.python import PythonOperator
    from airflow.sdk import DAG

    dag_id = invalid_dag_id(entry, index)
    while dag_id in taken:
        dag_id += f"_{index + 1}"
    label = entry_label(entry, index)
    message = (
        f"{source} has an invalid entry: {error.rstrip('. ')}. It has no DAGs until it is fixed; the other "
        "connectors' DAGs are not affected. Fix: correct the entry (its keys and defaults: README, "
        '"The example DAGs"); this DAG goes away when the DAG file is parsed next.'
    )
    with DAG(
        dag_id=dag_id,
        dag_display_name=f"mongocdc: invalid {label}",
        description=message,
        doc_md=f"### MongoDB CDC: invalid connector entry\n\n{message}\n",
        schedule="@once",
        start_date=pendulum.parse(DEFAULT_START_DATE, tz="UTC"),
        catchup=False,
        # Runs (and fails) once by itself, so that the entry shows as a failed run too.
        is_paused_upon_creation=False,
        tags=[*TAGS, "invalid"],
    ) as dag:
        # The message is no template (it may hold braces): the callable takes it, not op_args.
        PythonOperator(task_id=INVALID_ENTRY_TASK_ID, python_callable=partial(fail_with, message), retries=0)
    return dag


class Taken:
    """The names and topic prefixes of the entries read so far: a later entry that repeats one is
    invalid (one topic prefix, with its offsets and lease, belongs to one connector), wherever its
    configuration lives (inline, or the Variable as it holds it now: :func:`listed_prefix`)."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}
        self.prefixes: dict[str, str] = {}

    def claim(self, connector: Connector) -> None:
        if connector.name in self.names:
            raise ConnectorEntryError(
                f"{connector.label}: the name {connector.name!r} is already used by {self.names[connector.name]}"
            )
        prefix, where = listed_prefix(connector)
        if prefix is not None and prefix in self.prefixes:
            raise ConnectorEntryError(
                f"{connector.label}: its topic.prefix {prefix!r}{where} is that of {self.prefixes[prefix]}; "
                "a topic prefix (with its offsets topic and its lease) belongs to one connector, and two "
                "connectors sharing one would each commit positions past changes only the other emits. "
                "Give each connector its own topic.prefix"
            )
        self.names[connector.name] = connector.label
        if prefix is not None:
            self.prefixes[prefix] = connector.label + where


def listed_prefix(connector: Connector) -> tuple[str | None, str]:
    """The connector's ``topic.prefix`` and, when it is not inline, where it is set (words for a
    message): its Variable is read as it holds it now; None when it cannot be read (not set yet:
    the connector's tasks say so when they run). The runs refuse offsets and leases written under
    another connector's name in any case, for a Variable may change after the list was parsed."""
    if connector.config is not None:
        prefix = connector.config.get("topic.prefix")
        return (prefix if isinstance(prefix, str) else None), ""
    try:
        properties = json.loads(connector.connector_config())
    except Exception:  # noqa: BLE001 - not set or not readable now: its tasks report it
        return None, ""
    prefix = properties.get("topic.prefix") if isinstance(properties, Mapping) else None
    if not isinstance(prefix, str) or not prefix:
        return None, ""
    return prefix, f" (in the Airflow Variable {connector.config_variable!r})"


def connector_dags(
    connectors: list[Any] | None = None, *, path: str | os.PathLike | None = None
) -> dict[str, Any]:
    """The DAGs of every connector of ``connectors`` (entries) or of the list file ``path``:
    ``{dag_id: DAG}``, for ``globals().update(...)`` in a DAG file. Each invalid entry adds a DAG
    that names it and fails (:func:`invalid_entry_dag`) instead of its connector's DAGs."""
    if connectors is None:
        if path is None:
            raise TypeError("connector_dags needs connectors= or path=")
        connectors = load_connectors(path)
    dags: dict[str, Any] = {}
    seen = Taken()
    invalid: list[tuple[int, Any, str]] = []
    for index, entry in enumerate(connectors):
        try:
            connector = Connector(entry, index)
            seen.claim(connector)
            built = build_connector_dags(connector)
        except ConnectorEntryError as error:
            invalid.append((index, entry, str(error)))
            continue
        except Exception as error:  # noqa: BLE001 - one entry's failure never takes the file's DAGs away
            invalid.append(
                (index, entry, f"{entry_label(entry, index)}: its DAGs cannot be built: {_words(error)}")
            )
            continue
        dags.update(built)
    source = "The connector list" + (f" {path}" if path is not None else "")
    for index, entry, error in invalid:
        dag = invalid_entry_dag(entry, index, error, source, set(dags))
        dags[dag.dag_id] = dag
    return dags


def _words(error: BaseException) -> str:
    """An error of Airflow or the provider in one line, with its kind."""
    text = " ".join(str(error).split()) or "no message"
    return f"{type(error).__name__}: {text[:500]}"


def window_dag_schedule(connector: Connector) -> Any:
    """The window DAG's schedule: the clock; with ``changes``, the connector's changes Asset (its
    change watcher), or the clock OR that Asset (``AssetOrTimeSchedule``)."""
    if connector.changes is None:
        return connector.schedule
    from airflow.sdk import AssetOrTimeSchedule

    from airflow_provider_mongocdc.triggers.change_watcher import MongoChangeWatcher, changes_asset

    watcher = MongoChangeWatcher(
        connector.name,
        connector_config=connector.config,
        config_variable=connector.config_variable,
        mongo_conn_id=connector.conn_ids["mongo"],
        kafka_conn_id=connector.conn_ids["kafka"],
        watchdog_dag_id=connector.dag_ids["watchdog"],
        **connector.changes.to_kwargs(),
    )
    asset = changes_asset(watcher)
    if connector.schedule is None:
        return asset
    return AssetOrTimeSchedule(timetable=connector.schedule, assets=asset)


def build_connector_dags(connector: Connector) -> dict[str, Any]:
    """The hourly, re-snapshot and watchdog DAGs of one connector."""
    common = dict(
        start_date=connector.start_date,
        catchup=False,
        max_active_runs=1,
        user_defined_macros=connector.macros,
        tags=connector.tags,
    )
    dags = (window_dag(connector, common), resnapshot_dag(connector, common), watchdog_dag(connector, common))
    for dag in dags:
        dag.validate()  # what the DAG processor checks before it takes a DAG (the timetable's values)
    return {dag.dag_id: dag for dag in dags}


def window_dag(connector: Connector, common: Mapping[str, Any]):
    """``mongocdc_hourly``: snapshot >> window (>> delta_apply, with ``delta``)."""
    from airflow.sdk import DAG

    from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
    from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

    ids = connector.dag_ids
    with DAG(
        dag_id=ids["hourly"],
        schedule=window_dag_schedule(connector),
        doc_md=HOURLY_DOC.format(connector=connector.describe(), resnapshot=ids["resnapshot"])
        + (CHANGES_DOC.format(settings=connector.changes.describe()) if connector.changes else "")
        + (OPEN_DOC.format(settings=connector.open.describe()) if connector.open else "")
        + (
            (ICEBERG_DOC if connector.delta.format == "iceberg" else DELTA_DOC).format(
                location=connector.delta.location or f"the catalog of `{connector.delta.conn_id}`"
            )
            if connector.delta
            else ""
        ),
        **common,
        default_args=dict(DEFAULT_RETRIES),
    ) as dag:
        snapshot = MongoSnapshotOperator(
            task_id="snapshot",
            execution_timeout=SNAPSHOT_TIMEOUT,
            **connector.arguments(MongoSnapshotOperator),
        )
        window = MongoStreamWindowOperator(
            task_id="window",
            execution_timeout=WINDOW_TIMEOUT,
            # Stops at a point between transactions before the task's timeout; the next run continues.
            max_duration=WINDOW_MAX_DURATION_S,
            open_window=connector.open.to_entry() if connector.open else None,
            # An open window's tables follow its topics while it is open (delta_apply finds the rest).
            tables=connector.delta.to_json() if connector.delta and connector.open else None,
            **WINDOW_RETRIES,
            **connector.arguments(MongoStreamWindowOperator),
        )
        snapshot >> window
        if connector.delta is not None:
            window >> delta_apply_task(connector)
    return dag


def delta_apply_task(connector: Connector):
    """The task that applies the connector's topics to its tables, in the connector's pool:
    ``delta_apply`` (Delta Lake) or ``iceberg_apply`` (Apache Iceberg)."""
    from airflow_provider_mongocdc.operators.delta_apply import MongoDeltaApplyOperator
    from airflow_provider_mongocdc.operators.table_apply import MongoTableApplyOperator

    if connector.delta.format == "delta":
        return MongoDeltaApplyOperator(
            task_id="delta_apply",
            delta=connector.delta.to_json(),
            execution_timeout=WINDOW_TIMEOUT,
            **connector.arguments(MongoDeltaApplyOperator),
        )
    return MongoTableApplyOperator(
        task_id=f"{connector.delta.format}_apply",
        tables=connector.delta.to_json(),
        execution_timeout=WINDOW_TIMEOUT,
        **connector.arguments(MongoTableApplyOperator),
    )


def resnapshot_dag(connector: Connector, common: Mapping[str, Any]):
    """``mongocdc_resnapshot``: its trigger form (Params) and the re-snapshot task."""
    from airflow.sdk import DAG

    from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator, resnapshot_params

    ids = connector.dag_ids
    with DAG(
        dag_id=ids["resnapshot"],
        schedule=None,
        doc_md=RESNAPSHOT_DOC.format(
            connector=connector.describe(), dag_id=ids["resnapshot"], watchdog=ids["watchdog"]
        ),
        **common,
        render_template_as_native_obj=True,  # collections and the gap report stay lists and objects
        params=resnapshot_params(),
    ) as dag:
        MongoResnapshotOperator(
            task_id="resnapshot",
            collections="{{ params.collections }}",
            reason="{{ params.reason }}",
            mode="{{ params.mode }}",
            filters="{{ params.filters }}",
            gap_report="{{ dag_run.conf.get('gap_report') if dag_run.conf else None }}",
            execution_timeout=SNAPSHOT_TIMEOUT,
            **connector.arguments(MongoResnapshotOperator),
        )
    return dag


def watchdog_dag(connector: Connector, common: Mapping[str, Any]):
    """``mongocdc_watchdog``: detect_gap >> trigger_resnapshot (one re-snapshot run per gap)."""
    from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
    from airflow.sdk import DAG

    from airflow_provider_mongocdc.core.gap.headroom import HEADROOM_WARNING
    from airflow_provider_mongocdc.sensors.oplog_gap import OplogGapSensor

    ids = connector.dag_ids
    with DAG(
        dag_id=ids["watchdog"],
        schedule=connector.watchdog_schedule,
        doc_md=WATCHDOG_DOC.format(connector=connector.describe(), resnapshot=ids["resnapshot"]),
        **common,
    ) as dag:
        detect_gap = OplogGapSensor(
            task_id="detect_gap",
            mode="reschedule",
            poke_interval=timedelta(minutes=2),
            timeout=timedelta(minutes=8),
            soft_fail=True,
            headroom_warning=HEADROOM_WARNING,
            resnapshot_dag_id=ids["resnapshot"],
            **connector.arguments(None),
        )
        trigger_resnapshot = TriggerDagRunOperator(
            task_id="trigger_resnapshot",
            trigger_dag_id=ids["resnapshot"],
            trigger_run_id="{{ mongocdc_gap_run_id(ti.xcom_pull(task_ids='detect_gap')) }}",
            conf={
                "mode": "gap",
                "collections": [],
                "reason": "oplog gap found by {{ dag.dag_id }} run {{ run_id }}",
                "gap_report": detect_gap.output,
            },
            skip_when_already_exists=True,
            wait_for_completion=False,
        )
        detect_gap >> trigger_resnapshot
    return dag


HOURLY_DOC = """
### MongoDB CDC: windows

{connector}

Every run, the changes of the captured MongoDB collections from the stored offset up to the end
of the run's data interval become Debezium-compatible change events in Kafka; the offset moves
forward in the same Kafka transaction.

* **snapshot** runs the snapshot application; it copies only when `snapshot.mode` asks for it
  (no offset yet with `initial`; every run with `always`; a purged resume point with
  `when_needed`), and otherwise finishes at once ("no snapshot needed"). With `always` the stored
  offset stays where it is (unless it was purged from the oplog), so the window still streams
  every change since the previous run, deletes included, after the snapshot's read events.
* **window** streams from the stored offset up to `data_interval_end` (or now, when that lies in
  the future).

Both run in the connector's pool (one slot), as does the re-snapshot (`{resnapshot}`), so they
queue one after the other instead of overlapping. Each also holds the connector's lease (a record
in the offsets topic) while it runs, renewed as long as it runs, which keeps snapshots, windows
and `mongocdc offsets` changes apart even outside these DAGs and pools.

**Catch-up.** `catchup=False`: when the DAG is switched on, or after downtime, only the latest
interval runs. That loses nothing: a window always starts from the stored offset, not from its
data interval's start, so one run covers all the time since the previous window (`max_duration`
bounds how long it reads, and the next run continues). A re-run of an old interval (its end
before the stored offset) reads nothing and keeps the offset.
"""

CHANGES_DOC = """
**Change-driven windows.** The connector's change watcher (in Airflow's triggerer) asks for a run
when changes are pending ({settings}) or a stored position nears the end of the oplog; the run's
asset event says why (Asset `mongocdc.<name>.changes`). A run started by it has no data interval:
its window ends when the window task starts. One run at a time: changes that arrive while a
window runs make at most one next run, asked for once they reach a threshold. While an incremental
snapshot is requested or running, the watcher asks for windows one after the other until it is
done. Before the first snapshot the watcher stays quiet: press
**Trigger** once (or keep a clock in the schedule) to take it.
"""

OPEN_DOC = """
**Open windows.** Each window stays open while changes keep coming ({settings}): a change is in
Kafka about a commit interval after it was written, and the change watcher asks for no window
while one is open. The window task (and its Spark driver) runs as long as the window is open.
A window task that failed or was killed is retried 5 to 10 s later (each further retry waits
longer, at most 2 minutes) and continues from its last commit; the watcher asks for no other
window while a window killed with SIGKILL waits for its retry (its task still holds the lease).
"""

DELTA_DOC = """
**Delta Lake tables.** After each window, **delta_apply** applies the connector's topics to one
Delta table per collection under `{location}` (`<database>/<collection>`), exactly once: each table
records the topic positions it applied in the same commit as its rows. A completed snapshot sweeps
rows that are gone from MongoDB; small files are compacted and old ones vacuumed on the entry's
schedule (README, "Delta Lake tables").
"""

ICEBERG_DOC = """
**Apache Iceberg tables.** After each window, **delta_apply** applies the connector's topics to one
Iceberg table per collection (`<database>.<collection>`, in {location}), exactly once: each
table's snapshot records the topic positions it applied beside its rows. A completed snapshot sweeps
rows that are gone from MongoDB; small files are compacted and old snapshots expired on the entry's
schedule (README, "Apache Iceberg tables").
"""

RESNAPSHOT_DOC = """
### MongoDB CDC: re-snapshot

{connector}

Copies the captured collections to Kafka again as read events (`op: r`), with the snapshot
application. Trigger it from the UI (**Trigger**: the form opens valid; every field may stay
empty) or through the REST API (`POST /api/v2/dags/{dag_id}/dagRuns` with `conf`). The watchdog
(`{watchdog}`) triggers it with `mode: gap` and its gap report when a stored resume point is no
longer in the oplog.

* **mode `manual`** (default): the chosen collections (empty: all) are copied while the streaming
  offset stays where it is, so no change event is skipped. When the task finds that a stored
  resume point is gone after all, it proceeds as in gap mode.
* **mode `incremental`**: the request (collections, empty: all; optional **Filters**, a query per
  collection) is recorded in the offsets topic and the task ends at once. Each following
  `mongocdc_hourly` window, after streaming to its end, copies the next chunks
  (`incremental.snapshot.chunk.size` documents, within `incremental.snapshot.window.budget.ms`) as
  read events with `source.snapshot: incremental`, so streaming never stops. The window's summary
  (XCom) and `mongocdc offsets show` tell the progress. A new request while one runs copies both.
* **mode `gap`**: every captured collection is copied and the streaming offset moves to the new
  snapshot's start position. Gap mode copies every collection: to copy a chosen few, use `manual`
  or `incremental`. A gap re-snapshot ends a running incremental snapshot (it copied everything).
* **mode `stop`**: ends the running incremental snapshot (Debezium's `stop-snapshot`).

Documents deleted during lost history have no delete event (the oplog entries are gone): as with
Debezium, the re-snapshot's read events are the complete current state, and a consumer that
rebuilds state should drop the keys of a collection that a gap re-snapshot did not emit.
"""

WATCHDOG_DOC = """
### MongoDB CDC: oplog gap watchdog

{connector}

**detect_gap** (OplogGapSensor, reschedule mode) checks whether the stored resume points of the
connector are still in the oplog. A quiet run ends *skipped* when its timeout (8 minutes) passes
without a gap; the task log shows each partition's headroom and a warning below 6 hours.

When a position is gone, the sensor succeeds with a gap report (XCom) and **trigger_resnapshot**
starts `{resnapshot}` with `mode: gap` and the report in its conf. The triggered run's id is
derived from the lost positions, so the same gap triggers one re-snapshot however many watchdog
runs see it; if that re-snapshot fails, clear it to run it again.
"""
