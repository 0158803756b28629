"""Example DAG ``mongocdc_resnapshot``: a re-snapshot, from the trigger form or the watchdog."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, Param
from mongocdc_settings import MACROS, RESNAPSHOT_DAG_ID, SNAPSHOT_TIMEOUT, TAGS, connector_arguments

from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator

DOC = """
### MongoDB CDC: re-snapshot

Copies the captured collections to Kafka again as read events (`op: r`), with the snapshot
application. Trigger it from the UI (**Trigger**, the form below) or through the REST API
(`POST /api/v2/dags/mongocdc_resnapshot/dagRuns` with `conf`). The watchdog DAG
(`mongocdc_watchdog`) triggers it with `mode: gap` and its gap report when a stored resume point
is no longer in the oplog.

* **mode `gap`**: every captured collection is copied and the streaming offset moves to the new
  snapshot's start position (the history between the old offset and now is gone from the oplog).
  Choosing collections is refused in this mode.
* **mode `manual`**: the chosen collections (empty: all) are copied while the streaming offset
  stays where it is, so no change event is skipped. When the task finds that a stored resume
  point is gone after all, it proceeds as in gap mode.

Documents deleted during the lost history have no delete event (the oplog entries are gone): as
with Debezium, the re-snapshot's read events are the complete current state, and a consumer that
rebuilds state should drop the keys of a collection that a gap re-snapshot did not emit.

The task runs in the connector's pool (`mongocdc_<topic.prefix>`, one slot) and holds the
connector's lease, so no window runs meanwhile. Configuration: see `mongocdc_hourly`.
"""

with DAG(
    dag_id=RESNAPSHOT_DAG_ID,
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    user_defined_macros=MACROS,
    render_template_as_native_obj=True,  # collections and the gap report stay lists and objects
    tags=TAGS,
    params={
        "collections": Param(
            [],
            type="array",
            items={"type": "string", "pattern": "^[^.]+\\..+$"},
            title="Collections",
            description="Collections to copy again, one <database>.<collection> per line. Empty: "
            "every captured collection.",
        ),
        "reason": Param(
            "",
            type="string",
            title="Reason",
            description="Why the re-snapshot runs (kept in the run's summary).",
        ),
        "mode": Param(
            "manual",
            type="string",
            enum=["manual", "gap"],
            title="Mode",
            values_display={
                "manual": "manual: chosen collections, the offset stays",
                "gap": "gap: every collection, the offset resets",
            },
            description="gap after an oplog gap (every collection, offset reset); manual otherwise.",
        ),
    },
):
    MongoResnapshotOperator(
        task_id="resnapshot",
        collections="{{ params.collections }}",
        reason="{{ params.reason }}",
        mode="{{ params.mode }}",
        gap_report="{{ dag_run.conf.get('gap_report') if dag_run.conf else None }}",
        execution_timeout=SNAPSHOT_TIMEOUT,
        **connector_arguments(MongoResnapshotOperator),
    )
