"""The Delta tables on the MongoDB CDC page: each table's version and how far it is behind its
topic, a table that cannot be read as a problem in words, every value escaped."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

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


def test_each_table_shows_its_version_and_what_it_is_behind():
    tables = [
        {
            "collection": "shop.orders",
            "topic": "shop.shop.orders",
            "table": "/lake/shop/orders",
            "ends": {0: 120, 1: 40},
            "earliest": {0: 0, 1: 0},
            "state": {"version": 7, "positions": {0: 115, 1: 40}, "committed_ms": 1_795_000_000_000},
        },
        {
            "collection": "shop.<script>alert(1)</script>",
            "topic": "t",
            "table": "/lake/x",
            "ends": {0: 9},
            "earliest": {0: 2},
            "state": None,
        },
        {
            "collection": "shop.bad",
            "topic": "b",
            "table": "s3://b/x",
            "error": "Could not read. Cause: denied.",
        },
    ]
    shown = record()
    add_tables(shown, "/lake", Reading(tables, NOW), NOW)
    part = shown["tables"]
    assert [(t["collection"], t["version"], t["behind"]) for t in part["tables"]] == [
        ("shop.orders", 7, 5),
        ("shop.<script>alert(1)</script>", None, 7),
        ("shop.bad", None, 0),
    ]
    assert part["tables"][0]["committed_at"] == "2026-11-18T11:06:40Z"
    assert shown["status"] == "warning" and shown["problems"] == ["Delta table of shop.bad: Could not read"]
    (row,) = rows([shown])
    assert "shop.orders: version 7, 5 behind" in row and "not created yet, 7 behind" in row
    assert "<script>alert" not in row and "&lt;script&gt;" in row
    assert row.count("<td>") == len(COLUMNS)


def test_a_connector_without_tables_says_so_and_an_unreadable_read_is_a_problem():
    (row,) = rows([record()])
    assert 'none (no "delta" key)' in row
    shown = record(status="error")
    add_tables(shown, "s3://lake", Reading(None, NOW, "Kafka is down"), NOW)
    assert shown["status"] == "error" and shown["problems"] == [
        "Delta tables: could not be read: Kafka is down"
    ]
