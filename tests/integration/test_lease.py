"""The connector lease in the offsets topic, against the real broker."""

from __future__ import annotations

import json
import threading
import time

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.errors import LeaseHeldError
from airflow_provider_mongocdc.core.offsets.lease import SNAPSHOT, WINDOW, ConnectorLease, owner_for_task
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from tests.settled_offsets import SettledOffsetStore

pytestmark = pytest.mark.integration


def settled(lease: ConnectorLease) -> ConnectorLease:
    """``lease``, whose reads (current, check) wait for the commit markers of the lease
    transactions just committed (see tests/settled_offsets.py)."""
    lease.store = SettledOffsetStore(lease.kafka_config, lease.store.topic)
    return lease


def test_a_window_finds_the_snapshots_lease_and_names_its_holder(kafka_config, unique_name):
    lease = settled(ConnectorLease(kafka_config, unique_name))
    snapshot_owner = owner_for_task("mongocdc_resnapshot", "resnapshot", "manual__1")
    window_owner = owner_for_task("mongocdc_hourly", "window", "scheduled__2")

    taken = lease.acquire(snapshot_owner, SNAPSHOT, ttl=600)
    assert taken.owner == snapshot_owner and taken.live()

    with pytest.raises(LeaseHeldError) as held:
        lease.check(window_owner, WINDOW)
    message = str(held.value)
    assert snapshot_owner in message and "snapshot" in message
    assert taken.expires_at.isoformat().replace("+00:00", "Z") in message
    with pytest.raises(LeaseHeldError):
        lease.acquire(window_owner, WINDOW)

    # The same owner (a retry of the task instance) takes it over; others cannot release it.
    renewed = lease.acquire(snapshot_owner, SNAPSHOT, ttl=600)
    assert renewed.expires_at >= taken.expires_at
    assert lease.release(window_owner) is False
    assert lease.current().owner == snapshot_owner

    assert lease.release(snapshot_owner) is True
    assert lease.current() is None
    assert lease.check(window_owner, WINDOW) is None
    with lease.hold(window_owner, WINDOW) as held_lease:
        assert lease.current() == held_lease
        with pytest.raises(LeaseHeldError, match="window"):
            lease.acquire(snapshot_owner, SNAPSHOT)
    assert lease.current() is None  # released on leaving the block


def test_hold_releases_on_error_and_an_expired_lease_is_free(kafka_config, unique_name):
    lease = settled(ConnectorLease(kafka_config, unique_name))
    with pytest.raises(RuntimeError, match="spark-submit failed"):
        with lease.hold("dag/run/snapshot", SNAPSHOT):
            raise RuntimeError("spark-submit failed")
    assert lease.current() is None

    # Its holder dies without releasing; once the lease's own expiry has passed, it is free.
    killed = lease.acquire("dag/killed-run/snapshot", SNAPSHOT, ttl=1)
    deadline = time.monotonic() + 120
    while killed.live():
        assert time.monotonic() < deadline, f"the clock did not pass the lease's expiry {killed.expires_at}"
        time.sleep(0.1)
    stored = lease.current()  # still there, but expired
    assert stored.owner == killed.owner and not stored.live()
    assert lease.check("dag/next/window", WINDOW) is None
    assert lease.acquire("dag/next/window", WINDOW).owner == "dag/next/window"


def test_concurrent_contenders_get_the_lease_once(kafka_config, unique_name):
    lease_holders, refused, failures = [], [], []
    barrier = threading.Barrier(3)

    def contend(owner: str) -> None:
        lease = ConnectorLease(kafka_config, unique_name)
        barrier.wait()
        try:
            lease_holders.append(lease.acquire(owner, WINDOW, ttl=600).owner)
        except LeaseHeldError as error:
            refused.append(str(error))
        except Exception as error:  # reported below: any other outcome fails the test
            failures.append(repr(error))

    ConnectorLease(kafka_config, unique_name).store.ensure_topic()
    threads = [threading.Thread(target=contend, args=(f"dag/run{i}/window",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
        assert not thread.is_alive(), "a contender did not get an answer within 300 s"
    assert failures == []
    assert len(lease_holders) == 1, (lease_holders, refused)
    assert len(refused) == 2
    assert settled(ConnectorLease(kafka_config, unique_name)).current().owner == lease_holders[0]


def test_the_lease_record_leaves_the_offsets_as_they_are(kafka_config, unique_name):
    store = SettledOffsetStore(kafka_config, f"{unique_name}.offsets")
    partition = OffsetPartition(unique_name, "rs0")
    state = store.write(partition, OffsetState(position=Position(cluster_time=Timestamp(1_700_000_000, 3))))
    lease = settled(ConnectorLease(kafka_config, unique_name))
    lease.acquire("dag/run/window", WINDOW)

    assert store.read_all() == {partition: state}
    store.reset(partition)  # resetting a partition's offset does not free the connector's lease
    assert store.read_all() == {}
    assert lease.current().owner == "dag/run/window"


def test_resnapshot_operator_takes_the_lease_before_submitting(kafka_config, unique_name, monkeypatch):
    from types import SimpleNamespace

    from airflow_provider_mongocdc.core.base.errors import ConfigError
    from airflow_provider_mongocdc.operators.resnapshot import MongoResnapshotOperator

    conn_id = f"kafka_{unique_name}".lower()
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps({"conn_type": "mongocdc_kafka", "extra": kafka_config})
    )
    window = owner_for_task("mongocdc_hourly", "window", "scheduled__2026-01-01T10:00:00+00:00")
    ConnectorLease(kafka_config, unique_name).acquire(window, WINDOW, ttl=600)
    context = {
        "ti": SimpleNamespace(
            dag_id="mongocdc_resnapshot", task_id="resnapshot", run_id="manual__1", map_index=-1
        )
    }

    operator = MongoResnapshotOperator(
        task_id="resnapshot",
        connector_config={"topic.prefix": unique_name},
        kafka_conn_id=conn_id,
        mode="gap",
        reason="test",
    )
    with pytest.raises(LeaseHeldError) as held:
        operator.execute(context)  # refused before anything is submitted to Spark
    assert window in str(held.value) and "mongocdc_resnapshot/manual__1/resnapshot" in str(held.value)

    chosen = MongoResnapshotOperator(
        task_id="resnapshot",
        connector_config={"topic.prefix": unique_name},
        kafka_conn_id=conn_id,
        mode="gap",
        collections=["shop.orders"],
    )
    with pytest.raises(ConfigError, match="every captured collection"):
        chosen.execute(context)
