"""Connecting to MongoDB: connection details, a pymongo client, and a retried first contact.

The details mirror Debezium's connection properties: a seed list (``mongodb.hosts``, optionally
``rs0/host1:27017,host2:27017``) or ``mongodb.connection.string``, the replica set name,
``mongodb.user`` / ``mongodb.password`` / ``mongodb.authsource``, ``mongodb.ssl.enabled``,
``mongodb.ssl.invalid.hostname.allowed`` and ``mongodb.members.auto.discover`` (false: the first
seed only, with ``directConnection``, for servers behind a proxy).

The first contact is retried per :mod:`airflow_provider_mongocdc.core.base.backoff`; wrong credentials (:class:`AuthenticationError`)
and a standalone server (:class:`TopologyError`) fail at once. Passwords never appear in messages,
logs or ``repr`` (:mod:`airflow_provider_mongocdc.core.base.redaction`; ``redact_uri`` stays importable from here). Clients decode
dates with ``DATETIME_AUTO`` whatever the connection's options say: a date outside Python's years
1-9999 comes back as :class:`bson.datetime_ms.DatetimeMS` instead of failing the read. They decode
binary values as stored (``uuidRepresentation=unspecified``, whatever the connection sets): a UUID
keeps its subtype (3 or 4) and its bytes, as the Java driver gives them to Debezium.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from bson.codec_options import DatetimeConversion
from pymongo import MongoClient, ReadPreference
from pymongo.errors import (
    ConfigurationError,
    ConnectionFailure,
    OperationFailure,
    PyMongoError,
)

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy, format_duration_ms
from airflow_provider_mongocdc.core.base.errors import (
    AuthenticationError,
    ConfigError,
    ConnectionFailedError,
    TopologyError,
)
from airflow_provider_mongocdc.core.base.redaction import error_text, redact_uri
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

log = logging.getLogger(__name__)

AUTHENTICATION_FAILED = 18
DEFAULT_PORT = 27017
# Client options that decide how values decode; the connector sets them (client_arguments).
_DECODING_OPTIONS = frozenset({"datetimeconversion", "uuidrepresentation"})


def _option_name(key: str) -> str:
    """A pymongo option's name as pymongo compares them (``uuid_representation`` is
    ``uuidRepresentation``)."""
    return key.replace("_", "").lower()


def split_hosts(hosts: str) -> tuple[str | None, list[str]]:
    """``"rs0/h1:27017,h2"`` -> ``("rs0", ["h1:27017", "h2:27017"])``; ``"h1"`` -> ``(None, ["h1:27017"])``."""
    text = hosts.strip()
    replica_set = None
    if "/" in text:
        replica_set, text = text.split("/", 1)
        replica_set = replica_set.strip() or None
    seeds = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        if item.startswith("["):  # [ipv6]:port
            seeds.append(item if "]:" in item else f"{item}:{DEFAULT_PORT}")
        else:
            seeds.append(item if ":" in item else f"{item}:{DEFAULT_PORT}")
    return replica_set, seeds


@dataclass(frozen=True)
class MongoConnectionDetails:
    """How to reach a MongoDB deployment. Give ``hosts`` or ``connection_string``."""

    hosts: str | None = None
    connection_string: str | None = None
    replica_set: str | None = None
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    auth_source: str | None = None
    auth_mechanism: str | None = None
    tls: bool | None = None
    tls_allow_invalid_hostnames: bool = False
    members_auto_discover: bool = True
    connect_timeout_ms: int = 10_000
    server_selection_timeout_ms: int = 30_000
    socket_timeout_ms: int | None = None
    heartbeat_frequency_ms: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-friendly form (password included: write it only to owner-only files)."""
        data = asdict(self)
        data["options"] = dict(self.options)
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MongoConnectionDetails:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def __post_init__(self) -> None:
        if bool(self.hosts) == bool(self.connection_string):
            raise ConfigError(
                "MongoDB connection details need either a seed list or a connection string",
                cause="both were given" if self.hosts else "neither was given",
                fix="give the hosts (host1:27017,host2:27017 or rs0/host1:27017) or a connection "
                "string (mongodb://... or mongodb+srv://...), not both",
            )
        if self.connection_string and not self.connection_string.startswith(("mongodb://", "mongodb+srv://")):
            raise ConfigError(
                "The MongoDB connection string must start with mongodb:// or mongodb+srv://",
                cause=f"got {redact_uri(self.connection_string)[:40]!r}",
                fix="give a MongoDB connection string, or the hosts as host1:27017,host2:27017",
            )
        if (
            self.connection_string
            and self.connection_string.startswith("mongodb+srv://")
            and not self.members_auto_discover
        ):
            raise ConfigError(
                "A mongodb+srv:// connection string cannot be used with members auto-discover off",
                cause="the SRV record names the members; there is no single seed to talk to",
                fix="give the proxy's address as the host (mongodb://proxy:27017) instead",
            )
        if self.hosts and not split_hosts(self.hosts)[1]:
            raise ConfigError(
                "The MongoDB seed list is empty",
                cause=f"got {self.hosts!r}",
                fix="give the hosts as host1:27017,host2:27017 (optionally rs0/...)",
            )

    # -- derived values --
    def seeds(self) -> list[str]:
        """The seed addresses (for a mongodb+srv:// string: the SRV name)."""
        if self.hosts:
            return split_hosts(self.hosts)[1]
        parsed = _parse_uri(self.connection_string, resolve_srv=False)
        return [f"{host}:{port}" for host, port in parsed["nodelist"]] or [parsed.get("fqdn") or "?"]

    def effective_replica_set(self) -> str | None:
        if self.replica_set:
            return self.replica_set
        if self.hosts:
            return split_hosts(self.hosts)[0]
        return _parse_uri(self.connection_string, resolve_srv=False)["options"].get("replicaSet")

    def describe(self) -> str:
        """Where this connects, safe for messages (no password)."""
        target = ", ".join(self.seeds()) if self.hosts else redact_uri(self.connection_string)
        extras = []
        replica_set = self.effective_replica_set()
        if replica_set:
            extras.append(f"replica set {replica_set}")
        if self.username:
            extras.append(f"user {self.username}")
        if not self.members_auto_discover:
            extras.append("direct connection")
        return target + (f" ({', '.join(extras)})" if extras else "")

    def __repr__(self) -> str:
        return f"MongoConnectionDetails({self.describe()})"

    def client_arguments(self) -> tuple[Any, dict[str, Any]]:
        """``(host, keyword arguments)`` for ``pymongo.MongoClient``."""
        if self.connection_string and not self.members_auto_discover:
            return self.as_seed_list().client_arguments()
        kwargs: dict[str, Any] = {
            "connectTimeoutMS": self.connect_timeout_ms,
            "serverSelectionTimeoutMS": self.server_selection_timeout_ms,
            "appname": "airflow-provider-mongocdc",
        }
        if self.socket_timeout_ms:
            kwargs["socketTimeoutMS"] = self.socket_timeout_ms
        if self.heartbeat_frequency_ms:
            kwargs["heartbeatFrequencyMS"] = self.heartbeat_frequency_ms
        if self.connection_string:
            host: Any = self.connection_string  # its replicaSet and options stay in the string
            if self.replica_set:
                kwargs["replicaSet"] = self.replica_set
        elif self.members_auto_discover:
            host = self.seeds()
            if self.effective_replica_set():
                kwargs["replicaSet"] = self.effective_replica_set()
        else:
            # Behind a proxy: the first seed only, never the members it advertises.
            host = self.seeds()[0]
            kwargs["directConnection"] = True
        if self.username:
            kwargs["username"] = self.username
            kwargs["password"] = self.password or ""
        if self.auth_source:
            kwargs["authSource"] = self.auth_source
        if self.auth_mechanism:
            kwargs["authMechanism"] = self.auth_mechanism
        if self.tls is not None:
            kwargs["tls"] = bool(self.tls)
        if self.tls_allow_invalid_hostnames:
            kwargs["tlsAllowInvalidHostnames"] = True
        kwargs.update(self.options)
        # Every BSON date must decode: one outside Python's years 1-9999 (valid in MongoDB) would
        # otherwise fail every read of the change that holds it. Such dates become DatetimeMS.
        # Every binary value decodes as stored: a legacy uuidRepresentation (pythonLegacy,
        # javaLegacy, csharpLegacy) would turn subtype 3 into uuid.UUID, written back as subtype 4
        # (in another byte order for Java and C#), where Debezium writes the stored subtype 3.
        for key in [key for key in kwargs if _option_name(key) in _DECODING_OPTIONS]:
            del kwargs[key]
        kwargs["datetime_conversion"] = DatetimeConversion.DATETIME_AUTO
        kwargs["uuidRepresentation"] = "unspecified"
        return host, kwargs

    def as_seed_list(self) -> MongoConnectionDetails:
        """The same deployment, credentials and options, given as a seed list (a mongodb+srv://
        string is resolved through DNS)."""
        if self.hosts:
            return self
        parsed = _parse_uri(self.connection_string, resolve_srv=True)
        uri_options = dict(parsed["options"])
        for key in ("directConnection", "srvServiceName", "srvMaxHosts", "loadBalanced"):
            uri_options.pop(key, None)
        replica_set = self.replica_set or uri_options.pop("replicaSet", None)
        uri_options.pop("replicaSet", None)
        username, password = self.username, self.password
        if not username and parsed.get("username"):
            username, password = parsed["username"], parsed.get("password")
        auth_source = (
            self.auth_source
            or uri_options.pop("authSource", None)
            or (parsed.get("database") if parsed.get("username") else None)
        )
        uri_options.pop("authSource", None)
        tls = self.tls
        uri_tls = uri_options.pop("tls", uri_options.pop("ssl", None))
        uri_options.pop("ssl", None)
        if tls is None:
            tls = (
                bool(uri_tls)
                if uri_tls is not None
                else (True if self.connection_string.startswith("mongodb+srv://") else None)
            )
        allow_invalid = self.tls_allow_invalid_hostnames or bool(
            uri_options.pop("tlsAllowInvalidHostnames", False)
        )
        seeds = ",".join(f"{host}:{port}" for host, port in parsed["nodelist"])
        return replace(
            self,
            hosts=f"{replica_set}/{seeds}" if replica_set else seeds,
            connection_string=None,
            replica_set=replica_set,
            username=username,
            password=password,
            auth_source=auth_source,
            tls=tls,
            tls_allow_invalid_hostnames=allow_invalid,
            options={**uri_options, **self.options},
        )

    def for_replica_set(self, name: str, hosts: list[str]) -> MongoConnectionDetails:
        """The same credentials and TLS settings, for another replica set (a shard)."""
        return replace(self.as_seed_list(), hosts=f"{name}/{','.join(hosts)}", replica_set=name)

    def with_config(self, config: ConnectorConfig) -> MongoConnectionDetails:
        """These details with a ConnectorConfig's driver settings (mongodb.*.timeout.ms,
        mongodb.heartbeat.frequency.ms); ``mongodb.members.auto.discover=false`` in the
        configuration turns discovery off even when the connection leaves it on."""
        return replace(
            self,
            connect_timeout_ms=config.mongodb_connect_timeout_ms,
            server_selection_timeout_ms=config.mongodb_server_selection_timeout_ms,
            socket_timeout_ms=config.mongodb_socket_timeout_ms or None,
            heartbeat_frequency_ms=config.mongodb_heartbeat_frequency_ms,
            members_auto_discover=self.members_auto_discover and config.mongodb_members_auto_discover,
        )

    def create_client(self) -> MongoClient:
        """A client (pymongo connects lazily: nothing is contacted yet)."""
        host, kwargs = self.client_arguments()
        try:
            return MongoClient(host, **kwargs)
        except ConfigurationError as error:
            raise ConfigError(
                "The MongoDB connection settings are invalid",
                cause=redact_uri(str(error)),
                fix="correct the MongoDB connection (hosts or connection string and options)",
            ) from None


def connection_details(
    mongo: Mapping[str, Any] | MongoConnectionDetails, config: ConnectorConfig | None = None
) -> MongoConnectionDetails:
    """Connection details from a job spec's ``mongo`` mapping (:meth:`MongoConnectionDetails.to_dict`),
    with the connector's driver settings (:meth:`MongoConnectionDetails.with_config`) when
    ``config`` is given."""
    details = mongo if isinstance(mongo, MongoConnectionDetails) else MongoConnectionDetails.from_dict(mongo)
    return details if config is None else details.with_config(config)


def _parse_uri(uri: str, *, resolve_srv: bool) -> dict[str, Any]:
    from pymongo import uri_parser

    try:
        if uri.startswith("mongodb+srv://") and not resolve_srv:
            # Parse without DNS: swap the scheme, then report the SRV name as fqdn.
            parsed = uri_parser.parse_uri("mongodb://" + uri[len("mongodb+srv://") :], validate=False)
            parsed["fqdn"] = parsed["nodelist"][0][0] if parsed["nodelist"] else None
            parsed["nodelist"] = []
            return parsed
        return uri_parser.parse_uri(uri)
    except (ConfigurationError, ValueError) as error:
        raise ConfigError(
            "The MongoDB connection string is invalid",
            cause=redact_uri(str(error)),
            fix="check the connection string syntax (mongodb://user@host1:27017,host2/?replicaSet=rs0)",
        ) from None


# -- the first contact ------------------------------------------------------------------------------
def is_authentication_failure(error: BaseException) -> bool:
    return isinstance(error, OperationFailure) and error.code == AUTHENTICATION_FAILED


def is_retriable(error: BaseException) -> bool:
    """Network problems and missing primaries are retried; everything else fails at once."""
    return isinstance(error, ConnectionFailure) and not is_authentication_failure(error)


def _auth_identity(details: MongoConnectionDetails) -> tuple[str | None, str]:
    """(user name, authentication database) as the driver uses them."""
    user, source = details.username, details.auth_source
    if details.connection_string:
        parsed = _parse_uri(details.connection_string, resolve_srv=False)
        user = user or parsed.get("username")
        source = (
            source
            or parsed["options"].get("authSource")
            or (parsed.get("database") if parsed.get("username") else None)
        )
    source = source or details.options.get("authSource") or "admin"
    return user, source


def authentication_error(details: MongoConnectionDetails, error: BaseException) -> AuthenticationError:
    user, source = _auth_identity(details)
    return AuthenticationError(
        f"MongoDB at {', '.join(details.seeds())} refused the credentials"
        + (f" of user {user!r}" if user else ""),
        cause=f"AuthenticationFailed (code 18) with authentication database {source!r}: "
        + error_text(error, brief=True),
        fix="check the user name and password of the MongoDB connection, and that the user is "
        f"defined in the authentication database (mongodb.authsource, now {source!r})",
    )


def connect(
    details: MongoConnectionDetails,
    policy: BackoffPolicy | None = None,
    *,
    require_primary: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> MongoClient:
    """A client whose first contact (``hello``) succeeded, retried per ``policy``.

    ``require_primary`` waits for a writable primary (the change stream reads from it); otherwise
    any member answering is enough (topology discovery also reports a set without a primary).
    """
    policy = policy or BackoffPolicy()
    read_preference = ReadPreference.PRIMARY if require_primary else ReadPreference.PRIMARY_PREFERRED

    def attempt() -> MongoClient:
        client = details.create_client()
        try:
            client.admin.command("hello", read_preference=read_preference)
            return client
        except PyMongoError as error:
            client.close()
            if is_retriable(error):
                _diagnose_seeds(details, error)
            raise

    def on_retry(number: int, delay_ms: int, error: BaseException) -> None:
        log.warning(
            "MongoDB at %s not reachable (%s); reconnection attempt %d of %d in %s",
            details.describe(),
            error_text(error, brief=True),
            number,
            policy.max_attempts,
            format_duration_ms(delay_ms),
        )

    started = time.monotonic()
    try:
        return policy.call(attempt, retry_on=is_retriable, sleep=sleep, on_retry=on_retry)
    except OperationFailure as error:
        if is_authentication_failure(error):
            raise authentication_error(details, error) from None
        raise ConnectionFailedError(
            f"MongoDB at {details.describe()} refused the first command",
            cause=error_text(error, brief=True),
            fix="check the MongoDB connection settings and the user's roles",
        ) from None
    except ConnectionFailure as error:
        waited = int((time.monotonic() - started) * 1000)
        attempts = f"{policy.max_calls} attempt{'s' if policy.max_calls != 1 else ''}"
        raise ConnectionFailedError(
            f"Could not connect to MongoDB at {details.describe()} after {attempts} over {format_duration_ms(waited)}",
            cause=error_text(error, brief=True),
            fix=_connection_fix(details, error, require_primary, policy),
        ) from None


def _connection_fix(
    details: MongoConnectionDetails, error: BaseException, require_primary: bool, policy: BackoffPolicy
) -> str:
    text = str(error).lower()
    hints = []
    if "ssl" in text or "certificate" in text or "tls" in text:
        hints.append(
            "check the TLS settings (TLS on/off, the CA certificate, and 'allow invalid "
            "hostnames' only for test servers)"
        )
    if require_primary and "primary" in text:
        hints.append("wait for the replica set to elect a primary (rs.status())")
    hints.append(
        "check that the servers run and are reachable from this machine (host names, ports, firewalls, DNS)"
    )
    if details.effective_replica_set():
        hints.append(f"check that the replica set is named {details.effective_replica_set()!r}")
    if details.members_auto_discover:
        hints.append("behind a proxy set members auto-discover to false")
    if policy.max_attempts > 0:  # a single contact (health probes, gap checks) has no wait to raise
        hints.append(
            f"to wait longer raise connect.max.attempts (now {policy.max_attempts}) or "
            f"connect.backoff.max.delay.ms (now {policy.max_delay_ms})"
        )
    return "; ".join(hints)


def _diagnose_seeds(details: MongoConnectionDetails, error: BaseException) -> None:
    """When a replica set cannot be selected, ask each seed directly what it is: a standalone
    server or another replica set is a configuration problem, not worth retrying."""
    replica_set = details.effective_replica_set()
    if not replica_set or not details.members_auto_discover:
        return
    if details.connection_string and details.connection_string.startswith("mongodb+srv://"):
        return
    seeds = details.as_seed_list()
    timeout = min(2000, details.server_selection_timeout_ms)
    for seed in seeds.seeds():
        probe = replace(
            seeds,
            hosts=seed,
            replica_set=None,
            members_auto_discover=False,
            server_selection_timeout_ms=timeout,
            connect_timeout_ms=min(timeout, details.connect_timeout_ms),
        )
        try:
            with probe.create_client() as client:
                hello = client.admin.command("hello")
        except PyMongoError:
            continue
        if hello.get("msg") == "isdbgrid":
            raise ConfigError(
                f"{seed} is a mongos router, but the connection names replica set {replica_set!r}",
                cause="a replica set name makes the driver look for replica set members",
                fix="remove the replica set name from the MongoDB connection when connecting through mongos",
            )
        if not hello.get("setName"):
            raise not_initiated_error(seed) if hello.get("isreplicaset") else standalone_error(seed)
        if hello["setName"] != replica_set:
            raise ConfigError(
                f"{seed} belongs to replica set {hello['setName']!r}, not {replica_set!r}",
                cause="the replica set name of the MongoDB connection does not match the server's",
                fix=f"set the replica set name to {hello['setName']!r} (or connect to the right servers)",
            )


def standalone_error(where: str) -> TopologyError:
    return TopologyError(
        f"{where} is a standalone MongoDB server, which cannot be captured",
        cause="a standalone server has no oplog, so it has no change streams",
        fix="convert it to a one-member replica set: restart mongod with --replSet rs0 (or "
        "replication.replSetName: rs0 in mongod.conf), run rs.initiate() in mongosh, then "
        "connect with replica set name rs0",
    )


def not_initiated_error(where: str) -> TopologyError:
    return TopologyError(
        f"{where} runs with --replSet but its replica set is not initiated",
        cause="the replica set has no configuration yet, so there is no primary and no oplog",
        fix="run rs.initiate() in mongosh on that server, then retry",
    )
