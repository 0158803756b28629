"""Helpers of the stream window tests: connector settings, seeding the offset, running the Spark
application, reading topics, failing the connector's commands on the server, and waiting for the
server's cluster time to pass a second."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bson.timestamp import Timestamp
from pymongo import MongoClient

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.jobspec import JobSpec
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.mongo.connection import connection_details
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.core.window.streams import plan_streams
from devtools.kafka.reading import SETTLE_S, read_topic
from tests.settled_offsets import READ_TIMEOUT_S, SettledOffsetStore
from tests.spark_submit import AppRun, run_app
from tests.topic_records import DebeziumRecord, unwrapped

SPARK_TIMEOUT_S = 240


def connector(prefix: str, database: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Connector properties capturing every collection of ``database`` (and ``extra``)."""
    props = {
        "topic.prefix": prefix,
        "collection.include.list": f"{database}\\..*",
        "provide.transaction.metadata": True,
    }
    props.update(extra or {})
    return props


def seed_offset(
    uri: str, kafka: dict[str, Any], props: dict[str, Any]
) -> tuple[OffsetStore, OffsetPartition]:
    """Store the stream's current position as the offset (what a completed snapshot hands over)."""
    config = ConnectorConfig.from_properties(props)
    (target,) = plan_streams(connection_details({"connection_string": uri}), config)
    store = SettledOffsetStore(kafka, config.offsets_topic)
    store.ensure_topic()
    partition = OffsetPartition(config.topic_prefix, target.partition)
    with MongoClient(uri, serverSelectionTimeoutMS=20000) as client:
        store.write(partition, OffsetState(position=current_position(client, config)))
    return store, partition


def write_spec(
    directory: Path,
    name: str,
    props: dict[str, Any],
    uri: str,
    kafka: dict[str, Any],
    window_end: datetime | Timestamp,
    **params: Any,
) -> tuple[Path, Path]:
    if isinstance(window_end, Timestamp):
        window_end = datetime.fromtimestamp(window_end.time, timezone.utc)
    spec = JobSpec(
        "stream_window",
        props,
        {"connection_string": uri},
        dict(kafka),
        {"window_end": window_end.isoformat(), **params},
    )
    return spec.write(directory / f"{name}.json"), directory / f"{name}-result.json"


def run_window_app(spark_submit: str, *spec: Any, **params: Any) -> AppRun:
    """The stream window application run by spark-submit on the job spec that :func:`write_spec`
    writes of ``spec`` (its arguments from ``directory`` to ``window_end``) and ``params``."""
    spec_path, result = write_spec(*spec, **params)
    return run_app(spark_submit, "stream_window", spec_path, result, timeout=SPARK_TIMEOUT_S)


@dataclass(frozen=True)
class Event(DebeziumRecord):
    topic: str
    key: Any
    payload: dict[str, Any] | None  # None: tombstone

    @property
    def after(self) -> Any:
        return json.loads(self.payload["after"]) if self.payload and self.payload.get("after") else None


def topic_events(bootstrap: str, topic: str, settle: float = SETTLE_S) -> list[Event]:
    """The committed records of a topic (read_committed), with the JSON envelope unwrapped
    (``settle``: see :func:`devtools.kafka.reading.read_topic`)."""
    return [
        Event(topic, unwrapped(record.key), unwrapped(record.value))
        for record in read_topic(bootstrap, topic, settle=settle)
    ]


def insert_at(collection, document: dict, **kwargs) -> Timestamp:
    """Insert and return the operation's cluster time."""
    with collection.database.client.start_session() as session:
        collection.insert_one(document, session=session, **kwargs)
        return session.operation_time


def write_time(client: MongoClient, operation) -> Timestamp:
    """Run ``operation(session)`` and return its cluster time."""
    with client.start_session() as session:
        operation(session)
        return session.operation_time


def next_second(ts: Timestamp) -> Timestamp:
    """The window end right after ``ts``: the next whole second."""
    return Timestamp(ts.time + 1, 0)


def pass_second(client: MongoClient, end: Timestamp, marker_db: str) -> Timestamp:
    """Write uncaptured markers until the server's cluster time is at or past ``end``; returns the
    marker's cluster time (so a window ending at ``end`` can close)."""
    deadline = time.monotonic() + max(0.0, end.time - time.time()) + 120
    while True:
        ts = insert_at(client[marker_db]["markers"], {"at": time.time()})
        if ts >= end:
            return ts
        assert time.monotonic() < deadline, f"cluster time did not reach {end}"
        time.sleep(max(0.05, min(1.0, end.time - time.time() + 0.05)))


@contextmanager
def failing_commands(
    client: MongoClient, mode: Any, commands: list[str], fail_point: str = "failCommand", **data: Any
) -> Iterator[None]:
    """Within the block, the server fails (or holds) the connector's ``commands`` as the fail
    point's ``data`` says, in ``mode`` (``"alwaysOn"``, ``{"times": n}``, ``{"skip": n}``,
    ``{"activationProbability": p}``). ``failCommand`` fails a command before it runs;
    ``failGetMoreAfterCursorCheckout`` fails the connector's getMores once their cursor is checked
    out, as a real failure there would (``commands`` does not apply to it)."""
    client.admin.command(
        "configureFailPoint",
        fail_point,
        mode=mode,
        data={"failCommands": commands, "appName": "airflow-provider-mongocdc", **data},
    )
    try:
        yield
    finally:
        client.admin.command("configureFailPoint", fail_point, mode="off")


def settled_after_kill(
    store: OffsetStore, partition: OffsetPartition, visible: Callable[[], int], timeout: float = 120
) -> tuple[OffsetState, int]:
    """After a run was killed: its stored offset and the number of events a read_committed
    consumer sees (``visible()``, read without waiting for stable topics), once they agree.

    The killed run's open transaction holds its topics' last stable offsets back until the next
    run's writer aborts it, so waiting for stable topics would not end; but the commit markers of
    its last committed transaction may still be on their way. So both are read again until the
    offset counts exactly the events on the topic; the bound is reached only when they never
    agree (the open transaction visible, or committed events without their offset).
    """
    plain = OffsetStore(store.kafka_config, store.topic, read_timeout_s=READ_TIMEOUT_S)
    deadline = time.monotonic() + timeout
    while True:
        state = plain.read(partition)
        seen = visible()
        if state is not None and state.events == seen:
            return state, seen
        assert time.monotonic() < deadline, (
            f"{timeout:.0f} s after the kill the topic still shows {seen} events while the stored "
            f"offset counts {state.events if state else 'no offset'}"
        )
        time.sleep(0.2)


def end_after_insert(collection, document: dict, marker_db: str) -> Timestamp:
    """Insert ``document`` and return the window end right after it (:func:`next_second`) once the
    server's cluster time has reached that end (:func:`pass_second`), so a window ending there can close."""
    end = next_second(insert_at(collection, document))
    pass_second(collection.database.client, end, marker_db)
    return end
