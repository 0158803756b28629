"""Metrics of the snapshot and window tasks and the oplog gap sensor, sent through Airflow's Stats.

Each metric goes out twice, like Airflow's own metrics with ``legacy_names_on``: under its name with
the tag ``connector=<topic.prefix>`` (backends with tags) and under ``<name>.<topic.prefix>`` (plain
StatsD drops tags). Counters: ``mongocdc.window.events``, ``mongocdc.window.bytes``,
``mongocdc.snapshot.documents``, ``mongocdc.snapshot.bytes``, ``mongocdc.oplog.gap_detected`` (1 per
check that found a purged position). Gauges: ``mongocdc.window.lag_ms`` (a window's largest lag,
processing time minus cluster time) and ``mongocdc.oplog.headroom_hours`` (hours before the oldest
stored position is purged at the current oplog rate). The README's table says what each measures.

With metrics off they cost nothing; a failure to send a metric is logged and never fails the task.
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
