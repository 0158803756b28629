"""A transactional writer killed (SIGKILL) with its transaction open: what a killed window, snapshot
chunk or operator action leaves on the offsets topic until its ``transactional.id`` is taken over
(``init_transactions`` aborts it) or the broker times it out (``transaction.timeout.ms``)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_KILLED_WRITER = """
import json, sys
from airflow_provider_mongocdc.core.events.schema import Record
from airflow_provider_mongocdc.core.kafka.writer import TransactionalWriter
kafka, transactional_id, records = json.loads(sys.argv[1])
writer = TransactionalWriter(kafka, transactional_id)
writer.begin()
writer.send([Record(topic, key.encode(), None if value is None else value.encode()) for topic, key, value in records])
writer.flush()
print("open", flush=True)
sys.stdin.read()  # until killed (or the test's end closes stdin)
"""


@contextmanager
def killed_writer(
    kafka_config: dict[str, Any], transactional_id: str, records: list[tuple[str, bytes, bytes | None]]
) -> Iterator[None]:
    """Within the block, a transaction of ``transactional_id`` holding ``records`` (topic, key,
    value) is open and its writer is dead."""
    payload = [
        (topic, key.decode(), None if value is None else value.decode()) for topic, key, value in records
    ]
    process = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, json.dumps([kafka_config, transactional_id, payload])],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout.readline().strip() == "open", "the killed writer did not open its transaction"
        process.kill()
        process.wait(timeout=60)
        yield
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=60)
