"""The MongoDB CDC DAGs of every connector in ``mongocdc_connectors.json`` (next to this file).

Each connector gets an hourly window DAG, a re-snapshot DAG (trigger form) and an oplog gap
watchdog; the connector ``default`` keeps the ids ``mongocdc_hourly``, ``mongocdc_resnapshot`` and
``mongocdc_watchdog``, another connector ``<name>`` gets ``mongocdc_<name>_hourly`` ... The entries
are described in :mod:`airflow_provider_mongocdc.connector_dags`. An invalid entry shows as a DAG of its
own, ``mongocdc_invalid_<name>``, that names the entry and the fix; the other connectors' DAGs still
load. Nothing here reads a Variable or the network: the connector configuration is read when a task
runs.
"""

from __future__ import annotations

import os
from pathlib import Path

# Airflow's DAG processor imports the "airflow." modules a DAG file names once, before it starts the
# process that parses the file ([dag_processor] parsing_pre_import_modules, on by default). Named
# here, the Spark provider's operator (and the OpenLineage code it loads), which the mongocdc
# operators extend, is not imported again at every parse: about 0.07 instead of 0.37 CPU-s a parse.
import airflow.providers.apache.spark.operators.spark_submit  # noqa: F401

from airflow_provider_mongocdc.connector_dags import connector_dags

CONNECTORS = Path(
    os.environ.get("MONGOCDC_CONNECTORS_FILE") or Path(__file__).with_name("mongocdc_connectors.json")
)

globals().update(connector_dags(path=CONNECTORS))
