"""The Delta tables of a connector on the MongoDB CDC page: each table's version and how far it is
behind its topic, built without I/O from what the page read (the tables' application transactions,
the topics' end offsets) and added to a connector's record (:func:`add_tables`).

"Behind" counts the offsets between the position a table records and its topic's last stable
offset: the records a next apply would read (Kafka's commit markers included, so a table that
applied everything may show a few left until its next commit).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.health.record import (
    ERROR_STATUS,
    WARNING_STATUS,
    Reading,
    headline,
    shown_error,
)


def table_row(table: Mapping[str, Any]) -> dict[str, Any]:
    """One table: collection, topic, location, version, last commit, positions and what is behind."""
    state = table.get("state")
    ends = {str(p): int(o) for p, o in (table.get("ends") or {}).items()}
    earliest = {str(p): int(o) for p, o in (table.get("earliest") or {}).items()}
    positions = {str(p): o for p, o in ((state or {}).get("positions") or {}).items()}
    behind = sum(
        max(0, end - (positions.get(p) if positions.get(p) is not None else earliest.get(p, 0)))
        for p, end in ends.items()
    )
    committed = (state or {}).get("committed_ms")
    return {
        "collection": table.get("collection"),
        "topic": table.get("topic"),
        "table": table.get("table"),
        "version": None if state is None else state.get("version"),
        "committed_at": iso_z(datetime.fromtimestamp(committed / 1000, timezone.utc)) if committed else None,
        "positions": positions,
        "ends": ends,
        "behind": behind,
        "error": shown_error(table["error"]) if table.get("error") else None,
    }


def add_tables(
    record: dict[str, Any], location: str, reading: Reading[list[Mapping[str, Any]]], now: datetime
) -> None:
    """``record["tables"]`` from ``reading`` (the tables read, or the error), and its problems."""
    part: dict[str, Any] = {"location": location, "tables": [], **reading.meta(now)}
    problems = []
    if reading.error:
        problems.append(f"Delta tables: could not be read: {headline(reading.error)}")
    for table in reading.value or []:
        row = table_row(table)
        part["tables"].append(row)
        if row["error"]:
            problems.append(f"Delta table of {row['collection']}: {headline(row['error'])}")
    part["behind"] = sum(row["behind"] for row in part["tables"])
    record["tables"] = part
    if problems:
        record["problems"] = [*(record.get("problems") or []), *problems]
        if record.get("status") != ERROR_STATUS:
            record["status"] = WARNING_STATUS
