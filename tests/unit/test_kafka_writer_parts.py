"""The Kafka writer's parts, each with one role: the producer's lifecycle and fencing
(core/kafka/producer.py), sending with the account of deliveries (core/kafka/delivery.py) and the
transactions over them (core/kafka/writer.py). The writer's behaviour against the broker:
tests/integration/test_writer.py.

Here: the errors in words a transactional operation ends with, from the producer's part alone (no
broker: librdkafka connects at the first transactional call), and that no class of the Kafka
package grows back into one that does everything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from airflow_provider_mongocdc.core.base.errors import (
    ConnectionFailedError,
    DeliveryError,
    OversizeEventError,
)
from airflow_provider_mongocdc.core.kafka.client import producer_config
from airflow_provider_mongocdc.core.kafka.producer import TransactionalProducer

pytestmark = pytest.mark.unit

KAFKA_PACKAGE = Path(__file__).resolve().parents[2] / "airflow_provider_mongocdc" / "core" / "kafka"
# The longest a class of the Kafka package may be: a class over it mixes roles.
CLASS_LINES = 250


@pytest.fixture
def producer():
    config = producer_config({"bootstrap.servers": "127.0.0.1:9"}, "shop-window-rs0", None)
    made = TransactionalProducer(config, "shop-window-rs0", 1_000_000)
    yield made
    made.release()


def test_a_fenced_producer_is_unusable_and_says_so(producer):
    error = producer.failure(
        "commit the transaction",
        KafkaError(KafkaError._FENCED, "Producer fenced by newer instance", fatal=True),
    )
    assert isinstance(error, DeliveryError)
    assert "transactional.id 'shop-window-rs0') was fenced by a newer writer" in str(error)
    assert "Fix: nothing to repair: the newer run continues from the last committed offset" in str(error)
    with pytest.raises(DeliveryError, match="was fenced by a newer writer"):
        producer.check_usable()


def test_unanswered_brokers_are_a_connection_failure(producer):
    error = producer.failure("initialise transactions", KafkaError(KafkaError._TIMED_OUT, "timed out"))
    assert isinstance(error, ConnectionFailedError)
    assert str(error).startswith(
        "The Kafka writer could not initialise transactions: the brokers did not answer"
    )
    producer.check_usable()  # a timeout leaves the producer usable


def test_a_refused_transactional_id_names_the_grant(producer):
    error = producer.failure(
        "initialise transactions",
        KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "not authorized"),
    )
    assert "grant the Kafka principal WRITE and DESCRIBE on the transactional id 'shop-window-rs0'" in str(
        error
    )


def test_an_oversize_event_names_its_key_and_the_limit(producer):
    error = producer.oversize("shop.db.items", b'{"id": "7"}', 2_000_000, "the producer's message.max.bytes")
    assert isinstance(error, OversizeEventError)
    assert 'key {"id": "7"} on topic \'shop.db.items\' is 2000000 bytes' in str(error)
    assert "producer message.max.bytes=1000000" in str(error)


def test_a_released_producer_says_it_is_closed(producer):
    producer.release()
    with pytest.raises(DeliveryError, match="The Kafka writer is closed"):
        producer.check_usable()


def test_no_class_of_the_kafka_package_mixes_roles():
    long_classes = []
    for path in sorted(KAFKA_PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > CLASS_LINES:
                    long_classes.append(f"{path.name}: {node.name} ({lines} lines)")
    assert not long_classes, f"classes over {CLASS_LINES} lines: {long_classes}"
