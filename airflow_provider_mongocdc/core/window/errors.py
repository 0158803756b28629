"""The error of a window that did not reach its end: the server's cluster time stalled before an
end that lies in the past (what MongoDB's errors mean for a stream: :mod:`~airflow_provider_mongocdc.core.mongo.stream_errors`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.errors import MongoCdcError
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.window.params import MONGODB_NOOP_INTERVAL_S, WindowParams
from airflow_provider_mongocdc.core.window.summary import StopReason


class WindowEndNotReachedError(MongoCdcError):
    """A window went idle before its end although the end lies in the past: the server's cluster
    time did not move for ``idle_timeout_s``. What was read is committed; the task fails so that
    Airflow retries it (the retry continues from the committed offset)."""


def end_not_reached_error(
    summary: Mapping[str, Any], params: WindowParams
) -> WindowEndNotReachedError | None:
    """The error of a window (a stream's summary, or the merged summary of all streams) whose
    streams stalled before a window end in the past, or None when none did."""
    partitions = summary.get("partitions") or [summary]
    stalled = [item for item in partitions if item.get("stop_reason") == StopReason.CLUSTER_TIME_STALLED]
    if not stalled:
        return None
    where = "; ".join(
        f"stream {item['partition']} stayed at cluster time "
        f"{(item.get('end_position') or {}).get('time', 'unknown')} "
        f"after {item.get('events', 0)} events, read and committed"
        for item in stalled
    )
    return WindowEndNotReachedError(
        f"The stream window did not reach the window end {iso_z(params.window_end)}, which lies in the "
        f"past: MongoDB's cluster time did not move for {params.idle_timeout_s:g} s (idle_timeout_s) "
        f"before the end: {where}; the interval is not complete",
        cause=f"an idle MongoDB replica set writes a periodic no-op to its oplog every "
        f"{MONGODB_NOOP_INTERVAL_S} s (periodicNoopIntervalSecs), so its cluster time should have "
        "passed the end: the replica set has no primary taking writes or is stalled, its periodic "
        "no-op writer is off, or its clock runs behind the clock of this worker",
        fix="check the replica set (rs.status(): a primary and recent optimes) and that the MongoDB "
        "servers and the Airflow and Spark workers agree on the time (NTP); the task's retry (or the "
        "next run) continues from the committed offset",
    )
