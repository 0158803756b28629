"""The change watcher's I/O (:class:`WatchSession`), run by
:meth:`~airflow_provider_mongocdc.triggers.change_watcher.MongoChangeWatcher.run` in Airflow's
triggerer: the connector configuration and connections, the offsets topic (read in a thread:
confluent-kafka is synchronous), one change stream per partition on pymongo's asyncio API, the oplog
check, and the status the watcher writes for the MongoDB CDC page. The decisions are
:class:`~airflow_provider_mongocdc.core.watch.watcher.ChangeWatch`'s.

The trigger's module imports this one when the trigger runs, not when a DAG file that builds the
trigger is parsed: a parse imports neither pymongo nor confluent_kafka.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowNotFoundException
from bson.raw_bson import RawBSONDocument
from confluent_kafka import Producer
from pymongo import AsyncMongoClient
from pymongo.errors import OperationFailure, PyMongoError

from airflow_provider_mongocdc.connector_values import connection_id, connector_config_json
from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.base.errors import MongoCdcError, OffsetError
from airflow_provider_mongocdc.core.base.redaction import error_text
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.checker import AsyncGapChecker
from airflow_provider_mongocdc.core.kafka.committed_records import CommittedFollower
from airflow_provider_mongocdc.core.mongo.stream_errors import is_history_lost, is_unusable_position
from airflow_provider_mongocdc.core.offsets.keys import watch_key
from airflow_provider_mongocdc.core.offsets.lease import ConnectorLease
from airflow_provider_mongocdc.core.offsets.model import Position, compact
from airflow_provider_mongocdc.core.offsets.open_window import killed_window_of, open_window_of
from airflow_provider_mongocdc.core.offsets.store import OffsetStore, OffsetTopicContents
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalStanding, incremental_standing
from airflow_provider_mongocdc.core.watch.settings import POLLS_PER_CHECK
from airflow_provider_mongocdc.core.watch.stream import (
    aggregate_target,
    capture_check,
    change_position,
    change_time,
    watch_aggregate,
)
from airflow_provider_mongocdc.core.watch.watcher import ChangeWatch
from airflow_provider_mongocdc.core.window.streams import (
    StreamTarget,
    offset_partition,
    plan_streams,
    starting_position,
)
from airflow_provider_mongocdc.hooks.kafka import kafka_config_from_connection
from airflow_provider_mongocdc.hooks.topology import details_from_connection
from airflow_provider_mongocdc.operators.base import parse_connector_config

# The watcher's status is written again after this long even when nothing changed (the page tells
# a watcher that stopped reporting), and waits at most this long to be delivered.
STATUS_EVERY_S = 600.0
STATUS_WRITE_TIMEOUT_S = 10.0
# After a failure the next attempt waits the poll interval, doubled each time up to this.
MAX_RETRY_DELAY_S = 60.0


def fingerprint_of(text: str, *connections: Any) -> tuple:
    """What the watch was set up from: the configuration and each connection's fields (kept in
    memory only, compared, never shown)."""
    fields = ("conn_type", "host", "schema", "login", "password", "port", "extra")
    return (text, *(tuple(getattr(connection, name, None) for name in fields) for connection in connections))


def describe_standing(standing: IncrementalStanding) -> str:
    """An open incremental snapshot in a few words, for the watcher's event and log."""
    if standing.progress is not None:
        progress = standing.progress
        return f"{progress.request_id}, {progress.documents} documents in {progress.chunks} chunks so far"
    return f"{standing.request_id}, requested"


class WatchSession:
    """The watcher's I/O: connections, the offsets topic, one stream per partition, the oplog check.

    ``trigger`` is the :class:`~airflow_provider_mongocdc.triggers.change_watcher.MongoChangeWatcher`
    it runs for (its arguments, settings and log); this module does not import the trigger's, which
    imports this one when it runs."""

    def __init__(self, trigger: Any):
        self.trigger = trigger
        self.log = trigger.log
        self.settings = trigger.settings
        self.watch = ChangeWatch(trigger.connector, self.settings, trigger.watchdog_dag_id)
        self.config: ConnectorConfig | None = None
        self.config_text: str | None = None
        self.fingerprint: tuple | None = None  # of the configuration and connections set up with
        self.kafka: dict[str, Any] = {}
        self.producer = None  # writes the watcher's status (see publish)
        self.published: dict | None = None
        self.published_at: float | None = None
        self.details = None
        self.store: OffsetStore | None = None
        self.follower: CommittedFollower | None = None  # reads the offsets topic on from its last read
        self.targets: dict[str, StreamTarget] = {}
        self.clients: dict[str, Any] = {}
        self.cursors: dict[str, Any] = {}
        self.capture = None
        self.polls = 0
        self.failures = 0
        self.states = None
        self.checked_at: float | None = None
        self._said: dict[str, str] = {}

    # -- logging -----------------------------------------------------------------------------------
    def say(self, key: str, level: str, message: str) -> None:
        """Log ``message`` unless it is what was said last under ``key``."""
        if self._said.get(key) != message:
            self._said[key] = message
            getattr(self.log, level)("Change watcher of connector %s: %s", self.trigger.connector, message)

    def clear(self, key: str) -> None:
        self._said.pop(key, None)

    # -- one poll ----------------------------------------------------------------------------------
    async def step(self) -> dict | None:
        poll = self.settings.poll_interval_s
        try:
            if self.config is None:
                await self.setup()
            check_due = (
                self.checked_at is None or time.time() - self.checked_at >= self.settings.check_interval_s
            )
            if check_due and self.checked_at is not None:
                await self.refresh_config()  # a Variable set again since the last check
            if check_due or self.watch.offsets_due(time.time()):
                # While an event waits for its window: notice its commit at once; while a window is
                # open: notice when it can have closed.
                await self.read_offsets()
            if check_due or (self.watch.recheck and self.settings.min_headroom_s):
                await self.check()  # a moved position's headroom, at once
            await self.open_streams()
            await self.read_streams(poll)
            reasons = self.watch.due(time.time())
            if reasons:
                # Right before an event: a window may have carried the changes meanwhile, and a
                # stored position no longer in the oplog gets no window (its run would fail).
                await self.read_offsets()
                await self.check()
                reasons = self.watch.due(time.time())
            payload = None
            if reasons:
                payload = self.watch.fire(reasons, time.time())
                self.log.info(
                    "Change watcher of connector %s: window requested: %s",
                    self.trigger.connector,
                    payload["message"],
                )
            self.polls += 1
            await self.publish(payload is not None)
            if self.polls % POLLS_PER_CHECK == 0:
                self.log.info(
                    "Change watcher of connector %s: %s",
                    self.trigger.connector,
                    self.watch.status(time.time(), self.polls),
                )
            if self.failures:
                self.say("failure", "info", "watching again")
            self.failures = 0
            return payload
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - the watcher outlives every failure; it is a hint
            await self.failed(error)
            return None

    async def failed(self, error: BaseException) -> None:
        """Log the failure once, drop the connections, and wait before the next attempt."""
        if isinstance(error, AirflowNotFoundException):
            text = f"{error}. Fix: create the connection, or correct the connector's conn_ids"
        elif isinstance(error, MongoCdcError):
            text = str(error)
        elif isinstance(error, PyMongoError):
            where = self.details.describe() if self.details is not None else "the connection's hosts"
            text = (
                f"MongoDB at {where} could not be read. Cause: {type(error).__name__}: {error_text(error)}. "
                "Fix: check that the servers are up and reachable from the triggerer, and the MongoDB "
                "connection's hosts and credentials"
            )
        else:
            text = f"{type(error).__name__}: {error_text(error)}"
            if self._said.get("failure") != text:
                self.log.exception("Change watcher of connector %s failed", self.trigger.connector)
        delay = min(MAX_RETRY_DELAY_S, self.settings.poll_interval_s * 2**self.failures)
        self.failures += 1
        self.say(
            "failure",
            "warning",
            f"cannot watch: {text}. No event is sent meanwhile (windows on a clock schedule still "
            f"run); trying again within {MAX_RETRY_DELAY_S:g} s",
        )
        await self.close()
        self.config = None
        await asyncio.sleep(delay)

    # -- setup -------------------------------------------------------------------------------------
    async def resolve_config(self) -> str:
        trigger = self.trigger
        return await asyncio.to_thread(
            connector_config_json, trigger.connector, trigger.connector_config, trigger.config_variable
        )

    async def sources(self) -> tuple[str, Any, Any]:
        """The connector configuration (JSON) and its MongoDB and Kafka connections, as they are now."""
        trigger = self.trigger
        text = await self.resolve_config()
        mongo_id = await asyncio.to_thread(connection_id, trigger.connector, "mongo", trigger.mongo_conn_id)
        kafka_id = await asyncio.to_thread(connection_id, trigger.connector, "kafka", trigger.kafka_conn_id)
        return text, await BaseHook.aget_connection(mongo_id), await BaseHook.aget_connection(kafka_id)

    async def setup(self) -> None:
        """Resolve the configuration and the connections, list the streams, open the clients. A
        changed configuration, connection or list of streams starts the watch over."""
        text, mongo, kafka_connection = await self.sources()
        config = parse_connector_config(text)
        details = details_from_connection(
            mongo,
            connect_timeout_ms=config.mongodb_connect_timeout_ms,
            server_selection_timeout_ms=config.mongodb_server_selection_timeout_ms,
        ).with_config(config)
        kafka = kafka_config_from_connection(kafka_connection)
        # Streams as a window plans them; one attempt (the watcher's next poll is the retry).
        policy = BackoffPolicy.from_config(config)
        once = BackoffPolicy(policy.initial_delay_ms, policy.max_delay_ms, 0)
        targets = await asyncio.to_thread(plan_streams, details, config, policy=once)
        fingerprint = fingerprint_of(text, mongo, kafka_connection)
        changed = []
        if self.config_text is not None and text != self.config_text:
            changed.append("the connector configuration changed")
        if self.fingerprint is not None and fingerprint[1:] != self.fingerprint[1:]:
            changed.append("a connection changed")
        names = sorted(target.partition for target in targets)
        if self.targets and names != sorted(self.targets):
            changed.append(f"the streams are now {', '.join(names)} (were {', '.join(sorted(self.targets))})")
        if changed:
            self.watch = ChangeWatch(self.trigger.connector, self.settings, self.trigger.watchdog_dag_id)
            self.say("config", "info", "; ".join(changed) + ": watching from the committed positions again")
        self.config, self.config_text, self.details, self.fingerprint = config, text, details, fingerprint
        self.kafka, self.producer = kafka, None
        self.store = OffsetStore(kafka, config.offsets_topic)
        self.follower = self.store.follower()
        self.capture = capture_check(config)
        self.targets = {target.partition: target for target in targets}
        self.checked_at = None

    async def refresh_config(self) -> None:
        """A changed configuration (its Variable was set again) or connection (repointed to another
        deployment, new credentials) sets the watch up again, its streams planned anew."""
        text, mongo, kafka_connection = await self.sources()
        if fingerprint_of(text, mongo, kafka_connection) != self.fingerprint:
            await self.close()
            self.config = None
            await self.setup()

    # -- offsets and the oplog check ---------------------------------------------------------------
    async def read_offsets(self) -> None:
        """The committed starting position of every stream, as a window would find it."""
        config, store = self.config, self.store
        contents, lease = await asyncio.to_thread(self._read_topic)  # confluent-kafka is synchronous
        states = contents.states
        if contents.open_transactions:
            self.say(
                "open",
                "warning",
                "; ".join(open_one.describe() for open_one in contents.open_transactions)
                + ": the committed positions after it are not seen until it ends (changes are counted "
                "from the older ones)",
            )
        else:
            self.clear("open")
        starts: dict[str, Position | str | None] = {}
        for name in self.targets:
            partition = offset_partition(config, name)
            try:
                starts[name] = starting_position(states.get(partition), config, partition, store.topic)
            except OffsetError as error:  # no offset yet, or a snapshot in progress
                starts[name] = error.problem
        self.states = states
        now = time.time()
        notes = self.watch.committed(starts, now)
        partitions = [offset_partition(config, name) for name in self.targets]
        standing = incremental_standing(
            contents.requests.get((partitions[0].connector, partitions[0].server_id)) if partitions else None,
            [states[partition].incremental for partition in partitions if partition in states],
        )
        if standing is not None and standing.open:
            notes += self.watch.incremental(standing.marker(), describe_standing(standing), now)
        else:
            notes += self.watch.incremental(None, "", now)
        mine = [(partition, states[partition]) for partition in partitions if partition in states]
        moment = datetime.now(timezone.utc)
        # An open window, or one killed while open whose retry is due (its task holds the lease).
        window = open_window_of(mine, lease, moment) or killed_window_of(mine, lease, moment)
        notes += self.watch.window_open(window)
        for note in notes:
            self.log.info("Change watcher of connector %s: %s", self.trigger.connector, note)

    def _read_topic(self) -> tuple[OffsetTopicContents, Any]:
        """Everything committed in the offsets topic and the connector's lease, from one read."""
        store = self.store
        read = self.follower.read()
        contents = store.read_everything(read.records)
        contents.open_transactions = read.open_transactions
        lease = ConnectorLease(self.kafka, self.config.topic_prefix, store.topic).current(read.records)
        return contents, lease

    async def check(self) -> None:
        """Whether the stored positions are still in the oplog, and their headroom. Not while a
        window is open: it moves the positions on with every commit and reads from them itself;
        the positions it leaves are checked once it closed (``recheck`` stays set)."""
        self.checked_at = time.time()
        if self.watch.open_window is not None:
            return
        self.watch.recheck = False
        if not self.watch.watched():
            return
        try:
            report = await AsyncGapChecker(self.config, self.details).check(
                self.states, offsets_topic=self.store.topic
            )
        except (MongoCdcError, PyMongoError) as error:
            self.say(
                "check", "warning", f"the oplog check failed ({error}); headroom unknown until the next check"
            )
            return
        self.clear("check")
        for note in self.watch.checked(report):
            self.log.warning("Change watcher of connector %s: %s", self.trigger.connector, note)

    # -- what it counts, for the page --------------------------------------------------------------
    async def publish(self, fired: bool) -> None:
        """Write what the watcher counts to the offsets topic (key
        :func:`~airflow_provider_mongocdc.core.offsets.keys.watch_key`, outside any transaction) for
        the MongoDB CDC page: when the counts change, at most once per check interval (at once
        after an event), and every :data:`STATUS_EVERY_S` while nothing changes. A failed write is
        said once and tried again later: the status is a hint."""
        if not any(p.committed is not None for p in self.watch.partitions.values()):
            return  # no offset yet: the offsets topic may not exist, and the watcher never creates it
        now = time.time()
        report = self.watch.report(now)
        shown = {key: value for key, value in report.items() if key != "at"}
        since = now - self.published_at if self.published_at is not None else None
        changed = shown != self.published
        due = (
            since is None
            or fired
            or (changed and since >= self.settings.check_interval_s)
            or since >= STATUS_EVERY_S
        )
        if not due:
            return
        prefix = self.config.topic_prefix
        record = (watch_key(prefix, prefix), compact(report))
        try:
            await asyncio.to_thread(self._produce, record)
        except Exception as error:  # noqa: BLE001 - the page then shows an older status
            self.say("status", "warning", f"its status could not be written to the offsets topic ({error})")
            return
        self.clear("status")
        self.published, self.published_at = shown, now

    def _produce(self, record: tuple[bytes, bytes]) -> None:
        if self.producer is None:
            self.producer = Producer(
                {
                    **self.kafka,
                    "enable.idempotence": True,
                    "acks": "all",
                    "allow.auto.create.topics": False,  # the offsets topic is the connector's to create
                    "message.timeout.ms": int(STATUS_WRITE_TIMEOUT_S * 1000),
                }
            )
        key, value = record
        self.producer.produce(self.store.topic, key=key, value=value)
        left = self.producer.flush(STATUS_WRITE_TIMEOUT_S)
        if left:
            raise TimeoutError(f"not delivered within {STATUS_WRITE_TIMEOUT_S:g} s")

    # -- the streams -------------------------------------------------------------------------------
    async def open_streams(self) -> None:
        streaming = self.watch.streaming()
        for name in list(self.cursors):
            if name not in streaming:  # no longer watched, or a window is open (it reads them)
                await self._close_cursor(name)
        if self.watch.open_window is not None:
            # The open window reads the changes: no connection is kept meanwhile (an idle client's
            # monitors and periodic tasks wake the event loop several times a second).
            await self._close_clients()
            return
        for name, position in self.watch.to_open().items():
            await self._close_cursor(name)
            pipeline, options = watch_aggregate(self.config, position)
            target = aggregate_target(self._client(name), self.config)
            try:
                self.cursors[name] = await target.aggregate(
                    pipeline, maxAwaitTimeMS=int(self.settings.poll_interval_s * 1000), **options
                )
            except OperationFailure as error:
                if not self._refused(name, error):
                    raise
                continue
            self.watch.opened(name)

    def _refused(self, name: str, error: OperationFailure) -> bool:
        """A stream MongoDB cannot continue (purged history, refused token): blocked until its offset
        changes. Other errors are not handled here."""
        if is_history_lost(error):
            cause = f"the stored position is no longer in the oplog (error {error.code}: {error_text(error)})"
        elif is_unusable_position(error):
            cause = (
                f"MongoDB refuses the stored position (error {error.code}: {error_text(error)}); inspect it with "
                "mongocdc offsets show"
            )
        else:
            return False
        for note in self.watch.blocked(name, cause):
            self.log.warning("Change watcher of connector %s: %s", self.trigger.connector, note)
        return True

    async def read_streams(self, poll: float) -> None:
        if not self.cursors:
            await asyncio.sleep(poll)
            return
        deadline = time.monotonic() + poll
        # The names are taken before gather(): a cursor that closes itself leaves self.cursors
        # meanwhile, and each result must stay with its own stream.
        names = list(self.cursors)
        results = await asyncio.gather(
            *(self._drain(name, self.cursors[name], deadline) for name in names),
            return_exceptions=True,
        )
        for name, result in zip(names, results):
            if isinstance(result, OperationFailure) and self._refused(name, result):
                await self._close_cursor(name)
            elif isinstance(result, BaseException):
                raise result

    async def _drain(self, name: str, cursor, deadline: float) -> None:
        """Count what the stream returns until a read comes back empty (the server waited a poll
        interval) or the poll's time is up."""
        count, first, last, read = 0, None, None, None
        capture = self.capture
        try:
            while True:
                change = await cursor.try_next()
                if change is None:
                    break
                read = change
                if capture is None or capture(change):
                    count += 1
                    if first is None:
                        first = change
                    last = change
                if time.monotonic() >= deadline:
                    break
        finally:
            if read is not None:
                self.watch.counted(
                    name,
                    count,
                    change_time(first) if first is not None else None,
                    change_time(last) if last is not None else None,
                    change_position(read),
                )
        if not cursor.alive:  # closed by the server (an invalidate): read on from the last change
            await self._close_cursor(name)
            self.watch.reopen(name)

    async def _close_cursor(self, name: str) -> None:
        cursor = self.cursors.pop(name, None)
        if cursor is not None:
            try:
                await cursor.close()
            except PyMongoError:
                pass

    def _client(self, name: str):
        """The stream's MongoDB client, created when first needed."""
        client = self.clients.get(name)
        if client is None:
            host, kwargs = self.targets[name].details().client_arguments()
            client = self.clients[name] = AsyncMongoClient(host, document_class=RawBSONDocument, **kwargs)
        return client

    async def _close_clients(self) -> None:
        clients, self.clients = self.clients, {}
        for client in clients.values():
            await client.close()

    async def close(self) -> None:
        for name in list(self.cursors):
            await self._close_cursor(name)
            self.watch.reopen(name)
        await self._close_clients()
        follower, self.follower = self.follower, None
        if follower is not None:
            await asyncio.to_thread(follower.close)
