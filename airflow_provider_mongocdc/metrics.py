"""Metrics of the snapshot and window tasks and the oplog gap sensor, sent through Airflow's Stats.

Airflow's metrics backend (StatsD, Datadog or OpenTelemetry, ``[metrics]`` in airflow.cfg) carries
them; with metrics off they cost nothing. Every metric is sent twice, like Airflow's own metrics
with ``legacy_names_on``: under its name with the tag ``connector=<topic.prefix>`` (for backends
with tags), and under ``<name>.<topic.prefix>`` (for plain StatsD, which drops tags).

=====================================  =======  ============================================
name                                   type     value
=====================================  =======  ============================================
``mongocdc.window.events``             counter  events a window wrote (data, tombstones, ...)
``mongocdc.window.bytes``              counter  bytes of the events a window wrote
``mongocdc.window.lag_ms``             gauge    a window's largest lag (processing time minus
                                                the change's cluster time), ms
``mongocdc.snapshot.documents``        counter  documents a snapshot copied
``mongocdc.snapshot.bytes``            counter  bytes of the read events a snapshot wrote
``mongocdc.oplog.headroom_hours``      gauge    hours before the oldest stored position is
                                                purged at the current oplog rate (sensor)
``mongocdc.oplog.gap_detected``        counter  1 each time the sensor finds a purged position
=====================================  =======  ============================================

A failure to send a metric never fails the task: it is logged and the run goes on.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

WINDOW_EVENTS = "mongocdc.window.events"
WINDOW_BYTES = "mongocdc.window.bytes"
WINDOW_LAG_MS = "mongocdc.window.lag_ms"
SNAPSHOT_DOCUMENTS = "mongocdc.snapshot.documents"
SNAPSHOT_BYTES = "mongocdc.snapshot.bytes"
OPLOG_HEADROOM_HOURS = "mongocdc.oplog.headroom_hours"
OPLOG_GAP_DETECTED = "mongocdc.oplog.gap_detected"


def _stats():
    try:
        from airflow.sdk.observability import stats
    except ImportError:  # Airflow 3.0: the shim module
        from airflow.stats import Stats as stats  # noqa: N813
    return stats


def _send(kind: str, name: str, value: float, connector: str) -> None:
    try:
        stats = _stats()
        send = getattr(stats, kind)
        per_connector = stats.normalize_name_for_stats(f"{name}.{connector}", log_warning=False)
        if kind == "incr":
            send(name, count=value, tags={"connector": connector})
            send(per_connector, count=value)
        else:
            send(name, value, tags={"connector": connector})
            send(per_connector, value)
    except Exception as error:  # metrics are best effort: never fail a run for them
        log.warning("Could not send the metric %s: %s", name, error)


def window_metrics(connector: str, summary: Mapping[str, Any]) -> None:
    """Metrics of one stream window's summary (nothing for a skipped window)."""
    if summary.get("status") == "skipped":
        return
    _send("incr", WINDOW_EVENTS, int(summary.get("events") or 0), connector)
    _send("incr", WINDOW_BYTES, int(summary.get("bytes") or 0), connector)
    lag = (summary.get("lag_ms") or {}).get("max")
    if lag is not None:
        _send("gauge", WINDOW_LAG_MS, float(lag), connector)


def snapshot_metrics(connector: str, summary: Mapping[str, Any]) -> None:
    """Metrics of one snapshot's summary (0 documents when there was nothing to copy)."""
    _send("incr", SNAPSHOT_DOCUMENTS, int(summary.get("documents") or 0), connector)
    _send("incr", SNAPSHOT_BYTES, int(summary.get("bytes") or 0), connector)


def oplog_metrics(connector: str, headroom_seconds: float | None, gap: bool) -> None:
    """Metrics of one oplog gap check: the smallest headroom, and a count when a gap was found."""
    if headroom_seconds is not None:
        _send("gauge", OPLOG_HEADROOM_HOURS, round(headroom_seconds / 3600.0, 3), connector)
    if gap:
        _send("incr", OPLOG_GAP_DETECTED, 1, connector)
