"""Example DAG ``mongocdc_watchdog``: find oplog gaps every 10 minutes and trigger a re-snapshot."""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG
from mongocdc_settings import MACROS, RESNAPSHOT_DAG_ID, TAGS, connector_arguments

from airflow_provider_mongocdc.sensors.oplog_gap import OplogGapSensor

DOC = """
### MongoDB CDC: oplog gap watchdog

Every 10 minutes **detect_gap** (OplogGapSensor, reschedule mode) checks whether the stored resume
points of the connector are still in the oplog. A quiet run ends *skipped* when its timeout
(8 minutes, before the next run) passes without a gap; the task log shows each partition's
headroom (how long until its position would be purged at the current oplog rate) and a warning
below 6 hours.

When a position is gone, the sensor succeeds with a gap report (XCom) and
**trigger_resnapshot** starts `mongocdc_resnapshot` with `mode: gap` and the report in its conf.
The triggered run's id is derived from the lost positions, so the same gap triggers one
re-snapshot however many watchdog runs see it (later triggers are skipped); if that re-snapshot
fails, clear it to run it again. The sensor's extra link opens the re-snapshot DAG, whose
Trigger button shows its form. Configuration: see `mongocdc_hourly`.
"""

with DAG(
    dag_id="mongocdc_watchdog",
    schedule=timedelta(minutes=10),
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    user_defined_macros=MACROS,
    tags=TAGS,
):
    detect_gap = OplogGapSensor(
        task_id="detect_gap",
        mode="reschedule",
        poke_interval=timedelta(minutes=2),
        timeout=timedelta(minutes=8),
        soft_fail=True,
        headroom_warning=timedelta(hours=6),
        resnapshot_dag_id=RESNAPSHOT_DAG_ID,
        **connector_arguments(None),
    )
    trigger_resnapshot = TriggerDagRunOperator(
        task_id="trigger_resnapshot",
        trigger_dag_id=RESNAPSHOT_DAG_ID,
        trigger_run_id="{{ mongocdc_gap_run_id(ti.xcom_pull(task_ids='detect_gap')) }}",
        conf={
            "mode": "gap",
            "collections": [],
            "reason": "oplog gap found by {{ dag.dag_id }} run {{ run_id }}",
            "gap_report": detect_gap.output,
        },
        skip_when_already_exists=True,
        wait_for_completion=False,
    )
    detect_gap >> trigger_resnapshot
