"""Who may see what on the MongoDB CDC page and its JSON API (docs/operations.md, "Who sees what").

Airflow's auth manager decides, as for its own pages: a connector is shown to a user who may read
all of its DAGs, their task instances and their XComs (the page shows runs, durations and the
tasks' summaries, which are XComs). Within a shown connector's row, the pool's tasks of DAGs the
user may not read are counted, not named. An invalid entry of the connector list is told to the
users who may read the DAG standing for it (``mongocdc_invalid_<name>``); what keeps the whole list
from being read (its path on the server among it) only to users who may read Airflow's
configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# What a user must be allowed to read of each DAG of a connector (besides the DAG itself).
ENTITIES = ("TASK_INSTANCE", "XCOM")
LIST_HIDDEN = (
    "The connector list could not be read; users who may read Airflow's configuration see why "
    "(and the DAG import errors tell it)"
)


@dataclass(frozen=True)
class ListError:
    """A problem of the connector list: ``dag_id`` the invalid entry's DAG, None for the list."""

    text: str
    dag_id: str | None = None


def dag_teams(dag_ids: Sequence[str]) -> Mapping[str, str | None]:
    """The team of each DAG (Airflow's multi-team mode; None without)."""
    from airflow.models.dag import DagModel

    return DagModel.get_dag_id_to_team_name_mapping(list(dag_ids)) if dag_ids else {}


class Access:
    """One user's rights, asked of ``manager`` (Airflow's auth manager) once per DAG and request."""

    def __init__(
        self, user: Any, manager: Any, teams: Callable[[Sequence[str]], Mapping[str, Any]] = dag_teams
    ):
        self.user = user
        self.manager = manager
        self.teams = teams
        self._readable: dict[str, bool] = {}

    def readable_dags(self, dag_ids: Iterable[str]) -> set[str]:
        """Those of ``dag_ids`` whose DAG, task instances and XComs the user may read."""
        from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity, DagDetails

        dag_ids = set(dag_ids)
        unknown = sorted(dag_ids - set(self._readable))
        if unknown:
            teams = self.teams(unknown)
            by_team: dict[Any, set[str]] = {}
            for dag_id in unknown:
                by_team.setdefault(teams.get(dag_id), set()).add(dag_id)
            allowed: set[str] = set()
            for team, group in by_team.items():
                allowed |= self.manager.filter_authorized_dag_ids(
                    dag_ids=group, user=self.user, method="GET", team_name=team
                )
            for dag_id in unknown:
                details = DagDetails(id=dag_id, team_name=teams.get(dag_id))
                self._readable[dag_id] = dag_id in allowed and self.manager.batch_is_authorized_dag(
                    [
                        {"method": "GET", "access_entity": DagAccessEntity[entity], "details": details}
                        for entity in ENTITIES
                    ],
                    user=self.user,
                )
        return {dag_id for dag_id in dag_ids if self._readable[dag_id]}

    def connectors(self, connectors: Iterable[Any]) -> list[Any]:
        """The connectors all of whose DAGs the user may read (see :meth:`readable_dags`)."""
        connectors = list(connectors)
        readable = self.readable_dags(
            dag_id for connector in connectors for dag_id in connector.dag_ids.values()
        )
        return [connector for connector in connectors if set(connector.dag_ids.values()) <= readable]

    def reads_configuration(self) -> bool:
        return bool(self.manager.is_authorized_configuration(method="GET", user=self.user))

    def list_errors(self, errors: Sequence[ListError]) -> list[str]:
        """The problems of the connector list this user may be told."""
        shown: list[str] = []
        entries = self.readable_dags(error.dag_id for error in errors if error.dag_id)
        for error in errors:
            if error.dag_id is None:
                text = error.text if self.reads_configuration() else LIST_HIDDEN
                if text not in shown:
                    shown.append(text)
            elif error.dag_id in entries:
                shown.append(error.text)
        return shown

    def pool_tasks(self, record: dict[str, Any]) -> dict[str, Any]:
        """``record`` with its pool's tasks of DAGs the user may not read counted, not named."""
        pool = record.get("pool")
        tasks = (pool or {}).get("tasks")
        if not tasks:
            return record
        readable = self.readable_dags(task["dag_id"] for task in tasks)
        kept = [task for task in tasks if task["dag_id"] in readable]
        pool["tasks"] = kept
        pool["other_tasks"] = len(tasks) - len(kept)
        return record
