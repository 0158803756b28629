"""Example DAG ``mongocdc_hourly``: an hourly bounded change-stream window (after the snapshot)."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG
from mongocdc_settings import MACROS, SNAPSHOT_TIMEOUT, TAGS, WINDOW_TIMEOUT, connector_arguments

from airflow_provider_mongocdc.operators.snapshot import MongoSnapshotOperator
from airflow_provider_mongocdc.operators.stream_window import MongoStreamWindowOperator

DOC = """
### MongoDB CDC: hourly windows

Every hour, the changes of the captured MongoDB collections from the stored offset up to the end
of the run's data interval become Debezium-compatible change events in Kafka; the offset moves
forward in the same Kafka transaction.

* **snapshot** runs the snapshot application; it copies only when `snapshot.mode` asks for it
  (no offset yet with `initial`; every run with `always`; a purged resume point with
  `when_needed`), and otherwise finishes at once ("no snapshot needed"). With `always` the stored
  offset stays where it is (unless it was purged from the oplog), so the window still streams
  every change since the previous run, deletes included, after the snapshot's read events.
* **window** streams from the stored offset up to `data_interval_end` (or now, when that lies in
  the future).

Both run in the connector's pool `mongocdc_<topic.prefix>` (one slot), as does the re-snapshot
(`mongocdc_resnapshot`), so they queue one after the other instead of overlapping. Each also holds
the connector's lease (a record in the offsets topic) while it runs, renewed as long as it runs,
which keeps snapshots, windows and `mongocdc offsets` changes apart even outside these DAGs and
pools.

**Configuration** (no code change): the Airflow Variable `mongocdc_connector_config` (or the
environment variable `MONGOCDC_CONNECTOR_CONFIG`) holds the connector properties as JSON; the
connections are `mongocdc_default`, `kafka_default` and `spark_default`, overridable by the
Variables `mongocdc_mongo_conn_id`, `mongocdc_kafka_conn_id`, `mongocdc_spark_conn_id`. Create
the pool once: `airflow pools set mongocdc_<topic.prefix> 1 "MongoDB CDC <topic.prefix>"` (see
`mongocdc_settings.py` for how the DAG names it).

**Catch-up.** `catchup=False` (default here): when the DAG is switched on, or after downtime,
only the latest interval runs. That loses nothing: a window always starts from the stored offset,
not from its data interval's start, so one run covers all the time since the previous window
(`max_duration` bounds how long it reads, and the next run continues). With `catchup=True`
Airflow creates one run per missed hour; `max_active_runs=1` makes them run one at a time in
order of their logical dates, each window ending at its own `data_interval_end`, so the offset
advances hour by hour and each run's summary covers exactly one hour of changes. A re-run of an
old hour (its end before the stored offset) reads nothing and keeps the offset.
"""

with DAG(
    dag_id="mongocdc_hourly",
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    user_defined_macros=MACROS,
    tags=TAGS,
    default_args={"retries": 1, "retry_delay": pendulum.duration(minutes=2)},
):
    snapshot = MongoSnapshotOperator(
        task_id="snapshot",
        execution_timeout=SNAPSHOT_TIMEOUT,
        **connector_arguments(MongoSnapshotOperator),
    )
    window = MongoStreamWindowOperator(
        task_id="window",
        execution_timeout=WINDOW_TIMEOUT,
        # Stops at a point between transactions before the task's timeout; the next run continues.
        max_duration=WINDOW_TIMEOUT.total_seconds() - 300,
        **connector_arguments(MongoStreamWindowOperator),
    )
    snapshot >> window
