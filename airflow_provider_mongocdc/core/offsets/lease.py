"""The connector lease: a snapshot, a window and an offsets change of one connector never run at
the same time.

The lease is a record in the connector's offsets topic (key :func:`~airflow_provider_mongocdc.core.offsets.keys.lease_key`) naming
its holder (``owner``, e.g. the Airflow task instance), what it runs (``kind``: ``snapshot``,
``window`` or ``offsets``) and when it expires; a lease past its expiry is free. Taking and
releasing it go through one transactional producer per connector (``mongocdc-<topic.prefix>-lease``),
which makes the read-then-write atomic. The same ``owner`` may take its lease again (an Airflow
retry); any other owner gets :class:`~airflow_provider_mongocdc.core.base.errors.LeaseHeldError` naming the holder and the expiry.
``hold(..., renew=True)`` renews it in the background (:class:`LeaseKeeper`) and ends the block
with :class:`LeaseLostError` once it is lost. Reasons: docs/design.md, "Connector leases".
"""

from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_mongocdc.core.base.errors import DeliveryError, LeaseHeldError, OffsetError
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.config.connector import describe_connector
from airflow_provider_mongocdc.core.events.schema import Record

# The Kafka side (confluent_kafka, the offsets store and its bson) is imported when a ConnectorLease
# is built: the operators name their lease kind at import, which the DAG files do at every parse.
if TYPE_CHECKING:
    from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter

log = logging.getLogger(__name__)

SNAPSHOT, WINDOW, OFFSETS = "snapshot", "window", "offsets"
KINDS = (SNAPSHOT, WINDOW, OFFSETS)
DEFAULT_TTL = timedelta(hours=2)
OFFSETS_TTL = timedelta(minutes=5)  # an offsets change takes seconds
# What each kind of holder is called in messages.
NOUNS = {SNAPSHOT: "snapshot", WINDOW: "window", OFFSETS: "offsets change"}
# Attempts when a concurrent contender fences this one (it then re-reads and usually finds the
# other's lease).
FENCED_ATTEMPTS = 5


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def as_ttl(ttl: timedelta | float | int | str) -> timedelta:
    """A lease ttl given as a timedelta or seconds, checked to be positive."""
    value = ttl if isinstance(ttl, timedelta) else timedelta(seconds=float(ttl))
    if value <= timedelta(0):
        raise ValueError("the lease ttl must be positive")
    return value


def _noun(kind: str) -> str:
    return NOUNS.get(kind, kind)


def owner_for_task(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The lease owner of an Airflow task instance (the same for all its tries)."""
    owner = f"{dag_id}/{run_id}/{task_id}"
    return owner if map_index is None or map_index < 0 else f"{owner}[{map_index}]"


def task_owner(context: Mapping[str, Any]) -> str:
    """The lease owner of the task instance of an Airflow task context (``context["ti"]``)."""
    ti = context["ti"]
    return owner_for_task(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1))


def offsets_owner(action: str, tool: str = "mongocdc offsets") -> str:
    """The lease owner of an offsets change: the command, the user and the process."""
    import getpass
    import os

    try:
        user = getpass.getuser()
    except Exception:  # no user name in this environment (e.g. a container without passwd entry)
        user = f"uid {os.getuid()}" if hasattr(os, "getuid") else "unknown user"
    return f"{tool} {action} by {user} (pid {os.getpid()})"


@dataclass(frozen=True)
class Lease:
    """Who holds a connector's lease, for what, until when."""

    owner: str
    kind: str
    acquired_at: datetime
    expires_at: datetime
    host: str | None = None
    connector: str | None = None  # the holder's connector name (ConnectorConfig.name)

    def live(self, now: datetime | None = None) -> bool:
        return (now or _utcnow()) < self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "kind": self.kind,
            "acquired_at": iso_z(self.acquired_at),
            "expires_at": iso_z(self.expires_at),
            "host": self.host,
            **({"connector": self.connector} if self.connector is not None else {}),
            "format": 1,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(
            str(data["owner"]),
            str(data["kind"]),
            parse_iso(data["acquired_at"]),
            parse_iso(data["expires_at"]),
            data.get("host"),
            data.get("connector") if isinstance(data.get("connector"), str) else None,
        )

    def describe(self) -> str:
        return (
            f"{_noun(self.kind)} {self.owner!r}"
            + (f" on {self.host}" if self.host else "")
            + f", acquired {iso_z(self.acquired_at)}, expires {iso_z(self.expires_at)}"
        )

    def same_as(self, other: Lease | None) -> bool:
        """Whether ``other`` is this lease (possibly renewed): same owner, same acquisition."""
        return other is not None and other.owner == self.owner and other.acquired_at == self.acquired_at


def held_error(topic_prefix: str, lease: Lease, kind: str, owner: str) -> LeaseHeldError:
    holder = f"{_noun(lease.kind)} {lease.owner!r}"
    expiry = f"if it was killed, its lease expires at {iso_z(lease.expires_at)}"
    if kind == OFFSETS:
        return LeaseHeldError(
            f"The offsets of connector {topic_prefix!r} were not changed: the connector is locked by "
            f"the {holder} until {iso_z(lease.expires_at)}",
            cause=f"a running window or snapshot commits offsets of its own and would overwrite the "
            f"change; the lease is held by {lease.describe()}",
            fix=f"wait until that {_noun(lease.kind)} ends, pause the connector's DAGs so that no other "
            f"starts, then run the command again; {expiry}",
        )
    if lease.kind == OFFSETS:
        fix = f"run again when that offsets change is done (it takes seconds); {expiry}"
    else:
        fix = (
            f"run again after that {_noun(lease.kind)} ends (Airflow: put both tasks in the pool "
            f"mongocdc_{topic_prefix} so that they queue instead); {expiry}"
        )
    return LeaseHeldError(
        f"The {_noun(kind)} {owner!r} cannot start: connector {topic_prefix!r} is locked by the "
        f"{holder} until {iso_z(lease.expires_at)}",
        cause=f"a snapshot, a window and an offsets change of the same connector never run at the "
        f"same time; the lease is held by {lease.describe()}",
        fix=fix,
    )


def lease_value(records: Iterable[tuple[bytes | None, bytes | None]], key: bytes) -> bytes | None:
    """The last committed value of the lease ``key`` in ``records`` (None: none, or released)."""
    value: bytes | None = None
    for record_key, record_value in records:
        if record_key == key:
            value = record_value
    return value


@dataclass(frozen=True)
class LeaseSettling:
    """How a read of the lease settles the transactions open on the offsets topic: the lease tells
    whose writers are alive.

    A lease read must see every lease change committed before it: a read_committed reader stops
    at the first transaction still open (the last stable offset), and a lease taken, renewed or
    released after it would be hidden, so a read that only showed what is committed (``Observe``)
    could hand the lease to a second holder. The read therefore waits for the open transactions or
    ends them, as a run's reader does (:class:`~airflow_provider_mongocdc.core.offsets.writers.TakeOver`);
    which it does follows from the lease committed before the first open transaction (read up to
    the last stable offset when one stays open past ``wait_s``). Every run of the connector takes
    the lease before it writes, and ends the transactions that killed writers left open before its
    own writers start, so that lease is the one of the run that wrote the open transactions:

    * it is live and held by another owner than the reader's, or the reader renews its own lease
      (``renewing``): its holder runs, and the open transactions of the connector's writers (but
      the lease writer's) may be its live windows', chunks', control's or offsets change's
      commits under way. They are waited for, never taken over (``TakeOver(holder_runs=True)``):
      a holder renewing its lease, or a second run refused by the lease, never fences a live
      writer. A waited transaction still open past its ``transaction.timeout.ms`` is taken over
      as any (the broker has fenced its writer).
    * it is free or expired (no holder runs: a lease past its expiry is free), or it is the
      reader's own owner's and the reader takes it anew (a retry of the task instance, which
      supersedes the earlier try) or releases it (its run has ended): the writers are killed or
      superseded ones, taken over at once as before, so their transactions never hold back the
      next holder.

    The lease writer's own transactions are another contender's change of the lease: each lease
    change takes the lease writer over before it reads (``_exclusively``), which ends a killed
    holder's open lease transaction; one opened since is taken over, and its contender retries.
    ``owner``: the reader's lease owner (None: a reader that holds nothing, such as a forced
    release).
    """

    kafka_config: Mapping[str, Any]
    topic_prefix: str
    offsets_topic: str
    key: bytes
    wait_s: float
    read_timeout_s: float = 60.0
    owner: str | None = None
    renewing: bool = False

    def settle(self, open_ones, attempt: int, ended: set[tuple[int, int]]) -> bool:
        from airflow_provider_mongocdc.core.offsets.writers import TakeOver

        holder_runs = self.holder_runs(self.seen())
        return TakeOver(
            self.kafka_config, self.topic_prefix, self.offsets_topic, self.wait_s, holder_runs=holder_runs
        ).settle(open_ones, attempt, ended)

    def holder_runs(self, seen: Lease | None) -> bool:
        """Whether the lease ``seen`` (committed before the open transactions) has a holder that
        runs, whose writers' transactions are waited for."""
        if seen is None or not seen.live():
            return False
        return self.renewing or seen.owner != self.owner

    def seen(self) -> Lease | None:
        """The lease committed before the first transaction open now (None: free, or unreadable,
        which the lease change itself reports)."""
        from airflow_provider_mongocdc.core.kafka.committed_records import read_settled

        records = read_settled(self.kafka_config, self.offsets_topic, self.read_timeout_s, None).records
        value = lease_value(records, self.key)
        try:
            return Lease.from_json(json.loads(value)) if value is not None else None
        except (ValueError, KeyError, TypeError):
            return None


class LeaseLostError(LeaseHeldError):
    """A running holder lost the connector's lease (it expired and was taken, or was released)."""


def lost_error(
    topic_prefix: str, lease: Lease, current: Lease | None, failure: BaseException | None = None
) -> LeaseLostError:
    """The error of ``lease``'s holder finding the stored lease to be ``current`` (or unrenewable)."""
    if failure is not None:
        cause = (
            f"it could not be renewed before it expired at {iso_z(lease.expires_at)} (last error: "
            f"{failure}), so another task may take it"
        )
    elif current is None:
        cause = "it was released by someone else (a forced release) while the run went on"
    elif current.owner == lease.owner:
        cause = f"a later try of the same task took it over ({current.describe()})"
    else:
        cause = f"it expired or was released, and it is now held by {current.describe()}"
    return LeaseLostError(
        f"The {_noun(lease.kind)} {lease.owner!r} lost the lease of connector {topic_prefix!r} while "
        "it ran and was stopped",
        cause=cause,
        fix="run it again once the other holder ended: committed work is kept (a window continues "
        "from its last committed offset, a snapshot skips its committed chunks); if renewals "
        "failed, check that Kafka is reachable, and give the task a longer lease_ttl",
    )


class ConnectorLease:
    """The lease of connector ``topic_prefix``, stored in ``offsets_topic``.

    :param kafka_config: the Kafka connection's librdkafka configuration.
    :param topic_prefix: the connector's ``topic.prefix``.
    :param offsets_topic: the connector's offsets topic (default ``<topic.prefix>.offsets``).
    :param connector: the Kafka Connect connector name of the offset keys (default: topic prefix).
    :param connector_name: the name of the connector that takes the lease (``ConnectorConfig.name``,
        the entry's name in the connector list): taking it is refused while a lease or an offset
        of the topic prefix was last written under another name (one topic prefix belongs to one
        connector). None: not checked.
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic_prefix: str,
        offsets_topic: str | None = None,
        *,
        connector: str | None = None,
        connector_name: str | None = None,
        read_timeout_s: float = 60.0,
    ):
        from airflow_provider_mongocdc.core.offsets.keys import lease_key
        from airflow_provider_mongocdc.core.offsets.store import OffsetStore
        from airflow_provider_mongocdc.core.offsets.writers import SETTLE_S, lease_transactional_id

        self.kafka_config = dict(kafka_config)
        self.topic_prefix = topic_prefix
        self.connector_name = connector_name
        topic = offsets_topic or f"{topic_prefix}.offsets"
        self.key = lease_key(topic_prefix, connector)
        # Taking the lease reads it as it stands: another holder's commit is never hidden by a
        # transaction a killed writer of the connector left open, and a live holder's writers are
        # never fenced by a lease read (LeaseSettling).
        self.store = OffsetStore(
            self.kafka_config,
            topic,
            read_timeout_s=read_timeout_s,
            settling=LeaseSettling(
                self.kafka_config, topic_prefix, topic, self.key, SETTLE_S, read_timeout_s
            ),
        )
        self.transactional_id = lease_transactional_id(topic_prefix)

    @classmethod
    def for_config(cls, kafka_config: Mapping[str, Any], config, **kwargs: Any) -> ConnectorLease:
        """The lease of a :class:`~airflow_provider_mongocdc.core.config.connector.ConnectorConfig`'s
        connector, taken under its ``name``."""
        return cls(
            kafka_config, config.topic_prefix, config.offsets_topic, connector_name=config.name, **kwargs
        )

    def described(self) -> str:
        """``Connector default (topic prefix shop)``: how the lease's log lines name its connector."""
        words = describe_connector(self.connector_name, self.topic_prefix)
        return words[:1].upper() + words[1:]

    def __repr__(self) -> str:
        return f"ConnectorLease({self.topic_prefix!r}, topic={self.store.topic!r})"

    # -- reading --
    def current(
        self,
        records: Iterable[tuple[bytes | None, bytes | None]] | None = None,
        *,
        owner: str | None = None,
        renewing: bool = False,
    ) -> Lease | None:
        """The stored lease (live or expired), or None when free; from ``records`` when given (the
        offsets topic's committed records, read before). ``owner`` and ``renewing``: who reads,
        which tells whose open transactions the read waits for (:class:`LeaseSettling`)."""
        if records is None:
            records = self._reading(owner, renewing).read_committed_records()
        value = lease_value(records, self.key)
        if value is None:
            return None
        try:
            return Lease.from_json(json.loads(value))
        except (ValueError, KeyError, TypeError) as error:
            raise OffsetError(
                f"The lease of connector {self.topic_prefix!r} in {self.store.topic!r} is unreadable",
                cause=str(error),
                fix="release it (ConnectorLease(...).release(force=True)) and run again",
            ) from None

    def _reading(self, owner: str | None, renewing: bool = False):
        """The store a read by ``owner`` (None: no holder; ``renewing``: the holder renewing its
        lease) reads with: :attr:`store`, its :class:`LeaseSettling` told who reads (a store set
        by the caller with another settling is used as it is)."""
        import copy

        settling = self.store.settling
        if not isinstance(settling, LeaseSettling):
            return self.store
        store = copy.copy(self.store)
        store.settling = replace(settling, owner=owner, renewing=renewing)
        return store

    def check(
        self, owner: str | None = None, kind: str = WINDOW, *, now: datetime | None = None
    ) -> Lease | None:
        """The live lease, or None. Raises :class:`LeaseHeldError` when another owner than
        ``owner`` holds a live lease (``kind`` names what the caller wants to run)."""
        lease = self.current(owner=owner)
        if lease is None or not lease.live(now):
            return None
        if owner is not None and lease.owner != owner:
            raise held_error(self.topic_prefix, lease, kind, owner)
        return lease

    # -- writing --
    def acquire(self, owner: str, kind: str, ttl: timedelta | float = DEFAULT_TTL) -> Lease:
        """Take the lease for ``owner`` running ``kind`` for ``ttl`` (a timedelta or seconds).

        Takes it over when ``owner`` holds it already (a new acquisition: a holder that is still
        running with the earlier one finds it lost when it renews); raises
        :class:`LeaseHeldError` when someone else holds a live one.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        ttl = as_ttl(ttl)

        def write(writer: TransactionalWriter) -> Lease:
            records = self._reading(owner).read_committed_records()
            lease = self.current(records)
            now = _utcnow()
            self._check_owner(lease, records)
            if lease is not None and lease.live(now) and lease.owner != owner:
                raise held_error(self.topic_prefix, lease, kind, owner)
            mine = Lease(owner, kind, now, now + ttl, socket.gethostname(), self.connector_name)
            self._write(writer, mine)
            return mine

        lease = self._exclusively(write)
        log.info("%s: lease taken by %s", self.described(), lease.describe())
        return lease

    def _check_owner(self, lease: Lease | None, records: list[tuple[bytes | None, bytes | None]]) -> None:
        """Refuse a connector named otherwise than the last lease holder or the offsets' writer
        (:func:`~airflow_provider_mongocdc.core.offsets.store.check_owner`)."""
        from airflow_provider_mongocdc.core.offsets.store import check_owner

        if self.connector_name is None:
            return
        if lease is not None and lease.connector not in (None, self.connector_name):
            raise LeaseHeldError(
                f"Connector {self.connector_name!r} cannot take the lease of topic prefix "
                f"{self.topic_prefix!r}: it was last taken by connector {lease.connector!r} "
                f"({lease.describe()})",
                cause=f"connectors {lease.connector!r} and {self.connector_name!r} have the same "
                "topic.prefix; a topic prefix (its offsets and its lease) belongs to one connector",
                fix=f"give connector {self.connector_name!r} a topic.prefix of its own",
            )
        for partition, state in self.store.read_everything(records).states.items():
            if partition.server_id == self.topic_prefix:
                check_owner(partition, state.connector, self.connector_name, self.store.topic)

    def renew(self, lease: Lease, ttl: timedelta | float | None = None) -> Lease:
        """Extend ``lease`` to ``ttl`` from now (default: its own length); returns the renewed lease.

        Raises :class:`LeaseLostError` when the stored lease is no longer ``lease`` (released,
        taken by someone else after it expired, or taken over by a later try of the same owner).
        A lease that expired without anyone taking it is renewed: nobody else ran meanwhile.
        """
        ttl = as_ttl(ttl if ttl is not None else lease.expires_at - lease.acquired_at)

        def write(writer: TransactionalWriter) -> Lease:
            current = self.current(owner=lease.owner, renewing=True)
            if not lease.same_as(current):
                raise lost_error(self.topic_prefix, lease, current)
            renewed = replace(current, expires_at=_utcnow() + ttl)
            self._write(writer, renewed)
            return renewed

        renewed = self._exclusively(write)
        log.debug("%s: lease renewed until %s", self.described(), iso_z(renewed.expires_at))
        return renewed

    def release(self, owner: str | None = None, *, force: bool = False, lease: Lease | None = None) -> bool:
        """Free the lease when ``owner`` holds it (any holder with ``force``; only that very lease,
        not a later acquisition by the same owner, with ``lease``).

        Returns whether a lease was removed. A lease held by someone else is left as it is.
        """
        released, _current = self._release(owner, force=force, lease=lease)
        return released

    def _release(
        self, owner: str | None, *, force: bool = False, lease: Lease | None = None
    ) -> tuple[bool, Lease | None]:
        """``(released, the stored lease found)``."""
        owner = lease.owner if lease is not None else owner

        def write(writer: TransactionalWriter) -> tuple[bool, Lease | None]:
            current = self.current(owner=None if force else owner)
            if current is None:
                return False, None
            mine = lease.same_as(current) if lease is not None else current.owner == owner
            if not force and not mine:
                log.warning(
                    "%s: lease not released, it is held by %s",
                    self.described(),
                    current.describe(),
                )
                return False, current
            writer.begin()
            writer.commit([Record(self.store.topic, self.key, None)])
            return True, current

        released, current = self._exclusively(write)
        if released:
            log.info("%s: lease released by %s", self.described(), owner or "force")
        return released, current

    @contextmanager
    def hold(
        self,
        owner: str,
        kind: str,
        ttl: timedelta | float = DEFAULT_TTL,
        *,
        renew: bool = False,
        on_lost: Callable[[LeaseLostError], None] | None = None,
    ) -> Iterator[Lease]:
        """``with lease.hold(owner, "window"):`` — acquire, run, release (also on errors).

        With ``renew`` a :class:`LeaseKeeper` renews the lease every third of ``ttl`` while the
        block runs and calls ``on_lost`` when the lease is lost; the block then ends with
        :class:`LeaseLostError` (also when the loss is only found on release), whatever the
        block's own outcome.
        """
        ttl = as_ttl(ttl)
        lease = self.acquire(owner, kind, ttl)
        keeper = LeaseKeeper(self, lease, ttl, on_lost=on_lost).start() if renew else None
        try:
            yield lease
        finally:
            lost: LeaseLostError | None = None
            if keeper is not None:
                keeper.stop()
                lost, lease = keeper.lost, keeper.lease
            if lost is None:
                try:
                    released, current = self._release(owner, lease=lease)
                    if renew and not released:
                        lost = lost_error(self.topic_prefix, lease, current)
                except Exception as error:  # a failed release must not hide the run's own outcome
                    log.warning(
                        "%s: could not release the lease of %s (%s); it expires at %s",
                        self.described(),
                        owner,
                        error,
                        iso_z(lease.expires_at),
                    )
            if lost is not None:
                raise lost

    def _write(self, writer: TransactionalWriter, lease: Lease) -> None:
        writer.begin()
        writer.commit([Record(self.store.topic, self.key, json.dumps(lease.to_json()).encode())])

    def _exclusively(self, action):
        from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter

        self.store.ensure_topic()
        attempt = 1
        while True:
            # A writer per lease change (take, renew, release): its start is no news in the log.
            writer = TransactionalWriter(self.kafka_config, self.transactional_id, log_level=logging.DEBUG)
            try:
                return action(writer)
            except DeliveryError as error:
                if "fenced" not in str(error) or attempt >= FENCED_ATTEMPTS:
                    raise
                attempt += 1
                log.info(
                    "%s: another process changed the lease at the same time; reading it again",
                    self.described(),
                )
                time.sleep(random.uniform(0.05, 0.5))  # contenders retry at different times
            finally:
                writer.close()


class LeaseKeeper:
    """Renews a held lease in a daemon thread every ``interval`` seconds (default: a third of
    ``ttl``) until :meth:`stop`.

    A renewal that finds the lease lost ends the keeper at once; one that fails otherwise (Kafka
    unreachable) is retried sooner, until less than half an interval of the lease is left: then
    the lease counts as lost (another task may take it once it expires). On a loss, ``lost`` is
    set and ``on_lost(error)`` is called from the keeper's thread.
    """

    def __init__(
        self,
        connector_lease: ConnectorLease,
        lease: Lease,
        ttl: timedelta | float,
        *,
        interval: float | None = None,
        on_lost: Callable[[LeaseLostError], None] | None = None,
    ):
        self.connector_lease = connector_lease
        self.lease = lease
        self.ttl = as_ttl(ttl)
        self.interval = float(interval) if interval else self.ttl.total_seconds() / 3
        self.on_lost = on_lost
        self.lost: LeaseLostError | None = None
        self.renewals = 0
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"mongocdc-lease-{connector_lease.topic_prefix}", daemon=True
        )

    def start(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop renewing (waits for a renewal under way)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        prefix = self.connector_lease.topic_prefix
        wait = self.interval
        while not self._stopped.wait(wait):
            try:
                self.lease = self.connector_lease.renew(self.lease, self.ttl)
                self.renewals += 1
                wait = self.interval
            except LeaseLostError as error:
                self._lose(error)
                return
            except Exception as error:
                left = (self.lease.expires_at - _utcnow()).total_seconds()
                margin = self.interval / 2
                if left <= margin:
                    self._lose(lost_error(prefix, self.lease, None, failure=error))
                    return
                wait = max(0.5, min(self.interval, (left - margin) / 3))
                log.warning(
                    "%s: could not renew the lease of %s (%s); next attempt in %.0f s, it expires at %s",
                    self.connector_lease.described(),
                    self.lease.owner,
                    error,
                    wait,
                    iso_z(self.lease.expires_at),
                )

    def _lose(self, error: LeaseLostError) -> None:
        self.lost = error
        if self._stopped.is_set():
            return  # the run ended meanwhile: hold() reports the loss, nothing to stop
        log.error("%s", error)
        if self.on_lost is not None:
            try:
                self.on_lost(error)
            except Exception:  # the loss is reported by hold() in any case
                log.exception(
                    "%s: stopping the run after the lease was lost failed",
                    self.connector_lease.described(),
                )
