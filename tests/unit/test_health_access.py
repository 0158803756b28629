"""Who sees what on the MongoDB CDC page and its API, and what a request may cost: the rights come
from Airflow's auth manager (here one that grants per DAG and per kind of DAG data, as FAB's or
Keycloak's can), the readings from caches that refresh at most every few seconds and share one
read among concurrent requests, in a bounded number of threads."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest
from fastapi.testclient import TestClient

from airflow_provider_mongocdc.connector_dags import Connector
from airflow_provider_mongocdc.core.health.probes import ReadingCache
from airflow_provider_mongocdc.plugins import health_api
from airflow_provider_mongocdc.plugins.health_access import LIST_HIDDEN, Access, ListError

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
WAIT_S = 120  # a generous bound for a thread to reach a point; nothing waits on time itself


class Rights:
    """An auth manager granting ``dags`` (DAG read), ``entities`` (per DAG: TASK_INSTANCE, XCOM) and
    the configuration as given: the calls the page makes of Airflow's auth manager."""

    def __init__(self, dags=(), entities=None, configuration=False):
        self.dags = set(dags)
        self.entities = entities or {dag: {"TASK_INSTANCE", "XCOM"} for dag in self.dags}
        self.configuration = configuration

    def filter_authorized_dag_ids(self, *, dag_ids, user, method="GET", team_name=None):
        return {dag_id for dag_id in dag_ids if dag_id in self.dags}

    def batch_is_authorized_dag(self, requests, *, user):
        return all(
            request["access_entity"].value in self.entities.get(request["details"].id, set())
            for request in requests
        )

    def is_authorized_configuration(self, *, method, user, details=None):
        return self.configuration


def connector(name: str) -> Connector:
    return Connector({"name": name, "config": {"topic.prefix": name}}, 0)


ORDERS, USERS = connector("orders"), connector("users")


def rights(**grants) -> Access:
    return Access("someone", Rights(**grants), teams=lambda dag_ids: {})


# -- rights ----------------------------------------------------------------------------------------------
def test_a_connector_is_shown_only_to_who_may_read_its_dags_task_instances_and_xcoms():
    orders = set(ORDERS.dag_ids.values())
    assert rights(dags=orders).connectors([ORDERS, USERS]) == [ORDERS]
    # DAG read alone is not enough: the page shows runs (task instances) and summaries (XComs).
    for entities in ({"TASK_INSTANCE"}, {"XCOM"}, set()):
        grants = {dag: entities for dag in orders}
        assert rights(dags=orders, entities=grants).connectors([ORDERS]) == []


def test_pool_tasks_of_dags_the_user_may_not_read_are_counted_not_named():
    record = {
        "pool": {
            "name": "shared",
            "exists": True,
            "slots": 1,
            "running": 1,
            "queued": 1,
            "tasks": [
                {"dag_id": "mongocdc_orders_hourly", "task_id": "window", "run_id": "r", "state": "running"},
                {"dag_id": "payroll_secret", "task_id": "pay", "run_id": "r", "state": "queued"},
            ],
        }
    }
    shown = rights(dags=set(ORDERS.dag_ids.values())).pool_tasks(record)
    assert [task["dag_id"] for task in shown["pool"]["tasks"]] == ["mongocdc_orders_hourly"]
    assert shown["pool"]["other_tasks"] == 1
    from airflow_provider_mongocdc.plugins.health_page import render_page

    html = render_page(
        [{"name": "orders", "pool": shown["pool"], "dag_ids": ORDERS.dag_ids}],
        generated_at=NOW,
        dag_id=None,
        list_errors=[],
        hidden=0,
        threshold_seconds=3600,
    )
    assert "payroll_secret" not in html and "1 task(s) of DAGs you may not read" in html


def test_list_problems_go_to_who_may_read_them():
    errors = [
        ListError("No connector list at /srv/airflow/secret/path.json"),
        ListError("connector entry #2 ('billing'): bad", "mongocdc_invalid_billing"),
    ]
    assert rights().list_errors(errors) == [LIST_HIDDEN]
    assert rights(dags={"mongocdc_invalid_billing"}).list_errors(errors) == [
        LIST_HIDDEN,
        "connector entry #2 ('billing'): bad",
    ]
    assert rights(configuration=True).list_errors(errors) == [
        "No connector list at /srv/airflow/secret/path.json"
    ]


@pytest.fixture
def airflow_rights(monkeypatch):
    """The plugin with the connector list [orders, users] and the given user's rights."""
    granted = {}

    monkeypatch.setattr(health_api, "connector_list", lambda: ([ORDERS, USERS], []))
    monkeypatch.setattr(
        health_api, "access", lambda user: Access(user, Rights(**granted), teams=lambda d: {})
    )
    monkeypatch.setattr(
        health_api,
        "gather_all",
        lambda connectors, refresh, now: [{"name": c.name, "dag_ids": c.dag_ids} for c in connectors],
    )
    return granted


def test_a_connector_the_user_may_not_read_is_answered_as_unknown(airflow_rights):
    airflow_rights["dags"] = set(ORDERS.dag_ids.values())
    assert health_api.connector_json("orders", "someone", False)["name"] == "orders"
    answers = []
    for name in ("users", "nosuch"):
        with pytest.raises(health_api.HTTPException) as refused:
            health_api.connector_json(name, "someone", False)
        answers.append((refused.value.status_code, refused.value.detail.replace(repr(name), "<name>")))
    assert answers[0] == answers[1] and answers[0][0] == 404, answers


def test_the_tab_of_a_dag_says_whether_it_is_hidden_or_of_no_connector(airflow_rights):
    # The user may read the users connector's hourly DAG (its tab is open) but not its task data.
    hourly = USERS.dag_ids["hourly"]
    airflow_rights.update(dags={hourly}, entities={hourly: set()})
    assert "belongs to a MongoDB CDC connector whose DAGs you may not read" in health_api.page_html(
        "someone", hourly, False
    )
    assert "belongs to no MongoDB CDC connector" in health_api.page_html("someone", "unrelated_dag", False)
    # A DAG the user may not read at all is not said to be a connector's.
    airflow_rights.update(dags=set(), entities={})
    assert "belongs to no MongoDB CDC connector" in health_api.page_html("someone", hourly, False)


def test_the_api_description_and_its_pages_need_a_login():
    with TestClient(health_api.app) as client:
        for path in ("/docs", "/redoc"):
            assert client.get(path).status_code == 404, path
        assert client.get("/openapi.json").status_code == 401


# -- what a request may cost -----------------------------------------------------------------------------
def test_refreshes_in_a_row_read_once_and_the_cache_forgets():
    clock = [0.0]
    reads = []
    cache = ReadingCache(60, refresh_s=5, max_entries=3, clock=lambda: clock[0], now=lambda: NOW)

    def read():
        reads.append(1)
        return len(reads)

    assert cache.get("k", read, refresh=True).value == 1
    for _ in range(20):
        assert cache.get("k", read, refresh=True).value == 1  # no older than 5 s: the same reading
    clock[0] += 5
    assert cache.get("k", read, refresh=True).value == 2
    for key in range(10):
        cache.get(("left", key), read)
    assert len(cache) == 3


def test_concurrent_refreshes_share_one_read():
    cache = ReadingCache(60, refresh_s=5, clock=lambda: 0.0, now=lambda: NOW)
    entered, release = threading.Event(), threading.Event()
    reads = []

    def read():
        reads.append(1)
        entered.set()
        assert release.wait(WAIT_S)
        return "read"

    results = []
    first = threading.Thread(target=lambda: results.append(cache.get("k", read, refresh=True).value))
    first.start()
    assert entered.wait(WAIT_S)
    others = [
        threading.Thread(target=lambda: results.append(cache.get("k", read, refresh=True).value))
        for _ in range(8)
    ]
    for thread in others:
        thread.start()
    release.set()
    for thread in [first, *others]:
        thread.join(WAIT_S)
    assert results == ["read"] * 9 and len(reads) == 1


def test_every_request_together_reads_in_a_bounded_number_of_threads(monkeypatch):
    lock, release = threading.Lock(), threading.Event()
    active, most = [0], [0]
    full = threading.Event()

    def gather(connector, *, refresh, now):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
            if active[0] >= health_api.PROBE_THREADS:
                full.set()
        assert release.wait(WAIT_S)
        with lock:
            active[0] -= 1
        return {"name": connector.name}

    monkeypatch.setattr(health_api, "gather", gather)
    many = [connector(f"c{index}") for index in range(health_api.PROBE_THREADS)]
    requests = [
        threading.Thread(target=health_api.gather_all, args=(many,), kwargs={"refresh": True, "now": NOW})
        for _ in range(4)
    ]
    for thread in requests:
        thread.start()
    assert full.wait(WAIT_S)
    release.set()
    for thread in requests:
        thread.join(WAIT_S)
    assert most[0] == health_api.PROBE_THREADS
