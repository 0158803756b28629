"""Provider metadata: ``get_provider_info()`` names every hook, operator, sensor, trigger and extra
link of the package, and what it declares for the connection forms is what Airflow 3.3 shows.

The package's classes are discovered by walking its modules, so a new module that is not listed
in ``get_provider_info()`` fails here. No server and no Airflow database is needed.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import airflow
import jsonschema
import pytest
from airflow.sdk import BaseHook, BaseOperator, BaseOperatorLink, BaseSensorOperator, Connection
from airflow.triggers.base import BaseTrigger

import airflow_provider_mongocdc
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.get_provider_info import get_provider_info
from airflow_provider_mongocdc.hooks.kafka import kafka_config_from_connection
from airflow_provider_mongocdc.hooks.topology import details_from_connection

pytestmark = pytest.mark.unit

PACKAGE = airflow_provider_mongocdc.__name__
AIRFLOW_DIR = Path(airflow.__file__).resolve().parent

# Airflow class -> section of get_provider_info() that must list the module (or, for extra links,
# the class). Sensors are operators too: the most specific base decides.
SECTIONS = (
    (BaseSensorOperator, "sensors"),
    (BaseOperator, "operators"),
    (BaseHook, "hooks"),
    (BaseTrigger, "triggers"),
    (BaseOperatorLink, "extra-links"),
)

# Classes that need no entry, and why. Each must stay what its reason says (checked below).
NOT_LISTED = {
    f"{PACKAGE}.operators.base.MongoCdcSparkSubmitOperator": (
        "the base of the Spark operators: its application_name is empty, so it runs nothing by itself"
    ),
}

# The fields of the connection form of Airflow 3.3's UI that ui-field-behaviour can hide, relabel or
# give a placeholder: the fields of the API's StandardHookFields (its "url_schema" is the "schema"
# field). The extra is a JSON editor of its own, which ui-field-behaviour does not change.
FORM_FIELDS = {
    "description": "description",
    "schema": "url_schema",
    "host": "host",
    "port": "port",
    "login": "login",
    "password": "password",
}


def package_modules() -> list[str]:
    """Every module of the installed package, spark_apps included (it is mapped from another
    directory, so walking the package alone does not reach it)."""
    names = set()
    for package_name in (PACKAGE, f"{PACKAGE}.spark_apps"):
        package = importlib.import_module(package_name)
        names.add(package_name)
        names.update(info.name for info in pkgutil.walk_packages(package.__path__, f"{package_name}."))
    return sorted(names)


def section_of(cls: type) -> str | None:
    for base, section in SECTIONS:
        if issubclass(cls, base):
            return section
    return None


def package_classes() -> dict[str, str]:
    """``module.Class`` -> section, for every Airflow class defined in the package."""
    found = {}
    for module_name in package_modules():
        module = importlib.import_module(module_name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module_name and (section := section_of(cls)):
                found[f"{module_name}.{cls.__qualname__}"] = section
    return found


def listed_modules(info: dict, section: str) -> set[str]:
    return {module for entry in info.get(section, []) for module in entry["python-modules"]}


def import_class(path: str) -> type:
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def connection_type(conn_type: str) -> dict:
    (entry,) = [e for e in get_provider_info()["connection-types"] if e["connection-type"] == conn_type]
    return entry


# -- every class is listed, every listed name imports -----------------------------------------------


def test_discovery_finds_the_provider_classes():
    # Guards the walk itself: if it stopped finding classes, the next test would pass vacuously.
    found = package_classes()
    for path, section in {
        f"{PACKAGE}.hooks.topology.MongoTopologyHook": "hooks",
        f"{PACKAGE}.operators.snapshot.MongoSnapshotOperator": "operators",
        f"{PACKAGE}.sensors.oplog_gap.OplogGapSensor": "sensors",
        f"{PACKAGE}.triggers.oplog_gap.OplogGapTrigger": "triggers",
        f"{PACKAGE}.links.ResnapshotTriggerLink": "extra-links",
    }.items():
        assert found.get(path) == section, f"the package walk did not find {path} as {section}: {found}"


def test_every_hook_operator_sensor_trigger_and_link_is_listed():
    info = get_provider_info()
    missing = []
    for path, section in sorted(package_classes().items()):
        if path in NOT_LISTED:
            continue
        if section == "extra-links":
            if path not in info.get("extra-links", []):
                missing.append(f'{path} not in get_provider_info()["extra-links"]')
        elif path.rpartition(".")[0] not in listed_modules(info, section):
            missing.append(
                f"{path}: module {path.rpartition('.')[0]} not in get_provider_info()[{section!r}]"
            )
    assert not missing, (
        "Airflow only knows the provider's classes that get_provider_info() lists "
        "(airflow_provider_mongocdc/get_provider_info.py):\n" + "\n".join(missing)
    )


def test_unlisted_classes_are_what_their_reason_says():
    found = package_classes()
    for path in NOT_LISTED:
        assert path in found, f"{path} no longer exists: drop it from NOT_LISTED"
        assert import_class(path).application_name == "", f"{path} runs an application: list it"


def test_every_listed_module_and_class_imports_and_holds_its_kind():
    info = get_provider_info()
    for _, section in SECTIONS:
        if section == "extra-links":
            for path in info.get(section, []):
                cls = import_class(path)
                assert issubclass(cls, BaseOperatorLink), f"{path} is not a BaseOperatorLink"
            continue
        for module_name in listed_modules(info, section):
            module = importlib.import_module(module_name)
            kinds = {
                section_of(cls)
                for _, cls in inspect.getmembers(module, inspect.isclass)
                if cls.__module__ == module_name
            }
            assert section in kinds, f"{module_name} is listed under {section!r} but defines none"


def test_extra_links_of_every_operator_are_listed():
    info = get_provider_info()
    for path, section in package_classes().items():
        if section in ("operators", "sensors"):
            for link in import_class(path).operator_extra_links:
                link_path = f"{type(link).__module__}.{type(link).__qualname__}"
                assert link_path in info["extra-links"], f"{path} shows {link_path}, which is not listed"


# -- plugins: the scheduler listener creating missing connector pools ---------------------------------


def package_plugins() -> set[str]:
    """``module.Class`` of every AirflowPlugin defined in the package."""
    from airflow.plugins_manager import AirflowPlugin

    found = set()
    for module_name in package_modules():
        module = importlib.import_module(module_name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ == module_name and issubclass(cls, AirflowPlugin) and cls is not AirflowPlugin:
                found.add(f"{module_name}.{cls.__qualname__}")
    return found


def test_every_plugin_is_listed_and_has_an_entry_point():
    found = package_plugins()
    assert f"{PACKAGE}.plugins.pools.MongoCdcPoolsPlugin" in found, f"the package walk found {found}"
    listed = {entry["plugin-class"]: entry["name"] for entry in get_provider_info().get("plugins", [])}
    assert set(listed) == found, (
        f'get_provider_info()["plugins"] lists {sorted(listed)}, the package has {found}'
    )
    for path, name in listed.items():
        assert import_class(path).name == name, f"{path}.name is not {name!r}"
    # Airflow reads get_provider_info()["plugins"] only with [core] lazy_discover_providers = False:
    # the airflow.plugins entry point is what loads the plugins by default.
    points = {
        point.value.replace(":", ".")
        for point in importlib.metadata.entry_points(group="airflow.plugins")
        if point.value.startswith(f"{PACKAGE}.")
    }
    assert points == found, (
        f"airflow.plugins entry points of the installed package: {sorted(points)}, expected {sorted(found)} "
        '(pyproject.toml [project.entry-points."airflow.plugins"]; reinstall the package)'
    )


@pytest.mark.parametrize("lazy", ["True", "False"])
def test_airflow_registers_the_pool_listener(lazy):
    # A fresh interpreter, as the scheduler loads plugins; the listener manager validates the
    # listener's hooks against Airflow's specs (a wrong signature fails here).
    script = (
        "import json\n"
        "from airflow.listeners.listener import get_listener_manager\n"
        "from airflow.plugins_manager import get_plugin_info\n"
        "manager = get_listener_manager()\n"
        "hooks = [impl.plugin_name for impl in manager.hook.on_dag_run_running.get_hookimpls()]\n"
        "print(json.dumps({'plugins': get_plugin_info(), 'hooks': hooks}, default=str))\n"
    )
    env = {**os.environ, "AIRFLOW__CORE__LAZY_DISCOVER_PROVIDERS": lazy}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    ours = [plugin for plugin in loaded["plugins"] if plugin["name"] == "mongocdc_pools"]
    assert len(ours) == 1, [plugin["name"] for plugin in loaded["plugins"]]
    assert ours[0]["listeners"] == [f"{PACKAGE}.plugins.pools"], ours
    assert any(f"{PACKAGE}.plugins.pools" in name for name in loaded["hooks"]), loaded["hooks"]


# -- connection types --------------------------------------------------------------------------------


def test_every_connection_type_has_its_hook():
    info = get_provider_info()
    types = [entry["connection-type"] for entry in info["connection-types"]]
    assert len(types) == len(set(types)), f"connection types declared twice: {types}"
    for entry in info["connection-types"]:
        hook = import_class(entry["hook-class-name"])
        assert issubclass(hook, BaseHook), f"{entry['hook-class-name']} is not a BaseHook"
        assert hook.conn_type == entry["connection-type"], (
            f"{entry['hook-class-name']}.conn_type is {hook.conn_type!r}, "
            f"declared for {entry['connection-type']!r}"
        )
        assert hook.hook_name == entry["hook-name"]
        assert hook.__module__ in listed_modules(info, "hooks")
    declared = {entry["hook-class-name"] for entry in info["connection-types"]}
    for path, section in package_classes().items():
        # A conn_type inherited from another provider's hook (the Spark hook's "spark") is that
        # provider's connection type.
        if section == "hooks" and vars(import_class(path)).get("conn_type"):
            assert path in declared, f"{path} has a conn_type but no connection-types entry"


def _schema(name: str) -> dict:
    path = AIRFLOW_DIR / name
    assert path.is_file(), f"the installed Airflow has no {name} under {AIRFLOW_DIR}"
    return json.loads(path.read_text())


def test_provider_info_is_valid_for_airflow():
    # The schema Airflow's ProvidersManager validates every provider's info with.
    jsonschema.validate(get_provider_info(), _schema("provider_info.schema.json"))


def test_connection_types_are_valid_for_airflow():
    # provider_info.schema.json does not describe conn-fields and ui-field-behaviour; Airflow's
    # provider.yaml schema does, and the UI's field behaviours have a schema of their own.
    yaml_schema = _schema("provider.yaml.schema.json")
    entry_schema = {
        **yaml_schema["properties"]["connection-types"],
        "definitions": yaml_schema.get("definitions", {}),
    }
    behaviour_schema = _schema("customized_form_field_behaviours.schema.json")
    for entry in get_provider_info()["connection-types"]:
        jsonschema.validate([entry], entry_schema)
        behaviour = entry.get("ui-field-behaviour", {})
        jsonschema.validate(
            {
                "hidden_fields": behaviour.get("hidden-fields", []),
                "relabeling": behaviour.get("relabeling", {}),
                "placeholders": behaviour.get("placeholders", {}),
            },
            behaviour_schema,
        )
        for name, field in entry.get("conn-fields", {}).items():
            assert name not in FORM_FIELDS and name != "extra", f"conn-field {name!r} shadows a form field"
            if "default" in field["schema"]:
                jsonschema.validate(field["schema"]["default"], field["schema"])


def test_field_behaviour_names_real_form_fields():
    from airflow.api_fastapi.core_api.datamodels.connections import StandardHookFields

    assert set(FORM_FIELDS.values()) == set(StandardHookFields.model_fields), (
        "Airflow's connection form fields changed: update FORM_FIELDS"
    )
    for entry in get_provider_info()["connection-types"]:
        behaviour = entry.get("ui-field-behaviour", {})
        named = {
            "hidden-fields": behaviour.get("hidden-fields", []),
            "relabeling": behaviour.get("relabeling", {}),
            "placeholders": behaviour.get("placeholders", {}),
        }
        for key, names in named.items():
            unknown = sorted(set(names) - set(FORM_FIELDS))
            assert not unknown, (
                f"{entry['connection-type']}: {key} names {unknown}, which Airflow's connection form "
                f"does not apply it to (form fields: {sorted(FORM_FIELDS)})"
            )
        both = set(named["hidden-fields"]) & (set(named["relabeling"]) | set(named["placeholders"]))
        assert not both, f"{entry['connection-type']}: {sorted(both)} hidden and also relabeled"


@pytest.fixture(scope="module")
def airflow_forms() -> dict:
    """What Airflow's API gives the UI for the connection forms (a fresh interpreter, so that the
    ProvidersManager reads the provider through its entry point, as a deployment does)."""
    script = (
        "import json\n"
        "from airflow.api_fastapi.core_api.services.ui.connections import HookMetaService\n"
        "print(json.dumps({m.connection_type: m.model_dump(mode='json') for m in HookMetaService.hook_meta_data()}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=dict(os.environ)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_airflow_loads_the_connection_forms_from_the_entry_point(airflow_forms):
    forms = airflow_forms
    for entry in get_provider_info()["connection-types"]:
        conn_type = entry["connection-type"]
        assert conn_type in forms, f"Airflow does not offer the connection type {conn_type!r}"
        form = forms[conn_type]
        assert form["hook_class_name"] == entry["hook-class-name"]
        assert form["hook_name"] == entry["hook-name"]
        behaviour = entry.get("ui-field-behaviour", {})
        standard = form["standard_fields"] or {}

        def shown(name: str, conn_type: str = conn_type, standard: dict = standard) -> dict:
            field = standard.get(FORM_FIELDS.get(name, name))
            assert field, f"{conn_type}: Airflow's form shows nothing of the behaviour declared for {name!r}"
            return field

        for name in behaviour.get("hidden-fields", []):
            assert shown(name)["hidden"], f"{conn_type}: {name} is not hidden"
        for name, title in behaviour.get("relabeling", {}).items():
            assert shown(name)["title"] == title, f"{conn_type}: {name} is not relabeled"
        for name, text in behaviour.get("placeholders", {}).items():
            assert shown(name)["placeholder"] == text, f"{conn_type}: no placeholder on {name}"
        extra_fields = form["extra_fields"] or {}
        assert set(extra_fields) == set(entry.get("conn-fields", {})), f"{conn_type}: {extra_fields}"
        for name, field in entry.get("conn-fields", {}).items():
            assert extra_fields[name]["schema"]["title"] == field["label"]


# -- the MongoDB form's extra fields are what the hook reads ------------------------------------------


def _mongo_connection(host: str, extra: dict | None = None) -> Connection:
    return Connection(
        conn_id="form_test",
        conn_type="mongocdc",
        host=host,
        login="reader",
        password="pw",
        extra=json.dumps(extra) if extra is not None else None,
    )


def test_every_mongodb_form_field_is_read_by_the_hook():
    for name, field in connection_type("mongocdc")["conn-fields"].items():
        types = field["schema"]["type"]
        types = types if isinstance(types, list) else [types]
        if "boolean" in types:
            value = not field["schema"].get("default", False)
        elif "object" in types:
            value = {"maxPoolSize": 5}
        elif field["schema"].get("enum"):
            value = [choice for choice in field["schema"]["enum"] if choice is not None][-1]
        else:
            value = f"value-of-{name}"
        details = details_from_connection(_mongo_connection("h1:27017,h2:27017", {name: value}))
        assert getattr(details, name) == value, f"the form field {name!r} ({value!r}) is ignored: {details!r}"
    assert {"auth_mechanism", "options"} <= set(connection_type("mongocdc")["conn-fields"])


@pytest.mark.parametrize(
    "host",
    [
        "mongodb+srv://cluster.example.net/?replicaSet=rs0",
        "mongodb://h1:27017,h2:27017/?tls=true&replicaSet=rs0",
    ],
)
def test_mongodb_form_defaults_do_not_change_the_connection(host):
    # The connection form pre-fills each conn-field with its schema default (Airflow's API sends it
    # as the field's value), so a form saved unchanged stores those defaults in the extra. They must
    # not override what the connection string says: TLS is on for mongodb+srv:// and for tls=true
    # (pymongo applies a tls keyword argument over both).
    defaults = {
        name: field["schema"]["default"]
        for name, field in connection_type("mongocdc")["conn-fields"].items()
        if "default" in field["schema"]
    }
    saved = details_from_connection(_mongo_connection(host, defaults)).client_arguments()
    plain = details_from_connection(_mongo_connection(host)).client_arguments()
    assert saved == plain, (
        f"a connection saved from the form with its defaults {defaults} connects differently from "
        f"the same host without them: {saved[1]} instead of {plain[1]}"
    )


def test_every_mongodb_form_field_a_user_fills_is_shown_and_labelled(airflow_forms):
    standard = airflow_forms["mongocdc"]["standard_fields"]
    host = standard["host"]
    assert not host["hidden"] and host["title"] == "Seed list or connection string, without the password"
    assert "mongodb://host1:27017,host2:27017/?replicaSet=rs0" in host["placeholder"]
    # Admin > Connections lists the host: the form says where the password goes instead.
    assert host["placeholder"].endswith("(the password goes in Password)"), host["placeholder"]
    # A standard field without declared behaviour is absent from the API's answer: shown as is.
    for name in ("login", "password"):
        assert not (standard.get(name) or {}).get("hidden"), f"the MongoDB form hides {name}"
    extra_fields = airflow_forms["mongocdc"]["extra_fields"]
    for name in ("replica_set", "auth_source", "auth_mechanism", "tls", "options"):
        assert extra_fields[name]["schema"]["title"], f"the MongoDB form has no labelled {name!r} field"


# -- the Kafka form: its fields are the librdkafka keys the hook reads ---------------------------------

KAFKA_FORM = ("bootstrap.servers", "security.protocol", "sasl.mechanism")


def test_kafka_form_declares_the_librdkafka_fields():
    fields = connection_type("mongocdc_kafka")["conn-fields"]
    assert set(KAFKA_FORM) <= set(fields), f"the Kafka form lacks {set(KAFKA_FORM) - set(fields)}"
    servers = fields["bootstrap.servers"]["schema"]
    # A type without null is what Airflow's form marks as required.
    assert servers["type"] == "string", f"bootstrap.servers is not a required field: {servers}"
    assert "broker1:9092,broker2:9092" in fields["bootstrap.servers"]["description"]
    protocol = fields["security.protocol"]["schema"]
    assert set(protocol["enum"]) == {None, "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}
    assert protocol["default"] is None  # "not set" (the hook drops it)
    mechanism = fields["sasl.mechanism"]["schema"]
    assert {"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} <= set(mechanism["enum"])
    assert mechanism["default"] is None


def test_airflow_shows_the_kafka_form_fields(airflow_forms):
    form = airflow_forms["mongocdc_kafka"]
    extra_fields = form["extra_fields"] or {}
    for name in KAFKA_FORM:
        assert name in extra_fields, f"Airflow's Kafka connection form has no {name!r} field: {extra_fields}"
    servers = extra_fields["bootstrap.servers"]
    assert servers["schema"]["title"] == "Bootstrap servers" and servers["schema"]["type"] == "string"
    assert extra_fields["security.protocol"]["schema"]["enum"][1:] == [
        "PLAINTEXT",
        "SSL",
        "SASL_PLAINTEXT",
        "SASL_SSL",
    ]
    assert form["standard_fields"]["login"]["title"] == "SASL user name"


def _kafka_connection(extra: dict | None, host=None, login=None, password=None, port=None) -> Connection:
    return Connection(
        conn_id="kafka_form_test",
        conn_type="mongocdc_kafka",
        host=host,
        port=port,
        login=login,
        password=password,
        extra=json.dumps(extra) if extra is not None else None,
    )


def _saved_by_the_form(**filled) -> dict:
    """The extra as Airflow's connection form saves it: every conn-field under its name, with its
    schema default (null for the Kafka fields) when left untouched."""
    fields = connection_type("mongocdc_kafka")["conn-fields"]
    return {name: filled.get(name, field["schema"].get("default")) for name, field in fields.items()}


EXPECTED_SASL = {
    "bootstrap.servers": "broker1:9092,broker2:9092",
    "security.protocol": "SASL_SSL",
    "sasl.mechanism": "SCRAM-SHA-512",
    "sasl.username": "cdc",
    "sasl.password": "secret",
}


@pytest.mark.parametrize(
    "conn",
    [
        pytest.param(
            _kafka_connection(
                _saved_by_the_form(
                    **{
                        "bootstrap.servers": "broker1:9092,broker2:9092",
                        "security.protocol": "SASL_SSL",
                        "sasl.mechanism": "SCRAM-SHA-512",
                    }
                ),
                login="cdc",
                password="secret",
            ),
            id="form-fields",
        ),
        pytest.param(
            _kafka_connection(
                {
                    "bootstrap.servers": "broker1:9092,broker2:9092",
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanisms": "SCRAM-SHA-512",
                    "sasl.username": "cdc",
                    "sasl.password": "secret",
                }
            ),
            id="raw-extra",
        ),
        pytest.param(
            _kafka_connection(
                {
                    **_saved_by_the_form(),
                    "extra__mongocdc_kafka__bootstrap.servers": "broker1:9092,broker2:9092",
                    "extra__mongocdc_kafka__security.protocol": "SASL_SSL",
                    "extra__mongocdc_kafka__sasl.mechanism": "SCRAM-SHA-512",
                },
                login="cdc",
                password="secret",
            ),
            id="prefixed-form-fields",
        ),
        pytest.param(
            _kafka_connection(
                _saved_by_the_form(**{"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}),
                host="broker1:9092,broker2:9092",
                login="cdc",
                password="secret",
            ),
            id="host-field",
        ),
        pytest.param(
            _kafka_connection(
                {
                    **_saved_by_the_form(
                        **{
                            "bootstrap.servers": "broker1:9092,broker2:9092",
                            "security.protocol": "SASL_SSL",
                            "sasl.mechanism": "SCRAM-SHA-512",
                        }
                    ),
                    "sasl.mechanisms": "PLAIN",  # librdkafka's alias: the form's field wins
                },
                login="cdc",
                password="secret",
            ),
            id="form-field-over-alias",
        ),
    ],
)
def test_kafka_hook_builds_one_config_from_form_fields_and_raw_extra(conn):
    assert kafka_config_from_connection(conn) == EXPECTED_SASL


def test_kafka_form_defaults_do_not_change_the_connection():
    raw = {"bootstrap.servers": "broker1:9092", "client.id": "cdc"}
    saved = kafka_config_from_connection(_kafka_connection({**_saved_by_the_form(), **raw}))
    assert saved == kafka_config_from_connection(_kafka_connection(raw)) == raw, (
        f"a connection saved from the form with its untouched fields reads as {saved}, not {raw}"
    )


def test_kafka_host_and_port_still_give_bootstrap_servers():
    conn = _kafka_connection(_saved_by_the_form(), host="broker1", port=9093)
    assert kafka_config_from_connection(conn) == {"bootstrap.servers": "broker1:9093"}


@pytest.mark.parametrize(
    "extra", [None, {}, _saved_by_the_form(), _saved_by_the_form(**{"bootstrap.servers": " "})]
)
def test_kafka_connection_without_bootstrap_servers_names_the_field(extra):
    with pytest.raises(ConfigError) as raised:
        kafka_config_from_connection(_kafka_connection(extra))
    message = str(raised.value)
    assert "bootstrap.servers" in message and "'Bootstrap servers'" in message, message
    assert "Fix: fill in 'Bootstrap servers'" in message, message
