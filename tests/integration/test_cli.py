"""``mongocdc offsets ...`` run as a user runs it: a subprocess on the real broker; the README's
Operations commands as written, with the Kafka connection its setup adds to Airflow's metadata
database (a throwaway Airflow home, SQLite)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer

from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from tests.readme_commands import README_KAFKA, operations_commands, setup_commands, substitute

pytestmark = pytest.mark.integration

MONGOCDC = str(Path(sys.executable).parent / "mongocdc")


def mongocdc(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [MONGOCDC, "offsets", *args], capture_output=True, text=True, timeout=120, env=env or dict(os.environ)
    )


@pytest.fixture
def store(kafka_bootstrap, unique_name):
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{unique_name}.offsets")
    store.ensure_topic()
    return store


@pytest.fixture
def kafka_args(kafka_bootstrap, unique_name):
    return ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", unique_name]


def test_console_script_is_installed():
    assert Path(MONGOCDC).exists(), "install the project (pip install -e .) to get the mongocdc command"
    result = subprocess.run([MONGOCDC, "offsets", "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "show" in result.stdout and "reset" in result.stdout


def test_show_prints_the_committed_offsets_as_json(store, kafka_args, unique_name):
    rs0, rs1 = OffsetPartition(unique_name, "rs0"), OffsetPartition(unique_name, "rs1")
    store.write(
        rs0, OffsetState(position=Position({"_data": "82AA"}, Timestamp(1714557600, 3)), events=12, windows=2)
    )
    store.write(rs1, OffsetState(position=Position(cluster_time=Timestamp(1714557000, 1))))
    store.write(OffsetPartition("someone-else", "rs0"), OffsetState(position=Position({"_data": "82FF"})))

    result = mongocdc("show", *kafka_args)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    assert shown["topic"] == store.topic
    assert [entry["partition"]["rs"] for entry in shown["partitions"]] == ["rs0", "rs1"]
    first = shown["partitions"][0]["offset"]
    assert (first["sec"], first["ord"], first["resume_token"]) == (1714557600, 3, "82AA")
    assert first["counters"] == {"events": 12, "windows": 2, "snapshots": 0}
    assert first["cluster_time"] == "2024-05-01T10:00:00Z"

    one = json.loads(mongocdc("show", *kafka_args, "--partition", "rs1").stdout)
    assert [entry["partition"]["rs"] for entry in one["partitions"]] == ["rs1"]


def test_set_requires_yes_then_moves_the_offset_and_prints_the_change(store, kafka_args, unique_name):
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position({"_data": "82AA"}, Timestamp(100, 1)), events=5))

    refused = mongocdc("set", *kafka_args, "--partition", "rs0", "--cluster-time", "1714557600:7")
    assert refused.returncode == 2
    assert "--yes" in refused.stderr and "refusing" in refused.stderr
    assert store.read(partition).cluster_time == Timestamp(100, 1)  # unchanged

    moved = mongocdc("set", *kafka_args, "--partition", "rs0", "--cluster-time", "1714557600:7", "--yes")
    assert moved.returncode == 0, moved.stderr
    change = json.loads(moved.stdout)
    assert change["before"]["sec"] == 100 and change["before"]["resume_token"] == "82AA"
    assert change["after"]["sec"] == 1714557600 and change["after"]["ord"] == 7
    assert "resume_token" not in change["after"]
    state = store.read(partition)
    assert state.cluster_time == Timestamp(1714557600, 7) and state.resume_token is None
    assert state.events == 5  # counters kept

    by_time = mongocdc(
        "set", *kafka_args, "--partition", "rs0", "--cluster-time", "2024-05-01T10:00:00Z", "--yes"
    )
    assert by_time.returncode == 0, by_time.stderr
    assert store.read(partition).cluster_time == Timestamp(1714557600, 0)

    by_token = mongocdc(
        "set", *kafka_args, "--partition", "rs0", "--resume-token", '{"_data": "8263ABCDEF"}', "--yes"
    )
    assert by_token.returncode == 0, by_token.stderr
    assert store.read(partition).resume_token == {"_data": "8263ABCDEF"}

    bad = mongocdc("set", *kafka_args, "--partition", "rs0", "--cluster-time", "yesterday", "--yes")
    assert bad.returncode == 1 and "Cannot read cluster time" in bad.stderr and "Fix:" in bad.stderr


def test_reset_requires_yes_then_deletes_and_prints_what_it_removed(store, kafka_args, unique_name):
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position({"_data": "82AA"}, Timestamp(100, 1))))

    refused = mongocdc("reset", *kafka_args, "--partition", "rs0")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    assert store.read(partition) is not None

    reset = mongocdc("reset", *kafka_args, "--partition", "rs0", "--yes")
    assert reset.returncode == 0, reset.stderr
    change = json.loads(reset.stdout)
    assert (
        change["before"]["resume_token"] == "82AA" and change["after"] is None and change["changed"] is True
    )
    assert store.read(partition) is None
    again = json.loads(mongocdc("reset", *kafka_args, "--partition", "rs0", "--yes").stdout)
    assert again["before"] is None and again["changed"] is False


def test_kafka_settings_from_a_file_or_an_airflow_connection(store, kafka_bootstrap, unique_name, tmp_path):
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position(cluster_time=Timestamp(42, 1))))

    config = tmp_path / "kafka.json"
    config.write_text(json.dumps({"bootstrap.servers": kafka_bootstrap, "client.id": "mongocdc-cli-test"}))
    from_file = mongocdc("show", "--kafka-config", str(config), "--topic-prefix", unique_name)
    assert from_file.returncode == 0, from_file.stderr
    assert json.loads(from_file.stdout)["partitions"][0]["offset"]["sec"] == 42

    env = dict(os.environ)
    env["AIRFLOW_CONN_CLI_KAFKA"] = json.dumps(
        {"conn_type": "kafka", "extra": {"bootstrap.servers": kafka_bootstrap}}
    )
    from_connection = mongocdc("show", "--kafka-conn-id", "cli_kafka", "--topic-prefix", unique_name, env=env)
    assert from_connection.returncode == 0, from_connection.stderr
    assert json.loads(from_connection.stdout)["partitions"][0]["offset"]["sec"] == 42


def test_unreachable_kafka_is_a_clear_error(tmp_path, unique_name):
    result = mongocdc(
        "show", "--bootstrap-servers", "127.0.0.1:9", "--topic-prefix", unique_name, "--timeout", "3"
    )
    assert result.returncode == 1
    assert "Could not read the offsets topic" in result.stderr and "Fix:" in result.stderr
    assert "Traceback" not in result.stderr


# -- connections in Airflow's metadata database ------------------------------------------------------
AIRFLOW = str(Path(sys.executable).parent / "airflow")


def airflow_home(tmp_path: Path, migrate: bool = True) -> dict[str, str]:
    """The environment of a throwaway Airflow (SQLite, its own AIRFLOW_HOME) without connections or
    Variables in the environment: only what ``airflow connections add`` stores."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("AIRFLOW_CONN_", "AIRFLOW_VAR_"))
    }
    env.update(
        {
            "AIRFLOW_HOME": str(tmp_path),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path / 'airflow.db'}",
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(tmp_path / "logs"),
        }
    )
    if migrate:
        airflow("db", "migrate", env=env)
    return env


def airflow(*args: str, env: dict[str, str]) -> str:
    result = subprocess.run([AIRFLOW, *args], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, (
        f"airflow {' '.join(args)} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}"
    )
    return result.stdout


def test_readme_operations_commands_work_with_the_connection_the_readme_setup_adds(
    kafka_bootstrap, unique_name, tmp_path
):
    env = airflow_home(tmp_path)
    (add_kafka,) = [c for c in setup_commands() if c.startswith("airflow connections add kafka_default ")]
    (add_kafka,) = substitute([add_kafka], {README_KAFKA: kafka_bootstrap})
    airflow(*shlex.split(add_kafka)[1:], env=env)

    prefix, connect_topic = unique_name, f"{unique_name}.connect-offsets"
    store = OffsetStore({"bootstrap.servers": kafka_bootstrap}, f"{prefix}.offsets")
    store.ensure_topic()
    partition = OffsetPartition(prefix, "rs0")
    store.write(partition, OffsetState(position=Position({"_data": "82AA"}, Timestamp(1714557600, 3))))
    values = {"shop": prefix, "connect-offsets": connect_topic}
    commands = {argv[2]: [values.get(arg, arg) for arg in argv] for argv in operations_commands()}
    assert list(commands) == ["show", "set", "reset", "import-debezium", "export-debezium"]
    assert all(argv[argv.index("--kafka-conn-id") + 1] == "kafka_default" for argv in commands.values())

    def run(action: str) -> dict:
        result = mongocdc(*commands[action][2:], env=env)
        assert result.returncode == 0, f"{' '.join(commands[action])}:\n{result.stderr}"
        return json.loads(result.stdout)

    (shown,) = run("show")["partitions"]
    assert shown["offset"]["sec"] == 1714557600 and shown["offset"]["resume_token"] == "82AA"
    assert run("set")["after"]["cluster_time"] == "2026-11-21T10:00:00Z"
    assert run("reset")["after"] is None and store.read(partition) is None
    # The Debezium connector's offset, as its Kafka Connect worker stores it.
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    key = ["shop-mongodb", {"server_id": prefix}]
    producer.produce(connect_topic, key=json.dumps(key), value=json.dumps({"sec": 1764000000, "ord": 5}))
    assert producer.flush(120) == 0
    assert run("import-debezium")["after"]["sec"] == 1764000000
    assert store.read(partition).cluster_time == Timestamp(1764000000, 5)
    exported = run("export-debezium")
    assert exported["key"] == key and exported["value"]["sec"] == 1764000000


def test_a_connection_airflow_does_not_have_is_one_error_naming_the_alternatives(
    kafka_bootstrap, unique_name, tmp_path
):
    migrated = airflow_home(tmp_path / "migrated")
    missing = mongocdc(
        "show", "--kafka-conn-id", "no_such_kafka", "--topic-prefix", unique_name, env=migrated
    )
    # An Airflow home whose metadata database was never created: the error says so.
    unmigrated = airflow_home(tmp_path / "new", migrate=False)
    unreadable = mongocdc(
        "show", "--kafka-conn-id", "kafka_default", "--topic-prefix", unique_name, env=unmigrated
    )
    for result, conn_id in ((missing, "no_such_kafka"), (unreadable, "kafka_default")):
        assert result.returncode == 1 and result.stdout == "", result.stderr
        error = result.stderr.strip()
        assert "Traceback" not in error and len(error.splitlines()) == 1, error
        assert error.startswith(f"mongocdc: Kafka connection '{conn_id}' was not found"), error
        for alternative in ("--bootstrap-servers", "--kafka-config", f"AIRFLOW_CONN_{conn_id.upper()}"):
            assert alternative in error, error
    assert "metadata database" in missing.stderr
    assert "no such table: connection" in unreadable.stderr and "airflow db migrate" in unreadable.stderr
