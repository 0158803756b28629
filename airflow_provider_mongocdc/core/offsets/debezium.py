"""Debezium's offsets: switching from or to Debezium's MongoDB connector without a re-snapshot.

A Debezium 3.x MongoDB connector keeps one offset in Kafka Connect's offsets topic
(``offset.storage.topic`` of the Connect worker), written by Kafka Connect's JsonConverter:

* key ``["<connector name>", {"server_id": "<topic.prefix>"}]`` (MongoDbPartition);
* value ``{"sec", "ord", "resume_token": "<base64 BSON of the token document>", "lsid",
  "txnNumber", "initsync", "transaction_id", ...}`` (MongoDbOffsetContext.getOffset, SourceInfo,
  ResumeTokens.toBase64).

Debezium before 2.7 stored the token's ``_data`` hex string; Debezium reads both, and so does this
module. Keys with an ``rs`` field are the per-replica-set partitions of Debezium before 2.6, which
3.x still reads once to consolidate them. :meth:`~airflow_provider_mongocdc.core.offsets.store.OffsetStore.import_debezium` and
:meth:`~airflow_provider_mongocdc.core.offsets.store.OffsetStore.export_debezium` use these functions.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bson
from bson.timestamp import Timestamp
from confluent_kafka import Producer

from airflow_provider_mongocdc.core.base.errors import OffsetError
from airflow_provider_mongocdc.core.kafka.admin import describe_topic
from airflow_provider_mongocdc.core.kafka.client import CONSUMER_ONLY, NOT_FOR_CONSUMERS, librdkafka_log
from airflow_provider_mongocdc.core.kafka.committed_records import check_settings, read_committed
from airflow_provider_mongocdc.core.offsets.model import (
    Position,
    base64_token_document,
    compact,
    token_cluster_time,
)

DEBEZIUM_PARTITIONER = "murmur2_random"  # librdkafka's Java-compatible partitioner (Connect's keys)


@dataclass(frozen=True)
class DebeziumOffset:
    """One entry of a Kafka Connect offsets topic written by Debezium's MongoDB connector."""

    connector: str
    source_partition: Mapping[str, Any]
    value: Mapping[str, Any]

    def describe(self) -> str:
        return f"connector {self.connector!r} partition {compact(dict(self.source_partition)).decode()}"

    @property
    def token_format(self) -> str | None:
        """``base64`` (Debezium >= 2.7), ``hex`` (older) or None when the entry has no token."""
        token = self.value.get("resume_token")
        if token is None:
            return None
        return "base64" if base64_token_document(token) is not None else "hex"

    def position(self) -> Position:
        """The position Debezium resumes from: after its resume token (or, without one, at its
        ``sec``/``ord`` operation time, inclusive, as Debezium's ``startAtOperationTime``)."""
        if self.value.get("initsync"):
            raise OffsetError(
                f"The Debezium offset of {self.describe()} is taken during its initial snapshot",
                cause="initsync=true: Debezium restarts such a snapshot from the beginning, the offset "
                "holds no position to stream from",
                fix="let the Debezium connector finish its snapshot (or snapshot here instead), then "
                "import again",
            )
        if self.value.get("incremental_snapshot_collections"):
            raise OffsetError(
                f"The Debezium offset of {self.describe()} is taken during an incremental snapshot",
                cause="the collections it still had to read "
                f"({self.value['incremental_snapshot_collections']}) would never be copied here",
                fix="let the Debezium connector finish its incremental snapshot, then import again",
            )
        token = self.value.get("resume_token")
        sec, ord_ = self.value.get("sec"), self.value.get("ord")
        cluster_time = None
        if isinstance(sec, int) and sec >= 0:
            cluster_time = Timestamp(sec, int(ord_) if isinstance(ord_, int) and ord_ >= 0 else 0)
        document = None
        if token is not None:
            if not isinstance(token, str) or not token:
                raise OffsetError(
                    f"The Debezium offset of {self.describe()} holds an unreadable resume_token",
                    cause=f"got {token!r}",
                    fix="import the position with mongocdc offsets set --resume-token instead",
                )
            document = base64_token_document(token) or {"_data": token}
            if cluster_time is None:
                cluster_time = token_cluster_time(document)
        if document is None and cluster_time is None:
            raise OffsetError(
                f"The Debezium offset of {self.describe()} holds no position",
                cause=f"no resume_token and no sec/ord in {compact(dict(self.value)).decode()}",
                fix="let the Debezium connector stream at least once, or use mongocdc offsets set",
            )
        return Position(document, cluster_time)


def debezium_key(connector: str, server_id: str) -> bytes:
    """Kafka Connect's key of a Debezium 3.x MongoDB connector's offset."""
    return compact([connector, {"server_id": server_id}])


def debezium_value(position: Position) -> dict[str, Any]:
    """The offset Debezium 3.x writes for ``position`` (MongoDbOffsetContext.getOffset)."""
    cluster_time = position.cluster_time
    if cluster_time is None and position.resume_token is not None:
        cluster_time = token_cluster_time(position.resume_token)
    value: dict[str, Any] = {
        "sec": cluster_time.time if cluster_time is not None else -1,
        "ord": cluster_time.inc if cluster_time is not None else -1,
    }
    if position.resume_token is not None:
        value["resume_token"] = base64.b64encode(bson.encode(dict(position.resume_token))).decode("ascii")
    return value


def read_debezium_offsets(
    kafka_config: Mapping[str, Any], connect_topic: str, *, read_timeout_s: float = 60.0
) -> list[DebeziumOffset]:
    """The live entries (last value per key, tombstones dropped) of a Kafka Connect offsets
    topic whose partitions are Debezium MongoDB partitions (a ``server_id`` field)."""
    check_settings(kafka_config, connect_topic)
    described = describe_topic(dict(kafka_config), connect_topic)
    if described is None:
        raise OffsetError(
            f"The Kafka Connect offsets topic {connect_topic!r} does not exist",
            fix="give the offset.storage.topic of the Kafka Connect worker that runs the Debezium connector",
        )
    latest: dict[bytes, bytes | None] = {}
    for key, value in read_committed(dict(kafka_config), connect_topic, read_timeout_s):
        if key:
            latest[key] = value
    entries = []
    for key, value in latest.items():
        if value is None:
            continue
        try:
            data, offset = json.loads(key), json.loads(value)
        except ValueError:
            continue
        if (
            isinstance(data, list)
            and len(data) == 2
            and isinstance(data[0], str)
            and isinstance(data[1], dict)
            and isinstance(data[1].get("server_id"), str)
            and isinstance(offset, dict)
            and not ({"snapshot", "chunk", "lease"} & set(data[1]))
        ):
            entries.append(DebeziumOffset(data[0], data[1], offset))
    return entries


def find_debezium_offset(
    entries: list[DebeziumOffset], connector: str | None, server_id: str, rs: str | None = None
) -> DebeziumOffset:
    """The entry of Debezium connector ``connector`` (any name when None) for ``server_id``: its
    3.x partition ``{"server_id"}``, or else the pre-2.6 partition of replica set ``rs``."""
    matching = [
        entry
        for entry in entries
        if entry.source_partition.get("server_id") == server_id
        and (connector is None or entry.connector == connector)
    ]
    current = [entry for entry in matching if set(entry.source_partition) == {"server_id"}]
    older = [entry for entry in matching if entry.source_partition.get("rs") == rs and rs is not None]
    chosen = current or older
    wanted = f"connector {connector!r}" if connector else "any connector"
    if len(chosen) == 1:
        return chosen[0]
    found = ", ".join(entry.describe() for entry in entries) or "no Debezium MongoDB offset at all"
    if not chosen:
        raise OffsetError(
            f"No Debezium offset for {wanted} with server_id {server_id!r}",
            cause=f"the topic holds: {found}",
            fix="give the Kafka Connect connector name (--debezium-connector) and the topic.prefix the "
            "Debezium connector used, and the worker's offset.storage.topic",
        )
    raise OffsetError(
        f"Several Debezium offsets match {wanted} with server_id {server_id!r}",
        cause=f"found: {', '.join(entry.describe() for entry in chosen)}",
        fix="name the Kafka Connect connector (--debezium-connector)",
    )


def write_debezium_offset(
    kafka_config: Mapping[str, Any],
    connect_topic: str,
    connector: str,
    server_id: str,
    position: Position,
    *,
    timeout_s: float = 60.0,
) -> tuple[bytes, bytes]:
    """Write ``position`` as Debezium 3.x's offset of ``connector`` into a Kafka Connect offsets
    topic, on the partition Kafka Connect's Java producer picks for the key (murmur2), so that
    Connect reads it as the key's last value. Returns the ``(key, value)`` written."""
    if describe_topic(kafka_config, connect_topic) is None:
        raise OffsetError(
            f"The Kafka Connect offsets topic {connect_topic!r} does not exist",
            fix="give the offset.storage.topic of the Kafka Connect worker that will run the "
            "Debezium connector (the worker creates it when it starts)",
        )
    key, value = debezium_key(connector, server_id), compact(debezium_value(position))
    settings = {
        k: v for k, v in kafka_config.items() if k not in NOT_FOR_CONSUMERS and k not in CONSUMER_ONLY
    }
    settings.pop("group.id", None)
    settings.update(
        {
            "partitioner": DEBEZIUM_PARTITIONER,
            "acks": "all",
            "enable.idempotence": True,
            "logger": librdkafka_log,
        }
    )
    failures: list[str] = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(f"{error.name()}: {error.str()}")

    producer = Producer(settings)
    producer.produce(connect_topic, key=key, value=value, on_delivery=delivered)
    remaining = producer.flush(timeout_s)
    if remaining or failures:
        raise OffsetError(
            f"Could not write the Debezium offset into {connect_topic!r}",
            cause="; ".join(failures) or f"not delivered within {timeout_s:g} s",
            fix="check that the Kafka brokers are reachable and the principal may WRITE to the topic",
        )
    return key, value
