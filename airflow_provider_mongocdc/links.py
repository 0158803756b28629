"""Operator extra links shown on the provider's tasks in the Airflow UI."""

from __future__ import annotations

from urllib.parse import quote

from airflow.providers.common.compat.sdk import BaseOperatorLink, conf

from airflow_provider_mongocdc.core.base.dag_ids import RESNAPSHOT


def dag_url(dag_id: str) -> str:
    """The Airflow UI page of ``dag_id`` (``[api] base_url`` + ``/dags/<dag_id>``)."""
    base = conf.get("api", "base_url", fallback="/") or "/"
    return f"{base.rstrip('/')}/dags/{quote(dag_id, safe='')}"


class ResnapshotTriggerLink(BaseOperatorLink):
    """Opens the re-snapshot DAG in the Airflow UI, whose *Trigger* button shows its form
    (collections, reason, mode).

    Airflow 3.3's UI opens the trigger form from the DAG's page; it has no address that opens the
    form by itself. The DAG id is the operator's ``resnapshot_dag_id`` (default
    ``mongocdc_resnapshot``).
    """

    name = "Re-snapshot (trigger form)"

    def get_link(self, operator, *, ti_key) -> str:
        return dag_url(getattr(operator, "resnapshot_dag_id", None) or RESNAPSHOT)
