"""The shared helpers of core: ISO-8601 times with "Z", driver error texts without credentials,
booleans from what users write, and the default DAG ids."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from pymongo.errors import OperationFailure, ServerSelectionTimeoutError

from airflow_provider_mongocdc.core.base.booleans import parse_bool
from airflow_provider_mongocdc.core.base.dag_ids import HOURLY, RESNAPSHOT, WATCHDOG, dag_ids
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.redaction import error_text, redact_uri
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.mongo import connection

pytestmark = pytest.mark.unit

SECRET = "S3cret-value"


# -- times ------------------------------------------------------------------------------------------
def test_iso_z_writes_utc_with_z_from_aware_and_naive_times():
    paris = timezone(timedelta(hours=2))
    assert iso_z(datetime(2024, 5, 1, 14, 0, tzinfo=paris)) == "2024-05-01T12:00:00Z"
    assert iso_z(datetime(2024, 5, 1, 12, 0)) == "2024-05-01T12:00:00Z"  # naive: UTC
    assert iso_z(datetime(2024, 5, 1, 12, 0, 0, 250000, tzinfo=timezone.utc)) == "2024-05-01T12:00:00.250000Z"
    assert iso_z(None) is None


def test_parse_iso_reads_z_offsets_and_naive_text_as_aware_times():
    assert parse_iso("2024-05-01T12:00:00Z") == datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    assert parse_iso("2024-05-01T14:00:00+02:00") == datetime(2024, 5, 1, 12, tzinfo=timezone.utc)
    naive = parse_iso("2024-05-01T12:00:00")
    assert naive == datetime(2024, 5, 1, 12, tzinfo=timezone.utc) and naive.tzinfo is not None
    assert parse_iso(None) is None and parse_iso("") is None
    moment = datetime(2026, 11, 24, 17, 5, 3, 123456, tzinfo=timezone.utc)
    assert parse_iso(iso_z(moment)) == moment
    with pytest.raises(ValueError):
        parse_iso("yesterday")


# -- error texts ------------------------------------------------------------------------------------
def test_error_text_is_the_servers_errmsg_without_the_full_error_or_credentials():
    failure = OperationFailure(
        f"not authorized on mongodb://cdc:{SECRET}@h1",
        13,
        {"errmsg": f"denied for password={SECRET}", "code": 13},
    )
    assert "full error" in str(failure)
    assert error_text(failure) == "denied for password=***"
    plain = RuntimeError(f"cannot reach mongodb://cdc:{SECRET}@h1:27017/?tls=true")
    assert error_text(plain) == "cannot reach mongodb://cdc:***@h1:27017/?tls=true"


def test_error_text_brief_drops_the_driver_timeouts_and_topology_description():
    selection = ServerSelectionTimeoutError(
        "h1:27017: [Errno 111] Connection refused (configured timeouts: socketTimeoutMS: 20000.0ms, "
        "connectTimeoutMS: 20000.0ms), Timeout: 0.5s, Topology Description: <TopologyDescription "
        f"id: 1, servers: [mongodb://cdc:{SECRET}@h1:27017]>"
    )
    assert error_text(selection, brief=True) == "h1:27017: [Errno 111] Connection refused"
    assert "Topology Description" in error_text(selection) and SECRET not in error_text(selection)


def test_redact_uri_stays_importable_from_connection():
    assert connection.redact_uri is redact_uri
    assert SECRET not in connection.redact_uri(f"mongodb://cdc:{SECRET}@h1")


# -- booleans ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, True), (False, False), *[(w, True) for w in ("true", " TRUE ", "1", "yes", "on")]]
    + [(w, False) for w in ("false", "False", "0", "no", " off ")],
)
def test_parse_bool_reads_bools_and_the_usual_words(value, expected):
    assert parse_bool(value, "tls") is expected


def test_parse_bool_refuses_anything_else_in_words():
    with pytest.raises(ConfigError) as refused:
        parse_bool("maybe", "tls")
    assert (
        str(refused.value) == "tls must be true or false. Cause: got 'maybe'. Fix: set tls to true or false."
    )
    with pytest.raises(ConfigError) as refused:
        parse_bool(2, "force", problem="The snapshot parameter force=2 is not a boolean", cause=None)
    assert str(refused.value) == (
        "The snapshot parameter force=2 is not a boolean. Fix: set force to true or false."
    )


# -- DAG ids ----------------------------------------------------------------------------------------
def test_default_connector_has_the_short_dag_ids_and_others_are_named_after_the_connector():
    assert dag_ids("default") == {"hourly": HOURLY, "resnapshot": RESNAPSHOT, "watchdog": WATCHDOG}
    assert (HOURLY, RESNAPSHOT, WATCHDOG) == ("mongocdc_hourly", "mongocdc_resnapshot", "mongocdc_watchdog")
    assert dag_ids("eu") == {
        "hourly": "mongocdc_eu_hourly",
        "resnapshot": "mongocdc_eu_resnapshot",
        "watchdog": "mongocdc_eu_watchdog",
    }
