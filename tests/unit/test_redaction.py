"""The one helper that hides credentials in text (core.connection.redact_uri), and the job spec's
redacted form that the operators log."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.base.redaction import redact_secrets, redact_uri, secret_values
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


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # Azure SAS: the signature is secret; its version, times, permissions and services are not
        (
            "GET https://acct.blob.core.windows.net/c/t/_delta_log/0.json?sv=2022-11-02&ss=b&srt=co&sp=rwdl"
            "&se=2030-01-01T00:00:00Z&st=2024-01-01T00:00:00Z&spr=https&sig=S3cret-value%2Bx%3D failed",
            "GET https://acct.blob.core.windows.net/c/t/_delta_log/0.json?sv=2022-11-02&ss=b&srt=co&sp=rwdl"
            "&se=2030-01-01T00:00:00Z&st=2024-01-01T00:00:00Z&spr=https&sig=*** failed",
        ),
        ("sv=2022-11-02&sp=r&sig=S3cret-value", "sv=2022-11-02&sp=r&sig=***"),
        ("sig=S3cret-value&se=2030-01-01", "sig=***&se=2030-01-01"),
        ("(url: https://a/c?SIG=S3cret-value)", "(url: https://a/c?SIG=***)"),
        # an Azure connection string
        (
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=S3cret-value;EndpointSuffix=core.windows.net",
            "DefaultEndpointsProtocol=https;AccountName=acct;AccountKey=***;EndpointSuffix=core.windows.net",
        ),
        (
            "Endpoint=sb://ns/;SharedAccessKeyName=send;SharedAccessKey=S3cret-value",
            "Endpoint=sb://ns/;SharedAccessKeyName=send;SharedAccessKey=***",
        ),
        # S3 presigned (SigV4): credential, session token and signature; the rest stays
        (
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAS3cret-value"
            "%2F20240101%2Fus-east-1%2Fs3%2Faws4_request&X-Amz-Date=20240101T000000Z&X-Amz-Expires=900"
            "&X-Amz-SignedHeaders=host&X-Amz-Security-Token=S3cret-value&X-Amz-Signature=S3cret-value",
            "https://b.s3.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=***"
            "&X-Amz-Date=20240101T000000Z&X-Amz-Expires=900"
            "&X-Amz-SignedHeaders=host&X-Amz-Security-Token=***&X-Amz-Signature=***",
        ),
        (
            "https://b/k?x-amz-signature=S3cret-value&x-amz-date=1",
            "https://b/k?x-amz-signature=***&x-amz-date=1",
        ),
        # S3 query string authentication (SigV2), and GCS's V2 signed URLs alike
        (
            "https://b.s3.amazonaws.com/k?AWSAccessKeyId=S3cret-value&Expires=1700000000&Signature=S3cret-value%2B%3D",
            "https://b.s3.amazonaws.com/k?AWSAccessKeyId=***&Expires=1700000000&Signature=***",
        ),
        (
            "https://storage.googleapis.com/b/o?GoogleAccessId=S3cret-value&Expires=1&Signature=S3cret-value",
            "https://storage.googleapis.com/b/o?GoogleAccessId=***&Expires=1&Signature=***",
        ),
        # GCS signed URLs (V4)
        (
            "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=S3cret-value"
            "%40p.iam.gserviceaccount.com%2F20240101%2Fauto%2Fstorage%2Fgoog4_request&X-Goog-Date=20240101T000000Z"
            "&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=S3cret-value",
            "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Credential=***"
            "&X-Goog-Date=20240101T000000Z&X-Goog-Expires=900&X-Goog-SignedHeaders=host&X-Goog-Signature=***",
        ),
        # an AWS Authorization header (a ...credential= value runs to a blank: its comma goes with it)
        (
            "Authorization: AWS4-HMAC-SHA256 Credential=AKIAS3cret-value/20240101/us-east-1/s3/aws4_request, "
            "SignedHeaders=host;x-amz-date, Signature=S3cret-value",
            "Authorization: AWS4-HMAC-SHA256 Credential=*** SignedHeaders=host;x-amz-date, Signature=***",
        ),
        ("Authorization: Bearer S3cret-value.abc", "Authorization: Bearer ***"),
        # OAuth codes and tokens, API keys
        ("https://app/callback?code=S3cret-value&state=abc", "https://app/callback?code=***&state=abc"),
        (
            "https://app/#access_token=S3cret-value&expires_in=3600",
            "https://app/#access_token=***&expires_in=3600",
        ),
        (
            "https://maps.googleapis.com/maps/api/geocode/json?address=x&key=S3cret-value",
            "https://maps.googleapis.com/maps/api/geocode/json?address=x&key=***",
        ),
        ("https://api/v1?api_key=S3cret-value&q=1", "https://api/v1?api_key=***&q=1"),
        ("https://api/v1?apiKey=S3cret-value", "https://api/v1?apiKey=***"),
        ("https://api/v1?subscription-key=S3cret-value", "https://api/v1?subscription-key=***"),
        # a signed URL inside another URL's parameter (URL-encoded)
        (
            "https://login/?next=https%3A%2F%2Fb%2Fk%3FX-Amz-Signature%3DS3cret-value%26X-Amz-Date%3D1",
            "https://login/?next=https%3A%2F%2Fb%2Fk%3FX-Amz-Signature%3D***%26X-Amz-Date%3D1",
        ),
        # what holds no credential is left as it is
        ("https://acct.blob.core.windows.net/c?sv=2022-11-02&se=2030-01-01&sp=r&sr=c", None),
        ("HTTP status code=403 from the store; the design=1&assign=2 options", None),
        ("Signature mismatch: the request signature we calculated does not match", None),
        ("a Bearer token is required", None),
    ],
)
def test_redact_uri_hides_signed_url_parameters_and_api_keys(text, shown):
    assert redact_uri(text) == (text if shown is None else shown)
    assert SECRET not in redact_uri(text)


def test_the_secret_values_of_storage_options_are_hidden_wherever_they_appear():
    options = {
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE1",
        "AWS_SECRET_ACCESS_KEY": "wJalr/S3cret+value",
        "AZURE_STORAGE_SAS_TOKEN": "sv=2022-11-02&sp=r&sig=S1gn%2Bvalue%3D",
        "google_service_account_key": '{"private_key": "-----BEGIN PRIVATE KEY-----"}',
        "AWS_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": "http://minio:9000",
        "AWS_ALLOW_HTTP": "true",
        "AWS_SKIP_SIGNATURE": "false",
        "token": "abc",  # too short to be a real one: not matched by value (it would blank out words)
    }
    secrets = secret_values(options)
    assert "us-east-1" not in secrets and "http://minio:9000" not in secrets and "abc" not in secrets
    text = (
        "Error performing GET http://minio:9000/b/k in us-east-1 with AKIAEXAMPLE1 (allow http: true): "
        "wJalr/S3cret+value wJalr%2FS3cret%2Bvalue; the SAS S1gn+value= / sv=2022-11-02&sp=r&sig=S1gn%2Bvalue%3D; "
        'the key {"private_key": "-----BEGIN PRIVATE KEY-----"}'
    )
    shown = redact_secrets(text, secrets)
    for value in ("AKIAEXAMPLE1", "S3cret", "S1gn", "PRIVATE KEY"):
        assert value not in shown, shown
    assert shown.startswith(
        "Error performing GET http://minio:9000/b/k in us-east-1 with *** (allow http: true): "
    )
    assert redact_secrets("mongodb://u:S3cret-value@h/", ()) == "mongodb://u:***@h/"  # and redact_uri's
    assert secret_values(None) == ()


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
