"""Names shared with the example DAGs (``dags/mongocdc_connectors.py``), kept for imports from
earlier versions. The DAGs themselves are built by :mod:`airflow_provider_mongocdc.dags` from the
connector list ``dags/mongocdc_connectors.json``; see that module for the configuration of each
connector (its Variable or inline properties, connection ids, pool, schedule and tags)."""

from __future__ import annotations

from airflow_provider_mongocdc.core.dag_ids import RESNAPSHOT as RESNAPSHOT_DAG_ID  # noqa: F401
from airflow_provider_mongocdc.dags import (  # noqa: F401
    CONNECTOR_CONFIG_ENV,
    CONNECTOR_CONFIG_VARIABLE,
    DEFAULT_CONN_IDS,
    SNAPSHOT_TIMEOUT,
    TAGS,
    WINDOW_TIMEOUT,
    dag_ids,
    gap_run_id,
)
