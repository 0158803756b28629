"""Airflow hook for the MongoDB deployment to capture: a client, and its topology."""

from __future__ import annotations

import json
import logging
from typing import Any

from airflow.sdk import BaseHook
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.backoff import (
    DEFAULT_INITIAL_DELAY_MS,
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_DELAY_MS,
    BackoffPolicy,
)
from airflow_provider_mongocdc.core.base.booleans import parse_bool
from airflow_provider_mongocdc.core.base.errors import ConfigError, MongoCdcError
from airflow_provider_mongocdc.core.mongo.connection import MongoConnectionDetails, connect
from airflow_provider_mongocdc.core.mongo.topology import Topology, discover

log = logging.getLogger(__name__)

CONN_TYPE = "mongocdc"
# Connections made for apache-airflow-providers-mongo work too (its "mongo" type).
ACCEPTED_CONN_TYPES = (CONN_TYPE, "mongo")
# The connections whose host holds a password, already said in this process.
_PASSWORD_IN_HOST_WARNED: set[str] = set()


def _extra(extras: dict[str, Any], conn_type: str, name: str, default: Any = None) -> Any:
    """An extra field, stored plainly or with the form's ``extra__<type>__`` prefix."""
    for key in (name, f"extra__{conn_type}__{name}"):
        if key in extras and extras[key] not in (None, ""):
            return extras[key]
    return default


def _bool(value: Any, name: str) -> bool:
    return parse_bool(value, name, problem=f"The MongoDB connection field {name!r} must be true or false")


# The extras apache-airflow-providers-mongo's connection form writes, or this hook reads: every
# other extra of a "mongo" connection is a connection string option.
MONGO_PROVIDER_EXTRAS = frozenset(
    {
        "srv",
        "ssl",
        "tls",
        "allow_insecure",
        "replicaSet",
        "authSource",
        "authMechanism",
        "tlsAllowInvalidHostnames",
        "replica_set",
        "auth_source",
        "auth_mechanism",
        "members_auto_discover",
        "tls_allow_invalid_hostnames",
        "options",
    }
)


def details_from_connection(conn, **overrides: Any) -> MongoConnectionDetails:
    """Connection details from an Airflow connection of type ``mongocdc`` or ``mongo``.

    ``mongocdc``: host = a seed list (``host1:27017,host2:27017``, optionally ``rs0/...``) or a
    connection string (``mongodb://`` / ``mongodb+srv://``); login/password = the credentials;
    extras ``replica_set``, ``auth_source``, ``tls``, ``tls_allow_invalid_hostnames``,
    ``members_auto_discover``, ``auth_mechanism`` and ``options`` (more pymongo options).

    ``mongo`` (apache-airflow-providers-mongo): host/port/login/password/schema, extras ``srv``,
    ``ssl``/``tls``, ``allow_insecure`` and any connection string option (``replicaSet``,
    ``authSource`` ...).
    """
    conn_type = _checked_type(conn)
    extras = dict(conn.extra_dejson or {})
    host = (conn.host or "").strip()
    if not host:
        raise ConfigError(
            f"Connection {conn.conn_id!r} has no host",
            fix="set the host to the seed list (host1:27017,host2:27017) or a mongodb:// connection string",
        )
    options = _options(conn, extras, conn_type)
    tls = _extra(extras, conn_type, "tls", _extra(extras, conn_type, "ssl"))
    allow_invalid = _extra(
        extras, conn_type, "tls_allow_invalid_hostnames", extras.get("tlsAllowInvalidHostnames", False)
    )
    auth_source = _extra(extras, conn_type, "auth_source", extras.get("authSource"))
    auto_discover = _bool(_extra(extras, conn_type, "members_auto_discover", True), "members_auto_discover")
    if conn_type == "mongo":
        host, auth_source = _mongo_provider_fields(conn, extras, options, host, auth_source)
    elif conn.schema and not auth_source:
        auth_source = conn.schema
    _warn_password_in_host(conn.conn_id, host)
    kwargs: dict[str, Any] = {
        "replica_set": _extra(extras, conn_type, "replica_set", extras.get("replicaSet")) or None,
        "username": conn.login or None,
        "password": conn.password or None,
        "auth_source": auth_source or None,
        "auth_mechanism": _extra(extras, conn_type, "auth_mechanism", extras.get("authMechanism")) or None,
        "tls": None if tls is None else _bool(tls, "tls"),
        "tls_allow_invalid_hostnames": _bool(allow_invalid, "tls_allow_invalid_hostnames"),
        "members_auto_discover": auto_discover,
        "options": options,
        **_address(host, conn.port),
    }
    kwargs.update({key: value for key, value in overrides.items() if value is not None})
    return MongoConnectionDetails(**kwargs)


def _host_user_with_password(host: str) -> str | None:
    """The user name of a host that holds a password (``mongodb://user:secret@host1,host2/...``,
    also ``user:secret@host`` without a scheme), as the driver reads its user information: before
    the last ``@`` of the part ahead of the first ``/``. None when the host holds no password."""
    scheme_free = host.partition("://")[2] or host
    address = scheme_free.partition("/")[0]
    if "@" not in address:
        return None
    user, _, password = address.rpartition("@")[0].partition(":")
    return user if password else None


def _warn_password_in_host(conn_id: str, host: str) -> None:
    """Warn once per connection and process when its host holds a password: Airflow shows the host
    in its list of connections, and hides only the Password field."""
    user = _host_user_with_password(host)
    if user is None or conn_id in _PASSWORD_IN_HOST_WARNED:
        return
    _PASSWORD_IN_HOST_WARNED.add(conn_id)
    log.warning(
        "Connection %r: its host holds the password of user %r, which Admin > Connections shows to "
        "everyone who may list connections. Fix: move it to the Password field (and the user name "
        "to the User name field) and remove %r from the host.",
        conn_id,
        user,
        f"{user}:***@",
    )


def _checked_type(conn) -> str:
    conn_type = conn.conn_type or CONN_TYPE
    if conn_type not in ACCEPTED_CONN_TYPES:
        raise ConfigError(
            f"Connection {conn.conn_id!r} has type {conn_type!r}",
            cause="the MongoDB CDC hooks read MongoDB connections",
            fix="use a connection of type 'mongocdc' (or 'mongo')",
        )
    return conn_type


def _options(conn, extras: dict[str, Any], conn_type: str) -> dict[str, Any]:
    """The ``options`` extra: more pymongo options, as a mapping or its JSON text."""
    options = _extra(extras, conn_type, "options", {}) or {}
    if isinstance(options, str):
        try:
            options = json.loads(options)
        except ValueError:
            raise ConfigError(
                f"The 'options' field of connection {conn.conn_id!r} is not JSON",
                fix='give pymongo options as a JSON object, e.g. {"maxPoolSize": 5}',
            ) from None
    return dict(options)


def _mongo_provider_fields(
    conn, extras: dict[str, Any], options: dict[str, Any], host: str, auth_source: str | None
) -> tuple[str, str | None]:
    """A ``mongo`` connection's own fields: its other extras are connection string options (added
    to ``options``), ``allow_insecure``, the schema as the authentication database, ``srv``.
    Returns the host and the authentication database."""
    options.update({key: value for key, value in extras.items() if key not in MONGO_PROVIDER_EXTRAS})
    if _bool(extras.get("allow_insecure", False), "allow_insecure"):
        options["tlsAllowInvalidCertificates"] = True
    if _bool(extras.get("srv", False), "srv"):
        host = f"mongodb+srv://{host}"
    return host, auth_source or conn.schema or None


def _address(host: str, port: int | None) -> dict[str, str]:
    """``connection_string`` for a URI, else ``hosts`` (the port added to a single host without one)."""
    if host.startswith(("mongodb://", "mongodb+srv://")):
        return {"connection_string": host}
    if port and "," not in host and ":" not in host.split("/")[-1]:
        host = f"{host}:{port}"
    return {"hosts": host}


class MongoTopologyHook(BaseHook):
    """The MongoDB deployment behind an Airflow connection (type ``mongocdc``, or ``mongo``).

    :param mongo_conn_id: the Airflow connection.
    :param connect_backoff_initial_delay_ms: ``connect.backoff.initial.delay.ms`` (default 1000).
    :param connect_backoff_max_delay_ms: ``connect.backoff.max.delay.ms`` (default 120000).
    :param connect_max_attempts: ``connect.max.attempts`` (default 16).
    :param connect_timeout_ms: driver connect timeout (``mongodb.connect.timeout.ms``).
    :param server_selection_timeout_ms: driver server selection timeout per attempt.
    """

    conn_name_attr = "mongo_conn_id"
    default_conn_name = "mongocdc_default"
    conn_type = CONN_TYPE
    hook_name = "MongoDB (change data capture)"

    def __init__(
        self,
        mongo_conn_id: str = default_conn_name,
        *,
        connect_backoff_initial_delay_ms: int = DEFAULT_INITIAL_DELAY_MS,
        connect_backoff_max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
        connect_max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        connect_timeout_ms: int | None = None,
        server_selection_timeout_ms: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.mongo_conn_id = mongo_conn_id
        self.policy = BackoffPolicy(
            connect_backoff_initial_delay_ms, connect_backoff_max_delay_ms, connect_max_attempts
        )
        self.connect_timeout_ms = connect_timeout_ms
        self.server_selection_timeout_ms = server_selection_timeout_ms
        self._client: MongoClient | None = None

    @classmethod
    def from_config(cls, config, mongo_conn_id: str = default_conn_name) -> MongoTopologyHook:
        """A hook using a ConnectorConfig's connect.* and mongodb.*.timeout.ms properties."""
        return cls(
            mongo_conn_id,
            connect_backoff_initial_delay_ms=config.connect_backoff_initial_delay_ms,
            connect_backoff_max_delay_ms=config.connect_backoff_max_delay_ms,
            connect_max_attempts=config.connect_max_attempts,
            connect_timeout_ms=config.mongodb_connect_timeout_ms,
            server_selection_timeout_ms=config.mongodb_server_selection_timeout_ms,
        )

    def get_connection_details(self) -> MongoConnectionDetails:
        return details_from_connection(
            self.get_connection(self.mongo_conn_id),
            connect_timeout_ms=self.connect_timeout_ms,
            server_selection_timeout_ms=self.server_selection_timeout_ms,
        )

    def get_conn(self) -> MongoClient:
        """A pymongo client whose first contact succeeded (retried per the connect.* values)."""
        if self._client is None:
            self._client = connect(self.get_connection_details(), self.policy)
        return self._client

    def discover(self) -> Topology:
        """The deployment: replica set(s), members, primaries, oplog windows, shards."""
        return discover(self.get_connection_details(), policy=self.policy)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> MongoTopologyHook:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def test_connection(self) -> tuple[bool, str]:
        """The Airflow UI's "Test" button: one attempt, then the discovered topology."""
        try:
            topology = discover(
                self.get_connection_details(),
                policy=BackoffPolicy(self.policy.initial_delay_ms, self.policy.max_delay_ms, 0),
            )
        except MongoCdcError as error:
            return False, str(error)
        names = ", ".join(topology.replica_set_names)
        return True, f"Connected: {topology.kind.replace('_', ' ')} ({names})"
