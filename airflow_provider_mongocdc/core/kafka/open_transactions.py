"""Transactions open on a topic: what holds back its last stable offset, and who opened them.

A ``read_committed`` reader sees a partition up to its last stable offset (LSO): the first offset
of the oldest transaction still open there. A transaction left open by a killed writer hides
every record committed after it (by other writers) until the writer's ``transactional.id`` is
taken over (``init_transactions`` aborts it) or the broker aborts it after the writer's
``transaction.timeout.ms``. A reader that must see everything committed before it started (a
window reading where it starts) compares the LSO with the high watermark (HWM, read uncommitted):
equal, nothing is open; else it waits until the LSO passes the HWM it saw, and names what is
still open (:class:`OpenTransaction`) when that does not happen.

Who opened a transaction comes from Kafka's transaction admin requests (KIP-664: the partition's
active producers, then the transactional id of the producer whose transaction starts at the LSO),
made with kafka-python's admin client, which has them (librdkafka has not), and the
transaction's start, timeout and state by its coordinator (whether its commit or abort is already
under way); the record at the LSO (its key and time, read uncommitted) is described too, and is all
there is when the admin requests are refused.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.kafka.client import consumer_config

log = logging.getLogger("airflow_provider_mongocdc.core.offsets.store")  # logged as the offsets' lines

# How often the LSO is asked for while waiting for it to pass the HWM a reader saw.
POLL_S = 0.1


@dataclass(frozen=True)
class OpenTransaction:
    """A transaction open on ``partition`` of ``topic`` since ``start_offset`` (the LSO), below
    the partition's high watermark."""

    topic: str
    partition: int
    start_offset: int
    high_watermark: int
    key: bytes | None = None  # the record at start_offset (None: a tombstone key, or unread)
    written_at: datetime | None = None  # that record's time
    transactional_id: str | None = None  # KIP-664 (None: not known)
    started_at: datetime | None = None  # the transaction's start, by its coordinator
    timeout_ms: int | None = None  # its transaction.timeout.ms
    # Its coordinator's state (Ongoing; PrepareCommit, PrepareAbort, ...: its end is decided and
    # under way, the coordinator completes it without the writer); None: not known.
    state: str | None = None

    @property
    def since(self) -> datetime | None:
        return self.started_at or self.written_at

    def open_seconds(self, now: datetime | None = None) -> float | None:
        since = self.since
        if since is None:
            return None
        return max(0.0, ((now or datetime.now(timezone.utc)) - since).total_seconds())

    def writer(self) -> str:
        """The writer in words: its transactional id, else what its first record is."""
        if self.transactional_id:
            return f"transactional.id {self.transactional_id!r}"
        key = self.key.decode("utf-8", "replace") if self.key is not None else None
        return "a writer whose transactional.id is unknown" + (f" (first record key {key})" if key else "")

    def describe(self, now: datetime | None = None) -> str:
        """``a transaction of transactional.id 'x' open on topic t partition 0 since <time> (for 42 s)``."""
        text = f"a transaction of {self.writer()} open on topic {self.topic!r} partition {self.partition}"
        since, seconds = self.since, self.open_seconds(now)
        if since is not None and seconds is not None:
            text += f" since {iso_z(since)} ({seconds:.0f} s)"
        else:
            text += f" from offset {self.start_offset}"
        return text

    def expiry(self) -> str:
        """When the broker aborts it by itself."""
        if self.timeout_ms is None:
            return "the broker aborts it when its writer's transaction.timeout.ms has passed"
        if self.started_at is None:
            return (
                f"the broker aborts it {self.timeout_ms / 1000:g} s after it began (transaction.timeout.ms)"
            )
        ends = self.started_at.timestamp() + self.timeout_ms / 1000
        return (
            f"the broker aborts it at {iso_z(datetime.fromtimestamp(ends, timezone.utc))} "
            f"(transaction.timeout.ms {self.timeout_ms})"
        )

    def abort_command(self, bootstrap_servers: str | None) -> str:
        """Kafka's own command that aborts it."""
        return (
            f"kafka-transactions.sh --bootstrap-server {bootstrap_servers or '<brokers>'} abort "
            f"--topic {self.topic} --partition {self.partition} --start-offset {self.start_offset}"
        )

    def to_json(self, now: datetime | None = None) -> dict[str, Any]:
        return {
            "topic": self.topic,
            "partition": self.partition,
            "start_offset": self.start_offset,
            "high_watermark": self.high_watermark,
            "transactional_id": self.transactional_id,
            "since": iso_z(self.since),
            "open_seconds": None if self.open_seconds(now) is None else round(self.open_seconds(now), 1),
            "description": self.describe(now),
        }


# -- offsets ------------------------------------------------------------------------------------------
def reader_config(kafka_config: Mapping[str, Any], isolation: str) -> dict[str, Any]:
    """A consumer's settings for the LSO (``read_committed``) or the HWM (``read_uncommitted``)."""
    config = consumer_config(kafka_config)
    config["isolation.level"] = isolation
    config["group.id"] = f"mongocdc-watermarks-{uuid.uuid4().hex}"
    return config


def watermarks(consumer: Consumer, topic: str, partitions: list[int], timeout_s: float) -> dict[int, int]:
    """Each partition's end offset as ``consumer``'s isolation level sees it: the LSO for
    ``read_committed``, the high watermark for ``read_uncommitted``."""
    ends = {}
    for partition in partitions:
        _low, high = consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=max(1.0, timeout_s), cached=False
        )
        ends[partition] = high
    return ends


def wait_stable(committed: Consumer, topic: str, targets: Mapping[int, int], wait_s: float) -> dict[int, int]:
    """Wait (at most ``wait_s``) until each partition's LSO reaches its target offset; returns
    the LSOs last seen (those below their targets are still held back by open transactions)."""
    deadline = time.monotonic() + wait_s
    while True:
        stable = watermarks(committed, topic, sorted(targets), max(1.0, deadline - time.monotonic()))
        behind = {pid for pid, target in targets.items() if stable[pid] < target}
        if not behind or time.monotonic() >= deadline:
            return stable
        time.sleep(POLL_S)


# -- who opened them ------------------------------------------------------------------------------------
def describe_open(
    kafka_config: Mapping[str, Any], topic: str, held: Mapping[int, tuple[int, int]], timeout_s: float
) -> list[OpenTransaction]:
    """The transactions open at each ``partition: (lso, hwm)`` of ``held``: the record at the LSO
    and, when Kafka tells it, the writer's transactional id and the transaction's start."""
    found = []
    for partition, (lso, hwm) in sorted(held.items()):
        key, written_at = _record_at(kafka_config, topic, partition, lso, timeout_s)
        found.append(OpenTransaction(topic, partition, lso, hwm, key, written_at))
    try:
        return _named(kafka_config, found, timeout_s)
    except Exception as error:  # the admin requests may be refused: the records still tell much
        log.info("Offsets topic %s: could not ask Kafka who opened its transactions (%s)", topic, error)
        return found


def _record_at(
    kafka_config: Mapping[str, Any], topic: str, partition: int, offset: int, timeout_s: float
) -> tuple[bytes | None, datetime | None]:
    """The key and time of the record at ``offset`` (read uncommitted), or ``(None, None)``."""
    consumer = Consumer(reader_config(kafka_config, "read_uncommitted"))
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign([TopicPartition(topic, partition, offset)])
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            _kind, stamp = message.timestamp()
            written = datetime.fromtimestamp(stamp / 1000, timezone.utc) if stamp and stamp > 0 else None
            return message.key(), written
        return None, None
    except KafkaException:
        return None, None
    finally:
        consumer.close()


def admin_client_config(kafka_config: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
    """kafka-python's settings for a librdkafka configuration (bootstrap and security)."""
    mapping = {
        "security.protocol": "security_protocol",
        "sasl.mechanism": "sasl_mechanism",
        "sasl.mechanisms": "sasl_mechanism",
        "sasl.username": "sasl_plain_username",
        "sasl.password": "sasl_plain_password",
        "ssl.ca.location": "ssl_cafile",
        "ssl.certificate.location": "ssl_certfile",
        "ssl.key.location": "ssl_keyfile",
        "ssl.key.password": "ssl_password",
    }
    config: dict[str, Any] = {
        "bootstrap_servers": str(kafka_config["bootstrap.servers"]).split(","),
        "client_id": "mongocdc-transactions",
        "request_timeout_ms": int(max(1.0, timeout_s) * 1000),
    }
    for key, value in kafka_config.items():
        if key in mapping and value not in (None, ""):
            config[mapping[key]] = str(value).upper() if key.startswith(("security", "sasl.mech")) else value
    if str(kafka_config.get("ssl.endpoint.identification.algorithm", "https")).lower() == "none":
        config["ssl_check_hostname"] = False
    return config


def _named(
    kafka_config: Mapping[str, Any], found: list[OpenTransaction], timeout_s: float
) -> list[OpenTransaction]:
    """``found`` with each transaction's transactional id, start, timeout and state (KIP-664)."""
    if not found:
        return found
    from dataclasses import replace

    from kafka import KafkaAdminClient
    from kafka.structs import TopicPartition as KafkaPartition

    admin = KafkaAdminClient(**admin_client_config(kafka_config, timeout_s))
    try:
        states = admin.describe_producers([KafkaPartition(t.topic, t.partition) for t in found])
        producers: dict[int, int] = {}  # producer id -> index in found
        for index, open_one in enumerate(found):
            state = states.get(KafkaPartition(open_one.topic, open_one.partition))
            for producer in state.active_producers if state else []:
                if producer.current_transaction_start_offset == open_one.start_offset:
                    producers[producer.producer_id] = index
        if not producers:
            return found
        listed = admin.list_transactions(producer_id_filters=sorted(producers))
        ids = {
            listing.producer_id: listing.transactional_id
            for listings in listed.values()
            for listing in listings
        }
        described = admin.describe_transactions(sorted(set(ids.values()))) if ids else {}
    finally:
        admin.close()
    named = list(found)
    for producer_id, index in producers.items():
        transactional_id = ids.get(producer_id)
        if transactional_id is None:
            continue
        description = described.get(transactional_id)
        started = None
        if description is not None and description.transaction_start_time_ms > 0:
            started = datetime.fromtimestamp(description.transaction_start_time_ms / 1000, timezone.utc)
        named[index] = replace(
            named[index],
            transactional_id=transactional_id,
            started_at=started,
            timeout_ms=description.transaction_timeout_ms if description is not None else None,
            state=_state_name(description.state) if description is not None else None,
        )
    return named


def _state_name(state: Any) -> str | None:
    """A coordinator's transaction state as Kafka names it (``Ongoing``, ``PrepareCommit``, ...)."""
    if state is None:
        return None
    return str(getattr(state, "value", state))
