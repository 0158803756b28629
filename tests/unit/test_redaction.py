"""The one helper that hides credentials in text (core.connection.redact_uri), and the job spec's
redacted form that the operators log."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.base.redaction import redact_uri
from airflow_provider_mongocdc.core.jobspec import JobSpec

pytestmark = pytest.mark.unit

SECRET = "S3cret-value"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (
            "mongodb://cdc:S3cret-value@h1:27017,h2/?replicaSet=rs0",
            "mongodb://cdc:***@h1:27017,h2/?replicaSet=rs0",
        ),
        (
            "mongodb+srv://cdc:S3cret-value@cluster.example.net/db",
            "mongodb+srv://cdc:***@cluster.example.net/db",
        ),
        # unescaped "@" and "/" in the password: no part of it stays visible
        ("mongodb://cdc:S3cret-value/x@y@h1/?tls=true", "mongodb://cdc:***@h1/?tls=true"),
        ("https://client:S3cret-value@idp.example/token", "https://client:***@idp.example/token"),
        ("redis://:S3cret-value@h:6379/0", "redis://:***@h:6379/0"),
        ("kafka://h:9092/?sasl.password=S3cret-value&x=1", "kafka://h:9092/?sasl.password=***&x=1"),
        (
            "mongodb://h/?tlsCertificateKeyFilePassword=S3cret-value",
            "mongodb://h/?tlsCertificateKeyFilePassword=***",
        ),
        (
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:S3cret-value,"
            "SERVICE_NAME:x&w=1",
            "mongodb://h/?authMechanism=MONGODB-AWS&authMechanismProperties=AWS_SESSION_TOKEN:***,"
            "SERVICE_NAME:x&w=1",
        ),
        (
            "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN%3AS3cret-value%2CSERVICE_NAME%3Ax",
            "mongodb://h/?authMechanismProperties=AWS_SESSION_TOKEN%3A***%2CSERVICE_NAME%3Ax",
        ),
        ("AWS_SESSION_TOKEN:S3cret-value", "AWS_SESSION_TOKEN:***"),
        # what holds no credential is left as it is
        ("mongodb://cdc@h1/?authMechanism=MONGODB-X509", "mongodb://cdc@h1/?authMechanism=MONGODB-X509"),
        ("mongodb://h1:27017/?replicaSet=rs0 (ask admin@example.com)", None),
        ("check the user name and password of the MongoDB connection", None),
    ],
)
def test_redact_uri_hides_every_credential_inside_text(text, shown):
    assert redact_uri(text) == (text if shown is None else shown)
    assert SECRET not in redact_uri(text)


def test_job_spec_redacted_hides_credentials_in_uris_and_extras():
    spec = JobSpec(
        "snapshot",
        {"topic.prefix": "shop"},
        {
            "connection_string": f"mongodb://cdc:{SECRET}@h1/?replicaSet=rs0",
            "username": "cdc",
            "password": SECRET,
            "options": {"authMechanismProperties": f"AWS_SESSION_TOKEN:{SECRET}", "appname": "x"},
        },
        {"bootstrap.servers": "b:9092", "sasl.password": SECRET, "sasl.username": "u"},
    )
    shown = spec.redacted()
    assert SECRET not in repr(shown) and SECRET not in repr(spec)
    assert shown["mongo"]["connection_string"] == "mongodb://cdc:***@h1/?replicaSet=rs0"
    assert shown["mongo"]["options"] == {"authMechanismProperties": "AWS_SESSION_TOKEN:***", "appname": "x"}
    assert shown["kafka"] == {"bootstrap.servers": "b:9092", "sasl.password": "***", "sasl.username": "u"}
    assert shown["mongo"]["password"] == "***" and shown["mongo"]["username"] == "cdc"
