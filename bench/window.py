"""Stream windows against MongoDB (the simulator, or ``MONGOCDC_TEST_MONGODB_URI``) and Kafka.

(b) ``window``: exactly-once versus the same events produced without transactions.

* end to end: :func:`run_window` (``core/window``: fence, offset read, change stream, events and
  offset committed every ``max.batch.size``) versus the same change stream range read, built with
  the same :class:`EventBuilder` and sent by a plain idempotent producer (no transaction, no
  offset), flushed at the end. Rounds alternate the two sides.
* writer only: the same prebuilt records through :class:`TransactionalWriter` (commit with an
  offset record every ``max.batch.size``) versus a plain idempotent producer.
* what dominates: the time to only read the change stream range from the server, and the CPU time
  to build its events, measured in the same run.

(e) ``scaling``: window wall time against the collection size at a fixed number of changes
(updates, whose full document the server looks up) and against the number of changes at a fixed
collection size, with a least-squares line (fixed cost per window + cost per change).
"""

from __future__ import annotations

import contextlib
import datetime
import random
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from bson.timestamp import Timestamp
from confluent_kafka import Producer

import airflow_provider_mongocdc.core.window.stream_window as window_module
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.kafka.admin import TopicSpec, ensure_topics
from airflow_provider_mongocdc.core.kafka.client import DEFAULT_PRODUCER_CONFIG
from airflow_provider_mongocdc.core.mongo.change_stream import current_position, open_stream
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import (
    OffsetPartition,
    OffsetState,
    Position,
    token_cluster_time,
)
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.stream_window import run_window
from airflow_provider_mongocdc.core.window.streams import StreamTarget, plan_streams
from bench.events import make_document
from bench.produce import _Batches
from bench.services import Services, operation_time, pass_second

GOAL_EOS_RATIO = 0.6
BATCH_SIZES = (512, 2048, 8192)
POLL_MS = 200


def connector(prefix: str, database: str, **extra: Any) -> ConnectorConfig:
    props = {"topic.prefix": prefix, "collection.include.list": f"{database}\\..*"}
    props.update(extra)
    return ConnectorConfig.from_properties(props)


def target_of(services: Services, config: ConnectorConfig) -> StreamTarget:
    (target,) = plan_streams(connection_details({"connection_string": services.mongodb_uri}), config)
    return target


def seed(services: Services, config: ConnectorConfig, position: Position) -> StreamTarget:
    """Store ``position`` as the connector's offset (what a completed snapshot hands over)."""
    target = target_of(services, config)
    store = OffsetStore(services.kafka, config.offsets_topic, read_timeout_s=30)
    store.ensure_topic()
    store.write(OffsetPartition(config.topic_prefix, target.partition), OffsetState(position=position))
    return target


def window_end_after(services: Services, client, last: Timestamp, marker_db: str) -> datetime.datetime:
    """The whole second after ``last``, once the server's cluster time has passed it."""
    end = Timestamp(last.time + 1, 0)
    pass_second(client, end, marker_db)
    return datetime.datetime.fromtimestamp(end.time, datetime.timezone.utc)


def params(window_end: datetime.datetime) -> WindowParams:
    return WindowParams(window_end=window_end, idle_timeout_s=30, poll_ms=POLL_MS)


@contextlib.contextmanager
def _writer_start_timer(spent: list[float]):
    """Measure how long the window's writer takes to start (``init_transactions``): librdkafka
    retries the transaction coordinator lookup on a fixed 500 ms timer, so this part of a window's
    fixed cost is either ~0.05 s or ~0.5 s and would hide the per-change cost of small windows."""
    original = window_module.TransactionalWriter

    def timed(*args: Any, **kwargs: Any):
        started = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - started)

    window_module.TransactionalWriter = timed
    try:
        yield
    finally:
        window_module.TransactionalWriter = original


def timed_window(
    services: Services, config: ConnectorConfig, target: StreamTarget, window_end: datetime.datetime
) -> dict[str, Any]:
    writer_start: list[float] = []
    started_cpu, started = time.process_time(), time.perf_counter()
    with _writer_start_timer(writer_start):
        summary = run_window(target, config, services.kafka, params(window_end))
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "cpu_s": time.process_time() - started_cpu,
        "writer_start_s": sum(writer_start),
        "net_s": wall - sum(writer_start),
        "events": summary["events"],
        "batches": summary["batches_committed"],
        "stop_reason": summary["stop_reason"],
    }


def read_range(
    services: Services,
    config: ConnectorConfig,
    start: Position,
    window_end: datetime.datetime,
    on_change: Callable[[Any], None],
) -> int:
    """Read the change stream from ``start`` up to ``window_end`` (exclusive) as a window does."""
    end = Timestamp(int(window_end.timestamp()), 0)
    count = 0
    with services.client() as client:
        with open_stream(client, config, start, max_await_time_ms=POLL_MS) as stream:
            while True:
                change = stream.try_next()
                if change is None:
                    cluster_time = token_cluster_time(stream.resume_token)
                    if cluster_time is not None and cluster_time >= end:
                        return count
                    continue
                if change["clusterTime"] >= end:
                    return count
                on_change(change)
                count += 1


def plain_producer(kafka: dict[str, Any]) -> tuple[Producer, list[int]]:
    """An idempotent, non-transactional producer with the writer's throughput settings and a
    delivery callback like the writer's; returns it and its [delivered, failed] counters."""
    counters = [0, 0]

    def delivered(error, _message) -> None:
        counters[0 if error is None else 1] += 1

    settings = {
        key: value for key, value in DEFAULT_PRODUCER_CONFIG.items() if key != "transaction.timeout.ms"
    }
    settings.update(kafka)
    settings.update({"enable.idempotence": True, "acks": "all", "on_delivery": delivered})
    return Producer(settings), counters


def produce_all(producer: Producer, records) -> None:
    produce = producer.produce
    for record in records:
        while True:
            try:
                produce(record.topic, value=record.value, key=record.key)
                break
            except BufferError:
                producer.poll(0.1)
    producer.poll(0)


def timed_plain_window(
    services: Services, config: ConnectorConfig, start: Position, window_end: datetime.datetime
) -> dict[str, Any]:
    """The same change range, built and produced without transactions or offsets."""
    started_cpu, started = time.process_time(), time.perf_counter()
    builder = EventBuilder(config, replica_set="rs0")
    producer, counters = plain_producer(services.kafka)
    known: set[str] = set()

    def on_change(change) -> None:
        records = builder.build_change(change)
        topics = {record.topic for record in records} - known
        if topics:
            ensure_topics(services.kafka, [TopicSpec(name) for name in topics])
            known.update(topics)
        produce_all(producer, records)

    events = read_range(services, config, start, window_end, on_change)
    produce_all(producer, builder.finish())
    remaining = producer.flush(60)
    if remaining or counters[1]:
        raise RuntimeError(f"the plain producer lost events ({remaining} pending, {counters[1]} failed)")
    return {
        "wall_s": time.perf_counter() - started,
        "cpu_s": time.process_time() - started_cpu,
        "events": events,
    }


def insert_documents(
    client, database: str, collection: str, documents: list[dict[str, Any]], batch: int = 500
) -> Timestamp:
    last = None
    for index in range(0, len(documents), batch):
        chunk = documents[index : index + batch]
        last = operation_time(
            client,
            lambda s, chunk=chunk: client[database][collection].insert_many(chunk, ordered=True, session=s),
        )
    return last


# -- (b) ---------------------------------------------------------------------------------------------
def run_eos(services: Services, changes: int, rounds: int) -> dict[str, Any]:
    database = f"benchb{uuid.uuid4().hex[:8]}"
    rng = random.Random(5)
    documents = [make_document(rng, index) for index in range(changes)]
    with services.client() as client:
        probe = connector(f"{database}x", database)
        start = current_position(client, probe)
        last = insert_documents(client, database, "customers", documents)
        after = current_position(client, probe)  # past the last change, before the end
        window_end = window_end_after(services, client, last, f"{database}_markers")

    eos, plain = [], []
    for round_number in range(rounds):
        sides = ("eos", "plain") if round_number % 2 == 0 else ("plain", "eos")
        for side in sides:
            config = connector(f"{database}{side}{round_number}", database)
            if side == "eos":
                target = seed(services, config, start)
                eos.append(timed_window(services, config, target, window_end))
            else:
                plain.append(timed_plain_window(services, config, start, window_end))
    for run in eos + plain:
        if run["events"] != changes:
            raise RuntimeError(f"a window saw {run['events']} events, expected {changes}")

    # The commit interval: the same range with max.batch.size 512 / 2048 / 8192.
    by_batch: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    for round_number in range(rounds):
        order = BATCH_SIZES if round_number % 2 == 0 else tuple(reversed(BATCH_SIZES))
        for size in order:
            config = connector(f"{database}mb{size}r{round_number}", database, **{"max.batch.size": size})
            run = timed_window(services, config, seed(services, config, start), window_end)
            by_batch[size].append(run["wall_s"])

    # The fixed cost of a window: the same end, started after the last change (nothing to read).
    empty = []
    for round_number in range(rounds):
        config = connector(f"{database}empty{round_number}", database)
        empty.append(timed_window(services, config, seed(services, config, after), window_end))

    # What dominates: reading only, and building only (CPU), on the same range.
    read_wall, read_cpu, captured = [], [], []
    for _ in range(rounds):
        captured.clear()
        started_cpu, started = time.process_time(), time.perf_counter()
        read_range(services, connector(f"{database}r", database), start, window_end, captured.append)
        read_wall.append(time.perf_counter() - started)
        read_cpu.append(time.process_time() - started_cpu)
    builder = EventBuilder(connector(f"{database}w", database), replica_set="rs0")
    build_cpu = []
    records = []
    for _ in range(rounds):
        started_cpu = time.process_time()
        records = [record for change in captured for record in builder.build_change(change)]
        build_cpu.append(time.process_time() - started_cpu)

    writer = writer_comparison(
        services, records, max(rounds, 5), connector(f"{database}w", database).max_batch_size
    )
    eos_wall = statistics.median(run["wall_s"] for run in eos)
    plain_wall = statistics.median(run["wall_s"] for run in plain)
    read_s = statistics.median(read_wall)
    empty_s = statistics.median(run["wall_s"] for run in empty)
    return {
        "changes": changes,
        "rounds": rounds,
        "eos_window_s": round(eos_wall, 3),
        "eos_window_events_per_s": round(changes / eos_wall),
        "eos_window_cpu_s": round(statistics.median(run["cpu_s"] for run in eos), 3),
        "eos_batches": eos[0]["batches"],
        "plain_s": round(plain_wall, 3),
        "plain_events_per_s": round(changes / plain_wall),
        "plain_cpu_s": round(statistics.median(run["cpu_s"] for run in plain), 3),
        "ratio_end_to_end": round(plain_wall / eos_wall, 3),
        "eos_events_per_s_by_max_batch_size": {
            size: round(changes / statistics.median(times)) for size, times in by_batch.items()
        },
        "empty_window_s": round(empty_s, 3),
        "empty_window_writer_start_s": round(statistics.median(run["writer_start_s"] for run in empty), 3),
        "eos_writer_start_s": round(statistics.median(run["writer_start_s"] for run in eos), 3),
        "eos_events_per_s_after_fixed_cost": round(changes / max(1e-9, eos_wall - empty_s)),
        "read_only_s": round(read_s, 3),
        "read_only_events_per_s": round(changes / read_s),
        "read_only_client_cpu_s": round(statistics.median(read_cpu), 3),
        "build_cpu_s": round(statistics.median(build_cpu), 3),
        "read_share_of_eos_window": round(read_s / eos_wall, 2),
        "writer": writer,
        "goal_ratio": GOAL_EOS_RATIO,
        "meets_goal_end_to_end": plain_wall / eos_wall >= GOAL_EOS_RATIO,
        "meets_goal_writer": writer["ratio"] >= GOAL_EOS_RATIO,
    }


def writer_comparison(services: Services, records, rounds: int, max_batch: int) -> dict[str, Any]:
    """The same prebuilt records: exactly-once writer (commit with an offset record every
    ``max.batch.size``: the configured one, and 512 / 2048 / 8192) versus a plain idempotent
    producer; the sides take turns in every round."""
    kafka = services.kafka
    sides = ["plain", *sorted({max_batch, *BATCH_SIZES})]
    times: dict[Any, list[float]] = {side: [] for side in sides}
    for round_number in range(rounds):
        for side in sides if round_number % 2 == 0 else list(reversed(sides)):
            prefix = f"benchw{uuid.uuid4().hex[:8]}"
            topic = f"{prefix}.shop.customers"
            ensure_topics(kafka, [TopicSpec(topic)])
            batch = [record._replace(topic=topic) for record in records]
            if side != "plain":
                batches = _Batches(kafka, prefix, side)
                try:
                    batches.send([batch[0]])  # warm up: connection, partition in the transaction
                    batches.commit()
                    started = time.perf_counter()
                    for record in batch:
                        batches.send([record])
                    batches.commit()
                    times[side].append(time.perf_counter() - started)
                finally:
                    batches.close()
            else:
                producer, counters = plain_producer(kafka)
                produce_all(producer, batch[:1])  # warm up: connection, producer id
                producer.flush(30)
                started = time.perf_counter()
                produce_all(producer, batch)
                remaining = producer.flush(60)
                times[side].append(time.perf_counter() - started)
                if remaining or counters[1]:
                    raise RuntimeError("the plain producer lost records")
    plain_s = statistics.median(times["plain"])
    eos_s = statistics.median(times[max_batch])
    return {
        "records": len(records),
        "max_batch_size": max_batch,
        "rounds": rounds,
        "eos_records_per_s": round(len(records) / eos_s),
        "plain_records_per_s": round(len(records) / plain_s),
        "ratio": round(plain_s / eos_s, 3),
        "ratio_by_max_batch_size": {
            side: round(plain_s / statistics.median(values), 3)
            for side, values in times.items()
            if side != "plain"
        },
    }


# -- (e) ---------------------------------------------------------------------------------------------
def _updates(client, database: str, collection: str, size: int, count: int, seed_value: int) -> Timestamp:
    rng = random.Random(seed_value)
    coll = client[database][collection]
    last = None
    with client.start_session() as session:
        for number in range(count):
            coll.update_one(
                {"_id": rng.randrange(size)}, {"$set": {"v": number, "at": time.time()}}, session=session
            )
        last = session.operation_time
    return last


def _fit(points: list[tuple[int, float]]) -> dict[str, float]:
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.mean(xs), statistics.mean(ys)
    sxx = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / sxx
    intercept = mean_y - slope * mean_x
    total = sum((y - mean_y) ** 2 for y in ys)
    residual = sum((y - (intercept + slope * x)) ** 2 for x, y in points)
    return {
        "ms_per_change": round(slope * 1000, 3),
        "fixed_s": round(intercept, 3),
        "r2": round(1 - residual / total, 4) if total else 1.0,
    }


def _scaled_window(
    services: Services, client, database: str, size: int, changes: int, seed_value: int
) -> dict[str, Any]:
    config = connector(f"{database}s{size}c{changes}r{seed_value}", database)
    start = current_position(client, config)
    last = _updates(client, database, "items", size, changes, seed_value)
    window_end = window_end_after(services, client, last, f"{database}_markers")
    target = seed(services, config, start)
    run = timed_window(services, config, target, window_end)
    if run["events"] != changes:
        raise RuntimeError(f"the window saw {run['events']} events, expected {changes}")
    started = time.perf_counter()
    read_range(services, config, start, window_end, lambda change: None)
    run["read_only_s"] = time.perf_counter() - started
    return run


def run_scaling(
    services: Services, sizes: list[int], counts: list[int], fixed_changes: int, fixed_size: int, rounds: int
) -> dict[str, Any]:
    database = f"benche{uuid.uuid4().hex[:8]}"
    by_size: dict[int, list[dict[str, Any]]] = {}
    by_count: dict[int, list[dict[str, Any]]] = {}
    with services.client() as client:
        loaded = 0
        for size in sorted(set(sizes) | {fixed_size}):
            # One collection grows; windows run at each size (documents of ~150 bytes).
            insert_documents(
                client,
                database,
                "items",
                [
                    {"_id": index, "v": 0, "name": f"item {index}", "pad": "x" * 100}
                    for index in range(loaded, size)
                ],
                batch=1000,
            )
            loaded = size
            for round_number in range(rounds):
                if size in sizes:
                    by_size.setdefault(size, []).append(
                        _scaled_window(services, client, database, size, fixed_changes, 100 + round_number)
                    )
                if size == fixed_size:
                    for count in counts:
                        by_count.setdefault(count, []).append(
                            _scaled_window(services, client, database, size, count, 200 + round_number)
                        )

    def summary(runs: list[dict[str, Any]]) -> dict[str, float]:
        return {
            "window_s": round(statistics.median(run["wall_s"] for run in runs), 3),
            "net_s": round(statistics.median(run["net_s"] for run in runs), 3),
            "read_only_s": round(statistics.median(run["read_only_s"] for run in runs), 3),
            "cpu_s": round(statistics.median(run["cpu_s"] for run in runs), 3),
        }

    size_table = {size: summary(runs) for size, runs in sorted(by_size.items())}
    count_table = {count: summary(runs) for count, runs in sorted(by_count.items())}
    windows = [row["window_s"] for row in size_table.values()]
    nets = [row["net_s"] for row in size_table.values()]
    return {
        "rounds": rounds,
        "fixed_changes": fixed_changes,
        "fixed_size": fixed_size,
        "by_collection_size": size_table,
        "size_spread": round(max(windows) / min(windows), 3),
        "net_size_spread": round(max(nets) / min(nets), 3) if min(nets) > 0 else None,
        "by_changes": count_table,
        "fit_window": _fit([(count, row["window_s"]) for count, row in count_table.items()]),
        "fit_net": _fit([(count, row["net_s"]) for count, row in count_table.items()]),
        "fit_read_only": _fit([(count, row["read_only_s"]) for count, row in count_table.items()]),
        "fit_cpu": _fit([(count, row["cpu_s"]) for count, row in count_table.items()]),
    }


def report_eos(figures: dict[str, Any]) -> list[str]:
    writer = figures["writer"]
    return [
        f"{figures['changes']} inserts of ~1 KB documents, median of {figures['rounds']} alternating rounds",
        f"exactly-once window (run_window): {figures['eos_window_s']} s = "
        f"{figures['eos_window_events_per_s']} events/s ({figures['eos_batches']} transactions, "
        f"{figures['eos_window_cpu_s']} s CPU in this process)",
        f"same range, plain idempotent producer: {figures['plain_s']} s = "
        f"{figures['plain_events_per_s']} events/s ({figures['plain_cpu_s']} s CPU)",
        f"(b) end to end ratio exactly-once / plain: {figures['ratio_end_to_end']} "
        f"(goal >= {figures['goal_ratio']}: {'met' if figures['meets_goal_end_to_end'] else 'NOT met'})",
        f"(b) writer only, {writer['records']} prebuilt records: exactly-once "
        f"{writer['eos_records_per_s']} records/s vs plain {writer['plain_records_per_s']} records/s, "
        f"ratio {writer['ratio']} (goal >= {figures['goal_ratio']}: "
        f"{'met' if figures['meets_goal_writer'] else 'NOT met'}); by max.batch.size: "
        + ", ".join(f"{size}: {ratio}" for size, ratio in writer["ratio_by_max_batch_size"].items()),
        "exactly-once window events/s by max.batch.size: "
        + ", ".join(
            f"{size}: {rate}" for size, rate in figures["eos_events_per_s_by_max_batch_size"].items()
        ),
        f"fixed cost of a window (same end, nothing to read): {figures['empty_window_s']} s, of which "
        f"the writer's start (init_transactions) {figures['empty_window_writer_start_s']} s; "
        f"exactly-once throughput past it: {figures['eos_events_per_s_after_fixed_cost']} events/s",
        f"what dominates: reading the range only takes {figures['read_only_s']} s "
        f"({figures['read_only_events_per_s']} events/s, {figures['read_share_of_eos_window']:.0%} of "
        f"the window; client CPU {figures['read_only_client_cpu_s']} s), building its events "
        f"{figures['build_cpu_s']} s CPU",
    ]


def report_scaling(figures: dict[str, Any]) -> list[str]:
    lines = [
        f"window wall time vs collection size, {figures['fixed_changes']} updates "
        f"(full document looked up), median of {figures['rounds']}:"
    ]
    for size, row in figures["by_collection_size"].items():
        lines.append(
            f"  {size:>7} documents: window {row['window_s']} s, without the writer's start "
            f"{row['net_s']} s, reading only {row['read_only_s']} s, CPU {row['cpu_s']} s"
        )
    lines.append(
        f"  spread (slowest / fastest): window {figures['size_spread']}, without the "
        f"writer's start {figures['net_size_spread']}"
    )
    lines.append(f"window wall time vs number of changes, {figures['fixed_size']} documents:")
    for count, row in figures["by_changes"].items():
        lines.append(
            f"  {count:>7} changes: window {row['window_s']} s, without the writer's "
            f"start {row['net_s']} s, CPU {row['cpu_s']} s, reading only {row['read_only_s']} s"
        )
    fit, net = figures["fit_window"], figures["fit_net"]
    read, cpu = figures["fit_read_only"], figures["fit_cpu"]
    lines.append(
        f"  linear fit, window wall: {fit['fixed_s']} s fixed + {fit['ms_per_change']} ms per "
        f"change (R^2 {fit['r2']}); without the writer's start: {net['fixed_s']} s + "
        f"{net['ms_per_change']} ms per change (R^2 {net['r2']})"
    )
    lines.append(
        f"  window CPU in this process: {cpu['fixed_s']} s + "
        f"{cpu['ms_per_change']} ms per change (R^2 {cpu['r2']}); reading only: "
        f"{read['fixed_s']} s + {read['ms_per_change']} ms per change (R^2 {read['r2']})"
    )
    return lines
