"""Build plus exactly-once produce per core, and the producer settings that drive its cost.

(c) ``produce``: ~1 KB documents become insert events (``EventBuilder.build_change``) sent one
change at a time through :class:`TransactionalWriter` (as a window does), committed with an offset
record every ``max.batch.size`` events. "Per core" divides events by the CPU time of the whole
benchmark process (``time.process_time``: Python plus librdkafka's threads); the broker runs in
another process and is not counted. Build-only CPU time on the same changes is measured in the
same run, so the share of producing is known.

``producer``: the same prebuilt records through the exactly-once writer under different producer
settings (``compression.type``, ``linger.ms``, ``batch.size``) and commit intervals
(``max.batch.size`` 512 / 2048 / 8192): CPU per record, wall-clock records/s, and the bytes
librdkafka put on the wire (its statistics' ``txbytes``).
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from bson import Timestamp

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.kafka.client import DEFAULT_PRODUCER_CONFIG
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from bench.events import make_changes
from bench.services import Services

GOAL_EVENTS_PER_CORE = 25_000


def insert_changes(count: int, seed: int = 11) -> list[dict[str, Any]]:
    """``count`` insert change documents of ~1 KB documents (40% of make_changes are inserts)."""
    out = []
    for kind, _document, change in make_changes(count * 3, seed=seed):
        if kind == "insert":
            out.append(change)
        if len(out) == count:
            break
    return out


class _Batches:
    """Commits like a window: events and an offset record every ``max_batch`` changes."""

    def __init__(self, kafka: dict[str, Any], prefix: str, max_batch: int, overrides=None):
        self.store = OffsetStore(kafka, f"{prefix}.offsets")
        self.store.ensure_topic()
        self.partition = OffsetPartition(prefix, "rs0")
        self.writer = TransactionalWriter(kafka, f"bench-{prefix}", overrides=overrides)
        self.max_batch = max_batch
        self.pending = 0
        self.commits = 0

    def offset(self, number: int) -> Record:
        state = OffsetState(position=Position(cluster_time=Timestamp(1_700_000_000 + number, 1)))
        return self.store.offset_record(self.partition, state)

    def send(self, records: Sequence[Record]) -> None:
        if not self.writer.in_transaction:
            self.writer.begin()
        self.writer.send(records)
        self.pending += 1
        if self.pending >= self.max_batch:
            self.commit()

    def commit(self) -> None:
        if not self.writer.in_transaction:
            self.writer.begin()
        self.writer.commit([self.offset(self.commits)])
        self.commits += 1
        self.pending = 0

    def close(self) -> None:
        self.writer.close()


def _builder(prefix: str) -> EventBuilder:
    return EventBuilder(ConnectorConfig.from_properties({"topic.prefix": prefix}), replica_set="rs0")


def run_build_and_produce(services: Services, count: int, rounds: int) -> dict[str, Any]:
    """(c): build + exactly-once produce, CPU per event, with build-only rounds interleaved."""
    kafka = services.kafka
    changes = insert_changes(count)
    prefix = f"benchc{uuid.uuid4().hex[:8]}"
    builder = _builder(prefix)
    ensure_topics(kafka, [TopicSpec(builder.topic_for("shop", "customers"))])
    max_batch = ConnectorConfig.from_properties({"topic.prefix": prefix}).max_batch_size
    batches = _Batches(kafka, prefix, max_batch)
    build = builder.build_change
    sizes = [sum(record.size for record in build(change)) for change in changes[:500]]
    try:
        for change in changes[:max_batch]:  # warm up: connections, partitions in transaction
            batches.send(build(change))
        batches.commit()
        total_cpu, total_wall, build_cpu = [], [], []
        for _ in range(rounds):
            started_cpu, started_wall = time.process_time(), time.perf_counter()
            for change in changes:
                batches.send(build(change))
            batches.commit()
            total_cpu.append(time.process_time() - started_cpu)
            total_wall.append(time.perf_counter() - started_wall)
            started_cpu = time.process_time()
            for change in changes:
                build(change)
            build_cpu.append(time.process_time() - started_cpu)
    finally:
        batches.close()
    cpu = statistics.median(total_cpu)
    wall = statistics.median(total_wall)
    build_only = statistics.median(build_cpu)
    per_core = count / cpu
    return {
        "events": count,
        "rounds": rounds,
        "max_batch_size": max_batch,
        "event_bytes_mean": round(statistics.mean(sizes)),
        "cpu_us_per_event": round(cpu / count * 1e6, 2),
        "build_cpu_us_per_event": round(build_only / count * 1e6, 2),
        "produce_cpu_us_per_event": round((cpu - build_only) / count * 1e6, 2),
        "events_per_core_second": round(per_core),
        "events_per_core_second_best_round": round(count / min(total_cpu)),
        "events_per_wall_second": round(count / wall),
        "cpu_cores_busy": round(cpu / wall, 2),
        "goal_events_per_core": GOAL_EVENTS_PER_CORE,
        "meets_goal": per_core >= GOAL_EVENTS_PER_CORE,
    }


# -- producer settings -------------------------------------------------------------------------------
class _WireBytes:
    """librdkafka's statistics callback: bytes sent to the brokers (``txbytes``)."""

    def __init__(self) -> None:
        self.txbytes = 0
        self.lock = threading.Lock()

    def __call__(self, text: str) -> None:
        stats = json.loads(text)
        total = sum(int(broker.get("txbytes", 0)) for broker in stats.get("brokers", {}).values())
        with self.lock:
            self.txbytes = max(self.txbytes, total)


def _settled(wire: _WireBytes, batches: _Batches) -> int:
    """``txbytes`` once librdkafka has reported everything sent so far: statistics are emitted
    every 100 ms and delivered by the next poll, which a commit of one offset record does (its few
    hundred bytes are within the figures' rounding)."""
    time.sleep(0.3)
    batches.commit()
    return wire.txbytes


def _produce_prebuilt(
    kafka: dict[str, Any], records: list[Record], *, max_batch: int, overrides: dict[str, Any]
) -> dict[str, float]:
    prefix = f"benchp{uuid.uuid4().hex[:8]}"
    wire = _WireBytes()
    settings = {**overrides, "statistics.interval.ms": 100, "stats_cb": wire}
    topic = f"{prefix}.shop.customers"
    ensure_topics(kafka, [TopicSpec(topic)])
    records = [record._replace(topic=topic) for record in records]
    batches = _Batches(kafka, prefix, max_batch, overrides=settings)
    try:
        for record in records[:200]:  # warm up
            batches.send([record])
        batches.commit()
        wire_before = _settled(wire, batches)
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        for record in records:
            batches.send([record])
        batches.commit()
        cpu = time.process_time() - started_cpu
        wall = time.perf_counter() - started_wall
        wire_after = _settled(wire, batches)
    finally:
        batches.close()
    count = len(records)
    return {
        "cpu_us_per_record": cpu / count * 1e6,
        "records_per_wall_second": count / wall,
        "wire_bytes_per_record": (wire_after - wire_before) / count,
    }


def run_producer_settings(services: Services, count: int, rounds: int) -> dict[str, Any]:
    """Producer settings and commit intervals on the same prebuilt records."""
    kafka = services.kafka
    builder = _builder("benchp")
    records = [record for change in insert_changes(count) for record in builder.build_change(change)]
    payload_bytes = statistics.mean(record.size for record in records)
    default_batch = ConnectorConfig.from_properties({"topic.prefix": "x"}).max_batch_size
    variants: list[tuple[str, dict[str, Any], int]] = []
    for compression in ("none", "lz4", "zstd", "snappy", "gzip"):
        variants.append((f"compression.type={compression}", {"compression.type": compression}, default_batch))
    for linger in (0, 5, 20, 100):
        variants.append((f"linger.ms={linger}", {"linger.ms": linger}, default_batch))
    for size in (16_384, 131_072, 1_000_000):
        variants.append((f"batch.size={size}", {"batch.size": size}, default_batch))
    for batch in (512, 2048, 8192):
        variants.append((f"max.batch.size={batch}", {}, batch))
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _, _ in variants}
    for round_number in range(rounds):
        order = variants if round_number % 2 == 0 else list(reversed(variants))
        for name, overrides, batch in order:
            results[name].append(_produce_prebuilt(kafka, records, max_batch=batch, overrides=overrides))
    table = {}
    for name, _, _ in variants:
        runs = results[name]
        table[name] = {key: round(statistics.median(run[key] for run in runs), 1) for key in runs[0]}
    return {
        "records": count,
        "rounds": rounds,
        "record_bytes_mean": round(payload_bytes),
        "defaults": {
            key: DEFAULT_PRODUCER_CONFIG[key] for key in ("compression.type", "linger.ms", "batch.size")
        },
        "default_max_batch_size": default_batch,
        "variants": table,
    }


def report_build_and_produce(figures: dict[str, Any]) -> list[str]:
    return [
        f"{figures['events']} insert events of ~1 KB documents (~{figures['event_bytes_mean']} bytes "
        f"per record with schema), committed every {figures['max_batch_size']} with an offset record",
        f"CPU per event: {figures['cpu_us_per_event']} us = build {figures['build_cpu_us_per_event']} "
        f"+ produce {figures['produce_cpu_us_per_event']}",
        f"(c) events per core-second (build + exactly-once produce): "
        f"{figures['events_per_core_second']} (goal >= {figures['goal_events_per_core']}: "
        f"{'met' if figures['meets_goal'] else 'NOT met'}; best round "
        f"{figures['events_per_core_second_best_round']}); wall: "
        f"{figures['events_per_wall_second']} events/s using {figures['cpu_cores_busy']} cores",
    ]


def report_producer_settings(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"{figures['records']} prebuilt records (~{figures['record_bytes_mean']} bytes), "
        f"exactly-once writer; defaults {figures['defaults']}, max.batch.size "
        f"{figures['default_max_batch_size']}; median of {figures['rounds']} rounds",
        f"{'setting':28} {'CPU us/record':>14} {'records/s wall':>15} {'wire bytes/record':>18}",
    ]
    for name, row in figures["variants"].items():
        lines.append(
            f"{name:28} {row['cpu_us_per_record']:>14} {row['records_per_wall_second']:>15.0f} "
            f"{row['wire_bytes_per_record']:>18.0f}"
        )
    return lines
