"""The Delta and Iceberg tables on the MongoDB CDC page: each table's version and how far it is behind its
topic, a table that cannot be read as a problem in words, every value escaped."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from airflow_provider_mongocdc.core.health.probes import BEHIND_COUNTED
from airflow_provider_mongocdc.core.health.record import Reading
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.plugins.health_page import COLUMNS, rows

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 28, 12, 0, tzinfo=timezone.utc)


def record(**extra):
    return {
        "name": "shop",
        "status": "ok",
        "problems": [],
        "dag_ids": {"hourly": "h", "resnapshot": "r", "watchdog": "w"},
        "conn_ids": {"mongo": "m", "kafka": "k"},
        **extra,
    }


def test_each_table_shows_its_version_and_the_events_it_is_behind():
    # "Behind" is the committed records a next apply would read (counted from the table's position
    # to the last stable offset), not the offsets between them: commit markers are no events.
    tables = [
        {
            "collection": "shop.orders",
            "topic": "shop.shop.orders",
            "table": "/lake/shop/orders",
            "ends": {0: 124, 1: 41},
            "earliest": {0: 0, 1: 0},
            "behind": {"records": 5, "complete": True},
            "state": {"version": 7, "positions": {0: 115, 1: 40}, "committed_ms": 1_795_000_000_000},
        },
        {
            "collection": "shop.<script>alert(1)</script>",
            "topic": "t",
            "table": "/lake/x",
            "ends": {0: 9},
            "earliest": {0: 2},
            "behind": {"records": 6, "complete": True},
            "state": None,
        },
        {
            "collection": "shop.bad",
            "topic": "b",
            "table": "s3://b/x",
            "error": "Could not read. Cause: denied.",
        },
        {
            "collection": "shop.big",
            "topic": "g",
            "table": "/lake/shop/big",
            "ends": {0: 90_000},
            "earliest": {0: 0},
            "behind": {"records": BEHIND_COUNTED, "complete": False},
            "state": {"version": 1, "positions": {0: 3}, "committed_ms": None},
        },
    ]
    shown = record()
    add_tables(shown, "/lake", Reading(tables, NOW), NOW)
    part = shown["tables"]
    assert [(t["collection"], t["version"], t["behind"], t["behind_more"]) for t in part["tables"]] == [
        ("shop.orders", 7, 5, False),
        ("shop.<script>alert(1)</script>", None, 6, False),
        ("shop.bad", None, None, False),
        ("shop.big", 1, BEHIND_COUNTED, True),
    ]
    assert part["behind"] == 5 + 6 + BEHIND_COUNTED and part["behind_more"] is True
    assert part["tables"][0]["committed_at"] == "2026-11-18T11:06:40Z"
    assert shown["status"] == "warning" and shown["problems"] == ["Delta table of shop.bad: Could not read"]
    (row,) = rows([shown])
    assert "shop.<wbr>orders: version 7, 5 behind" in row and "not created yet, 6 behind" in row
    assert "shop.<wbr>big: version 1, more than 10\u00a0000 behind" in row
    assert "<script>alert" not in row and "&lt;script&gt;" in row
    assert row.count("<td>") == len(COLUMNS)


def misfit_table(collection: str, misfits: dict) -> dict:
    return {
        "collection": collection,
        "topic": f"shop.{collection}",
        "table": f"/lake/{collection.replace('.', '/')}",
        "ends": {0: 10},
        "earliest": {0: 0},
        "behind": {"records": 0, "complete": True},
        "state": {"version": 3, "positions": {0: 10}, "committed_ms": None, "misfits": misfits},
    }


def test_values_that_did_not_fit_a_declared_column_are_counted_marked_and_make_the_connector_warn():
    orders = misfit_table(
        "shop.orders",
        {
            "total": {"type": "double", "total": 3, "last_run": 1},
            "status": {"type": "string", "total": 0, "last_run": 0},
        },
    )
    fine = misfit_table("shop.customers", {"name": {"type": "string", "total": 0, "last_run": 0}})
    shown = record()
    add_tables(shown, "/lake", Reading([orders, fine], NOW), NOW)
    part = shown["tables"]
    by_name = {table["collection"]: table for table in part["tables"]}
    assert by_name["shop.orders"]["misfits"] == {
        "total": {"type": "double", "total": 3, "last_run": 1},
        "status": {"type": "string", "total": 0, "last_run": 0},
    }
    assert by_name["shop.orders"]["misfits_total"] == 3 and by_name["shop.customers"]["misfits_total"] == 0
    assert part["misfits"] == 3
    assert shown["status"] == "warning"
    assert shown["problems"] == [
        "Delta table of shop.orders: 3 value(s) of the column total did not fit double since the table "
        "was created, 1 in its last apply run (null in the column, kept in _doc)"
    ]
    (row,) = rows([shown])
    assert 'data-collection="shop.orders"' in row and 'data-misfits="3"' in row
    assert "⚠ total: 3 values did not fit double, 1 in the last run" in row
    assert 'data-collection="shop.customers" data-version="3" data-behind="0" data-misfits="0"' in row
    assert row.count("⚠") == 1  # the table without misfits has no mark

    # A connector in error stays in error; its misfits are added to its problems.
    broken = record(status="error", problems=["Kafka: the offsets could not be read: down"])
    add_tables(broken, "/lake", Reading([orders], NOW), NOW)
    assert broken["status"] == "error" and len(broken["problems"]) == 2


def test_a_connector_without_tables_says_so_and_an_unreadable_read_is_a_problem():
    (row,) = rows([record()])
    assert 'none (no "tables" or "delta" key)' in row
    shown = record(status="error")
    add_tables(shown, "s3://lake", Reading(None, NOW, "Kafka is down"), NOW)
    assert shown["status"] == "error" and shown["problems"] == ["Tables: could not be read: Kafka is down"]
