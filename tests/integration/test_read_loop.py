"""A stream window's read loop (core/window/read_loop.py) against the MongoDB simulator (or
MONGOCDC_TEST_MONGODB_URI) and the real Kafka broker: the stop it returns, the position to store
with it, and what its batch then commits."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

import pytest
from pymongo import MongoClient

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.offsets.model import Position, position_time
from airflow_provider_mongocdc.core.window.batch import BatchSender, WindowBatch
from airflow_provider_mongocdc.core.window.params import WindowParams
from airflow_provider_mongocdc.core.window.read_loop import ReadLoop
from airflow_provider_mongocdc.core.window.scope import StreamScope
from airflow_provider_mongocdc.core.window.streams import offset_partition
from airflow_provider_mongocdc.core.window.summary import StopReason
from tests.integration.window_helpers import (
    connector,
    end_after_insert,
    insert_at,
    next_second,
    pass_second,
    topic_events,
)
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration


@contextmanager
def read_loop(
    client: MongoClient, kafka_config: dict, config: ConnectorConfig, start: Position, params: WindowParams
) -> Iterator[tuple[ReadLoop, SettledOffsetStore]]:
    """The read loop of a window from ``start``, with its batch, and the offsets topic."""
    store = SettledOffsetStore(kafka_config, config.offsets_topic)
    store.ensure_topic()
    scope = StreamScope(config, offset_partition(config, "rs0"), "rs0", params, clock_ms=lambda: 0)
    with TransactionalWriter(kafka_config, f"{config.topic_prefix}-window") as writer:
        batch = WindowBatch(scope, BatchSender(writer, kafka_config, {store.topic}), store)
        batch.begin(None, start)
        loop = ReadLoop(scope, client, batch, policy=BackoffPolicy.from_config(config), sleep=lambda _: None)
        loop.position = start
        yield loop, store


def test_the_loop_returns_end_reached_with_the_end_as_the_position_to_store(
    mongodb_uri, kafka_config, kafka_bootstrap, unique_name
):
    db_name = unique_name[:40]
    config = ConnectorConfig.from_properties(connector(unique_name, db_name))
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        start = current_position(client, config)
        client[db_name].orders.insert_many([{"_id": 1}, {"_id": 2}])
        end = end_after_insert(client[db_name].orders, {"_id": 3}, f"{db_name}_m")
        insert_at(client[db_name].orders, {"_id": 4})  # at or past the end
        params = WindowParams(datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60)
        with read_loop(client, kafka_config, config, start, params) as (loop, store):
            reason, final = loop.read()
            loop.batch.commit(final, last=True)

    assert (reason, final) == (StopReason.END_REACHED, Position(cluster_time=end))
    assert loop.invalidated_at is None and loop.reconnects == 0
    events = topic_events(kafka_bootstrap, f"{unique_name}.{db_name}.orders")
    assert [int(event.key["id"]) for event in events] == [1, 2, 3]
    assert store.read(loop.batch.scope.partition).position == Position(cluster_time=end)


def test_the_loop_returns_max_duration_at_the_first_change_once_its_time_is_up(
    mongodb_uri, kafka_config, unique_name
):
    db_name = unique_name[:40]
    config = ConnectorConfig.from_properties(connector(unique_name, db_name))
    with MongoClient(mongodb_uri, serverSelectionTimeoutMS=20000) as client:
        start = current_position(client, config)
        inserted = insert_at(client[db_name].orders, {"_id": 1})
        end = next_second(inserted)
        pass_second(client, end, f"{db_name}_m")
        # A max duration of a microsecond is over before the stream's first answer arrives.
        params = WindowParams(
            datetime.fromtimestamp(end.time, timezone.utc), idle_timeout_s=60, max_duration_s=1e-6
        )
        with read_loop(client, kafka_config, config, start, params) as (loop, store):
            reason, final = loop.read()
            loop.batch.commit(final, last=True)

    assert reason == StopReason.MAX_DURATION
    assert position_time(final) < inserted, f"the position {final.describe()} lies past an unread change"
    assert loop.batch.tally.summary(1.0, reconnects=0)["events"] == 0
    state = store.read(loop.batch.scope.partition)
    assert (state.position, state.events, state.windows) == (final, 0, 1)
