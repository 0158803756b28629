"""A connector's configuration and connection ids as its tasks and its change watcher read them at
run time (never while a DAG file is parsed): inline, or from an Airflow Variable; the connector
``default`` also from the environment variable ``MONGOCDC_CONNECTOR_CONFIG`` and, for its
connections, the Variables ``mongocdc_<kind>_conn_id`` (README, "The example DAGs")."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.dag_ids import DEFAULT_NAME
from airflow_provider_mongocdc.core.base.errors import ConfigError

CONNECTOR_CONFIG_ENV = "MONGOCDC_CONNECTOR_CONFIG"


def connector_config_json(name: str, config: Mapping[str, Any] | None, config_variable: str | None) -> str:
    """The configuration of connector ``name`` as JSON: ``config`` when given, else the Variable
    ``config_variable``; its property ``name`` is the connector's name (a topic prefix belongs to
    one connector: runs refuse offsets and leases written under another name)."""
    if config is not None:
        return named(json.dumps(dict(config)), name)
    from airflow.sdk import Variable

    value: Any = Variable.get(config_variable, default=None)
    if value in (None, "") and name == DEFAULT_NAME:
        value = os.environ.get(CONNECTOR_CONFIG_ENV)
    if value in (None, ""):
        raise ConfigError(
            f"Connector {name!r} has no connector configuration",
            cause=f"the Airflow Variable {config_variable!r} is not set",
            fix=f"airflow variables set {config_variable} "
            '\'{"topic.prefix": "shop", "collection.include.list": "shop\\\\..*"}\'',
        )
    return named(value if isinstance(value, str) else json.dumps(value), name)


def named(config_json: str, name: str) -> str:
    """``config_json`` with the property ``name`` set to ``name`` (text that is not a JSON object
    is left as it is: the task reports it)."""
    try:
        properties = json.loads(config_json)
    except ValueError:
        return config_json
    if not isinstance(properties, dict):
        return config_json
    return json.dumps({**properties, "name": name})


def connection_id(name: str, kind: str, conn_id: str) -> str:
    """The ``kind`` (``mongo``, ``kafka``, ``spark``) connection id of connector ``name``:
    ``conn_id``, or for the connector ``default`` the Variable ``mongocdc_<kind>_conn_id`` when set."""
    if name == DEFAULT_NAME:
        from airflow.sdk import Variable

        return Variable.get(f"mongocdc_{kind}_conn_id", default=None) or conn_id
    return conn_id
