"""Provider metadata read by Airflow through the ``apache_airflow_provider`` entry point."""

from __future__ import annotations

from airflow_provider_mongocdc import __version__


def _field(label: str, description: str, schema: dict) -> dict:
    """A field of a connection form (``conn-fields``): its label, its description and the JSON
    schema of its value."""
    return {"label": label, "description": description, "schema": schema}


def _optional(kind: str, **schema) -> dict:
    """The JSON schema of a field that may stay empty: a ``kind`` value or null, then ``schema``'s
    keywords (enum, default, values_display)."""
    return {"type": [kind, "null"], **schema}


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
                    "airflow_provider_mongocdc.hooks.spark_submit",
                    "airflow_provider_mongocdc.hooks.delta",
                    "airflow_provider_mongocdc.hooks.iceberg",
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
                    "airflow_provider_mongocdc.operators.delta_apply",
                    "airflow_provider_mongocdc.operators.table_apply",
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
                "python-modules": [
                    "airflow_provider_mongocdc.triggers.oplog_gap",
                    "airflow_provider_mongocdc.triggers.change_watcher",
                ],
            }
        ],
        "connection-types": [
            {
                "connection-type": "mongocdc",
                "hook-class-name": "airflow_provider_mongocdc.hooks.topology.MongoTopologyHook",
                "hook-name": "MongoDB (change data capture)",
                "ui-field-behaviour": {
                    "hidden-fields": ["port", "schema"],
                    # Admin > Connections lists the host; only the Password field is hidden.
                    "relabeling": {
                        "host": "Seed list or connection string, without the password",
                        "login": "User name",
                    },
                    "placeholders": {
                        "host": "mongodb://host1:27017,host2:27017/?replicaSet=rs0 or rs0/host1:27017,host2:27017 "
                        "(the password goes in Password)",
                        "login": "leave empty without authentication",
                    },
                },
                "conn-fields": {
                    "replica_set": _field(
                        "Replica set name",
                        "Name of the replica set (not for mongos or mongodb+srv:// strings that name it).",
                        _optional("string"),
                    ),
                    "auth_source": _field(
                        "Authentication database",
                        "Database where the user is defined (mongodb.authsource); default admin.",
                        _optional("string"),
                    ),
                    "tls": _field(
                        "Use TLS",
                        "Connect with TLS (mongodb.ssl.enabled). Unset: as the host says "
                        "(on for mongodb+srv:// and tls=true strings, off otherwise).",
                        # No default: the form saves a default in the extra, and a tls value there
                        # overrides the connection string's (mongodb+srv:// turns TLS on).
                        _optional("boolean"),
                    ),
                    "tls_allow_invalid_hostnames": _field(
                        "Allow invalid host names",
                        "Skip the TLS host name check (mongodb.ssl.invalid.hostname.allowed); "
                        "test servers only.",
                        _optional("boolean", default=False),
                    ),
                    "auth_mechanism": _field(
                        "Authentication mechanism",
                        "How the user name and password authenticate (pymongo authMechanism). "
                        "Unset: negotiated with the server (SCRAM), or as the connection string says.",
                        _optional(
                            "string",
                            enum=[
                                None,
                                "SCRAM-SHA-256",
                                "SCRAM-SHA-1",
                                "MONGODB-X509",
                                "MONGODB-AWS",
                                "MONGODB-OIDC",
                                "GSSAPI",
                                "PLAIN",
                            ],
                            values_display={"null": "Not set (negotiated)"},
                        ),
                    ),
                    "options": _field(
                        "More client options",
                        'Further pymongo MongoClient options as JSON, e.g. {"tlsCAFile": '
                        '"/etc/ssl/mongo-ca.pem", "readPreference": "secondaryPreferred"}.',
                        _optional("object"),
                    ),
                    "members_auto_discover": _field(
                        "Discover members",
                        "Use the seeds to discover all members (mongodb.members.auto.discover); "
                        "turn off behind a proxy to talk to the first seed only.",
                        _optional("boolean", default=True),
                    ),
                },
            },
            {
                "connection-type": "mongocdc_kafka",
                "hook-class-name": "airflow_provider_mongocdc.hooks.kafka.KafkaConfigHook",
                "hook-name": "Apache Kafka (for MongoDB CDC)",
                # The extra is the librdkafka configuration, e.g. {"bootstrap.servers": "broker1:9092",
                # "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512"}. Airflow 3's
                # connection form edits the extra as JSON of its own: ui-field-behaviour cannot
                # relabel it or give it a placeholder. The conn-fields below are named after the
                # librdkafka keys they set: Airflow stores a conn-field in the extra under its name,
                # so the form shows the extra's bootstrap.servers and saves the field there.
                # Airflow 3.3 shows no placeholder on conn-fields: the examples are in the descriptions.
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "host"],
                    "relabeling": {"login": "SASL user name", "password": "SASL password"},
                    "placeholders": {"login": "with SASL only", "password": "with SASL only"},
                },
                "conn-fields": {
                    "bootstrap.servers": _field(
                        "Bootstrap servers",
                        "The Kafka brokers to contact first, host:port separated by commas, "
                        "e.g. broker1:9092,broker2:9092 (librdkafka bootstrap.servers).",
                        # Not nullable: the form marks it required.
                        {"type": "string", "minLength": 1},
                    ),
                    "security.protocol": _field(
                        "Security protocol",
                        "How to talk to the brokers: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT or "
                        "SASL_SSL (SASL over TLS) (librdkafka security.protocol). Not set: PLAINTEXT.",
                        _optional(
                            "string",
                            enum=[None, "PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"],
                            default=None,
                            values_display={"null": "Not set (PLAINTEXT)"},
                        ),
                    ),
                    "sasl.mechanism": _field(
                        "SASL mechanism",
                        "With SASL_PLAINTEXT or SASL_SSL: how the SASL user name and password "
                        "authenticate (librdkafka sasl.mechanism). Not set: GSSAPI (Kerberos).",
                        _optional(
                            "string",
                            enum=[None, "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"],
                            default=None,
                            values_display={"null": "Not set (GSSAPI)"},
                        ),
                    ),
                },
            },
        ],
        "extra-links": ["airflow_provider_mongocdc.links.ResnapshotTriggerLink"],
        # The scheduler listener that creates a missing connector pool (one slot) when a run starts.
        # Also the airflow.plugins entry point (pyproject.toml): Airflow reads this list only with
        # [core] lazy_discover_providers = False.
        "plugins": [
            {
                "name": "mongocdc_pools",
                "plugin-class": "airflow_provider_mongocdc.plugins.pools.MongoCdcPoolsPlugin",
            },
            # The MongoDB CDC page of the UI (navigation bar and a tab of each DAG) and its JSON API.
            {
                "name": "mongocdc_health",
                "plugin-class": "airflow_provider_mongocdc.plugins.health.MongoCdcHealthPlugin",
            },
        ],
    }
