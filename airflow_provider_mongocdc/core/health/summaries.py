"""A task's run summary (its XCom ``return_value``) as the MongoDB CDC page shows it: the fields the
page reads, each coerced to its type, anything else dropped.

A summary is written by the window and snapshot tasks, but Airflow's REST API lets any user who may
edit a DAG create or change its XCom entries, so what is read back is untrusted input: a count that
is not a count is shown as unknown (None), an operation or collection name that is not a string is
left out, a time that is not an ISO time is unknown. The page escapes whatever it shows as well
(:mod:`airflow_provider_mongocdc.plugins.health_page`); this keeps the JSON API's values typed and
the chart's arithmetic safe.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso

# Longest text kept of a summary's string field (a snapshot id, a mode, an action, a name).
TEXT_KEPT = 200
# Most entries kept of a summary's count table (events per operation, documents per collection).
ENTRIES_KEPT = 200


def as_mapping(value: Any) -> Mapping[str, Any]:
    """A summary as a mapping: a JSON object (also when stored as its text), else empty."""
    if isinstance(value, (str, bytes)):
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, Mapping) else {}


def count(value: Any) -> int | None:
    """A non-negative whole number, or None (booleans, texts, fractions and negatives are not counts)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        return None
    return int(value) if value >= 0 else None


def seconds(value: Any) -> float | None:
    """A non-negative finite duration in seconds, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def text(value: Any) -> str | None:
    """A string, cut to :data:`TEXT_KEPT` characters, or None."""
    if not isinstance(value, str):
        return None
    return value if len(value) <= TEXT_KEPT else value[: TEXT_KEPT - 1] + "…"


def iso_time(value: Any) -> str | None:
    """An ISO 8601 time (normalised to UTC, ``Z``), or None."""
    if not isinstance(value, str):
        return None
    try:
        moment = parse_iso(value)
    except ValueError:
        return None
    return iso_z(moment) if moment is not None else None


def counts(value: Any) -> dict[str, int] | None:
    """A table of counts by name (string keys, count values; other entries dropped), or None."""
    if not isinstance(value, Mapping):
        return None
    table: dict[str, int] = {}
    for key, number in value.items():
        kept = count(number)
        if isinstance(key, str) and kept is not None and len(table) < ENTRIES_KEPT:
            table[text(key) or ""] = kept
    return table


WINDOW_FIELDS = {
    "events": ("events", count),
    "events_by_op": ("events_by_op", counts),
    "window_end": ("window_end", iso_time),
    "app_duration_s": ("duration_s", seconds),
}
SNAPSHOT_FIELDS = {
    "snapshot_id": ("snapshot_id", text),
    "documents": ("documents", count),
    "documents_by_collection": ("collections", counts),
    "action": ("action", text),
    "app_duration_s": ("duration_s", seconds),
}


def summary_fields(summary: Any, fields: Mapping[str, tuple[str, Any]]) -> dict[str, Any]:
    """``{name: coerce(summary[key])}`` for each ``name: (key, coerce)`` of ``fields``."""
    found = as_mapping(summary)
    return {name: coerce(found.get(key)) for name, (key, coerce) in fields.items()}


def window_summary(summary: Any) -> dict[str, Any]:
    """What the page shows of a window task's summary."""
    return summary_fields(summary, WINDOW_FIELDS)


def snapshot_summary(summary: Any) -> dict[str, Any]:
    """What the page shows of a snapshot or re-snapshot task's summary (``mode``: a re-snapshot's)."""
    found = summary_fields(summary, SNAPSHOT_FIELDS)
    resnapshot = as_mapping(summary).get("resnapshot")
    if resnapshot is not None:
        found["mode"] = text(as_mapping(resnapshot).get("mode"))
    return found
