"""The MongoDB CDC page's record of one connector, built from what was read (no servers): the lag
behind now, the headroom red below the watchdog's threshold, words for an unreachable server, the
lease, an incremental snapshot's chunks left, and what never appears in a record or on the page
(passwords, connection strings, full resume tokens)."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.gap.headroom import HEADROOM_WARNING
from airflow_provider_mongocdc.core.gap.plan import Probe
from airflow_provider_mongocdc.core.gap.report import GapReport, assess
from airflow_provider_mongocdc.core.health.probes import ReadingCache
from airflow_provider_mongocdc.core.health.record import (
    TOKEN_SHOWN,
    ConnectorIdentity,
    OffsetsView,
    Reading,
    Sources,
    connector_record,
)
from airflow_provider_mongocdc.core.mongo.oplog_span import OplogSpan
from airflow_provider_mongocdc.core.offsets.lease import Lease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress, IncrementalRequest
from airflow_provider_mongocdc.plugins.health_page import render_page

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
THRESHOLD = HEADROOM_WARNING.total_seconds()
PARTITION = OffsetPartition("shop", "rs0")
TOKEN = {"_data": "8267" + "45A1B2C3" + "00000001" + "2B022C0100296E5A1004" * 4}


def identity(**changes) -> ConnectorIdentity:
    values = dict(
        name="default",
        dag_ids={
            "hourly": "mongocdc_hourly",
            "resnapshot": "mongocdc_resnapshot",
            "watchdog": "mongocdc_watchdog",
        },
        conn_ids={"mongo": "mongocdc_default", "kafka": "kafka_default", "spark": "spark_default"},
        pool="mongocdc_default",
        topic_prefix="shop",
        offsets_topic="shop.offsets",
        chunk_size=100,
    )
    values.update(changes)
    return ConnectorIdentity(**values)


def state_at(seconds_before_now: int, **changes) -> OffsetState:
    position = Position(
        resume_token=TOKEN, cluster_time=Timestamp(int(NOW.timestamp()) - seconds_before_now, 3)
    )
    return OffsetState(position=position, windows=2, **changes)


def view(state: OffsetState, lease: Lease | None = None) -> Reading[OffsetsView]:
    return Reading(OffsetsView({PARTITION: state}, None, lease), NOW - timedelta(seconds=5))


def report_with_headroom(state: OffsetState, oldest_before_now: int, newest_before_now: int = 0) -> GapReport:
    """The gap check's report for an oplog spanning from ``oldest_before_now`` s ago to now."""
    span = OplogSpan(
        "rs0",
        oldest=Timestamp(int(NOW.timestamp()) - oldest_before_now, 1),
        newest=Timestamp(int(NOW.timestamp()) - newest_before_now, 1),
        size_bytes=500,
        max_size_bytes=1000,
    )
    check = assess(Probe(PARTITION, state, None, (None,)), [span], stream="resumable")
    return GapReport("shop", (check,), detected_at=NOW)


def record(sources: Sources, **identity_changes) -> dict:
    return connector_record(
        identity(**identity_changes), sources, now=NOW, headroom_threshold_seconds=THRESHOLD
    )


def test_lag_is_now_minus_the_committed_cluster_time_and_each_value_says_its_age():
    shown = record(Sources(offsets=view(state_at(754))))
    (row,) = shown["offsets"]["partitions"]
    assert row["partition"] == "rs0"
    assert row["cluster_time"] == "2026-11-26T11:47:26Z"
    assert row["cluster_time_ts"] == {"t": int(NOW.timestamp()) - 754, "i": 3}
    assert row["lag_seconds"] == 754 and shown["offsets"]["lag_seconds"] == 754
    assert shown["offsets"]["age_seconds"] == 5 and shown["offsets"]["error"] is None
    assert shown["status"] == "ok" and shown["problems"] == []


def test_resume_token_is_cut_to_its_cluster_time():
    shown = record(Sources(offsets=view(state_at(10))))
    token = shown["offsets"]["partitions"][0]["resume_token"]
    assert token == TOKEN["_data"][:TOKEN_SHOWN] + "…"
    assert TOKEN["_data"] not in json.dumps(shown)


@pytest.mark.parametrize(
    ("hours_of_headroom", "low"),
    [(THRESHOLD / 3600 - 1, True), (THRESHOLD / 3600 + 1, False)],
)
def test_headroom_is_low_below_the_watchdogs_threshold(hours_of_headroom, low):
    # Half full in the last hour with the stored position 10 min old: the oplog rolls past it in
    # (oldest age - position age) scaled by the free share; choose the oldest entry accordingly.
    state = state_at(600)
    oldest = int(600 + hours_of_headroom * 3600 / 2)  # half full: headroom doubles the retained span
    report = report_with_headroom(state, oldest)
    shown = record(Sources(offsets=view(state), oplog=Reading(report, NOW)))
    (row,) = shown["oplog"]["partitions"]
    assert row["headroom_seconds"] == report.checks[0].headroom_seconds
    assert (row["headroom_seconds"] < THRESHOLD) is low
    assert row["low"] is low
    assert shown["status"] == ("warning" if low else "ok")
    if low:
        assert "oplog headroom below 6 h" in shown["problems"][0]


def test_an_unreachable_mongodb_or_kafka_is_words_with_credentials_hidden():
    mongo_error = (
        "MongoDB at mongodb://cdc:s3cret@db1:27017/?replicaSet=rs0 is not reachable. "
        "Cause: No servers found yet. Fix: check the host"
    )
    kafka_error = (
        "Could not read the offsets topic 'shop.offsets' from 'k1:9092'. Cause: sasl.password=hunter2 refused"
    )
    unreachable = record(Sources(offsets=view(state_at(30)), oplog=Reading(None, NOW, mongo_error)))
    assert unreachable["status"] == "warning"
    assert unreachable["oplog"]["error"].startswith("MongoDB at mongodb://cdc:***@db1:27017")
    assert unreachable["problems"] == [
        "MongoDB: the oplog headroom is unknown: MongoDB at mongodb://cdc:***@db1:27017/?replicaSet=rs0 "
        "is not reachable"
    ]
    assert unreachable["offsets"]["lag_seconds"] == 30  # what Kafka says is still shown

    no_kafka = record(Sources(offsets=Reading(None, NOW, kafka_error)))
    assert no_kafka["status"] == "error"
    assert no_kafka["offsets"]["partitions"] == [] and no_kafka["offsets"]["lag_seconds"] is None
    assert no_kafka["problems"][0].startswith("Kafka: the offsets could not be read")
    for text in (json.dumps(unreachable), json.dumps(no_kafka)):
        assert "s3cret" not in text and "hunter2" not in text


def test_reading_of_turns_an_error_into_words():
    def unreachable():
        raise ConnectionError("connect to mongodb://u:pw@h:1 refused")

    reading = Reading.of(unreachable, lambda: NOW)
    assert reading.value is None and reading.as_of == NOW
    assert reading.error == "connect to mongodb://u:***@h:1 refused"


def test_lease_held_by_a_task_names_the_run_until_when_and_an_expired_one_is_free():
    held = Lease(
        "mongocdc_hourly/scheduled__2026-11-26T11:00:00+00:00/window",
        "window",
        NOW,
        NOW + timedelta(minutes=55),
        "w1",
    )
    shown = record(Sources(offsets=view(state_at(10), held)))["lease"]
    assert shown["state"] == "held" and shown["kind"] == "window"
    assert shown["task_instance"] == {
        "dag_id": "mongocdc_hourly",
        "run_id": "scheduled__2026-11-26T11:00:00+00:00",
        "task_id": "window",
    }
    assert shown["expires_at"] == "2026-11-26T12:55:00Z"
    expired = Lease(
        "mongocdc offsets reset by ops (pid 7)",
        "offsets",
        NOW - timedelta(hours=1),
        NOW - timedelta(minutes=55),
    )
    shown = record(Sources(offsets=view(state_at(10), expired)))["lease"]
    assert shown["state"] == "expired" and "task_instance" not in shown
    assert record(Sources(offsets=view(state_at(10))))["lease"]["state"] == "free"


def test_running_incremental_snapshot_shows_collection_documents_and_chunks_left():
    progress = IncrementalProgress(
        "incremental-1", pending=("shop.customers",), current="shop.orders", documents=250, chunks=3
    )
    state = state_at(10, incremental=progress.to_json())
    left = Reading({"shop.orders": 150, "shop.customers": 201}, NOW - timedelta(seconds=20))
    shown = record(Sources(offsets=view(state), documents_left=left), chunk_size=100)["incremental_snapshot"]
    assert shown["status"] == "running" and shown["collection"] == "shop.orders"
    assert shown["documents"] == 250 and shown["chunks_done"] == 3
    assert shown["documents_left"] == 351 and shown["chunks_left"] == 2 + 3
    assert shown["collections_left"] == ["shop.orders", "shop.customers"]
    assert shown["counted"]["age_seconds"] == 20


def test_no_configuration_is_a_problem_in_words_and_nothing_is_read():
    shown = record(
        Sources(),
        topic_prefix=None,
        offsets_topic=None,
        config_error="Connector 'default' has no connector configuration. Cause: the Airflow Variable ...",
    )
    assert shown["status"] == "error"
    assert shown["problems"] == ["configuration: Connector 'default' has no connector configuration"]
    assert shown["offsets"]["partitions"] == [] and shown["lease"] == {"state": "free"}


def test_offsets_or_a_lease_of_another_connector_are_not_shown_as_this_ones():
    # shopdup has the topic prefix of default, which ran: its row is no "OK" with default's position.
    import html as markup

    state = state_at(754, connector="default")
    read = Sources(offsets=view(state), oplog=Reading(report_with_headroom(state, 9000), NOW))
    shown = record(read, name="shopdup")
    assert shown["status"] == "error"
    assert shown["problems"][0].startswith(
        "offsets: the topic prefix 'shop' belongs to connector 'default' (its offsets were last written "
        "by connector 'default'), so they are not shown as connector 'shopdup''s and its runs are refused"
    ), shown["problems"]
    assert shown["offsets"]["belongs_to"] == "default"
    assert shown["offsets"]["partitions"] == [] and shown["offsets"]["lag_seconds"] is None
    assert shown["oplog"]["partitions"] == [] and shown["oplog"]["headroom_seconds"] is None
    page = markup.unescape(
        render_page(
            [shown], generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=THRESHOLD
        )
    )
    assert "belongs to connector 'default'" in page and "2026-11-26 11:47:26" not in page
    assert 'data-lag-seconds="754"' not in page
    # default's own row shows them.
    assert record(read)["offsets"]["partitions"][0]["lag_seconds"] == 754

    # A lease taken by another connector's run tells the same, whoever wrote the positions.
    held = Lease(
        "mongocdc_hourly/scheduled__1/window", "window", NOW, NOW + timedelta(minutes=55), connector="default"
    )
    shown = record(Sources(offsets=view(state_at(10), held)), name="shopdup")
    assert shown["status"] == "error" and shown["offsets"]["partitions"] == []
    assert "its lease was last taken by connector 'default'" in shown["problems"][0], shown["problems"]


def test_cache_keeps_a_reading_for_its_ttl_then_reads_again():
    clock = [100.0]
    reads = []
    cache = ReadingCache(15, clock=lambda: clock[0], now=lambda: NOW)

    def read():
        reads.append(1)
        return len(reads)

    assert cache.get("k", read).value == 1
    clock[0] += 14
    assert cache.get("k", read).value == 1  # kept
    assert cache.get("k", read, refresh=True).value == 2  # read again on demand
    clock[0] += 15
    assert cache.get("k", read).value == 3  # expired


def test_page_row_shows_lag_red_headroom_words_for_an_unreachable_server_and_no_secret():
    state = state_at(7260)
    low = report_with_headroom(state, 7260 + 3600)  # half full: about four hours of headroom
    rows = [
        record(Sources(offsets=view(state), oplog=Reading(low, NOW))),
        record(
            Sources(
                offsets=view(state_at(30)),
                oplog=Reading(
                    None, NOW, "Could not connect to MongoDB at mongodb://cdc:pw1@db:1. Cause: refused"
                ),
            ),
            name="lost",
        ),
    ]
    html = render_page(
        rows, generated_at=NOW, dag_id=None, list_errors=[], hidden=1, threshold_seconds=THRESHOLD
    )
    default = html[html.index('data-connector="default"') : html.index('data-connector="lost"')]
    assert 'data-lag-seconds="7260"' in default and "lag 2 h 1 min" in default
    assert '<div class="low"' in default and "rs0: 4 h 1 min" in default  # below 6 h: red
    lost = html[html.index('data-connector="lost"') :]
    assert "Could not connect to MongoDB at mongodb://cdc:***@db:1" in lost and "pw1" not in html
    assert "1 connector(s) not shown: you may not read their DAGs" in html
    assert TOKEN["_data"] not in html


def test_a_completed_incremental_snapshot_shows_as_completed_with_its_time_and_counts():
    # The request stays in the offsets topic after its snapshot completed: it is no longer "requested".
    request = IncrementalRequest("incremental-1", ("shop.customers",), requested_at=NOW - timedelta(hours=1))
    done = IncrementalProgress(
        "incremental-1",
        status="completed",
        done=("shop.customers",),
        documents=60,
        chunks=3,
        started_at=NOW - timedelta(minutes=50),
        completed_at=NOW - timedelta(minutes=40),
    )
    state = state_at(10, incremental=done.to_json())
    offsets = Reading(OffsetsView({PARTITION: state}, request.to_json(), None), NOW)
    shown = record(Sources(offsets=offsets))["incremental_snapshot"]
    assert shown["status"] == "completed" and shown["request_id"] == "incremental-1"
    assert (shown["documents"], shown["chunks_done"]) == (60, 3)
    assert shown["completed_at"] == "2026-11-26T11:20:00Z"
    html = render_page(
        [record(Sources(offsets=offsets))],
        generated_at=NOW,
        dag_id=None,
        list_errors=[],
        hidden=0,
        threshold_seconds=THRESHOLD,
    )
    assert "waiting for the next window" not in html
    assert "last one completed 2026-11-26 11:20:00 UTC" in html and "60 documents in 3 chunks" in html
    # A new request after it: requested again, until a window takes it up.
    again = IncrementalRequest("incremental-2", (), requested_at=NOW)
    offsets = Reading(OffsetsView({PARTITION: state}, again.to_json(), None), NOW)
    assert record(Sources(offsets=offsets))["incremental_snapshot"]["status"] == "requested"


def test_offsets_show_lists_a_request_until_its_snapshot_is_done_then_its_outcome():
    from airflow_provider_mongocdc.cli import with_incremental_standing

    request = IncrementalRequest("incremental-1", ("shop.customers",), requested_at=NOW)
    shown = {
        "partitions": [
            {
                "partition": PARTITION.to_dict(),
                "offset": state_at(10).to_dict(),
                "finished_chunks": {},
            }
        ],
        "incremental_snapshot_requests": [
            {"connector": "shop", "server_id": "shop", "request": request.to_json()}
        ],
    }
    waiting = with_incremental_standing(json.loads(json.dumps(shown)))
    assert [item["status"] for item in waiting["incremental_snapshot_requests"]] == ["requested"]
    done = IncrementalProgress("incremental-1", status="completed", documents=60, chunks=3, completed_at=NOW)
    shown["partitions"][0]["offset"] = state_at(10, incremental=done.to_json()).to_dict()
    finished = with_incremental_standing(json.loads(json.dumps(shown)))
    assert finished["incremental_snapshot_requests"] == []
    (outcome,) = finished["incremental_snapshots"]
    assert outcome["status"] == "completed" and outcome["id"] == "incremental-1"
    assert (outcome["documents"], outcome["chunks"], outcome["completed_at"]) == (
        60,
        3,
        "2026-11-26T12:00:00Z",
    )


def watcher_status(pending: int, since_before_now: int | None, reported_before_now: int = 20) -> dict:
    """What a change watcher writes to the offsets topic (ChangeWatch.report)."""
    since = NOW - timedelta(seconds=since_before_now) if since_before_now is not None else None
    return {
        "connector": "shop",
        "at": (NOW - timedelta(seconds=reported_before_now)).isoformat(),
        "pending": pending,
        "pending_since": since.isoformat() if since else None,
        "partitions": {"rs0": {"state": "watched", "pending": pending, "since": None, "note": ""}},
        "waiting_for_window": False,
        "last_event_at": None,
        "incremental_snapshot": None,
    }


def test_change_driven_lag_tells_a_quiet_connector_from_one_that_is_behind():
    # With change-driven windows no window runs while nothing changes: the lag grows, yet nothing
    # is pending. The watcher's count (its status record in the offsets topic) tells which.
    def shown(status):
        offsets = Reading(OffsetsView({PARTITION: state_at(432)}, None, None, watcher=status), NOW)
        return record(Sources(offsets=offsets), change_driven=True)

    quiet = shown(watcher_status(0, None))
    assert quiet["offsets"]["lag_seconds"] == 432
    watcher = quiet["offsets"]["watcher"]
    assert (watcher["state"], watcher["pending"], watcher["age_seconds"]) == ("quiet", 0, 20)
    assert quiet["status"] == "ok"
    behind = shown(watcher_status(120, 300))
    assert behind["offsets"]["watcher"]["state"] == "behind"
    assert behind["offsets"]["watcher"]["oldest_pending_seconds"] == 300
    html = render_page(
        [quiet, behind], generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=THRESHOLD
    )
    assert "quiet: no change pending" in html
    assert "behind: 120 change(s) pending, the oldest 5 min 0 s old" in html
    assert "change watcher counted 20 s ago" in html
    # A watcher that stopped reporting (the triggerer is down) is a problem of its own.
    stale = shown(watcher_status(0, None, reported_before_now=7200))
    assert stale["status"] == "warning"
    assert any("the change watcher last reported 2 h ago" in problem for problem in stale["problems"])
    # A clock-scheduled connector has no watcher to ask.
    assert record(Sources(offsets=view(state_at(432))))["offsets"]["watcher"] is None


def test_the_watchers_status_record_is_read_from_the_offsets_topic_and_is_no_offset():
    from airflow_provider_mongocdc.core.offsets.keys import watch_key
    from airflow_provider_mongocdc.core.offsets.model import compact
    from airflow_provider_mongocdc.core.offsets.store import OffsetStore

    store = OffsetStore({"bootstrap.servers": "127.0.0.1:1"}, "shop.offsets")
    contents = store.read_everything([(watch_key("shop", "shop"), compact(watcher_status(3, 60)))])
    assert contents.states == {} and contents.skipped == 0
    assert OffsetsView.of(contents, None, "shop").watcher["pending"] == 3


def test_before_the_first_snapshot_a_silent_watcher_is_no_problem():
    offsets = Reading(OffsetsView({}, None, None), NOW)
    shown = record(Sources(offsets=offsets), change_driven=True)
    assert shown["offsets"]["watcher"]["state"] == "waiting"
    assert not any("change watcher" in problem for problem in shown["problems"])
    offsets = Reading(OffsetsView({PARTITION: state_at(60)}, None, None), NOW)
    shown = record(Sources(offsets=offsets), change_driven=True)
    assert any("the change watcher has not reported yet" in problem for problem in shown["problems"])


def test_an_open_window_shows_since_when_its_events_so_far_and_its_committed_lag():
    from airflow_provider_mongocdc.core.offsets.open_window import open_marker

    opened = open_marker(
        since=NOW - timedelta(minutes=12),
        now=NOW - timedelta(seconds=1),
        events=4321,
        commits=700,
        lag_ms=1400,
        next_commit_within_s=32,
        closes_by=NOW + timedelta(minutes=38),
    )
    holder = Lease(
        "mongocdc_hourly/asset_run/window", "window", NOW - timedelta(minutes=12), NOW + timedelta(minutes=43)
    )
    row = record(Sources(offsets=view(state_at(2, open_window=opened), holder)))
    window = row["offsets"]["open_window"]
    assert window["since"] == iso(NOW - timedelta(minutes=12))
    assert (window["events"], window["commits"], window["lag_seconds"]) == (4321, 700, 1.4)
    assert window["held_by"] == "mongocdc_hourly/asset_run/window"
    json.dumps(row)  # the page's JSON API returns the record
    html = render_page(
        [row], generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=THRESHOLD
    )
    assert f'data-open-since="{window["since"]}" data-events="4321"' in html
    assert "4321 events so far, committed lag 1 s" in html

    # Closed (no marker), or killed and its lease expired: no open window.
    assert record(Sources(offsets=view(state_at(2), holder)))["offsets"]["open_window"] is None
    expired = Lease(holder.owner, "window", holder.acquired_at, NOW - timedelta(seconds=1))
    killed = record(Sources(offsets=view(state_at(2, open_window=opened), expired)))
    assert killed["offsets"]["open_window"] is None
    assert "window open since" not in render_page(
        [killed], generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=THRESHOLD
    )


def iso(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def test_while_a_window_is_open_the_watcher_state_follows_it_not_the_watchers_last_count():
    # The watcher counted nothing pending when it asked for the window, then rests while the window
    # carries the changes: its record still says quiet. The open window's marker says otherwise.
    from airflow_provider_mongocdc.core.offsets.open_window import open_marker

    opened = open_marker(
        since=NOW - timedelta(minutes=12),
        now=NOW - timedelta(seconds=1),
        events=7200,
        commits=700,
        lag_ms=1400,
        next_commit_within_s=32,
        closes_by=NOW + timedelta(minutes=38),
    )
    holder = Lease(
        "mongocdc_hourly/asset_run/window", "window", NOW - timedelta(minutes=12), NOW + timedelta(minutes=43)
    )
    quiet_before = watcher_status(0, None, reported_before_now=12 * 60 + 5)
    offsets = Reading(
        OffsetsView({PARTITION: state_at(2, open_window=opened)}, None, holder, watcher=quiet_before), NOW
    )
    shown = record(Sources(offsets=offsets), change_driven=True)
    watcher = shown["offsets"]["watcher"]
    assert watcher["state"] == "open", watcher
    assert (watcher["open_since"], watcher["events"], watcher["commits"]) == (
        iso(NOW - timedelta(minutes=12)),
        7200,
        700,
    )
    assert watcher["note"] == "window open since 2026-11-26T11:48:00Z: 7200 changes committed in 700 commits"
    assert shown["status"] == "ok", shown["problems"]
    json.dumps(shown)
    html = render_page(
        [shown], generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=THRESHOLD
    )
    assert 'data-watcher-state="open"' in html
    assert "window open since 2026-11-26 11:48:00 UTC, 7200 changes committed" in html
    assert "quiet: no change pending" not in html

    # Once it closed (its marker removed with its last commit), the watcher's own count again.
    closed = Reading(OffsetsView({PARTITION: state_at(2)}, None, None, watcher=watcher_status(0, None)), NOW)
    after = record(Sources(offsets=closed), change_driven=True)["offsets"]["watcher"]
    assert after["state"] == "quiet" and "open_since" not in after
