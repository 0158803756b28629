"""The connector lease: a snapshot and a window of the same connector never run at the same time.

Both rewrite the connector's offsets: a window that streamed while a snapshot ran would move the
offset that the snapshot is about to replace with its recorded start (or the other way round),
and events would be skipped or reordered. The lease is a record in the connector's offsets topic
(key :func:`~.offsets.lease_key`) naming its holder (``owner``, e.g. the Airflow task instance),
what it runs (``kind``: ``snapshot`` or ``window``) and when it expires; a lease past its expiry
is free, so a holder killed without releasing blocks others for ``ttl`` at most.

Taking a lease is a read-then-write made atomic with Kafka's transactional producer: every change
goes through the producer ``mongocdc-<topic.prefix>-lease``, whose initialisation fences any
other producer with that id. The holder initialises, reads the committed lease (read_committed:
after initialisation every earlier lease transaction is complete), writes its lease and commits.
When two contenders overlap, the one that initialised first is fenced and its commit fails;
it then starts over and finds the other's lease. Releasing writes a tombstone the same way, and
only when the lease is the caller's own.

The same ``owner`` may take its lease again (an Airflow retry of the same task instance takes
over the lease its killed try left behind); any other owner gets :class:`~.errors.LeaseHeldError`
naming the holder and when the lease expires.
"""

from __future__ import annotations

import json
import logging
import random
import socket
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from airflow_provider_mongocdc.core.errors import DeliveryError, LeaseHeldError, OffsetError
from airflow_provider_mongocdc.core.events import Record
from airflow_provider_mongocdc.core.offsets import OffsetStore, lease_key
from airflow_provider_mongocdc.core.writer import TransactionalWriter

log = logging.getLogger(__name__)

SNAPSHOT, WINDOW = "snapshot", "window"
KINDS = (SNAPSHOT, WINDOW)
DEFAULT_TTL = timedelta(hours=2)
# Attempts when a concurrent contender fences this one (it then re-reads and usually finds the
# other's lease).
FENCED_ATTEMPTS = 5


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _iso(value: datetime) -> str:
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def _parse_iso(value: str) -> datetime:
    parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def owner_for_task(dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> str:
    """The lease owner of an Airflow task instance (the same for all its tries)."""
    owner = f"{dag_id}/{run_id}/{task_id}"
    return owner if map_index is None or map_index < 0 else f"{owner}[{map_index}]"


def task_owner(context: Mapping[str, Any]) -> str:
    """The lease owner of the task instance of an Airflow task context (``context["ti"]``)."""
    ti = context["ti"]
    return owner_for_task(ti.dag_id, ti.task_id, ti.run_id, getattr(ti, "map_index", -1))


@dataclass(frozen=True)
class Lease:
    """Who holds a connector's lease, for what, until when."""

    owner: str
    kind: str
    acquired_at: datetime
    expires_at: datetime
    host: str | None = None

    def live(self, now: datetime | None = None) -> bool:
        return (now or _utcnow()) < self.expires_at

    def to_json(self) -> dict[str, Any]:
        return {
            "owner": self.owner,
            "kind": self.kind,
            "acquired_at": _iso(self.acquired_at),
            "expires_at": _iso(self.expires_at),
            "host": self.host,
            "format": 1,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Lease:
        return cls(
            str(data["owner"]),
            str(data["kind"]),
            _parse_iso(data["acquired_at"]),
            _parse_iso(data["expires_at"]),
            data.get("host"),
        )

    def describe(self) -> str:
        return (
            f"{self.kind} {self.owner!r}"
            + (f" on {self.host}" if self.host else "")
            + f", acquired {_iso(self.acquired_at)}, expires {_iso(self.expires_at)}"
        )


def held_error(topic_prefix: str, lease: Lease, kind: str, owner: str) -> LeaseHeldError:
    return LeaseHeldError(
        f"The {kind} {owner!r} cannot start: connector {topic_prefix!r} is locked by the {lease.kind} "
        f"{lease.owner!r} until {_iso(lease.expires_at)}",
        cause=f"a snapshot and a window of the same connector never run at the same time; the lease "
        f"is held by {lease.describe()}",
        fix=f"run again after that {lease.kind} ends (Airflow: put both tasks in the pool "
        f"mongocdc_{topic_prefix} so that they queue instead); if it was killed, its lease "
        f"expires at {_iso(lease.expires_at)}",
    )


class ConnectorLease:
    """The lease of connector ``topic_prefix``, stored in ``offsets_topic``.

    :param kafka_config: the Kafka connection's librdkafka configuration.
    :param topic_prefix: the connector's ``topic.prefix``.
    :param offsets_topic: the connector's offsets topic (default ``<topic.prefix>.offsets``).
    :param connector: the Kafka Connect connector name of the offset keys (default: topic prefix).
    """

    def __init__(
        self,
        kafka_config: Mapping[str, Any],
        topic_prefix: str,
        offsets_topic: str | None = None,
        *,
        connector: str | None = None,
        read_timeout_s: float = 60.0,
    ):
        self.kafka_config = dict(kafka_config)
        self.topic_prefix = topic_prefix
        self.store = OffsetStore(
            self.kafka_config, offsets_topic or f"{topic_prefix}.offsets", read_timeout_s=read_timeout_s
        )
        self.key = lease_key(topic_prefix, connector)
        self.transactional_id = f"mongocdc-{topic_prefix}-lease"

    @classmethod
    def for_config(cls, kafka_config: Mapping[str, Any], config, **kwargs: Any) -> ConnectorLease:
        """The lease of a :class:`~.config.ConnectorConfig`'s connector."""
        return cls(kafka_config, config.topic_prefix, config.offsets_topic, **kwargs)

    def __repr__(self) -> str:
        return f"ConnectorLease({self.topic_prefix!r}, topic={self.store.topic!r})"

    # -- reading --
    def current(self) -> Lease | None:
        """The stored lease (live or expired), or None when free."""
        value: bytes | None = None
        for key, record_value in self.store.read_committed_records():
            if key == self.key:
                value = record_value
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

    def check(
        self, owner: str | None = None, kind: str = WINDOW, *, now: datetime | None = None
    ) -> Lease | None:
        """The live lease, or None. Raises :class:`LeaseHeldError` when another owner than
        ``owner`` holds a live lease (``kind`` names what the caller wants to run)."""
        lease = self.current()
        if lease is None or not lease.live(now):
            return None
        if owner is not None and lease.owner != owner:
            raise held_error(self.topic_prefix, lease, kind, owner)
        return lease

    # -- writing --
    def acquire(self, owner: str, kind: str, ttl: timedelta | float = DEFAULT_TTL) -> Lease:
        """Take the lease for ``owner`` running ``kind`` for ``ttl`` (a timedelta or seconds).

        Renews the lease when ``owner`` holds it already; raises :class:`LeaseHeldError` when
        someone else holds a live one.
        """
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        ttl = ttl if isinstance(ttl, timedelta) else timedelta(seconds=float(ttl))
        if ttl <= timedelta(0):
            raise ValueError("the lease ttl must be positive")

        def write(writer: TransactionalWriter) -> Lease:
            now = _utcnow()
            lease = self.current()
            if lease is not None and lease.live(now) and lease.owner != owner:
                raise held_error(self.topic_prefix, lease, kind, owner)
            mine = Lease(owner, kind, now, now + ttl, socket.gethostname())
            writer.begin()
            writer.commit([Record(self.store.topic, self.key, json.dumps(mine.to_json()).encode())])
            return mine

        lease = self._exclusively(write)
        log.info("Connector %s: lease taken by %s", self.topic_prefix, lease.describe())
        return lease

    def release(self, owner: str | None = None, *, force: bool = False) -> bool:
        """Free the lease when ``owner`` holds it (any holder with ``force``).

        Returns whether a lease was removed. A lease held by someone else is left as it is.
        """

        def write(writer: TransactionalWriter) -> bool:
            lease = self.current()
            if lease is None:
                return False
            if not force and lease.owner != owner:
                log.warning(
                    "Connector %s: lease not released, it is held by %s", self.topic_prefix, lease.describe()
                )
                return False
            writer.begin()
            writer.commit([Record(self.store.topic, self.key, None)])
            return True

        released = self._exclusively(write)
        if released:
            log.info("Connector %s: lease released by %s", self.topic_prefix, owner or "force")
        return released

    @contextmanager
    def hold(self, owner: str, kind: str, ttl: timedelta | float = DEFAULT_TTL) -> Iterator[Lease]:
        """``with lease.hold(owner, "window"):`` — acquire, run, release (also on errors)."""
        lease = self.acquire(owner, kind, ttl)
        try:
            yield lease
        finally:
            try:
                self.release(owner)
            except Exception as error:  # a failed release must not hide the run's own outcome
                log.warning(
                    "Connector %s: could not release the lease of %s (%s); it expires at %s",
                    self.topic_prefix,
                    owner,
                    error,
                    _iso(lease.expires_at),
                )

    def _exclusively(self, action):
        self.store.ensure_topic()
        attempt = 1
        while True:
            writer = TransactionalWriter(self.kafka_config, self.transactional_id)
            try:
                return action(writer)
            except DeliveryError as error:
                if "fenced" not in str(error) or attempt >= FENCED_ATTEMPTS:
                    raise
                attempt += 1
                log.info(
                    "Connector %s: another process changed the lease at the same time; reading it again",
                    self.topic_prefix,
                )
                time.sleep(random.uniform(0.05, 0.5))  # contenders retry at different times
            finally:
                writer.close()
