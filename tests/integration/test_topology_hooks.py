"""MongoTopologyHook over Airflow connections of type mongocdc (and the mongo provider's mongo)."""

from __future__ import annotations

import json
import logging

import pytest
from pymongo import uri_parser

from airflow_provider_mongocdc.core.base.errors import ConfigError, ConnectionFailedError
from airflow_provider_mongocdc.hooks.topology import MongoTopologyHook

pytestmark = pytest.mark.integration


def set_connection(monkeypatch, conn_id: str, **fields) -> None:
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_mongocdc_connection_with_a_connection_string(monkeypatch, mongodb_uri):
    set_connection(monkeypatch, "cdc_source", conn_type="mongocdc", host=mongodb_uri)
    with MongoTopologyHook("cdc_source", connect_max_attempts=2) as hook:
        client = hook.get_conn()
        hello = client.admin.command("hello")
        topology = hook.discover()
    assert topology.kind == "replica_set"
    assert topology.replica_sets[0].name == hello["setName"]
    assert topology.replica_sets[0].primary == hello["primary"]


def test_mongo_provider_connection_is_accepted(monkeypatch, mongodb_uri):
    """A connection made for apache-airflow-providers-mongo: host/port/login/password + extras."""
    parsed = uri_parser.parse_uri(mongodb_uri)
    host, port = parsed["nodelist"][0]
    extra = {key: value for key, value in parsed["options"].items()}
    set_connection(
        monkeypatch,
        "mongo_default_like",
        conn_type="mongo",
        host=host,
        port=port,
        login=parsed.get("username"),
        password=parsed.get("password"),
        extra=extra,
    )
    hook = MongoTopologyHook("mongo_default_like", connect_max_attempts=2)
    details = hook.get_connection_details()
    assert details.hosts == f"{host}:{port}"
    assert details.replica_set == parsed["options"].get("replicaSet")
    topology = hook.discover()
    assert topology.replica_sets[0].primary


@pytest.mark.simulator_only
def test_seed_list_with_credentials_and_the_ui_test_button(monkeypatch, mongosim, caplog):
    sim = mongosim("replset", members=3, auth=("cdc", "hook-secret"))
    seeds = ",".join(sim.member_addresses)
    set_connection(
        monkeypatch,
        "cdc_seeds",
        conn_type="mongocdc",
        host=seeds,
        login="cdc",
        password="hook-secret",
        extra={"replica_set": "rs0", "auth_source": "admin", "members_auto_discover": "true", "tls": False},
    )
    hook = MongoTopologyHook("cdc_seeds")
    details = hook.get_connection_details()
    assert details.replica_set == "rs0" and details.username == "cdc" and details.tls is False
    with caplog.at_level(logging.DEBUG):
        ok, message = hook.test_connection()
        assert ok, message
        assert "replica set" in message and "rs0" in message
        assert len(hook.discover().replica_sets[0].members) == 3
    assert "hook-secret" not in caplog.text and "hook-secret" not in repr(details)

    set_connection(
        monkeypatch,
        "cdc_wrong",
        conn_type="mongocdc",
        host=seeds,
        login="cdc",
        password="not-it",
        extra={"replica_set": "rs0"},
    )
    ok, message = MongoTopologyHook("cdc_wrong").test_connection()
    assert not ok and "refused the credentials" in message and "not-it" not in message


@pytest.mark.simulator_only
def test_a_password_inside_the_host_connects_and_is_named_once_without_it(monkeypatch, mongosim, caplog):
    # Admin > Connections lists each connection's host: a password written into the connection
    # string is shown there. The hook connects with it and says, once, to move it.
    sim = mongosim("replset", members=1, auth=("cdc", "uri-secret"))
    seeds = ",".join(sim.member_addresses)
    set_connection(
        monkeypatch,
        "cdc_uri_password",
        conn_type="mongocdc",
        host=f"mongodb://cdc:uri-secret@{seeds}/?replicaSet=rs0&authSource=admin",
    )
    set_connection(monkeypatch, "mongo_uri_password", conn_type="mongo", host=f"cdc:uri-secret@{seeds}")
    with caplog.at_level(logging.WARNING):
        hook = MongoTopologyHook("cdc_uri_password", connect_max_attempts=2)
        ok, message = hook.test_connection()
        assert ok, message
        assert hook.discover().replica_sets[0].primary
        hook.get_conn().admin.command("ping")
        hook.close()
        MongoTopologyHook("cdc_uri_password").get_connection_details()
        MongoTopologyHook("mongo_uri_password").get_connection_details()
        MongoTopologyHook("mongo_uri_password").get_connection_details()
    warnings = [record.getMessage() for record in caplog.records if record.levelno >= logging.WARNING]
    assert "uri-secret" not in caplog.text
    for conn_id in ("cdc_uri_password", "mongo_uri_password"):
        said = [text for text in warnings if f"'{conn_id}'" in text]
        assert len(said) == 1, warnings
        assert "holds the password of user 'cdc'" in said[0], said[0]
        assert "Admin > Connections" in said[0] and "move it to the Password field" in said[0], said[0]

    # Moved to the Password field (and the user name to User name): connected, nothing to say.
    caplog.clear()
    set_connection(
        monkeypatch,
        "cdc_password_field",
        conn_type="mongocdc",
        host=f"mongodb://{seeds}/?replicaSet=rs0&authSource=admin",
        login="cdc",
        password="uri-secret",
    )
    with caplog.at_level(logging.WARNING):
        ok, message = MongoTopologyHook("cdc_password_field", connect_max_attempts=2).test_connection()
    assert ok, message
    assert not [record for record in caplog.records if record.levelno >= logging.WARNING], caplog.text


def test_hook_retries_per_its_connect_parameters(monkeypatch):
    set_connection(monkeypatch, "cdc_down", conn_type="mongocdc", host="rs0/127.0.0.1:9")
    hook = MongoTopologyHook(
        "cdc_down",
        connect_backoff_initial_delay_ms=5,
        connect_backoff_max_delay_ms=10,
        connect_max_attempts=2,
        server_selection_timeout_ms=200,
        connect_timeout_ms=200,
    )
    with pytest.raises(ConnectionFailedError) as info:
        hook.get_conn()
    assert "after 3 attempts" in str(info.value) and "127.0.0.1:9" in str(info.value)
    assert "connect.max.attempts (now 2)" in str(info.value)


def test_other_connection_types_are_refused(monkeypatch):
    set_connection(monkeypatch, "not_mongo", conn_type="postgres", host="db")
    with pytest.raises(ConfigError, match="mongocdc"):
        MongoTopologyHook("not_mongo").get_connection_details()
    set_connection(monkeypatch, "no_host", conn_type="mongocdc")
    with pytest.raises(ConfigError, match="no host"):
        MongoTopologyHook("no_host").get_connection_details()
