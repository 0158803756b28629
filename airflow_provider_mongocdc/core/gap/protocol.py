"""The gap check without I/O: which MongoDB operation comes next, and what its reply (or error) means.

:func:`check_gaps` is a generator. It yields an operation (:class:`Connect`, :class:`Command`,
:class:`FindOne`, :class:`FindAll`, :class:`ReadStream`), is sent the operation's result, or has
the exception the operation raised thrown into it, and finally returns the :class:`GapReport`.
A driver performs the operations: :class:`~airflow_provider_mongocdc.core.gap.checker.GapChecker` with pymongo's synchronous API,
:class:`~airflow_provider_mongocdc.core.gap.checker.AsyncGapChecker` with its asyncio API (:func:`drive` and :func:`adrive` run the
exchange). Clients are opaque handles here: the driver creates them on :class:`Connect` and closes
every one when the check ends.

Contract with drivers: a :class:`Connect` may raise :class:`~airflow_provider_mongocdc.core.base.errors.ConnectionFailedError` (a
driver that contacts the server first), or return a client that is contacted on first use (then
connection errors surface as pymongo's ``ConnectionFailure`` on the next operation). Both are
handled here the same way for every driver.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from pymongo.errors import ConnectionFailure, OperationFailure, PyMongoError

from airflow_provider_mongocdc.core.base.errors import (
    AuthenticationError,
    ConnectionFailedError,
    MongoCdcError,
    TopologyError,
)
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.plan import Layout, Probe, layout_from_hello, plan_probes
from airflow_provider_mongocdc.core.gap.report import HISTORY_LOST, RESUMABLE, GapReport, assess
from airflow_provider_mongocdc.core.mongo.connection import (
    AUTHENTICATION_FAILED,
    MongoConnectionDetails,
)
from airflow_provider_mongocdc.core.mongo.oplog_span import OplogSpan, span_from_documents
from airflow_provider_mongocdc.core.mongo.stream_errors import (
    is_history_lost,
    is_unusable_position,
    unusable_position_error,
)
from airflow_provider_mongocdc.core.mongo.topology import ShardAddress
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position

# How long the stream check waits for the first batch (it reads one batch at most).
STREAM_PROBE_AWAIT_MS = 100
# Shards contacted directly only to read their oplog: one attempt, bounded server selection.
SHARD_PROBE_TIMEOUT_MS = 5000
SHARD_UNREACHABLE = "the shard is not reachable"

# The first entry's op and o.msg tell whether it is the replica set's initiation (o can be large).
_FIRST_PROJECTION = {"ts": 1, "op": 1, "o.msg": 1, "_id": 0}
_OPLOG_PROJECTION = {"ts": 1, "_id": 0}


# -- the operations a driver performs ---------------------------------------------------------------
@dataclass(frozen=True)
class Connect:
    """Open a client to ``details``; the result is the client. ``retry``: the first contact is
    retried per the driver's policy (else: one attempt; a shard read only for its oplog)."""

    details: MongoConnectionDetails
    retry: bool = True


@dataclass(frozen=True)
class Command:
    """``client[database].command(name, value)``; the result is the reply."""

    client: Any
    database: str
    name: str
    value: Any = 1


@dataclass(frozen=True)
class FindOne:
    """``client[database][collection].find_one(filter, projection, sort=sort)``."""

    client: Any
    database: str
    collection: str
    filter: Mapping[str, Any]
    projection: Mapping[str, Any]
    sort: list[tuple[str, int]]


@dataclass(frozen=True)
class FindAll:
    """Every document of ``client[database][collection]``, as a list."""

    client: Any
    database: str
    collection: str


@dataclass(frozen=True)
class ReadStream:
    """Open the connector's change stream at ``position`` on ``client`` as a window opens it
    (:func:`~airflow_provider_mongocdc.core.mongo.change_stream.open_stream`, ``max_await_time_ms``), read one batch, close it."""

    client: Any
    config: ConnectorConfig
    position: Position
    max_await_time_ms: int = STREAM_PROBE_AWAIT_MS


Operation = Connect | Command | FindOne | FindAll | ReadStream
T = TypeVar("T")
Exchange = Generator[Operation, Any, T]


class Steps:
    """Walks an exchange: the next operation, then that operation's result or exception."""

    def __init__(self, exchange: Exchange[T]):
        self._exchange = exchange
        self._result: Any = None
        self._error: Exception | None = None
        self.value: T | None = None

    def next_operation(self) -> Operation | None:
        """The next operation; None when the exchange returned (its value is :attr:`value`)."""
        try:
            if self._error is None:
                return self._exchange.send(self._result)
            return self._exchange.throw(self._error)
        except StopIteration as done:
            self.value = done.value
            return None

    def succeeded(self, result: Any) -> None:
        self._result, self._error = result, None

    def failed(self, error: Exception) -> None:
        self._result, self._error = None, error


def drive(exchange: Exchange[T], perform: Callable[[Operation], Any]) -> T:
    """Run ``exchange`` with a synchronous ``perform``; its exceptions go back into the exchange."""
    steps = Steps(exchange)
    while (operation := steps.next_operation()) is not None:
        try:
            steps.succeeded(perform(operation))
        except Exception as failure:  # the exchange decides what the failure means
            steps.failed(failure)
    return steps.value


async def adrive(exchange: Exchange[T], perform: Callable[[Operation], Awaitable[Any]]) -> T:
    """:func:`drive` with an ``async`` ``perform``."""
    steps = Steps(exchange)
    while (operation := steps.next_operation()) is not None:
        try:
            steps.succeeded(await perform(operation))
        except Exception as failure:  # the exchange decides what the failure means
            steps.failed(failure)
    return steps.value


# -- errors -----------------------------------------------------------------------------------------
def _layout_refused(error: OperationFailure, where: str) -> MongoCdcError:
    if error.code == AUTHENTICATION_FAILED:
        return AuthenticationError(
            f"MongoDB at {where} refused the credentials",
            cause=error_text(error),
            fix="check the user name and password of the MongoDB connection",
        )
    return TopologyError(
        f"MongoDB at {where} refused to describe the deployment",
        cause=f"error {error.code}: {error_text(error)}",
        fix="grant the connector's user the clusterMonitor role (listShards, reading local.oplog.rs)",
    )


def _stream_refused(error: OperationFailure, where: str) -> MongoCdcError:
    return ConnectionFailedError(
        f"MongoDB at {where} refused to open the connector's change stream at the stored position",
        cause=f"error {error.code}: {error_text(error)}",
        fix="grant the connector's user the changeStream and find privileges on the captured "
        "databases (read role), and check the capture.scope/capture.target properties",
    )


def _unreachable(error: PyMongoError, where: str) -> ConnectionFailedError:
    return ConnectionFailedError(
        f"Lost the connection to MongoDB at {where} while checking the stored resume point",
        cause=error_text(error),
        fix="this is not a gap: check that the servers are reachable; the check runs again",
    )


# -- the exchanges ----------------------------------------------------------------------------------
def read_layout(client: Any, where: str) -> Exchange[Layout]:
    try:
        hello = yield Command(client, "admin", "hello")
        shards: list[Mapping[str, Any]] = []
        if hello.get("msg") == "isdbgrid":
            shards = (yield Command(client, "admin", "listShards"))["shards"]
        elif hello.get("setName") and hello.get("configsvr"):
            shards = yield FindAll(client, "config", "shards")
    except OperationFailure as error:
        raise _layout_refused(error, where) from None
    return layout_from_hello(hello, shards, where)


def read_oplog_span(client: Any, replica_set: str) -> Exchange[OplogSpan]:
    """The oplog span of the replica set ``client`` is connected to. A refused read (no privilege
    on ``local``) gives a span with ``error``; connection errors raise."""
    try:
        first = yield FindOne(client, "local", "oplog.rs", {}, _FIRST_PROJECTION, [("$natural", 1)])
        last = yield FindOne(client, "local", "oplog.rs", {}, _OPLOG_PROJECTION, [("$natural", -1)])
    except OperationFailure as error:
        return OplogSpan(replica_set, error=f"local.oplog.rs is not readable: {error_text(error)}")
    try:
        stats = yield Command(client, "local", "collStats", "oplog.rs")
    except OperationFailure:
        stats = None
    return span_from_documents(replica_set, first, last, stats)


def check_stream(
    client: Any, config: ConnectorConfig, probe: Probe, where: str
) -> Exchange[tuple[str, str | None]]:
    """The stream check: RESUMABLE, or HISTORY_LOST with MongoDB's error. An unusable stored position
    (260, 280) and any other refusal raise: they are not gaps."""
    try:
        yield ReadStream(client, config, probe.position)
    except OperationFailure as error:
        if is_history_lost(error):
            return HISTORY_LOST, f"error {error.code}: {error_text(error)}"
        if is_unusable_position(error):
            raise unusable_position_error(config, probe.partition, probe.position, error) from None
        raise _stream_refused(error, where) from None
    return RESUMABLE, None


def shard_details(
    details: MongoConnectionDetails, shard: ShardAddress, timeout_ms: int
) -> MongoConnectionDetails:
    """How to reach one shard directly: the connection's credentials, bounded server selection."""
    direct = details.for_replica_set(shard.replica_set, shard.hosts)
    return replace(
        direct,
        server_selection_timeout_ms=timeout_ms,
        connect_timeout_ms=min(direct.connect_timeout_ms, timeout_ms),
    )


class _Check:
    """The state of one check: the layout, the clients opened so far, the notes for the report."""

    def __init__(self, details: MongoConnectionDetails, shard_timeout_ms: int):
        self.details = details
        self.shard_timeout_ms = shard_timeout_ms
        self.where = details.describe()
        self.notes: list[str] = []
        self.shards: dict[str, Any] = {}
        self.layout: Layout | None = None

    def shard(self, name: str, *, required: bool) -> Exchange[Any]:
        """The client of shard ``name`` (None: an optional shard that could not be contacted)."""
        if name not in self.shards:
            details = shard_details(self.details, self.layout.shard(name), self.shard_timeout_ms)
            try:
                self.shards[name] = yield Connect(details, retry=required)
            except ConnectionFailedError:
                if required:
                    raise
                return None
        return self.shards[name]

    def spans(self, probes: list[Probe], main: Any) -> Exchange[dict[str | None, OplogSpan]]:
        needed = list(
            dict.fromkeys(name for probe in probes if probe.state is not None for name in probe.oplogs)
        )
        spans: dict[str | None, OplogSpan] = {}
        for name in needed:
            if name is None:
                spans[None] = yield from read_oplog_span(main, self.layout.replica_set)
                continue
            client = yield from self.shard(name, required=False)
            if client is None:
                self.notes.append(
                    f"shard {name} is not reachable from here: for it only the stream check applies"
                )
                spans[name] = OplogSpan(name, error=SHARD_UNREACHABLE)
                continue
            try:
                spans[name] = yield from read_oplog_span(client, name)
            except ConnectionFailure as error:
                self.notes.append(f"shard {name}: {error_text(error)}; for it only the stream check applies")
                spans[name] = OplogSpan(name, error=SHARD_UNREACHABLE)
        for span in spans.values():
            if span.error and span.error != SHARD_UNREACHABLE:
                self.notes.append(f"{span.replica_set}: {span.error}; only the stream check applies")
        return spans


def check_gaps(
    config: ConnectorConfig,
    details: MongoConnectionDetails,
    states: Mapping[OffsetPartition, OffsetState],
    *,
    connector: str | None = None,
    offsets_topic: str | None = None,
    shard_timeout_ms: int = SHARD_PROBE_TIMEOUT_MS,
) -> Exchange[GapReport]:
    """Check every partition of the connector in ``states`` (all of an offsets topic is fine)."""
    check = _Check(details, shard_timeout_ms)
    where = check.where
    main = yield Connect(details)
    try:
        check.layout = layout = yield from read_layout(main, where)
        probes = plan_probes(layout, config, states, connector)
        spans = yield from check.spans(probes, main)
        checks = []
        for probe in probes:
            stream = stream_error = None
            if probe.checks_stream:
                if probe.stream_via == "":
                    raise TopologyError(
                        f"The offsets name replica set {probe.partition.rs!r}, which is not a "
                        f"shard of the cluster behind {where}",
                        fix="reset that partition's offset if the shard was removed",
                    )
                client = (
                    main
                    if probe.stream_via is None
                    else (yield from check.shard(probe.stream_via, required=True))
                )
                stream, stream_error = yield from check_stream(client, config, probe, where)
            checks.append(
                assess(probe, [spans[name] for name in probe.oplogs if name in spans], stream, stream_error)
            )
    except ConnectionFailure as error:
        raise _unreachable(error, where) from None
    return GapReport(
        connector or config.topic_prefix,
        tuple(checks),
        offsets_topic=offsets_topic or config.offsets_topic,
        notes=tuple(check.notes),
    )
