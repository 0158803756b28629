"""The oplog headroom below which a connector is in danger: the watchdog's
:class:`~airflow_provider_mongocdc.sensors.oplog_gap.OplogGapSensor` warns and the MongoDB CDC page
shows the headroom red. Apart from :mod:`.report` (bson, the Kafka client): the sensor and the
watchdog DAG name it when a DAG file is parsed."""

from __future__ import annotations

from datetime import timedelta

HEADROOM_WARNING = timedelta(hours=6)
