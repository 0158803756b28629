"""The Delta tables of a connector on the MongoDB CDC page: each table's version, how far it is
behind its topic and the values that did not fit its declared columns, built without I/O from what
the page read (the tables' application transactions, the topics' end offsets, the events counted
between them) and added to a connector's record (:func:`add_tables`).

"Behind" counts the events a next apply would read: the committed records between the position a
table records and its topic's last stable offset (commit markers and aborted records are not
events), at most :data:`~airflow_provider_mongocdc.core.health.probes.BEHIND_COUNTED`; beyond,
``behind_more`` says there are more. A misfit is a value of a declared column that did not fit its
type: the column is null there and the document keeps the value in ``_doc``; the apply counts them
per column (since the table was created and in its last run), and a table with misfits makes the
connector's status a warning that names the column.
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
from airflow_provider_mongocdc.core.health.summaries import count, text


def misfit_counts(value: Any) -> dict[str, dict[str, Any]]:
    """Per declared column: its type and the values that did not fit it, in total and in the last
    run (entries that are not such counts dropped)."""
    if not isinstance(value, Mapping):
        return {}
    found = {}
    for column, counts in value.items():
        if isinstance(column, str) and isinstance(counts, Mapping):
            found[column] = {
                "type": text(counts.get("type")),
                "total": count(counts.get("total")) or 0,
                "last_run": count(counts.get("last_run")) or 0,
            }
    return found


def table_row(table: Mapping[str, Any]) -> dict[str, Any]:
    """One table: collection, topic, location, version, last commit, positions, the events it is
    behind and its misfits per declared column."""
    state = table.get("state")
    ends = {str(p): int(o) for p, o in (table.get("ends") or {}).items()}
    positions = {str(p): o for p, o in ((state or {}).get("positions") or {}).items()}
    counted = table.get("behind") if isinstance(table.get("behind"), Mapping) else {}
    behind = count(counted.get("records"))
    misfits = misfit_counts((state or {}).get("misfits"))
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
        "behind_more": behind is not None and counted.get("complete") is False,
        "misfits": misfits,
        "misfits_total": sum(column["total"] for column in misfits.values()),
        "error": shown_error(table["error"]) if table.get("error") else None,
    }


def misfit_problem(row: Mapping[str, Any], column: str, counts: Mapping[str, Any]) -> str:
    """A column's misfits in words, for the connector's problems."""
    return (
        f"Delta table of {row['collection']}: {counts['total']} value(s) of the column {column} did not fit "
        f"{counts['type']} since the table was created, {counts['last_run']} in its last apply run "
        "(null in the column, kept in _doc)"
    )


def add_tables(
    record: dict[str, Any], location: str, reading: Reading[list[Mapping[str, Any]]], now: datetime
) -> None:
    """``record["tables"]`` from ``reading`` (the tables read, or the error), and its problems."""
    part: dict[str, Any] = {"location": location, "tables": [], **reading.meta(now)}
    problems = []
    if reading.error:
        problems.append(f"Tables: could not be read: {headline(reading.error)}")
    for table in reading.value or []:
        row = table_row(table)
        part["tables"].append(row)
        if row["error"]:
            problems.append(f"Delta table of {row['collection']}: {headline(row['error'])}")
        problems += [
            misfit_problem(row, column, counts)
            for column, counts in row["misfits"].items()
            if counts["total"]
        ]
    part["behind"] = sum(row["behind"] or 0 for row in part["tables"])
    part["behind_more"] = any(row["behind_more"] for row in part["tables"])
    part["misfits"] = sum(row["misfits_total"] for row in part["tables"])
    record["tables"] = part
    if problems:
        record["problems"] = [*(record.get("problems") or []), *problems]
        if record.get("status") != ERROR_STATUS:
            record["status"] = WARNING_STATUS
