"""The MongoDB CDC page and its JSON API, mounted by the plugin at ``/mongocdc`` of the API server.

* ``GET /mongocdc/`` the page (``?dag_id=<a connector's DAG>``: that connector only);
* ``GET /mongocdc/api/connectors`` every connector the user may read, as JSON;
* ``GET /mongocdc/api/connectors/<name>`` one connector (404 unknown, 403 not readable).

Every endpoint takes the user as Airflow's own API does (:func:`airflow.api_fastapi.core_api.security.get_user`:
the JWT of the ``Authorization: Bearer`` header, else the UI's ``_token`` cookie; 401 without one,
403 for an invalid one), the OpenAPI description (``/mongocdc/openapi.json``) included, and shows a
connector only to a user whom Airflow's auth manager allows to read all of its DAGs, their task
instances and XComs (:mod:`airflow_provider_mongocdc.plugins.health_access`); a connector the user
may not read is answered as one that does not exist (404). ``?refresh=true`` takes what was read
less than :data:`~airflow_provider_mongocdc.core.health.probes.REFRESH_S` seconds ago instead of
:data:`OFFSETS_TTL_S` / :data:`PROBE_TTL_S`; concurrent requests share one read, and the reading
runs in the provider's own bounded threads, never in more than :data:`PROBE_THREADS` at once.

The connectors are those of the connector list (``MONGOCDC_CONNECTORS_FILE``, else
``mongocdc_connectors.json`` in ``[core] dags_folder``, as the example DAG file reads it); their
configuration and connections are read as the tasks read them (Variables, connections). What the
record holds and leaves out: :mod:`airflow_provider_mongocdc.core.health.record`.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.api_fastapi.app import get_auth_manager
from airflow.api_fastapi.core_api.security import GetUserDep
from fastapi import FastAPI, HTTPException, Request
from fastapi.exception_handlers import http_exception_handler
from fastapi.responses import HTMLResponse

from airflow_provider_mongocdc.connector_dags import (
    Connector,
    ConnectorEntryError,
    Taken,
    invalid_dag_id,
    load_connectors,
)
from airflow_provider_mongocdc.core.base.timefmt import iso_z
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.gap.headroom import HEADROOM_WARNING
from airflow_provider_mongocdc.core.health.probes import (
    ReadingCache,
    count_documents_left,
    probe_oplog,
    read_offsets,
)
from airflow_provider_mongocdc.core.health.record import (
    ConnectorIdentity,
    Reading,
    Sources,
    connector_record,
    other_owner_of,
    running_incremental,
    shown_error,
    utcnow,
)
from airflow_provider_mongocdc.core.health.summaries import snapshot_summary, window_summary
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.plugins.health_access import Access, ListError
from airflow_provider_mongocdc.plugins.health_page import render_login, render_page
from airflow_provider_mongocdc.plugins.health_tables import read_tables
from airflow_provider_mongocdc.plugins.health_urls import task_url, ui_url

CONNECTORS_FILE_ENV = "MONGOCDC_CONNECTORS_FILE"
CONNECTORS_FILE = "mongocdc_connectors.json"
# How long a read of the offsets topic, and a MongoDB probe, is shown before it is read again.
OFFSETS_TTL_S = 15.0
PROBE_TTL_S = 60.0
CHART_HOURS = 24
WINDOW_TASK, SNAPSHOT_TASK, RESNAPSHOT_TASK = "window", "snapshot", "resnapshot"
# Snapshot summaries of runs that copied nothing (snapshot.mode found nothing to do).
NO_COPY_ACTIONS = ("nothing", "record_position")

# Threads that build the responses, and that read Kafka, MongoDB and Airflow's database for them,
# shared by every request: a flood of requests waits here instead of holding the API server's
# threads or opening more connections.
REQUEST_THREADS = 4
PROBE_THREADS = 8

app = FastAPI(
    title="MongoDB CDC",
    description="Every MongoDB CDC connector's health: committed positions and lag, oplog headroom, "
    "the last window and snapshot, incremental snapshots, the lease and the pool.",
    # No page answers without a login: the OpenAPI description is served below, behind it.
    docs_url=None,
    redoc_url=None,
    openapi_url=None,
)
offsets_cache = ReadingCache(OFFSETS_TTL_S)
probe_cache = ReadingCache(PROBE_TTL_S)
request_threads = ThreadPoolExecutor(max_workers=REQUEST_THREADS, thread_name_prefix="mongocdc-request")
probe_threads = ThreadPoolExecutor(max_workers=PROBE_THREADS, thread_name_prefix="mongocdc-health")


# -- the connectors ---------------------------------------------------------------------------------
def connectors_file() -> Path:
    """The connector list: ``MONGOCDC_CONNECTORS_FILE``, else the one in the DAGs folder."""
    from airflow.configuration import conf

    given = os.environ.get(CONNECTORS_FILE_ENV)
    return Path(given) if given else Path(conf.get("core", "dags_folder")) / CONNECTORS_FILE


def connector_list() -> tuple[list[Connector], list[ListError]]:
    """The valid connectors of the list, and the words for what could not be read (an entry's
    with the DAG that stands for it, see :class:`~airflow_provider_mongocdc.plugins.health_access.ListError`)."""
    path = connectors_file()
    if not path.is_file():
        return [], [
            ListError(
                f"No connector list at {path}: set {CONNECTORS_FILE_ENV} on the API server to the "
                f"connector list file (or put {CONNECTORS_FILE} in the DAGs folder)"
            )
        ]
    try:
        entries = load_connectors(path)
    except (ConnectorEntryError, OSError) as error:
        return [], [ListError(shown_error(error))]
    connectors, errors, taken = [], [], Taken()
    for index, entry in enumerate(entries):
        try:
            connector = Connector(entry, index)
            taken.claim(connector)  # the DAG file refuses a repeated name or topic prefix likewise
        except ConnectorEntryError as error:
            dag_id = invalid_dag_id(entry, index)
            errors.append(
                ListError(f"{shown_error(error)} (not shown; the DAG {dag_id} stands for it)", dag_id)
            )
            continue
        connectors.append(connector)
    return connectors, errors


def identity(connector: Connector) -> tuple[ConnectorIdentity, ConnectorConfig | None]:
    """What the page needs of a connector, its configuration read as a task reads it."""
    conn_ids, config, error = dict(connector.conn_ids), None, None
    try:
        conn_ids = {kind: connector.conn_id(kind) for kind in connector.conn_ids}
        properties = json.loads(connector.connector_config())
        if not isinstance(properties, dict):
            raise ValueError("the connector configuration is not a JSON object")
        config = ConnectorConfig.from_properties(properties)
    except Exception as failure:  # shown in words
        error = shown_error(failure)
    return (
        ConnectorIdentity(
            name=connector.name,
            dag_ids=connector.dag_ids,
            conn_ids=conn_ids,
            pool=connector.pool,
            topic_prefix=config.topic_prefix if config else None,
            offsets_topic=config.offsets_topic if config else None,
            config_error=error,
            chunk_size=config.incremental_snapshot_chunk_size if config else 1024,
            change_driven=connector.changes is not None,
        ),
        config,
    )


# -- authorization ----------------------------------------------------------------------------------
def access(user) -> Access:
    """What ``user`` may see, as Airflow's auth manager says."""
    return Access(user, get_auth_manager())


# -- what Airflow knows: runs, pools, DAGs --------------------------------------------------------------
def _summaries(session, instances) -> dict[tuple[str, str, str], Any]:
    """The return values (run summaries) of task instances, by (dag_id, run_id, task_id)."""
    from airflow.models.xcom import XComModel
    from sqlalchemy import select, tuple_

    keys = {(ti.dag_id, ti.run_id, ti.task_id) for ti in instances}
    if not keys:
        return {}
    rows = session.scalars(
        select(XComModel).where(
            XComModel.key == "return_value",
            XComModel.map_index == -1,
            tuple_(XComModel.dag_id, XComModel.run_id, XComModel.task_id).in_(sorted(keys)),
        )
    )
    found = {}
    for row in rows:
        try:
            found[(row.dag_id, row.run_id, row.task_id)] = XComModel.deserialize_value(row)
        except Exception:  # an XCom that cannot be read is a summary not shown
            continue
    return found


def _run(ti, fields: Mapping[str, Any]) -> dict[str, Any]:
    """A task instance and the ``fields`` of its summary (coerced: :mod:`airflow_provider_mongocdc.core.health.summaries`).
    ``duration_s`` is the task's (as Airflow's grid shows it), ``app_duration_s`` the Spark
    application's, from its summary."""
    duration = None
    if ti.start_date and ti.end_date:
        duration = round((ti.end_date - ti.start_date).total_seconds(), 1)
    return {
        "dag_id": ti.dag_id,
        "run_id": ti.run_id,
        "task_id": ti.task_id,
        "state": str(ti.state) if ti.state is not None else None,
        "start_date": ti.start_date.isoformat() if ti.start_date else None,
        "end_date": ti.end_date.isoformat() if ti.end_date else None,
        "duration_s": duration,
        "log_url": task_url(ti.dag_id, ti.run_id, ti.task_id, ti.try_number),
        **fields,
    }


def read_runs(dag_ids: Mapping[str, str], now: datetime) -> dict[str, Any]:
    """The connector's last window, last snapshot and the windows of the last day."""
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import and_, or_, select

    hourly, resnapshot = dag_ids["hourly"], dag_ids["resnapshot"]
    with create_session() as session:
        windows = list(
            session.scalars(
                select(TI)
                .where(TI.dag_id == hourly, TI.task_id == WINDOW_TASK, TI.start_date.is_not(None))
                .order_by(TI.start_date.desc())
                .limit(200)
            )
        )
        day = [
            ti
            for ti in windows
            if ti.end_date is not None and ti.end_date >= now - timedelta(hours=CHART_HOURS)
        ]
        snapshots = list(
            session.scalars(
                select(TI)
                .where(
                    or_(
                        and_(TI.dag_id == hourly, TI.task_id == SNAPSHOT_TASK),
                        and_(TI.dag_id == resnapshot, TI.task_id == RESNAPSHOT_TASK),
                    ),
                    TI.start_date.is_not(None),
                )
                .order_by(TI.start_date.desc())
                .limit(50)
            )
        )
        summaries = _summaries(session, [*windows[:1], *day, *snapshots])
        last = windows[0] if windows else None
        return {
            "last_window": _run(last, window_summary(summaries.get((hourly, last.run_id, WINDOW_TASK))))
            if last
            else None,
            "last_snapshot": _last_snapshot(snapshots, summaries),
            "windows": _window_points(day, summaries),
        }


def _last_snapshot(snapshots, summaries: Mapping[tuple[str, str, str], Any]) -> dict[str, Any] | None:
    """The newest of ``snapshots`` (newest first) that copied documents or did not succeed; of the
    running ones, only a re-snapshot's counts (the hourly DAG's snapshot task is left out)."""
    for ti in snapshots:
        summary = snapshot_summary(summaries.get((ti.dag_id, ti.run_id, ti.task_id)))
        copied = summary["action"] not in (None, *NO_COPY_ACTIONS)
        unfinished = ti.state not in ("success", "skipped")
        if copied or (unfinished and (ti.task_id == RESNAPSHOT_TASK or ti.state != "running")):
            return _run(ti, summary)
    return None


def _window_points(day, summaries: Mapping[tuple[str, str, str], Any]) -> list[dict[str, Any]]:
    """The chart's points: each window of the last day, its end, events, state and run id."""
    points = []
    for ti in day:
        summary = window_summary(summaries.get((ti.dag_id, ti.run_id, WINDOW_TASK)))
        points.append(
            {
                "end": summary["window_end"] or ti.end_date.isoformat(),
                "events": summary["events"],
                "state": str(ti.state),
                "run_id": ti.run_id,
            }
        )
    return points


def read_pool(name: str) -> dict[str, Any]:
    """The pool's slots and the tasks that use them."""
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance as TI
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        stats = Pool.slots_stats(session=session).get(name)
        if stats is None:
            return {"exists": False, "note": "created with one slot when the connector's next run starts"}
        users = session.execute(
            select(TI.dag_id, TI.run_id, TI.task_id, TI.state, TI.try_number).where(
                TI.pool == name, TI.state.in_(("running", "queued", "deferred", "scheduled"))
            )
        ).all()
    total = stats["total"]
    return {
        "exists": True,
        "slots": None if total == float("inf") else int(total),
        "running": int(stats["running"]),
        "queued": int(stats["queued"]),
        "scheduled": int(stats["scheduled"]),
        "deferred": int(stats["deferred"]),
        "open": None if stats["open"] == float("inf") else int(stats["open"]),
        "tasks": [
            {
                "dag_id": dag_id,
                "run_id": run_id,
                "task_id": task_id,
                "state": str(state),
                "url": task_url(dag_id, run_id, task_id, try_number),
            }
            for dag_id, run_id, task_id, state, try_number in users
        ],
    }


def registered(dag_ids: Iterable[str]) -> tuple[frozenset[str], dict[str, bool]]:
    """The DAG ids known to Airflow, and whether each is paused."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        rows = session.execute(
            select(DagModel.dag_id, DagModel.is_paused).where(DagModel.dag_id.in_(list(dag_ids)))
        ).all()
    return frozenset(dag_id for dag_id, _ in rows), {dag_id: bool(paused) for dag_id, paused in rows}


# -- one connector's record -----------------------------------------------------------------------------
def gather(connector: Connector, *, refresh: bool, now: datetime) -> dict[str, Any]:
    """The health record of ``connector``: Kafka and MongoDB read through the caches."""
    from airflow_provider_mongocdc.hooks.kafka import KafkaConfigHook
    from airflow_provider_mongocdc.hooks.topology import MongoTopologyHook

    who, config = identity(connector)
    sources: dict[str, Any] = {}
    if config is not None:
        kafka_id, mongo_id = who.conn_ids["kafka"], who.conn_ids["mongo"]
        offsets = offsets_cache.get(
            ("offsets", kafka_id, config.offsets_topic, config.topic_prefix),
            lambda: read_offsets(KafkaConfigHook(kafka_id).get_kafka_config(), config),
            refresh=refresh,
        )
        sources["offsets"] = offsets
        if offsets.value is None:
            sources["oplog"] = Reading(None, offsets.as_of, "not checked: the offsets could not be read")
        elif other_owner_of(offsets.value, who) is None:  # another connector's positions: not probed
            view = offsets.value

            def details():
                return MongoTopologyHook.from_config(config, mongo_id).get_connection_details()

            sources["oplog"] = probe_cache.get(
                ("oplog", mongo_id, config.topic_prefix),
                lambda: probe_oplog(config, details(), view),
                refresh=refresh,
            )
            progress = running_incremental(view)
            if progress is not None:
                sources["documents_left"] = probe_cache.get(
                    ("left", mongo_id, config.topic_prefix, progress.request_id, progress.chunks),
                    lambda: count_documents_left(config, details(), view),
                    refresh=refresh,
                )
    sources["runs"] = Reading.of(lambda: read_runs(connector.dag_ids, now))
    sources["pool"] = Reading.of(lambda: read_pool(connector.pool))
    known = Reading.of(lambda: registered(connector.dag_ids.values()))
    if known.value is not None:
        sources["registered_dags"] = known.value[0]
    record = connector_record(
        who, Sources(**sources), now=now, headroom_threshold_seconds=HEADROOM_WARNING.total_seconds()
    )
    if connector.delta is not None and config is not None:
        kafka_id = who.conn_ids["kafka"]
        tables = probe_cache.get(
            ("tables", kafka_id, config.topic_prefix, connector.delta.location),
            lambda: read_tables(connector.delta, config, KafkaConfigHook(kafka_id).get_kafka_config()),
            refresh=refresh,
        )
        add_tables(record, connector.delta.location, tables, now)
    record["paused"] = known.value[1] if known.value is not None else None
    holder = record["lease"].get("task_instance")
    if holder:
        record["lease"]["url"] = task_url(holder["dag_id"], holder["run_id"], holder["task_id"])
    record["links"] = {kind: ui_url("dags", dag_id) for kind, dag_id in connector.dag_ids.items()} | {
        "resnapshot_form": ui_url("dags", connector.dag_ids["resnapshot"])
    }
    return record


def gather_all(connectors: list[Connector], *, refresh: bool, now: datetime) -> list[dict[str, Any]]:
    """The records of ``connectors`` at ``now``, read side by side in the shared probe threads (a
    slow server delays only its own row; every request together reads in :data:`PROBE_THREADS`)."""
    return list(probe_threads.map(lambda connector: gather(connector, refresh=refresh, now=now), connectors))


async def in_request_threads(work: Callable[[], Any]) -> Any:
    """``work()`` in the provider's request threads: the API server's own threads stay free."""
    return await asyncio.get_running_loop().run_in_executor(request_threads, work)


# -- the endpoints ----------------------------------------------------------------------------------------
@app.exception_handler(HTTPException)
async def _refusal(request: Request, error: HTTPException):
    """A refused request for the page gets a page saying how to log in; the API answers JSON."""
    if error.status_code in (401, 403) and request.scope.get("endpoint") is page:
        login = get_auth_manager().get_url_login(next_url=str(request.url))
        return HTMLResponse(
            render_login(error.status_code, str(error.detail), login), status_code=error.status_code
        )
    return await http_exception_handler(request, error)


def records_for(
    rights: Access, connectors: list[Connector], *, refresh: bool, now: datetime
) -> list[dict[str, Any]]:
    """The records of ``connectors`` as ``rights``' user may see them."""
    return [rights.pool_tasks(record) for record in gather_all(connectors, refresh=refresh, now=now)]


def page_html(user, dag_id: str | None, refresh: bool) -> str:
    connectors, errors = connector_list()
    rights = access(user)
    allowed = rights.connectors(connectors)
    shown = (
        [connector for connector in allowed if dag_id in connector.dag_ids.values()] if dag_id else allowed
    )
    # The DAG of the tab belongs to a connector the user may not read all of (but may read the DAG).
    hidden_dag = bool(
        dag_id
        and not shown
        and any(dag_id in connector.dag_ids.values() for connector in connectors)
        and _dag_readable(rights, dag_id)
    )
    now = utcnow()
    return render_page(
        records_for(rights, shown, refresh=refresh, now=now),
        generated_at=now,
        dag_id=dag_id,
        list_errors=rights.list_errors(errors),
        hidden=len(connectors) - len(allowed),
        threshold_seconds=HEADROOM_WARNING.total_seconds(),
        hidden_dag=hidden_dag,
    )


def _dag_readable(rights: Access, dag_id: str) -> set[str]:
    """``{dag_id}`` when the user may read the DAG itself (its tab is open), else empty."""
    return rights.manager.filter_authorized_dag_ids(dag_ids={dag_id}, user=rights.user, method="GET")


@app.get("/", response_class=HTMLResponse, summary="The MongoDB CDC page")
async def page(user: GetUserDep, dag_id: str | None = None, refresh: bool = False) -> HTMLResponse:
    return HTMLResponse(await in_request_threads(lambda: page_html(user, dag_id, refresh)))


def connectors_json(user, refresh: bool) -> dict[str, Any]:
    connectors, errors = connector_list()
    rights = access(user)
    now = utcnow()
    records = records_for(rights, rights.connectors(connectors), refresh=refresh, now=now)
    return {
        "connectors": records,
        "total_entries": len(records),
        "list_errors": rights.list_errors(errors),
        "generated_at": iso_z(now),
        "headroom_threshold_seconds": int(HEADROOM_WARNING.total_seconds()),
    }


@app.get("/api/connectors", summary="Every connector's health record (those the user may read)")
async def list_connectors(user: GetUserDep, refresh: bool = False) -> dict[str, Any]:
    return await in_request_threads(lambda: connectors_json(user, refresh))


def connector_json(name: str, user, refresh: bool) -> dict[str, Any]:
    connectors, _ = connector_list()
    rights = access(user)
    found = rights.connectors(connector for connector in connectors if connector.name == name)
    if not found:  # unknown and not readable alike: the answer does not tell whether it exists
        raise HTTPException(404, f"No connector {name!r} that you may read in the connector list")
    return records_for(rights, found, refresh=refresh, now=utcnow())[0]


@app.get("/api/connectors/{name}", summary="One connector's health record")
async def one_connector(name: str, user: GetUserDep, refresh: bool = False) -> dict[str, Any]:
    return await in_request_threads(lambda: connector_json(name, user, refresh))


@app.get("/openapi.json", include_in_schema=False)
async def openapi(user: GetUserDep) -> dict[str, Any]:
    """The API's OpenAPI description, for logged-in users only."""
    return app.openapi()
