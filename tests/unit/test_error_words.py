"""The exact words of errors raised before any server is contacted: the ``mongocdc`` command's Kafka
configuration file and resume token, a filter of an incremental snapshot, and an unknown status of a
stored snapshot or incremental snapshot."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.cli import main
from airflow_provider_mongocdc.core.base.errors import ConfigError, OffsetError
from airflow_provider_mongocdc.core.offsets.model import SnapshotState
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, parse_filter

pytestmark = pytest.mark.unit

OBJECT_FIX = 'Fix: write a JSON object such as {"bootstrap.servers": "host:9092"}.'


def show_with_config_file(path, capsys) -> tuple[int, str]:
    code = main(["offsets", "show", "--kafka-config", str(path), "--topic-prefix", "shop"])
    return code, capsys.readouterr().err.strip()


def test_an_unreadable_kafka_configuration_file_is_named_with_the_fix(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    code, error = show_with_config_file(missing, capsys)
    assert code == 1
    assert error == (
        f"mongocdc: Cannot read the Kafka configuration file {str(missing)!r}. "
        f"Cause: [Errno 2] No such file or directory: {str(missing)!r}. "
        "Fix: give the path of a readable JSON file."
    )


def test_a_kafka_configuration_file_must_hold_a_json_object(tmp_path, capsys):
    config = tmp_path / "kafka.json"
    config.write_text("bootstrap.servers=host:9092")
    code, error = show_with_config_file(config, capsys)
    assert code == 1
    assert error == (
        f"mongocdc: The Kafka configuration file {str(config)!r} is not JSON. "
        f"Cause: Expecting value: line 1 column 1 (char 0). {OBJECT_FIX}"
    )

    config.write_text('["host:9092"]')
    code, error = show_with_config_file(config, capsys)
    assert code == 1
    assert (
        error
        == f"mongocdc: The Kafka configuration file {str(config)!r} does not hold a JSON object. {OBJECT_FIX}"
    )


def test_a_resume_token_that_is_not_json_is_refused_before_kafka_is_asked(capsys):
    args = ["offsets", "set", "--bootstrap-servers", "127.0.0.1:9", "--topic-prefix", "shop"]
    code = main([*args, "--partition", "rs0", "--resume-token", '{"_data": 8263', "--yes"])
    assert code == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("mongocdc: The resume token is not valid JSON. Cause: ")
    assert error.endswith('Fix: give the token as JSON, e.g. {"_data": "8263..."}.')


def test_an_incremental_snapshot_filter_must_be_a_json_query_document():
    fix = 'Fix: write a MongoDB query in (extended) JSON, e.g. {"status": "open"}.'
    with pytest.raises(ConfigError) as not_json:
        parse_filter("shop.orders", "{status: open")
    assert str(not_json.value).startswith("The filter of shop.orders is not a JSON query. Cause: ")
    assert str(not_json.value).endswith(fix)
    with pytest.raises(ConfigError) as not_a_document:
        parse_filter("shop.orders", "[1]")
    assert (
        str(not_a_document.value)
        == f"The filter of shop.orders must be a query document. Cause: got list. {fix}"
    )
    assert parse_filter("shop.orders", '{"total": {"$gt": 10}}') == {"total": {"$gt": 10}}
    assert parse_filter("shop.orders", {"status": "open"}) == {"status": "open"}


def test_an_unknown_stored_status_is_an_offset_error_that_lists_the_known_ones():
    with pytest.raises(OffsetError) as snapshot:
        SnapshotState("paused", "snapshot-1")
    assert str(snapshot.value) == (
        "Unknown snapshot status 'paused'. Fix: use one of none, in_progress, completed."
    )
    with pytest.raises(OffsetError) as incremental:
        IncrementalProgress("incremental-1", status="paused")
    assert str(incremental.value) == (
        "Unknown incremental snapshot status 'paused'. Fix: use one of running, completed, stopped."
    )


def test_a_resume_token_with_a_malformed_extended_json_value_is_refused_in_words(capsys):
    args = ["offsets", "set", "--bootstrap-servers", "127.0.0.1:9", "--topic-prefix", "shop"]
    token = '{"_data": "8263", "at": {"$timestamp": 3}}'
    code = main([*args, "--partition", "rs0", "--resume-token", token, "--yes"])
    assert code == 1
    error = capsys.readouterr().err.strip()
    assert error.startswith("mongocdc: The resume token is not valid JSON. Cause: $timestamp value must be")
    assert error.endswith('Fix: give the token as JSON, e.g. {"_data": "8263..."}.')
