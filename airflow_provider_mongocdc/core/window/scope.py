"""What every part of one stream's window works on (:class:`StreamScope`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition
from airflow_provider_mongocdc.core.window.params import WindowParams


@dataclass(frozen=True)
class StreamScope:
    """One stream's window: the connector's configuration, the stream's offset partition and the
    replica set its events name (``source.rs`` of ``event.format=oplog``), the window's
    parameters, and the clock (epoch milliseconds) of the events' ``ts_ms``, of the lag and of
    whether the window end has passed."""

    config: ConnectorConfig
    partition: OffsetPartition
    replica_set: str
    params: WindowParams
    clock_ms: Callable[[], int]

    def describe(self) -> str:
        """The stream in words, as the window's log lines name it: ``connector default (topic
        prefix shop), stream rs0``."""
        return f"{self.config.in_words()}, stream {self.partition.rs}"
