"""The scheduler creates a missing connector pool with one slot, so no task of the provider waits for it.

Airflow never queues a task whose pool does not exist, and a task cannot create one; the scheduler
can. Each time a DAG run starts, this plugin's listener (:func:`on_dag_run_running`) creates the
missing pool of every waiting task of :data:`OPERATORS` (by ``TaskInstance.operator``) with one
slot and the description ``MongoDB CDC connector <name>: one snapshot or window at a time``, and
logs one INFO line per pool created. A pool that exists is never changed. A pool created meanwhile
by someone else is ignored and any other error is logged, so the scheduler goes on. Task processes
load the plugin too but never call the listener: nothing is imported at module level beyond the
plugin base class and ``hookimpl``. Registered through the ``airflow.plugins`` entry point and
``get_provider_info()["plugins"]``. Why, what "waiting" means, limits: docs/design.md, "Connector
pools".
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
OPERATORS = (
    "MongoSnapshotOperator",
    "MongoStreamWindowOperator",
    "MongoResnapshotOperator",
    "MongoDeltaApplyOperator",
    "MongoTableApplyOperator",
)
# The DAG ids of airflow_provider_mongocdc.core.base.dag_ids with a pool: mongocdc_hourly and
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
