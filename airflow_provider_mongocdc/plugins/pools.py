"""The scheduler creates a missing connector pool with one slot, so no task of the provider waits for it.

Airflow 3.3 never queues a task whose pool does not exist: the task stays *scheduled*, with one
scheduler log line ("Tasks using non-existent pool ... will not be scheduled") and no DAG warning.
A task cannot create its pool (Airflow 3 task processes have no metadata database and the Task SDK
has no pool calls), but the scheduler can: this plugin's listener runs in the scheduler process
(``airflow scheduler``, also under ``airflow standalone``) and, each time a DAG run starts
(``on_dag_run_running``, called by the scheduler in the transaction that moves queued runs to
running, before it queues their tasks), creates the pool of every waiting task of the provider's
operators (:data:`OPERATORS`, by ``TaskInstance.operator``) whose pool does not exist:

* with **1 slot** (one snapshot or window of a connector at a time) and the description
  ``MongoDB CDC connector <name>: one snapshot or window at a time`` (the connector is read from the
  DAG id of :func:`airflow_provider_mongocdc.dags.dag_ids`; other DAGs are named instead);
* a pool that exists is never changed: its size is the user's (``airflow pools set <pool> <slots>``);
* one INFO line in the scheduler log per pool created.

"Waiting" means not started yet (no state, *scheduled*, *up_for_retry*, *up_for_reschedule*) in a
queued or running DAG run, of any DAG: so the start of any run also recreates the pool of a task
whose pool was deleted while its own run was already running (a task cleared or retried in a
running run: the scheduler reports no event for it), for example at the connector's watchdog run
every 10 minutes. Limit: until some DAG run starts, such a task waits.

The insert ignores a pool created meanwhile by someone else (another scheduler, ``airflow pools
set``), so it cannot fail the scheduler's transaction; any other error is logged (the scheduler
goes on; Airflow also catches listener errors) and the run's tasks wait for the pool as before.
Task processes load the plugin too (Airflow loads plugins everywhere) but never call the listener;
nothing here is imported at module level beyond the plugin base class.

The plugin is registered twice, as OpenLineage's is: through the ``airflow.plugins`` entry point
(always loaded) and in ``get_provider_info()["plugins"]`` (loaded only with
``[core] lazy_discover_providers = False``, where Airflow skips the second registration by name).
"""

from __future__ import annotations

import logging
import re
import sys
from typing import TYPE_CHECKING, Any

from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

log = logging.getLogger(__name__)

SLOTS = 1
# The provider's operators that run in a connector's pool, as Airflow records them in
# TaskInstance.operator (the class name). The re-snapshot operator subclasses the snapshot operator.
OPERATORS = ("MongoSnapshotOperator", "MongoStreamWindowOperator", "MongoResnapshotOperator")
# The DAG ids of airflow_provider_mongocdc.dags.dag_ids with a pool: mongocdc_hourly and
# mongocdc_resnapshot for the connector "default", mongocdc_<name>_hourly / _resnapshot otherwise.
_CONNECTOR_DAG = re.compile(r"^mongocdc(?:_(?P<name>\w+?))?_(?:hourly|resnapshot)$")


def connector_of(dag_id: str) -> str | None:
    """The connector name of a DAG id built by the connector DAG factory, else None."""
    match = _CONNECTOR_DAG.match(dag_id)
    if not match:
        return None
    return match.group("name") or "default"


def pool_description(dag_ids: list[str]) -> str:
    for dag_id in sorted(dag_ids):
        if (name := connector_of(dag_id)) is not None:
            return f"MongoDB CDC connector {name}: one snapshot or window at a time"
    return f"MongoDB CDC tasks of DAG {sorted(dag_ids)[0]}: one snapshot or window at a time"


def missing_pools(session: Session) -> dict[str, list[str]]:
    """``{pool: [dag_id, ...]}`` of the waiting tasks of :data:`OPERATORS` whose pool does not exist."""
    from airflow.models.dagrun import DagRun
    from airflow.models.pool import Pool
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.state import DagRunState, TaskInstanceState
    from sqlalchemy import and_, exists, or_, select

    waiting = (
        TaskInstanceState.SCHEDULED,
        TaskInstanceState.UP_FOR_RETRY,
        TaskInstanceState.UP_FOR_RESCHEDULE,
    )
    rows = session.execute(
        select(TaskInstance.pool, TaskInstance.dag_id)
        .join(DagRun, and_(DagRun.dag_id == TaskInstance.dag_id, DagRun.run_id == TaskInstance.run_id))
        .where(
            # The run that is starting is still queued in the database (the scheduler's session
            # does not flush before it calls the listener).
            DagRun.state.in_((DagRunState.QUEUED, DagRunState.RUNNING)),
            TaskInstance.operator.in_(OPERATORS),
            or_(TaskInstance.state.is_(None), TaskInstance.state.in_(waiting)),
            TaskInstance.pool != Pool.DEFAULT_POOL_NAME,
            ~exists().where(Pool.pool == TaskInstance.pool),
        )
        .distinct()
    ).all()
    pools: dict[str, list[str]] = {}
    for pool, dag_id in rows:
        pools.setdefault(pool, []).append(dag_id)
    return pools


def insert_pool(session: Session, name: str, description: str) -> bool:
    """Insert the pool with :data:`SLOTS` slots unless a pool of that name exists (also one inserted
    concurrently); True when this call created it. The session is not committed."""
    from airflow.models.pool import Pool

    values = {"pool": name, "slots": SLOTS, "description": description, "include_deferred": False}
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        from sqlalchemy.dialects.postgresql import insert

        statement: Any = insert(Pool.__table__).values(values).on_conflict_do_nothing()
    elif dialect == "sqlite":
        from sqlalchemy.dialects.sqlite import insert

        statement = insert(Pool.__table__).values(values).on_conflict_do_nothing()
    elif dialect == "mysql":
        from sqlalchemy.dialects.mysql import insert

        # INSERT IGNORE: a duplicate name inserts nothing (0 rows).
        statement = insert(Pool.__table__).values(values).prefix_with("IGNORE")
    else:
        from sqlalchemy import insert

        statement = insert(Pool.__table__).values(values)
    return session.execute(statement).rowcount == 1


def create_missing_pools(session: Session) -> list[str]:
    """Create every missing pool of the provider's waiting tasks; the names created."""
    created = []
    for pool, dag_ids in sorted(missing_pools(session).items()):
        description = pool_description(dag_ids)
        if insert_pool(session, pool, description):
            created.append(pool)
            log.info(
                "Created the pool %r with %d slot (%s) for the tasks of %s: it did not exist, and Airflow "
                "does not queue a task whose pool does not exist. Size it with: airflow pools set %s "
                '<slots> "%s"',
                pool,
                SLOTS,
                description,
                ", ".join(sorted(set(dag_ids))),
                pool,
                description,
            )
    return created


@hookimpl
def on_dag_run_running(dag_run, msg: str):
    """A DAG run starts (in the scheduler): create the missing pools of the provider's waiting tasks."""
    try:
        from sqlalchemy.orm import object_session

        session = object_session(dag_run)
        if session is not None:
            # The scheduler's own transaction: committed with the run's start, before it queues tasks.
            create_missing_pools(session)
        else:
            from airflow.utils.session import create_session

            with create_session() as own:
                create_missing_pools(own)
    except Exception:
        log.exception(
            "MongoDB CDC could not create the missing pools of the tasks of %s run %s; tasks whose pool "
            "does not exist stay scheduled until it exists. Create it: airflow pools set <pool> 1 "
            '"MongoDB CDC connector <name>"',
            getattr(dag_run, "dag_id", "?"),
            getattr(dag_run, "run_id", "?"),
        )


class MongoCdcPoolsPlugin(AirflowPlugin):
    """Creates a missing connector pool (one slot) when a DAG run starts (scheduler listener)."""

    name = "mongocdc_pools"
    listeners = [sys.modules[__name__]]
