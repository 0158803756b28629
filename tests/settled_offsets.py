"""Reading a connector's offsets in tests right after something committed them.

Kafka answers a transaction's commit before it has written the commit markers into the
partitions, and a read_committed reader stops at the last stable offset until they are there: a
read in the milliseconds after a commit (a window run in this process, an offset just written, a
lease just taken) can miss that commit. The product's runs do not meet this, because they create
their transactional writer (whose initialisation waits for the earlier transaction of the same
``transactional.id``) before they read; a test that only reads waits for the markers instead.
"""

from __future__ import annotations

from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from devtools.kafka.reading import wait_stable

# Bounds a read of the offsets topic (a broker round trip) on a loaded machine.
READ_TIMEOUT_S = 120.0


class SettledOffsetStore(OffsetStore):
    """An :class:`OffsetStore` whose reads first wait until no transaction holds the offsets topic
    back (:func:`devtools.kafka.reading.wait_stable`, bounded; an open transaction of a killed run
    is then read past as before)."""

    def __init__(self, kafka_config, topic: str, *, read_timeout_s: float = READ_TIMEOUT_S, **kwargs):
        super().__init__(kafka_config, topic, read_timeout_s=read_timeout_s, **kwargs)

    def read_records(self):
        wait_stable(self.kafka_config["bootstrap.servers"], self.topic)
        return super().read_records()
