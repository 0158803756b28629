"""Real Apache Kafka broker (KRaft, single node) for tests and the demo."""

from devtools.kafka.broker import KafkaBroker, KafkaLaunchError, ensure_jars, stop_pid

__all__ = ["KafkaBroker", "KafkaLaunchError", "ensure_jars", "stop_pid"]
