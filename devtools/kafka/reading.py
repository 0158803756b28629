"""Read a topic to its end, as a downstream consumer would (tests and the demo)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from confluent_kafka import Consumer, IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

# Bounds of broker round trips; they only bound a failure, so they leave room for a loaded machine.
REQUEST_TIMEOUT_S = 60.0
# How long a read_committed read waits for the commit markers of just-committed transactions. The
# markers take milliseconds; the wait only lasts this long when a transaction is really left open
# (a killed producer's), which no wait ends: pass ``settle=0`` where that is expected.
SETTLE_S = 60.0


@dataclass(frozen=True)
class ReadRecord:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()  # the record's Kafka headers, in order


def wait_stable(bootstrap: str, topic: str, timeout: float = SETTLE_S) -> bool:
    """Wait until no transaction holds ``topic`` back (last stable offset == high watermark).

    A producer's commit returns before the broker has written the commit markers into the
    partitions; until it has, read_committed readers stop short of the committed records. Returns
    False when a transaction is still open after ``timeout`` (then readers see up to it).
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    # The metadata of all topics: asking for the one topic would make a broker with
    # auto.create.topics.enable create it (with the broker's default configuration).
    metadata = admin.list_topics(timeout=REQUEST_TIMEOUT_S)
    info = metadata.topics.get(topic)
    if info is None or info.error is not None or not info.partitions:
        return True
    partitions = [TopicPartition(topic, pid) for pid in info.partitions]
    deadline = time.monotonic() + timeout
    while True:
        ends = {}
        for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
            futures = admin.list_offsets(
                {tp: OffsetSpec.latest() for tp in partitions},
                isolation_level=level,
                request_timeout=REQUEST_TIMEOUT_S,
            )
            ends[level] = {tp.partition: future.result().offset for tp, future in futures.items()}
        if ends[IsolationLevel.READ_COMMITTED] == ends[IsolationLevel.READ_UNCOMMITTED]:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def read_topic(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_committed",
    timeout: float = 120.0,
    extra_config: dict | None = None,
    settle: float = SETTLE_S,
) -> list[ReadRecord]:
    """Every record of ``topic`` from the beginning to the end offsets seen at the call.

    With ``read_committed`` (the default) the end is the last stable offset, so records of
    aborted or still-open transactions are not returned; the read first waits up to ``settle``
    seconds for the commit markers of just-committed transactions (:func:`wait_stable`). A
    missing topic reads as empty.
    """
    if isolation == "read_committed" and settle > 0:
        wait_stable(bootstrap, topic, settle)
    config = {
        "bootstrap.servers": bootstrap,
        "group.id": f"mongocdc-reader-{uuid.uuid4().hex}",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
    }
    config.update(extra_config or {})
    consumer = Consumer(config)
    try:
        metadata = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S)
        info = metadata.topics.get(topic)
        if info is None or info.error is not None or not info.partitions:
            return []
        ends = {}
        for pid in info.partitions:
            _low, high = consumer.get_watermark_offsets(
                TopicPartition(topic, pid), timeout=REQUEST_TIMEOUT_S, cached=False
            )
            ends[pid] = high
        assignment = [TopicPartition(topic, pid, 0) for pid, high in ends.items() if high > 0]
        if not assignment:
            return []
        consumer.assign(assignment)
        records: list[ReadRecord] = []
        done = {pid for pid, high in ends.items() if high == 0}
        deadline = time.monotonic() + timeout
        while len(done) < len(ends) and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                # read_committed: transaction markers and aborted records are skipped, so the
                # position can reach the end without a message at the last offset.
                for tp in consumer.position(assignment):
                    if tp.offset >= ends[tp.partition]:
                        done.add(tp.partition)
                continue
            if msg.error():
                raise KafkaException(msg.error())
            if msg.offset() < ends[msg.partition()]:
                records.append(
                    ReadRecord(
                        msg.topic(),
                        msg.partition(),
                        msg.offset(),
                        msg.key(),
                        msg.value(),
                        tuple(msg.headers() or ()),
                    )
                )
            if msg.offset() + 1 >= ends[msg.partition()]:
                done.add(msg.partition())
        if len(done) < len(ends):
            raise TimeoutError(f"reading {topic} did not reach its end offsets {ends} within {timeout}s")
        return records
    finally:
        consumer.close()
