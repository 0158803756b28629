"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_mongocdc import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-provider-mongocdc",
        "name": "MongoDB CDC",
        "description": "MongoDB change data capture: Debezium-compatible change events from "
        "snapshots and bounded change-stream windows, run on Spark, delivered exactly once to Kafka.",
        "versions": [__version__],
        "integrations": [
            {
                "integration-name": "MongoDB CDC",
                "external-doc-url": "https://debezium.io/documentation/reference/stable/connectors/mongodb.html",
                "tags": ["software"],
            }
        ],
        "hooks": [
            {
                "integration-name": "MongoDB CDC",
                "python-modules": [
                    "airflow_provider_mongocdc.hooks.topology",
                    "airflow_provider_mongocdc.hooks.kafka",
                    "airflow_provider_mongocdc.hooks.offsets",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "MongoDB CDC",
                "python-modules": [
                    "airflow_provider_mongocdc.operators.snapshot",
                    "airflow_provider_mongocdc.operators.stream_window",
                    "airflow_provider_mongocdc.operators.resnapshot",
                ],
            }
        ],
        "sensors": [
            {
                "integration-name": "MongoDB CDC",
                "python-modules": ["airflow_provider_mongocdc.sensors.oplog_gap"],
            }
        ],
        "triggers": [
            {
                "integration-name": "MongoDB CDC",
                "python-modules": ["airflow_provider_mongocdc.triggers.oplog_gap"],
            }
        ],
        "connection-types": [
            {
                "connection-type": "mongocdc",
                "hook-class-name": "airflow_provider_mongocdc.hooks.topology.MongoTopologyHook",
                "hook-name": "MongoDB (change data capture)",
                "ui-field-behaviour": {
                    "hidden-fields": ["port", "schema"],
                    "relabeling": {"host": "Seed list or connection string", "login": "User name"},
                    "placeholders": {
                        "host": "rs0/mongo1:27017,mongo2:27017 or mongodb+srv://cluster.example.net",
                    },
                },
                "conn-fields": {
                    "replica_set": {
                        "label": "Replica set name",
                        "description": "Name of the replica set (not for mongos or mongodb+srv:// "
                        "strings that name it).",
                        "schema": {"type": ["string", "null"]},
                    },
                    "auth_source": {
                        "label": "Authentication database",
                        "description": "Database where the user is defined (mongodb.authsource); "
                        "default admin.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "tls": {
                        "label": "Use TLS",
                        "description": "Connect with TLS (mongodb.ssl.enabled). Unset: as the host says "
                        "(on for mongodb+srv:// and tls=true strings, off otherwise).",
                        # No default: the form saves a default in the extra, and a tls value there
                        # overrides the connection string's (mongodb+srv:// turns TLS on).
                        "schema": {"type": ["boolean", "null"]},
                    },
                    "tls_allow_invalid_hostnames": {
                        "label": "Allow invalid host names",
                        "description": "Skip the TLS host name check (mongodb.ssl.invalid.hostname.allowed); "
                        "test servers only.",
                        "schema": {"type": ["boolean", "null"], "default": False},
                    },
                    "members_auto_discover": {
                        "label": "Discover members",
                        "description": "Use the seeds to discover all members (mongodb.members.auto.discover); "
                        "turn off behind a proxy to talk to the first seed only.",
                        "schema": {"type": ["boolean", "null"], "default": True},
                    },
                },
            },
            {
                "connection-type": "mongocdc_kafka",
                "hook-class-name": "airflow_provider_mongocdc.hooks.kafka.KafkaConfigHook",
                "hook-name": "Apache Kafka (for MongoDB CDC)",
                # The extra is the librdkafka configuration, e.g. {"bootstrap.servers": "broker1:9092",
                # "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}. Airflow 3's
                # connection form edits the extra as JSON of its own: ui-field-behaviour cannot
                # relabel it or give it a placeholder.
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "host"],
                    "relabeling": {"login": "SASL user name", "password": "SASL password"},
                },
            },
        ],
        "extra-links": ["airflow_provider_mongocdc.links.ResnapshotTriggerLink"],
    }
