"""Helpers of the oplog gap tests: OplogGapSensor as a DAG declares it, and the first event of an
OplogGapTrigger."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from airflow_provider_mongocdc.sensors.oplog_gap import OplogGapSensor
from airflow_provider_mongocdc.triggers.oplog_gap import OplogGapTrigger


def sensor(props: dict[str, Any], ids: dict[str, str], **kwargs: Any) -> OplogGapSensor:
    """The sensor of the connector ``props`` with the connections ``ids`` (see the
    ``gap_connections`` fixture), in reschedule mode unless ``kwargs`` say otherwise."""
    kwargs = {"mode": "reschedule", "poke_interval": 60, "timeout": 300, **kwargs}
    return OplogGapSensor(
        task_id="detect_gap",
        connector_config=json.dumps(props),
        mongo_conn_id=ids["mongo"],
        kafka_conn_id=ids["kafka"],
        **kwargs,
    )


def first_event(trigger: OplogGapTrigger, timeout: float = 120.0) -> dict[str, Any]:
    """The payload of the first event ``trigger`` yields, waited for at most ``timeout`` seconds."""

    async def first():
        async for event in trigger.run():
            return event.payload

    return asyncio.run(asyncio.wait_for(first(), timeout))
