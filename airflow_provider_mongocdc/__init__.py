"""MongoDB change data capture for Apache Airflow: Debezium-compatible events into Kafka."""

__version__ = "0.1.0"
