"""The transactional Kafka writer against the real broker: what read_committed consumers see."""

from __future__ import annotations

import logging
import os
import uuid
from typing import NamedTuple

import pytest

from airflow_provider_mongocdc.core.base.errors import ConfigError, DeliveryError, OversizeEventError
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, describe_topic, ensure_topics
from airflow_provider_mongocdc.core.kafka.client import redact_config
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from devtools.kafka import reading

pytestmark = pytest.mark.integration


class Rec(NamedTuple):
    topic: str
    key: bytes | None
    value: bytes | None


def read_topic(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[tuple[bytes, bytes]]:
    """(key, value) of every record of the topic up to its end: the last stable offset when
    read_committed, once the markers of just-committed transactions are written (a commit returns
    before the broker has written them), the end reached by the read position, which moves past
    markers and aborted records without a message there."""
    return [
        (record.key, record.value) for record in reading.read_topic(bootstrap, topic, isolation=isolation)
    ]


@pytest.fixture
def topics(kafka_config, unique_name):
    events, offsets = f"{unique_name}.db.coll", f"{unique_name}.offsets"
    ensure_topics(
        kafka_config, [TopicSpec(events, 1), TopicSpec(offsets, 1, config={"cleanup.policy": "compact"})]
    )
    return events, offsets


def test_committed_events_and_offset_are_visible_together(kafka_config, kafka_bootstrap, topics, unique_name):
    events, offsets = topics
    with TransactionalWriter(kafka_config, f"{unique_name}-w") as writer:
        writer.begin()
        assert writer.send(Rec(events, f"k{i}".encode(), f"v{i}".encode()) for i in range(5)) == 5
        stats = writer.commit([Rec(offsets, b"partition", b'{"position": 5}')])
        assert stats.produced == stats.delivered == 6
        assert stats.topics == {events: 5, offsets: 1}
    assert read_topic(kafka_bootstrap, events) == [(f"k{i}".encode(), f"v{i}".encode()) for i in range(5)]
    assert read_topic(kafka_bootstrap, offsets) == [(b"partition", b'{"position": 5}')]


def test_aborted_transaction_is_invisible_to_read_committed(
    kafka_config, kafka_bootstrap, topics, unique_name
):
    events, offsets = topics
    with TransactionalWriter(kafka_config, f"{unique_name}-w") as writer:
        with writer.transaction():
            writer.send([Rec(events, b"a", b"committed")])
        writer.begin()
        writer.send([Rec(events, b"b", b"aborted"), Rec(offsets, b"partition", b"aborted-offset")])
        writer.flush()  # the records are in the log, only the abort marker hides them
        writer.abort()
        with pytest.raises(RuntimeError):
            with writer.transaction():
                writer.send([Rec(events, b"c", b"aborted by error")])
                writer.flush()
                raise RuntimeError("the batch failed half way")
        with writer.transaction():
            writer.send([Rec(events, b"d", b"after")])
    assert [v for _, v in read_topic(kafka_bootstrap, events)] == [b"committed", b"after"]
    assert read_topic(kafka_bootstrap, offsets) == []
    # The aborted records were really written: a read_uncommitted consumer sees them.
    uncommitted = [v for _, v in read_topic(kafka_bootstrap, events, isolation="read_uncommitted")]
    assert b"aborted" in uncommitted and b"aborted by error" in uncommitted


def test_zombie_writer_is_fenced_with_a_clear_error(kafka_config, kafka_bootstrap, topics, unique_name):
    events, offsets = topics
    zombie = TransactionalWriter(kafka_config, f"{unique_name}-task-0")
    zombie.begin()
    zombie.send([Rec(events, b"z", b"zombie-before")])
    zombie.flush()
    successor = TransactionalWriter(kafka_config, f"{unique_name}-task-0")  # a retry of the same task
    try:
        with pytest.raises(DeliveryError) as info:
            zombie.commit([Rec(offsets, b"partition", b"zombie-offset")])
        message = str(info.value)
        assert "fenced" in message and f"{unique_name}-task-0" in message and "Fix:" in message
        with pytest.raises(DeliveryError, match="fenced"):
            zombie.begin()  # the zombie stays unusable
        with successor.transaction():
            successor.send([Rec(events, b"s", b"successor")])
            successor.send([Rec(offsets, b"partition", b"successor-offset")])
    finally:
        zombie.close()
        successor.close()
    assert [v for _, v in read_topic(kafka_bootstrap, events)] == [b"successor"]
    assert read_topic(kafka_bootstrap, offsets) == [(b"partition", b"successor-offset")]


def test_event_larger_than_the_producer_limit_aborts_with_oversize_error(
    kafka_config, kafka_bootstrap, topics, unique_name
):
    events, offsets = topics
    with TransactionalWriter(
        kafka_config, f"{unique_name}-w", overrides={"message.max.bytes": 100_000}
    ) as writer:
        writer.begin()
        writer.send([Rec(events, b"small", b"x")])
        with pytest.raises(OversizeEventError) as info:
            writer.send([Rec(events, b'{"id": "big-doc"}', b"y" * 200_000)])
        message = str(info.value)
        assert "big-doc" in message and events in message and "message.max.bytes" in message
        assert not writer.in_transaction
        with writer.transaction():  # the writer stays usable for the next batch
            writer.send([Rec(events, b"next", b"ok")])
    assert [k for k, _ in read_topic(kafka_bootstrap, events)] == [b"next"]
    assert read_topic(kafka_bootstrap, offsets) == []


def test_event_rejected_by_the_topic_limit_aborts_and_never_commits_the_offset(
    kafka_config, kafka_bootstrap, unique_name
):
    small, offsets = f"{unique_name}.small", f"{unique_name}.offsets"
    ensure_topics(
        kafka_config,
        [
            TopicSpec(small, 1, config={"max.message.bytes": "50000"}),
            TopicSpec(offsets, 1, config={"cleanup.policy": "compact"}),
        ],
    )
    with TransactionalWriter(kafka_config, f"{unique_name}-w") as writer:
        writer.begin()
        # Incompressible, so that lz4 does not bring it under the topic's limit.
        writer.send([Rec(small, b"ok", b"fine"), Rec(small, b'{"id": 42}', os.urandom(200_000))])
        with pytest.raises(OversizeEventError) as info:
            writer.commit([Rec(offsets, b"partition", b"must-not-be-visible")])
        assert small in str(info.value) and '{"id": 42}' in str(info.value)
        assert not writer.in_transaction
    assert read_topic(kafka_bootstrap, small) == []
    assert read_topic(kafka_bootstrap, offsets) == []


def test_exactly_once_settings_cannot_be_weakened(kafka_config, unique_name):
    for override in ({"acks": "1"}, {"enable.idempotence": False}):
        with pytest.raises(ConfigError) as info:
            TransactionalWriter(kafka_config, f"{unique_name}-w", overrides=override)
        assert next(iter(override)) in str(info.value)
    with pytest.raises(ConfigError, match="bootstrap.servers"):
        TransactionalWriter({}, f"{unique_name}-w")
    with pytest.raises(ConfigError, match="transactional.id"):
        TransactionalWriter(kafka_config, "")


def test_secrets_never_appear_in_repr_or_logs(kafka_config, unique_name, caplog):
    secret = "s3cr3t-" + uuid.uuid4().hex
    config = dict(kafka_config, **{"sasl.password": secret, "sasl.username": "svc"})
    assert redact_config(config)["sasl.password"] == "***"
    assert redact_config(config)["sasl.username"] == "svc"
    with caplog.at_level(logging.DEBUG):
        with TransactionalWriter(config, f"{unique_name}-w") as writer:
            assert secret not in repr(writer)
            assert secret not in str(writer.config)
    assert secret not in caplog.text
    assert f"{unique_name}-w" in caplog.text  # the writer did log its (redacted) config


def test_ensure_topics_is_idempotent_and_applies_configs(kafka_config, unique_name):
    spec = TopicSpec(
        f"{unique_name}.compacted", 1, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "1000"}
    )
    assert ensure_topics(kafka_config, [spec]) == {spec.name: "created"}
    assert ensure_topics(kafka_config, [spec]) == {spec.name: "exists"}
    partitions, configs = describe_topic(kafka_config, spec.name)
    assert partitions == 1
    assert configs["cleanup.policy"] == "compact"
    assert configs["min.compaction.lag.ms"] == "1000"
    assert describe_topic(kafka_config, f"{unique_name}.missing") is None
