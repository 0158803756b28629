"""``mongocdc offsets set | reset`` and the connector lease, run as a user runs them (the installed
console script, the real broker): refused while a window or snapshot holds the lease, naming the
holder; otherwise the change is made under the command's own lease, released afterwards."""

from __future__ import annotations

import json

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, owner_for_task
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from tests.integration.test_cli import mongocdc

pytestmark = pytest.mark.integration


def _iso(value) -> str:
    return value.isoformat().replace("+00:00", "Z")


@pytest.fixture
def store(new_offsets_store):
    return new_offsets_store(OffsetStore)


@pytest.fixture
def kafka_args(kafka_bootstrap, unique_name):
    return ["--bootstrap-servers", kafka_bootstrap, "--topic-prefix", unique_name]


@pytest.mark.parametrize("kind", [WINDOW, SNAPSHOT])
def test_set_and_reset_are_refused_while_a_window_or_snapshot_holds_the_lease(
    kind, store, kafka_config, kafka_args, unique_name
):
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position({"_data": "82AA"}, Timestamp(100, 1))))
    lease = ConnectorLease(kafka_config, unique_name)
    holder = owner_for_task("mongocdc_hourly", kind, "scheduled__2026-01-01T10:00:00+00:00")
    held = lease.acquire(holder, kind, ttl=600)

    moved = mongocdc("set", *kafka_args, "--partition", "rs0", "--cluster-time", "1714557600:7", "--yes")
    reset = mongocdc("reset", *kafka_args, "--partition", "rs0", "--yes")
    for result in (moved, reset):
        assert result.returncode == 1, result.stdout + result.stderr
        message = result.stderr
        assert f"the {kind} {holder!r}" in message, message  # kind and who
        assert _iso(held.acquired_at) in message and _iso(held.expires_at) in message  # since, expiry
        assert "Cause:" in message and "Fix:" in message, message
        assert result.stdout == ""
    state = store.read(partition)
    assert state.cluster_time == Timestamp(100, 1) and state.resume_token == {"_data": "82AA"}  # unchanged
    assert lease.current().owner == holder  # the holder's lease is left as it is

    shown = mongocdc("show", *kafka_args)  # reading needs no lease
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["partitions"][0]["offset"]["sec"] == 100


def test_set_and_reset_take_the_lease_for_the_change_and_release_it(
    store, kafka_config, kafka_args, unique_name
):
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position({"_data": "82AA"}, Timestamp(100, 1))))
    lease = ConnectorLease(kafka_config, unique_name)

    moved = mongocdc("set", *kafka_args, "--partition", "rs0", "--cluster-time", "1714557600:7", "--yes")
    assert moved.returncode == 0, moved.stderr
    assert store.read(partition).cluster_time == Timestamp(1714557600, 7)
    assert lease.current() is None  # released

    reset = mongocdc("reset", *kafka_args, "--partition", "rs0", "--yes")
    assert reset.returncode == 0, reset.stderr
    assert store.read(partition) is None
    assert lease.current() is None

    # The topic's history: each change was made between taking the lease and releasing it.
    history = []
    for key, value in store.read_committed_records():
        if key == lease.key:
            history.append(("lease", json.loads(value) if value else None))
        elif key == partition.key():
            history.append(("offset", value))
    leases = [entry for what, entry in history if what == "lease" and entry]
    assert [entry["kind"] for entry in leases] == ["offsets", "offsets"], history
    assert "mongocdc offsets set" in leases[0]["owner"] and "mongocdc offsets reset" in leases[1]["owner"]
    shape = [what if what == "offset" else ("take" if entry else "release") for what, entry in history]
    assert shape == ["offset", "take", "offset", "release", "take", "offset", "release"], shape


def test_the_offsets_hook_is_refused_too_while_a_snapshot_holds_the_lease(
    store, kafka_config, unique_name, monkeypatch
):
    from airflow_provider_mongocdc.core.base.errors import LeaseHeldError
    from airflow_provider_mongocdc.hooks.offsets import OffsetStoreHook

    monkeypatch.setenv(
        "AIRFLOW_CONN_LEASE_KAFKA", json.dumps({"conn_type": "mongocdc_kafka", "extra": kafka_config})
    )
    partition = OffsetPartition(unique_name, "rs0")
    store.write(partition, OffsetState(position=Position(cluster_time=Timestamp(100, 1))))
    hook = OffsetStoreHook("lease_kafka", unique_name)
    lease = ConnectorLease(kafka_config, unique_name)
    holder = owner_for_task("mongocdc_resnapshot", "resnapshot", "manual__1")
    lease.acquire(holder, SNAPSHOT, ttl=600)

    with pytest.raises(LeaseHeldError, match="were not changed") as refused:
        hook.set_position("rs0", cluster_time=Timestamp(200, 1))
    assert f"the snapshot {holder!r}" in str(refused.value)
    with pytest.raises(LeaseHeldError):
        hook.reset("rs0")
    assert store.read(partition).cluster_time == Timestamp(100, 1)

    lease.release(holder)
    before, after = hook.set_position("rs0", cluster_time=Timestamp(200, 1))
    assert before.cluster_time == Timestamp(100, 1) and after.cluster_time == Timestamp(200, 1)
    assert lease.current() is None
