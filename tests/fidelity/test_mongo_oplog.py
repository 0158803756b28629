"""local.oplog.rs: entry shapes, ordering, size, retention and the periodic no-op writer."""

from __future__ import annotations

import datetime
import time

import pytest
from bson import Timestamp

pytestmark = pytest.mark.fidelity


def _entries(client, ns_prefix: str) -> list[dict]:
    return list(client.local["oplog.rs"].find({"ns": {"$regex": "^" + ns_prefix.replace(".", "\\.")}}))


def test_crud_entries_have_mongodb_shape(client, db):
    db.c.insert_one({"_id": 1, "a": 1, "arr": [1]})
    db.c.update_one({"_id": 1}, {"$set": {"a": 2, "s.t": 1}, "$push": {"arr": 2}})
    db.c.replace_one({"_id": 1}, {"b": 1})
    db.c.delete_one({"_id": 1})
    crud = [e for e in _entries(client, f"{db.name}.c") if e["op"] in "iud"]
    assert [e["op"] for e in crud] == ["i", "u", "u", "d"]
    insert, update, replace, delete = crud
    uuid = next(db.list_collections())["info"]["uuid"]
    for entry in crud:
        assert entry["ns"] == f"{db.name}.c"
        assert entry["ui"] == uuid
        assert isinstance(entry["ts"], Timestamp)
        assert isinstance(entry["wall"], datetime.datetime)
        assert entry["v"] == 2
        assert entry["t"] >= 1
    assert insert["o"] == {"_id": 1, "a": 1, "arr": [1]}
    assert insert["o2"] == {"_id": 1}
    assert update["o"] == {
        "$v": 2,
        "diff": {"u": {"a": 2}, "i": {"s": {"t": 1}}, "sarr": {"a": True, "u1": 2}},
    }
    assert update["o2"] == {"_id": 1}
    assert replace["o"] == {"_id": 1, "b": 1}
    assert delete["o"] == {"_id": 1}


def test_retryable_write_entries_carry_the_session(client, db):
    db.c.insert_one({"_id": 1})
    entry = next(e for e in _entries(client, f"{db.name}.c") if e["op"] == "i")
    assert entry["txnNumber"] >= 1
    assert set(entry["lsid"]) == {"id", "uid"}
    assert entry["stmtId"] == 0
    assert entry["prevOpTime"] == {"ts": Timestamp(0, 0), "t": -1}


def test_command_entries_for_create_and_drop(client, db):
    db.c.insert_one({"_id": 1})
    db.c.drop()
    commands = [e for e in client.local["oplog.rs"].find({"ns": f"{db.name}.$cmd"})]
    assert commands[0]["op"] == "c" and commands[0]["o"]["create"] == "c"
    assert commands[-1]["o"] == {"drop": "c"}


def test_transaction_is_one_apply_ops_entry(client, db):
    db.c.insert_one({"_id": 0})
    with client.start_session() as session:
        session.with_transaction(
            lambda s: (
                db.c.insert_one({"_id": 1}, session=s),
                db.c.update_one({"_id": 0}, {"$set": {"x": 1}}, session=s),
            )
        )
        lsid = session.session_id
    entry = client.local["oplog.rs"].find_one({"o.applyOps.ns": f"{db.name}.c"})
    assert entry["op"] == "c" and entry["ns"] == "admin.$cmd"
    assert entry["lsid"]["id"] == lsid["id"]
    assert [op["op"] for op in entry["o"]["applyOps"]] == ["i", "u"]
    assert "ts" not in entry["o"]["applyOps"][0]


def test_natural_order_is_timestamp_order(client, db):
    db.c.insert_many([{"_id": i} for i in range(20)])
    forward = [e["ts"] for e in client.local["oplog.rs"].find({"ns": f"{db.name}.c"})]
    assert forward == sorted(forward) and len(set(forward)) == 20
    newest = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()
    latest = list(client.local["oplog.rs"].find({"ts": {"$gte": newest["ts"]}}))
    assert [e["ts"] for e in latest] == [newest["ts"]]


def test_oplog_stats(client):
    stats = client.local.command("collStats", "oplog.rs")
    assert stats["capped"] is True
    assert stats["count"] > 0
    assert stats["size"] > 0
    assert stats["maxSize"] > 0


@pytest.mark.simulator_only
def test_retention_drops_the_oldest_entries(mongosim):
    sim = mongosim(oplog_max_entries=1000)
    with sim.client() as mongo:
        mongo.db.c.insert_many([{"_id": i} for i in range(50)])
        sim.set_oplog_retention(max_entries=10)
        oplog = mongo.local["oplog.rs"]
        assert oplog.count_documents({}) == 10
        assert [e["o"]["_id"] for e in oplog.find({"op": "i"})] == list(range(40, 50))
        mongo.db.c.insert_one({"_id": 50})
        assert oplog.count_documents({}) == 10
        sim.set_oplog_retention(max_bytes=300)
        assert mongo.local.command("collStats", "oplog.rs")["size"] <= 300
        assert mongo.local.command("collStats", "oplog.rs")["maxSize"] == 300


@pytest.mark.simulator_only
def test_periodic_noop_advances_cluster_time_when_idle(mongosim):
    sim = mongosim(noop_interval=0.3)
    with sim.client() as mongo:
        first = mongo.admin.command("ping")["$clusterTime"]["clusterTime"]
        deadline = time.monotonic() + 120
        noops = []
        while time.monotonic() < deadline and len(noops) < 2:
            noops = list(mongo.local["oplog.rs"].find({"op": "n", "o.msg": "periodic noop"}))
            time.sleep(0.1)
        assert len(noops) >= 2, f"{len(noops)} periodic no-ops within 120 s (one every 0.3 s expected)"
        assert noops[-1]["ns"] == ""
        assert mongo.admin.command("ping")["$clusterTime"]["clusterTime"] > first


def test_tailable_await_cursor_follows_the_oplog(client, db):
    from pymongo import CursorType

    db.c.insert_one({"_id": 0})
    last = client.local["oplog.rs"].find().sort("$natural", -1).limit(1).next()["ts"]
    cursor = (
        client.local["oplog.rs"]
        .find({"ts": {"$gt": last}, "ns": f"{db.name}.c"}, cursor_type=CursorType.TAILABLE_AWAIT)
        .max_await_time_ms(200)
    )
    db.c.insert_many([{"_id": 1}, {"_id": 2}])
    seen = []
    deadline = time.monotonic() + 120
    while len(seen) < 2 and time.monotonic() < deadline:
        for entry in cursor:  # a tailable cursor stops iterating when no entry is available
            seen.append(entry["o"]["_id"])
    assert seen == [1, 2]
    assert cursor.alive
    cursor.close()
