"""The DAGs built from a connector list, as Airflow 3.3's DAG processor loads them, and the
re-snapshot trigger form: the DAG ids, pools and connections of each connector, a DAG of its own
(no import error) naming each invalid entry while the other connectors load, a form that validates
as it opens, and re-snapshot messages in words."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import jsonschema
import pytest
from airflow.dag_processing.dagbag import DagBag
from airflow.sdk.definitions.timetables.simple import OnceTimetable
from airflow.sdk.exceptions import AirflowFailException, ParamValidationError
from airflow.serialization.serialized_objects import DagSerialization

from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.operators.base import parse_connector_config
from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator, parse_collections

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]


def dag_folder(tmp_path: Path, connectors: list | None = None) -> Path:
    """A DAGs folder with the repository's connector DAG files and, when given, this connector list."""
    folder = tmp_path / "dags"
    folder.mkdir()
    for name in ("mongocdc_connectors.py", "mongocdc_connectors.json"):
        shutil.copy(REPO / "dags" / name, folder / name)
    if connectors is not None:
        (folder / "mongocdc_connectors.json").write_text(json.dumps({"connectors": connectors}))
    return folder


def load(folder: Path, monkeypatch) -> DagBag:
    monkeypatch.delenv("MONGOCDC_POOL", raising=False)
    monkeypatch.delenv("MONGOCDC_CONNECTORS_FILE", raising=False)
    return DagBag(str(folder))


def resnapshot_dag(tmp_path, monkeypatch):
    bag = load(dag_folder(tmp_path), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    return bag.dags["mongocdc_resnapshot"]


# -- the connector list ------------------------------------------------------------------------------


def test_repository_dag_folder_keeps_the_default_dag_ids_and_names_its_pool(tmp_path, monkeypatch):
    # The pool comes from the connector list, not from a connector configuration in the environment.
    monkeypatch.setenv("MONGOCDC_CONNECTOR_CONFIG", json.dumps({"topic.prefix": "shop"}))
    bag = load(dag_folder(tmp_path), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == ["mongocdc_hourly", "mongocdc_resnapshot", "mongocdc_watchdog"]
    pools = {task.task_id: task.pool for task in bag.dags["mongocdc_hourly"].tasks}
    assert pools == {"snapshot": "mongocdc_default", "window": "mongocdc_default"}


def test_two_connectors_have_their_own_dags_pools_and_connections(tmp_path, monkeypatch):
    connectors = [
        {"name": "orders", "config": {"topic.prefix": "orders"}, "tags": ["team-a"]},
        {
            "name": "users",
            "config_variable": "users_cdc",
            "pool": "cdc_users",
            "conn_ids": {"mongo": "users_mongo", "kafka": "users_kafka"},
            "schedule": "*/30 * * * *",
        },
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == sorted(
        f"mongocdc_{name}_{kind}"
        for name in ("orders", "users")
        for kind in ("hourly", "resnapshot", "watchdog")
    )
    orders, users = bag.dags["mongocdc_orders_hourly"], bag.dags["mongocdc_users_hourly"]
    assert {t.pool for t in orders.tasks} == {"mongocdc_orders"}
    assert {t.pool for t in users.tasks} == {"cdc_users"}
    assert {t.pool for t in bag.dags["mongocdc_users_resnapshot"].tasks} == {"cdc_users"}
    assert {"team-a", "orders"} <= set(orders.tags)
    assert users.timetable.expression == "*/30 * * * *"
    watchdog = bag.dags["mongocdc_users_watchdog"]
    assert watchdog.get_task("trigger_resnapshot").trigger_dag_id == "mongocdc_users_resnapshot"
    # Run-time macros of each DAG: its own connections and configuration (inline: no Variable read).
    macros = users.user_defined_macros
    assert [macros["mongocdc_conn_id"](kind) for kind in ("mongo", "kafka", "spark")] == [
        "users_mongo",
        "users_kafka",
        "spark_default",
    ]
    # The connector's name travels in its configuration (a topic prefix belongs to one connector).
    assert json.loads(orders.user_defined_macros["mongocdc_connector_config"]()) == {
        "topic.prefix": "orders",
        "name": "orders",
    }


def test_an_invalid_entry_is_a_dag_of_its_own_naming_it_and_the_others_load(tmp_path, monkeypatch):
    # No import error: Airflow 3.3 would mark every DAG of the file stale, the valid ones included.
    connectors = [
        {"name": "orders", "config": {"topic.prefix": "orders"}},
        {"name": "billing", "config": {"topic.prefix": "billing", "snapshot.mode": "sometimes"}},
        {"name": "bad-name", "config": {"topic.prefix": "bad"}},
    ]
    folder = dag_folder(tmp_path, connectors)
    bag = load(folder, monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == [
        "mongocdc_invalid_bad-name",
        "mongocdc_invalid_billing",
        "mongocdc_orders_hourly",
        "mongocdc_orders_resnapshot",
        "mongocdc_orders_watchdog",
    ]
    billing = bag.dags["mongocdc_invalid_billing"]
    assert billing.dag_display_name == "mongocdc: invalid connector entry #2 ('billing')"
    for text in (billing.description, billing.doc_md):
        assert "connector entry #2 ('billing')" in text and "snapshot.mode" in text, text
        assert str(folder / "mongocdc_connectors.json") in text and "Fix: correct the entry" in text
        assert "orders" not in text.replace("the other connectors' DAGs", "")
    bad_name = bag.dags["mongocdc_invalid_bad-name"].description
    assert "connector entry #3 ('bad-name')" in bad_name and "letters, digits and _" in bad_name
    # It runs once by itself and its one task fails, without retries, with the same words.
    assert isinstance(billing.timetable, OnceTimetable) and billing.is_paused_upon_creation is False
    (task,) = billing.tasks
    assert task.task_id == "invalid_connector_entry" and task.retries == 0
    with pytest.raises(AirflowFailException) as raised:
        task.execute({})
    assert str(raised.value) == billing.description


def test_a_second_entry_with_the_same_topic_prefix_is_invalid_and_names_both(tmp_path, monkeypatch):
    # Two connectors with one topic prefix would share its offsets and lease: each would commit
    # positions past changes only the other emits.
    connectors = [
        {"name": "a", "config": {"topic.prefix": "p", "collection.include.list": "db\\.a"}},
        {"name": "b", "config": {"topic.prefix": "p", "collection.include.list": "db\\.b"}},
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == [
        "mongocdc_a_hourly",
        "mongocdc_a_resnapshot",
        "mongocdc_a_watchdog",
        "mongocdc_invalid_b",
    ]
    text = bag.dags["mongocdc_invalid_b"].description
    assert "connector entry #2 ('b'): its topic.prefix 'p' is that of connector entry #1 ('a')" in text, text
    assert "Give each connector its own topic.prefix" in text


def test_a_topic_prefix_held_in_a_variable_is_taken_like_an_inline_one(tmp_path, monkeypatch):
    # The Variable's prefix counts where the configuration lives (read while the list is parsed,
    # for this check only): an inline entry after it, and a Variable entry after an inline one,
    # are the invalid entry's DAG with the words of a repeated inline prefix.
    monkeypatch.setenv("AIRFLOW_VAR_MONGOCDC_CONNECTOR_CONFIG", json.dumps({"topic.prefix": "shop"}))
    monkeypatch.setenv("AIRFLOW_VAR_USERS_CDC", json.dumps({"topic.prefix": "orders"}))
    connectors = [
        {"name": "default", "config_variable": "mongocdc_connector_config"},
        {"name": "shopdup", "config": {"topic.prefix": "shop"}},
        {"name": "orders", "config": {"topic.prefix": "orders"}},
        {"name": "users", "config_variable": "users_cdc"},
        {"name": "unset", "config_variable": "no_such_variable"},  # read when its tasks run
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == sorted(
        [
            *(f"mongocdc_{kind}" for kind in ("hourly", "resnapshot", "watchdog")),
            *(
                f"mongocdc_{name}_{kind}"
                for name in ("orders", "unset")
                for kind in ("hourly", "resnapshot", "watchdog")
            ),
            "mongocdc_invalid_shopdup",
            "mongocdc_invalid_users",
        ]
    )
    shopdup = bag.dags["mongocdc_invalid_shopdup"].description
    assert (
        "connector entry #2 ('shopdup'): its topic.prefix 'shop' is that of connector entry #1 ('default')"
        in shopdup
    )
    assert "('default') (in the Airflow Variable 'mongocdc_connector_config'); a topic prefix" in shopdup
    assert "Give each connector its own topic.prefix" in shopdup
    users = bag.dags["mongocdc_invalid_users"].description
    assert (
        "connector entry #4 ('users'): its topic.prefix 'orders' (in the Airflow Variable 'users_cdc') "
        "is that of connector entry #3 ('orders')"
    ) in users
    assert "Give each connector its own topic.prefix" in users


def test_invalid_entries_without_a_usable_name_are_numbered_and_never_take_a_valid_dag_id(
    tmp_path, monkeypatch
):
    connectors = [
        {"name": "invalid", "config": {"topic.prefix": "inv"}},
        42,
        {"name": "two words"},
        {"name": "hourly", "unknown": 1},
        {"name": "invalid", "config": {"topic.prefix": "again"}},
    ]
    bag = load(dag_folder(tmp_path, connectors), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    invalid = {
        dag_id: dag
        for dag_id, dag in bag.dags.items()
        if "invalid_" in dag_id and dag.tasks[0].task_id == "invalid_connector_entry"
    }
    assert sorted(invalid) == [
        "mongocdc_invalid_entry_2",
        "mongocdc_invalid_entry_3",
        "mongocdc_invalid_hourly_4",  # mongocdc_invalid_hourly is the valid connector "invalid"'s
        "mongocdc_invalid_invalid",
    ]
    assert "must be a JSON object, got int" in invalid["mongocdc_invalid_entry_2"].description
    assert "already used by connector entry #1 ('invalid')" in invalid["mongocdc_invalid_invalid"].description
    assert {"mongocdc_invalid_hourly", "mongocdc_invalid_resnapshot", "mongocdc_invalid_watchdog"} <= set(
        bag.dags
    )


# -- the re-snapshot form ----------------------------------------------------------------------------


def test_resnapshot_form_is_valid_as_it_opens_and_left_empty(tmp_path, monkeypatch):
    dag = resnapshot_dag(tmp_path, monkeypatch)
    params = dag.params
    params.validate()  # the defaults: the form opens with Trigger enabled
    assert params.dump()["mode"] == "manual"
    # The form sends an emptied field as null: still valid, and each description says what empty means.
    for name in ("collections", "reason"):
        params[name] = None
        params.validate()
        assert "Empty:" in params.get_param(name).description


def test_resnapshot_form_refuses_a_collection_without_its_database_before_any_run(tmp_path, monkeypatch):
    # What the API server does with the trigger form's conf (POST .../dagRuns): the serialized DAG's
    # params, merged with the conf, validated; the error's text is the answer's detail, which the
    # form shows as it is above its fields (and the task run validates the DAG's own params alike).
    dag = resnapshot_dag(tmp_path, monkeypatch)
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    for good in (["shop.orders", " shop.customers ", "", "shop.a.b"], [], None):
        serialized.params.deep_merge({"collections": good}).validate()
    for bad, fix in (
        ("orders", "write it as <database>.orders"),
        (".orders", "write it as <database>.orders"),
        ("shop.", "write it as shop.<collection>"),
        (" shop. ", "write it as shop.<collection>"),
    ):
        for merge in (
            lambda conf: serialized.params.deep_merge(conf).validate(),
            lambda conf: copy.deepcopy(dag.params).update(conf),  # as a task run takes its conf
        ):
            with pytest.raises(ParamValidationError) as raised:
                merge({"collections": ["shop.customers", bad]})
            message = str(raised.value)
            # One line that names the field and says the rule: no schema, no regular expression.
            assert message.startswith(
                f"Invalid input for param collections: `{bad.strip()}` is not `<database>.<collection>`."
            ), message
            assert f"Fix: {fix}, e.g. shop.orders" in message, message
            assert "\n" not in message and "Failed validating" not in message, message
            assert "\\" not in message and "^" not in message and "pattern" not in message, message


# Values of a Collections line, and whether the re-snapshot takes them (blank lines are skipped).
COLLECTION_LINES = {
    "shop.orders": True,
    " shop.customers ": True,
    "\tshop.orders": True,
    "shop.a.b": True,
    "shop..": True,
    "my shop.orders": True,
    "shop. orders": True,
    "": True,
    "  ": True,
    "orders": False,
    ".orders": False,
    "shop.": False,
    " shop. ": False,
    ".": False,
    "..": False,
    " .orders": False,
}


def test_resnapshot_form_schema_says_the_collection_rule_to_any_json_schema_validator(tmp_path, monkeypatch):
    # The form's schema as the API server holds it, checked as a JSON Schema validator in a browser
    # or an API client checks it: with the standard keywords only (no format of the server's).
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(resnapshot_dag(tmp_path, monkeypatch)))
    schema = serialized.params.get_param("collections").schema
    validator = jsonschema.validators.validator_for(schema)(schema)
    assert validator.format_checker is None
    taken = {}
    for line in COLLECTION_LINES:
        try:
            parse_collections([line])
            taken[line] = True
        except ConfigError:
            taken[line] = False
    assert taken == COLLECTION_LINES
    checked = {line: validator.is_valid([line]) for line in COLLECTION_LINES}
    assert checked == COLLECTION_LINES, "the schema and the re-snapshot disagree"
    assert validator.is_valid(None) and validator.is_valid([])
    # The rule in words next to the field, and for each line.
    assert "<database>.<collection>" in serialized.params.get_param("collections").description
    assert "<database>.<collection>" in schema["items"]["description"]


def test_resnapshot_collection_without_database_is_rejected_in_words():
    with pytest.raises(ConfigError) as raised:
        parse_collections(["shop.orders", "orders"])
    assert str(raised.value).startswith("`orders` is not `<database>.<collection>`")


def test_gap_mode_with_chosen_collections_says_gap_mode_copies_everything_without_claiming_a_gap():
    operator = MongoResnapshotOperator(
        task_id="resnapshot",
        connector_config={"topic.prefix": "shop"},
        mode="gap",
        collections=["shop.orders"],
    )
    with pytest.raises(ConfigError) as raised:
        operator.decide(parse_connector_config(operator.connector_config))
    message = str(raised.value)
    assert "Gap mode copies every captured collection" in message and "manual" in message
    assert "no longer in the oplog" not in message


def test_resnapshot_rendered_templates_show_the_mode_not_a_reset_offset(tmp_path, monkeypatch):
    task = resnapshot_dag(tmp_path, monkeypatch).get_task("resnapshot")
    assert "mode" in task.template_fields
    assert "reset_offset" not in task.template_fields and "force" not in task.template_fields


# -- careless values: one entry's DAGs, never the file's ------------------------------------------------

VALID = {"name": "orders", "config": {"topic.prefix": "orders"}}
VALID_DAGS = ["mongocdc_orders_hourly", "mongocdc_orders_resnapshot", "mongocdc_orders_watchdog"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"watchdog_schedule": [300]}, "'watchdog_schedule' must be a cron expression or preset"),
        ({"tags": ["t" * 101]}, "a tag may have at most 100 characters"),
        ({"name": "n" * 240}, "Airflow's limit is 250"),
        ({"start_date": "P1D"}, "'start_date' must be an ISO 8601 date"),
        ({"start_date": "10:00"}, "'start_date' must be an ISO 8601 date"),
        ({"window_schedule": {"clock": 1e20}}, "'window_schedule' 'clock' 1e+20 is not a number of seconds"),
        ({"schedule": 1e20}, "'schedule' 1e+20 is not a number of seconds"),
        ({"schedule": "every hour"}, "'schedule' 'every hour' is not a cron expression or preset"),
        ({"watchdog_schedule": -5}, "'watchdog_schedule' -5 is not a number of seconds between runs above 0"),
        ({"watchdog_schedule": float("nan")}, "'watchdog_schedule' nan is not a number of seconds"),
        ({"conn_ids": {"mongo": 5}}, "'conn_ids' must be an object with the keys mongo, kafka, spark"),
        (
            {"config": {"topic.prefix": "careless", "value.converter.basic.auth.user.info": "u:p"}},
            "'config' holds credential properties (value.converter.basic.auth.user.info)",
        ),
        (
            {"config": {"topic.prefix": "careless", "producer.override.sasl.jaas.config": "x"}},
            "'config' holds credential properties (producer.override.sasl.jaas.config)",
        ),
    ],
)
def test_a_careless_value_makes_its_entry_invalid_and_the_other_connectors_load(
    tmp_path, monkeypatch, values, message
):
    careless = {"name": "careless", "config": {"topic.prefix": "careless"}, **values}
    bag = load(dag_folder(tmp_path, [VALID, careless]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    invalid = [dag_id for dag_id in bag.dags if dag_id.startswith("mongocdc_invalid_")]
    assert sorted(set(bag.dags) - set(invalid)) == VALID_DAGS
    (dag_id,) = invalid
    assert message in bag.dags[dag_id].description, bag.dags[dag_id].description
    assert "connector entry #2" in bag.dags[dag_id].description
    # The valid connector's DAGs are what the DAG processor would store.
    for name in VALID_DAGS:
        DagSerialization.to_dict(bag.dags[name])


@pytest.mark.parametrize(
    "values, check",
    [
        ({"schedule": 3600}, None),
        ({"schedule": 1800.5, "watchdog_schedule": 300.0}, None),
        ({"watchdog_schedule": "*/10 * * * *"}, None),
        ({"schedule": None}, None),
        ({"schedule": "@once"}, None),
    ],
)
def test_seconds_work_wherever_the_clock_takes_them(tmp_path, monkeypatch, values, check):
    entry = {"name": "timed", "config": {"topic.prefix": "timed"}, **values}
    bag = load(dag_folder(tmp_path, [entry]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    assert sorted(bag.dags) == [
        "mongocdc_timed_hourly",
        "mongocdc_timed_resnapshot",
        "mongocdc_timed_watchdog",
    ]
    if values.get("schedule") == 3600:
        assert bag.dags["mongocdc_timed_hourly"].timetable.delta.total_seconds() == 3600
    if values.get("watchdog_schedule") == 300.0:
        assert bag.dags["mongocdc_timed_watchdog"].timetable.delta.total_seconds() == 300


def test_every_bad_value_of_an_entry_is_named_at_once(tmp_path, monkeypatch):
    careless = {
        "name": "careless",
        "config": {"topic.prefix": "careless"},
        "window_schedule": {"clock": "often", "changes": {"max_delay": "soon", "min_changes": -5}},
        "watchdog_schedule": -5,
        "start_date": "P1D",
    }
    bag = load(dag_folder(tmp_path, [VALID, careless]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    text = bag.dags["mongocdc_invalid_careless"].description
    for words in (
        "5 problems",
        "'window_schedule' 'clock' 'often' is not a cron expression",
        "min_changes must be a whole number of changes, 1 or more, got -5",
        "max_delay must be a duration, got 'soon'",
        "'watchdog_schedule' -5 is not a number of seconds",
        "'start_date' must be an ISO 8601 date",
    ):
        assert words in text, (words, text)


def test_an_exception_while_building_an_entry_is_its_invalid_entry_dag(tmp_path, monkeypatch):
    # Whatever fails while one entry's DAGs are built (here: Airflow refuses a DAG) stays that
    # entry's: the file has no import error and the other connectors' DAGs load.
    from airflow_provider_mongocdc import connector_dags as module

    built = module.build_connector_dags

    def failing(connector):
        if connector.name == "careless":
            raise RuntimeError("refused by Airflow")
        return built(connector)

    monkeypatch.setattr(module, "build_connector_dags", failing)
    careless = {"name": "careless", "config": {"topic.prefix": "careless"}}
    dags = module.connector_dags([VALID, careless])
    assert sorted(dags) == sorted([*VALID_DAGS, "mongocdc_invalid_careless"])
    text = dags["mongocdc_invalid_careless"].description
    assert "its DAGs cannot be built: RuntimeError: refused by Airflow" in text, text


def test_the_dag_processor_imports_the_spark_operator_once_not_at_every_parse(tmp_path):
    """Airflow's DAG processor imports the "airflow." modules a DAG file names before it starts the
    process that parses the file: after that, a parse of the connector DAG file imports neither the
    Spark provider nor the OpenLineage code it loads (they cost about 0.6 CPU-s a parse)."""
    import subprocess
    import sys

    path = dag_folder(tmp_path) / "mongocdc_connectors.py"
    code = (
        "import importlib.util, sys, structlog\n"
        "from airflow.dag_processing.processor import _pre_import_airflow_modules\n"
        f"_pre_import_airflow_modules({str(path)!r}, structlog.get_logger())\n"
        "before = set(sys.modules)\n"
        f"spec = importlib.util.spec_from_file_location('parsed', {str(path)!r})\n"
        "spec.loader.exec_module(importlib.util.module_from_spec(spec))\n"
        "heavy = ('airflow.providers.apache.spark', 'airflow.providers.openlineage', 'openlineage')\n"
        "print(sorted(name for name in set(sys.modules) - before if name.startswith(heavy)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


CLIENTS = ("pymongo", "bson", "confluent_kafka")


def parse_after_the_pre_import(path: Path, then: str = "") -> list[str]:
    """Parse the DAG file ``path`` as Airflow's DAG processor does, in a fresh process: the
    ``airflow.`` modules it names imported first, then the file executed. ``then`` runs after (the
    parsed module is ``parsed``); its output lines come back, then the DAG ids and the MongoDB and
    Kafka client modules imported."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys, structlog\n"
        "from airflow.dag_processing.processor import _pre_import_airflow_modules\n"
        f"_pre_import_airflow_modules({str(path)!r}, structlog.get_logger())\n"
        f"spec = importlib.util.spec_from_file_location('parsed', {str(path)!r})\n"
        "parsed = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(parsed)\n"
        f"{then}\n"
        "print(sorted(name for name in vars(parsed) if name.startswith('mongocdc_')))\n"
        f"print(sorted(name for name in sys.modules if name.split('.')[0] in {CLIENTS!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_a_parse_of_the_dag_file_imports_neither_the_mongodb_nor_the_kafka_client(tmp_path):
    """A parse builds the DAGs and never talks to MongoDB or Kafka: after Airflow's pre-import, the
    connector DAG file leaves pymongo, bson and confluent_kafka unimported (they cost about 0.2 CPU-s
    a parse); the tasks import them when they run."""
    dag_ids, clients = parse_after_the_pre_import(dag_folder(tmp_path) / "mongocdc_connectors.py")[-2:]
    assert dag_ids == str(["mongocdc_hourly", "mongocdc_resnapshot", "mongocdc_watchdog"])
    assert clients == "[]"


def test_a_parse_of_change_driven_and_delta_entries_imports_neither_client(tmp_path):
    """The change watcher is built at a parse (the trigger of the window DAG's Asset), and stored as
    its class path and arguments: its MongoDB and Kafka reads import the clients when the triggerer
    runs it. A ``delta`` entry's settings are checked at a parse, its values converted when it runs."""
    connectors = [
        {
            "name": "shop",
            "config": {"topic.prefix": "shop"},
            "window_schedule": {"changes": {"min_changes": 1, "max_delay": "5s"}, "open": {"idle": "30s"}},
        },
        {
            "name": "lake",
            "config": {"topic.prefix": "lake"},
            "window_schedule": {"clock": "@hourly", "changes": {}},
            "delta": {"location": "/data/delta/lake", "columns": {"lake.orders": {"total": "decimal(10,2)"}}},
        },
    ]
    path = dag_folder(tmp_path, connectors) / "mongocdc_connectors.py"
    # What the DAG processor stores of each window DAG's schedule: the Asset, its watcher's trigger.
    then = (
        "from airflow.serialization.encoders import encode_trigger\n"
        "for name in ('shop', 'lake'):\n"
        "    dag = getattr(parsed, f'mongocdc_{name}_hourly')\n"
        "    asset = dag.timetable.asset_condition\n"
        "    (watcher,) = asset.watchers\n"
        "    stored = encode_trigger(watcher.trigger)\n"
        "    print(asset.uri, watcher.name, stored['classpath'], stored['kwargs']['connector'])\n"
        "print([task.task_id for task in parsed.mongocdc_lake_hourly.tasks])\n"
    )
    *shown, tasks, dag_ids, clients = parse_after_the_pre_import(path, then)
    classpath = "airflow_provider_mongocdc.triggers.change_watcher.MongoChangeWatcher"
    assert shown == [
        f"mongocdc-changes://shop/ mongocdc_shop_changes {classpath} shop",
        f"mongocdc-changes://lake/ mongocdc_lake_changes {classpath} lake",
    ]
    assert tasks == str(["snapshot", "window", "delta_apply"])
    assert dag_ids == str(
        [
            "mongocdc_lake_hourly",
            "mongocdc_lake_resnapshot",
            "mongocdc_lake_watchdog",
            "mongocdc_shop_hourly",
            "mongocdc_shop_resnapshot",
            "mongocdc_shop_watchdog",
        ]
    )
    assert clients == "[]"


def test_a_failed_or_killed_window_is_retried_within_seconds_and_later_tries_wait_longer(
    tmp_path, monkeypatch
):
    # Airflow's scheduler (the DAG as it serializes it) gives each try's retry its time: the window's
    # first retry starts within 10 s of the failure (a window killed while open continues from its
    # last commit at once), each further one waits longer, none more than 2 minutes (a task cleared
    # many times); the snapshot and the Delta apply keep one retry after 2 minutes.
    import uuid
    from datetime import datetime, timedelta, timezone

    from airflow.models.taskinstance import TaskInstance

    entry = {
        "name": "sales",
        "config": {"topic.prefix": "sales"},
        "window_schedule": {"changes": {"max_delay": "30s"}, "open": {}},
        "delta": {"location": "/data/delta/sales"},
    }
    bag = load(dag_folder(tmp_path, [entry]), monkeypatch)
    assert not bag.import_errors, bag.import_errors
    dag = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["mongocdc_sales_hourly"]))
    failed_at = datetime(2027, 1, 15, 10, 0, tzinfo=timezone.utc)

    def retry_delays(task_id: str, tries) -> list[float]:
        task = dag.get_task(task_id)
        delays = []
        for try_number in tries:
            ti = TaskInstance(task, dag_version_id=uuid.uuid4(), run_id="asset_triggered__x")
            ti.try_number, ti.end_date = try_number, failed_at
            delays.append((ti.next_retry_datetime() - failed_at).total_seconds())
        return delays

    window = dag.get_task("window")
    assert 1 <= retry_delays("window", [1])[0] <= 10
    assert window.retries >= 3
    delays = retry_delays("window", range(1, window.retries + 1))
    assert all(later > earlier for earlier, later in zip(delays, delays[1:])), delays
    assert max(retry_delays("window", range(1, 30))) <= timedelta(minutes=2).total_seconds()
    for task_id in ("snapshot", "delta_apply"):
        assert dag.get_task(task_id).retries == 1
        assert retry_delays(task_id, [1]) == [120.0]
