"""The MongoDB CDC page and its JSON API on a real Airflow API server, and the page in a real browser.

One stack for the module (api-server, scheduler with LocalExecutor, dag-processor on 127.0.0.1,
the MongoDB simulator, the real Kafka broker) with a connector list of four connectors:
``default`` set up with the README's commands and run once as the UI's Trigger button runs it;
``orders``, whose offset an operator set two hours back with ``mongocdc offsets set``; ``lost``,
whose MongoDB connection points at a port where nothing listens; ``tables``, change-driven with a
Delta table, whose topic, table and offsets topic the test writes as its window and apply would:
60 events in three Kafka transactions, a table at their start whose declared column ``total``
had 3 values that did not fit it, and a window open since five minutes (its marker and lease)
after the change watcher counted nothing pending.

1. Every new endpoint refuses a request without credentials (401) and with an invalid token (403).
2. The API lists the four connectors; the default connector's committed position is the one
   ``mongocdc offsets show`` prints and its lag is the API's time minus it; the last window, the
   last snapshot, the lease, the pool and the chart come from the run; no response holds a
   password or a full resume token.
3. ``lost``: MongoDB unreachable is said in words, the rest of its row is still there.
4. A headless Chromium (Debian's chromium and chromium-driver, ``make browser``) logs in through
   the UI's login form, opens *MongoDB CDC* in the navigation bar, finds both connectors' rows with
   their lag, the open window as the change watcher's state and the table's misfits marked,
   no word cut at a line's end 1 900 px wide, follows the re-snapshot action to the DAG's Trigger
   form, and finds the *MongoDB CDC* tab of a connector's DAG showing that connector only.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote

import httpx
import pyarrow as pa
import pytest
from bson.timestamp import Timestamp
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from deltalake import CommitProperties, Transaction, write_deltalake

from airflow_provider_mongocdc.core.apply.state import last_misfits_app_id, misfits_app_id, position_app_id
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.health.record import TOKEN_SHOWN
from airflow_provider_mongocdc.core.offsets.keys import watch_key
from airflow_provider_mongocdc.core.offsets.lease import ConnectorLease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, compact
from airflow_provider_mongocdc.core.offsets.open_window import open_marker
from airflow_provider_mongocdc.core.offsets.store import OffsetStore
from airflow_provider_mongocdc.plugins.health_page import COLUMNS
from devtools.mongosim import MongoSim
from tests.e2e.airflow_stack import (
    HTTP_TIMEOUT_S,
    Stack,
    assert_all_tasks_succeed,
    dag_folder,
    free_port,
    own_airflow,
    start_airflow,
    stop,
    trigger,
    unpause,
    wait_registered,
)
from tests.readme_commands import README_KAFKA, README_MONGO_URI, README_PREFIX, setup_commands, substitute

pytestmark = [pytest.mark.e2e, pytest.mark.simulator_only]

MONGOCDC = str(Path(sys.executable).parent / "mongocdc")
ENDPOINTS = (
    "/mongocdc/",
    "/mongocdc/api/connectors",
    "/mongocdc/api/connectors/default",
    "/mongocdc/openapi.json",
)
ORDERS_BEHIND_S = 2 * 3600
LOST_PASSWORD = "s3cret-Pw"
# A browser step: the UI's pages load their data through the API on a loaded machine.
BROWSER_TIMEOUT_S = 180


@pytest.fixture(scope="module")
def stack(airflow_env, kafka_bootstrap, tmp_path_factory):
    home = tmp_path_factory.mktemp("health")
    run = uuid.uuid4().hex[:6]
    connectors = {
        "connectors": [
            # Triggered runs only: no scheduled run queues before the one triggered below.
            {"name": "default", "schedule": None},
            {
                "name": "orders",
                "config": {"topic.prefix": f"orders{run}", "collection.include.list": "shop\\.orders"},
            },
            {"name": "lost", "config": {"topic.prefix": f"lost{run}"}, "conn_ids": {"mongo": "lost_mongo"}},
            {
                "name": "tables",
                "config": {"topic.prefix": f"tables{run}", "collection.include.list": "shop\\.orders"},
                "window_schedule": {"changes": {"min_changes": 1000}},
                "delta": {"location": str(home / "lake"), "columns": {"shop.orders": {"total": "double"}}},
            },
        ]
    }
    env = own_airflow(airflow_env, home, dag_folder(home, connectors))
    prefix = f"health{run}"
    with MongoSim(mode="replset") as sim:
        stack = Stack(sim, prefix, kafka_bootstrap, env, home)
        try:
            for command in substitute(
                setup_commands(),
                {
                    README_MONGO_URI: sim.uri,
                    README_KAFKA: kafka_bootstrap,
                    README_PREFIX: f'"topic.prefix": "{prefix}"',
                },
            ):
                stack.airflow(*shlex.split(command)[1:])
            # Nothing listens there; the password must never reach a response.
            nowhere = f"mongodb://cdc:{LOST_PASSWORD}@127.0.0.1:{free_port()}/?replicaSet=rs0"
            stack.airflow(
                "connections", "add", "lost_mongo", "--conn-type", "mongocdc", "--conn-host", nowhere
            )
            client = stack.client
            client.shop.orders.insert_many([{"_id": i, "status": "new"} for i in range(1, 21)])
            client.shop.customers.insert_many([{"_id": f"c{i}", "name": f"c {i}"} for i in range(1, 6)])

            # Two hours back for orders and lost: an operator's mongocdc offsets set.
            behind = Timestamp(int(datetime.now(timezone.utc).timestamp()) - ORDERS_BEHIND_S, 1)
            for name in ("orders", "lost"):
                offsets(
                    kafka_bootstrap,
                    "set",
                    f"{name}{run}",
                    "--partition",
                    "rs0",
                    "--cluster-time",
                    f"{behind.time}:{behind.inc}",
                    "--yes",
                )

            write_tables_connector(kafka_bootstrap, f"tables{run}", home / "lake")

            api = start_airflow(stack)
            for dag_id in (
                "mongocdc_hourly",
                "mongocdc_orders_hourly",
                "mongocdc_lost_hourly",
                "mongocdc_tables_hourly",
            ):
                wait_registered(api, dag_id)
            # One hourly run, as the UI's Trigger button starts it.
            unpause(api, "mongocdc_hourly")
            hourly = trigger(api, "mongocdc_hourly", datetime.now(timezone.utc).isoformat())
            assert_all_tasks_succeed(api, "mongocdc_hourly", hourly)
            stack.api = api
            stack.run = run
            stack.hourly_run = hourly
            yield stack
        finally:
            stop(stack.processes)


TABLE_EVENTS = 60
MISFITS = 3
OPEN_EVENTS = 3000
KAFKA_TIMEOUT_S = 120  # bounds a broker round trip on a loaded machine


def write_tables_connector(bootstrap: str, prefix: str, lake: Path) -> None:
    """What the ``tables`` connector's runs would have left: the topic of shop.orders with
    :data:`TABLE_EVENTS` events in three transactions (each with its commit marker), the Delta table
    at their start with :data:`MISFITS` values of ``total`` that did not fit, the change watcher's
    count (nothing pending) and then a window open since five minutes (its marker and lease)."""
    kafka = {"bootstrap.servers": bootstrap}
    topic = f"{prefix}.shop.orders"
    admin = AdminClient(kafka)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(KAFKA_TIMEOUT_S)
    producer = Producer({**kafka, "transactional.id": f"{prefix}-events", "transaction.timeout.ms": 60000})
    producer.init_transactions(KAFKA_TIMEOUT_S)
    for first in range(0, TABLE_EVENTS, TABLE_EVENTS // 3):
        producer.begin_transaction()
        for number in range(first, first + TABLE_EVENTS // 3):
            producer.produce(topic, key=f'{{"id": {number}}}'.encode(), value=b'{"op": "c"}')
        producer.commit_transaction(KAFKA_TIMEOUT_S)
    write_deltalake(
        str(lake / "shop" / "orders"),
        pa.table({"_id": ["1"], "_doc": ["{}"], "total": pa.array([None], pa.float64())}),
        commit_properties=CommitProperties(
            app_transactions=[
                Transaction(position_app_id(topic, 0), 0),
                Transaction(misfits_app_id(topic, "total"), MISFITS),
                Transaction(last_misfits_app_id(topic, "total"), MISFITS),
            ]
        ),
    )

    now = datetime.now(timezone.utc)
    position = Timestamp(int(now.timestamp()) - 1, 1)
    offsets(bootstrap, "set", prefix, "--partition", "rs0", "--cluster-time", f"{position.time}:1", "--yes")
    watcher = {
        "connector": prefix,
        "at": iso_z(now),
        "pending": 0,
        "pending_since": None,
        "partitions": {"rs0": {"state": "watched", "pending": 0, "since": None, "note": ""}},
        "waiting_for_window": False,
        "last_event_at": None,
        "incremental_snapshot": None,
    }
    plain = Producer(kafka)
    plain.produce(f"{prefix}.offsets", key=watch_key(prefix, prefix), value=compact(watcher))
    assert plain.flush(KAFKA_TIMEOUT_S) == 0
    owner = "mongocdc_tables_hourly/asset_triggered__1/window"
    ConnectorLease(kafka, prefix, f"{prefix}.offsets").acquire(owner, "window", timedelta(hours=3))
    store = OffsetStore(kafka, f"{prefix}.offsets")
    partition = OffsetPartition(prefix, "rs0")
    marker = open_marker(
        since=now - timedelta(minutes=5),
        now=now,
        events=OPEN_EVENTS,
        commits=150,
        lag_ms=800,
        next_commit_within_s=3 * 3600,
        closes_by=now + timedelta(hours=3),
    )
    store.write(partition, replace(store.read(partition), open_window=marker))


def offsets(bootstrap: str, action: str, prefix: str, *args: str) -> dict:
    result = subprocess.run(
        [MONGOCDC, "offsets", action, "--bootstrap-servers", bootstrap, "--topic-prefix", prefix, *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def lag_at(generated_at: str, cluster_time: str) -> int:
    return int((parse_iso(generated_at) - parse_iso(cluster_time)).total_seconds())


# -- 1: authentication ------------------------------------------------------------------------------------
def test_every_endpoint_refuses_requests_without_a_valid_token(stack):
    http = stack.api.http
    with httpx.Client(
        base_url=http.base_url, cookies={"_token": "not-a-token"}, timeout=HTTP_TIMEOUT_S
    ) as forged_cookie:
        for path in ENDPOINTS:
            anonymous = http.get(path)
            assert anonymous.status_code == 401, (path, anonymous.text)
            forged = http.get(path, headers={"Authorization": "Bearer not-a-token"})
            assert forged.status_code == 403, (path, forged.text)
            cookie = forged_cookie.get(path)
            assert cookie.status_code == 403, (path, cookie.text)
            for refused in (anonymous, forged, cookie):  # nothing of a connector in a refusal
                assert "mongocdc_hourly" not in refused.text and "data-connector" not in refused.text
                assert stack.prefix not in refused.text
    # The API's description pages are not served at all.
    for path in ("/mongocdc/docs", "/mongocdc/redoc"):
        assert http.get(path).status_code == 404, path
    assert stack.api.call("GET", "/mongocdc/openapi.json").json()["info"]["title"] == "MongoDB CDC"
    # The page says how to get in.
    assert "Log in to Airflow" in http.get("/mongocdc/").text
    unknown = stack.api.call("GET", "/mongocdc/api/connectors/nosuch")
    assert unknown.status_code == 404 and "nosuch" in unknown.json()["detail"]


# -- 2: the API after one hourly run ---------------------------------------------------------------------
def test_api_shows_the_lag_of_mongocdc_offsets_show_and_the_last_run(stack):
    listed = stack.api.call("GET", "/mongocdc/api/connectors", params={"refresh": "true"})
    assert listed.status_code == 200, listed.text
    body = listed.json()
    records = {record["name"]: record for record in body["connectors"]}
    assert sorted(records) == ["default", "lost", "orders", "tables"], body

    shown = offsets(stack.bootstrap, "show", stack.prefix)
    (partition,) = shown["partitions"]
    committed = partition["offset"]["cluster_time"]
    default = records["default"]
    (row,) = default["offsets"]["partitions"]
    assert row["partition"] == "rs0" and row["cluster_time"] == committed, default["offsets"]
    assert row["lag_seconds"] == lag_at(default["generated_at"], committed), default["offsets"]
    assert default["offsets"]["lag_seconds"] == row["lag_seconds"], listed.text
    assert row["counters"] == partition["offset"]["counters"]
    assert (
        row["snapshot"]["status"] == "completed"
        and row["snapshot"]["id"] == partition["offset"]["snapshot"]["id"]
    )
    assert default["status"] == "ok", default["problems"]

    window = default["last_window"]
    assert window["run_id"] == stack.hourly_run and window["state"] == "success"
    assert window["log_url"].startswith(
        f"/dags/mongocdc_hourly/runs/{quote(stack.hourly_run, safe='')}/tasks/window"
    )
    assert window["events"] == 0 and window["duration_s"] > 0
    snapshot = default["last_snapshot"]
    assert snapshot["run_id"] == stack.hourly_run and snapshot["documents"] == 25
    assert [point["events"] for point in default["windows_last_day"]] == [0]
    assert default["lease"]["state"] == "free"
    assert default["pool"]["exists"] and default["pool"]["slots"] == 1 and default["pool"]["running"] == 0
    (headroom,) = default["oplog"]["partitions"]
    assert headroom["status"] == "ok" and headroom["headroom_seconds"] is not None
    assert default["oplog"]["threshold_seconds"] == 6 * 3600

    orders = records["orders"]
    (orders_row,) = orders["offsets"]["partitions"]
    assert orders_row["lag_seconds"] == lag_at(orders["generated_at"], orders_row["cluster_time"])
    assert orders_row["lag_seconds"] >= ORDERS_BEHIND_S
    assert orders["last_window"] is None and orders["pool"]["exists"] is False

    one = stack.api.call("GET", "/mongocdc/api/connectors/default").json()
    assert one["offsets"]["partitions"][0]["cluster_time"] == committed

    # Nothing secret: no full resume token, no connection string.
    token = partition["offset"].get("resume_token")
    text = listed.text + json.dumps(one)
    assert isinstance(token, str) and len(token) > TOKEN_SHOWN and token not in text
    assert row["resume_token"] == token[:TOKEN_SHOWN] + "…"
    assert LOST_PASSWORD not in text  # the lost connector's connection has one


def test_api_shows_the_open_window_as_the_watchers_state_and_the_tables_events_and_misfits(stack):
    tables = stack.api.call("GET", "/mongocdc/api/connectors/tables", params={"refresh": "true"}).json()
    watcher = tables["offsets"]["watcher"]
    assert watcher["state"] == "open" and watcher["events"] == OPEN_EVENTS, watcher
    assert watcher["open_since"] == tables["offsets"]["open_window"]["since"], tables["offsets"]
    (table,) = tables["tables"]["tables"]
    assert table["collection"] == "shop.orders" and table["version"] == 0, table
    # 60 events and 3 commit markers: 63 offsets, 60 behind.
    assert table["ends"] == {"0": TABLE_EVENTS + 3} and table["behind"] == TABLE_EVENTS, table
    assert table["behind_more"] is False
    assert table["misfits"] == {"total": {"type": "double", "total": MISFITS, "last_run": MISFITS}}
    assert tables["status"] == "warning", tables["problems"]
    assert (
        f"Delta table of shop.orders: {MISFITS} value(s) of the column total did not fit double since the "
        f"table was created, {MISFITS} in its last apply run (null in the column, kept in _doc)"
    ) in tables["problems"], tables["problems"]


# -- 3: an unreachable MongoDB ------------------------------------------------------------------------------
def test_unreachable_mongodb_is_said_in_words_and_the_rest_is_shown(stack):
    lost = stack.api.call("GET", "/mongocdc/api/connectors/lost").json()
    assert lost["status"] == "warning"
    assert "Could not connect to MongoDB" in lost["oplog"]["error"]
    assert lost["problems"][0].startswith(
        "MongoDB: the oplog headroom is unknown: Could not connect to MongoDB"
    )
    assert lost["offsets"]["partitions"][0]["lag_seconds"] >= ORDERS_BEHIND_S  # Kafka still read
    page = stack.api.call("GET", "/mongocdc/")
    assert page.status_code == 200
    assert 'data-connector="lost"' in page.text and "Could not connect to MongoDB" in page.text
    assert LOST_PASSWORD not in page.text + json.dumps(lost)


# -- 4: the page in a real browser ----------------------------------------------------------------------------
@pytest.fixture
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    assert chromium and driver, (
        "the browser test needs Debian's chromium and chromium-driver: make browser (root: apt-get "
        "install -y chromium chromium-driver)"
    )
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    profile = tempfile.mkdtemp(prefix="mongocdc-chromium-")
    for argument in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1800,1100",
        f"--user-data-dir={profile}",
    ):
        options.add_argument(argument)
    session = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield session
    finally:
        session.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_browser_logs_in_finds_both_connectors_with_their_lag_and_opens_the_resnapshot_form(stack, browser):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    base = str(stack.api.http.base_url).rstrip("/")
    wait = WebDriverWait(browser, BROWSER_TIMEOUT_S)

    # The UI's own login form (SimpleAuthManager).
    browser.get(f"{base}/")
    username = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "input[name='username']"))
    username.send_keys("admin")
    browser.find_element(By.CSS_SELECTOR, "input[name='password']").send_keys(stack.api.password)
    browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
    wait.until(lambda b: "/auth/login" not in b.current_url and b.get_cookie("_token"))

    # MongoDB CDC in the navigation bar: the page in its frame.
    browser.get(f"{base}/plugin/mongocdc")
    frame = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "iframe[title='MongoDB CDC']"))
    browser.switch_to.frame(frame)
    table = wait.until(lambda b: b.find_element(By.ID, "connectors"))
    generated_at = table.get_attribute("data-generated-at")
    committed = offsets(stack.bootstrap, "show", stack.prefix)["partitions"][0]["offset"]["cluster_time"]
    for name in ("default", "orders"):
        row = browser.find_element(By.CSS_SELECTOR, f"tr[data-connector='{name}']")
        lag = row.find_element(By.CSS_SELECTOR, ".lag")
        assert lag.text.startswith("lag "), lag.text
        position = row.find_element(By.CSS_SELECTOR, ".partition[data-partition='rs0']")
        cluster_time = position.get_attribute("data-cluster-time")
        if name == "default":
            assert cluster_time == committed
        assert int(lag.get_attribute("data-lag-seconds")) == lag_at(generated_at, cluster_time)
    assert "lag 2 h" in browser.find_element(By.CSS_SELECTOR, "tr[data-connector='orders'] .lag").text

    # The change-driven connector with a window open: the watcher's state follows the window, and
    # its table is marked for the values that did not fit its declared column.
    tables = browser.find_element(By.CSS_SELECTOR, "tr[data-connector='tables']")
    watcher = tables.find_element(By.CSS_SELECTOR, ".watcher")
    assert watcher.get_attribute("data-watcher-state") == "open", watcher.text
    assert (
        watcher.text.startswith("window open since ") and f", {OPEN_EVENTS} changes committed" in watcher.text
    )
    assert "quiet" not in tables.text, tables.text
    table = tables.find_element(By.CSS_SELECTOR, ".table[data-collection='shop.orders']")
    assert f"{TABLE_EVENTS} behind" in table.text, table.text
    misfit = table.find_element(By.CSS_SELECTOR, ".misfit")
    assert misfit.is_displayed()
    assert misfit.text == f"⚠ total: {MISFITS} values did not fit double, {MISFITS} in the last run", (
        misfit.text
    )
    assert "Attention" in tables.find_element(By.CSS_SELECTOR, ".badge").text
    assert "3 value(s) of the column total did not fit double" in tables.text

    # The re-snapshot action opens the connector's re-snapshot DAG in the UI; its Trigger form.
    browser.find_element(By.CSS_SELECTOR, "tr[data-connector='default'] a[data-action='resnapshot']").click()
    browser.switch_to.default_content()
    wait.until(lambda b: b.current_url.endswith("/dags/mongocdc_resnapshot"))
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "[data-testid='trigger-dag-button']")).click()
    wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "[data-testid='trigger-dag-submit']"))
    form = browser.find_element(By.TAG_NAME, "body").text
    assert "Trigger Dag - mongocdc_resnapshot" in form, form[-2000:]
    for field in ("Mode", "Collections", "manual: chosen collections (or all), the offset stays"):
        assert field in form, form[-2000:]
    # A collection without its database: Trigger gets the API server's refusal, one line in words
    # above the form's fields, and no run.
    runs_path = "/api/v2/dags/mongocdc_resnapshot/dagRuns"
    runs = stack.api.call("GET", runs_path).json()["total_entries"]
    browser.find_element(By.ID, "element_collections").send_keys("orders")
    browser.find_element(By.CSS_SELECTOR, "[data-testid='trigger-dag-submit']").click()
    refusal = "Invalid input for param collections: `orders` is not `<database>.<collection>`."
    alert = wait.until(
        lambda b: b.find_element(By.XPATH, f"//*[starts-with(normalize-space(.), {refusal!r})]")
    )
    assert "Fix: write it as <database>.orders, e.g. shop.orders" in alert.text, alert.text
    assert "\n" not in alert.text.strip() and "Failed validating" not in alert.text, alert.text
    # Airflow's form shows it above its fields: the page scrolls up to it from Trigger.
    field = browser.find_element(By.ID, "element_collections")
    above = browser.execute_script(
        "return arguments[0].getBoundingClientRect().bottom <= arguments[1].getBoundingClientRect().top;",
        alert,
        field,
    )
    assert above, alert.text
    assert stack.api.call("GET", runs_path).json()["total_entries"] == runs

    # The MongoDB CDC tab of a connector's DAG: that connector's row only.
    browser.get(f"{base}/dags/mongocdc_orders_hourly/plugin/mongocdc-connector")
    frame = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "iframe[title='MongoDB CDC']"))
    browser.switch_to.frame(frame)
    rows = wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr[data-connector]"))
    assert [row.get_attribute("data-connector") for row in rows] == ["orders"]

    # 1 600 px wide, the tab shares the window with the DAG's grid: every cell of the row, the
    # chart and the actions included, lies inside the frame (nothing to scroll to, nothing cut off).
    browser.switch_to.default_content()
    browser.set_window_size(1600, 1100)
    browser.get(f"{base}/dags/mongocdc_orders_hourly/plugin/mongocdc-connector")
    frame = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "iframe[title='MongoDB CDC']"))
    browser.switch_to.frame(frame)
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr[data-connector='orders'] a[data-action]"))
    fit = browser.execute_script(
        """
        const cells = [...document.querySelectorAll("tr[data-connector='orders'] > td")];
        const action = document.querySelector("tr[data-connector='orders'] a[data-action='resnapshot']");
        return {width: document.documentElement.clientWidth, scroll: document.documentElement.scrollWidth,
                cells: cells.length, right: Math.max(...cells.map(c => c.getBoundingClientRect().right)),
                action: action.getBoundingClientRect().right};
        """
    )
    assert fit["cells"] == len(COLUMNS) and fit["scroll"] <= fit["width"], fit
    assert fit["right"] <= fit["width"] and fit["action"] <= fit["width"], fit
    # Each cell under its column's title (the narrow layout's labels).
    labels = browser.execute_script(
        """
        return [...document.querySelectorAll("tr[data-connector='orders'] > td")]
            .map(cell => getComputedStyle(cell, "::before").content);
        """
    )
    if fit["width"] <= 1650:
        assert labels == [f'"{title}"' for title in COLUMNS], (fit, labels)

    # 1 900 px wide: every row's words lie whole on one line (a name wraps between its parts).
    browser.switch_to.default_content()
    browser.set_window_size(1900, 1100)
    browser.get(f"{base}/mongocdc/?refresh=true")
    wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, "tr[data-connector='tables'] .misfit"))
    cut = browser.execute_script(CUT_WORDS)
    assert cut == [], cut


# The words of the connectors' rows (letters and digits between other characters) that a line's
# end cuts: a word whose text takes more than one line box.
CUT_WORDS = """
const cut = [];
const walker = document.createTreeWalker(document.querySelector("#connectors tbody"), NodeFilter.SHOW_TEXT);
while (walker.nextNode()) {
  const node = walker.currentNode, words = /[A-Za-z0-9]+/g;
  let word;
  while ((word = words.exec(node.data))) {
    const range = document.createRange();
    range.setStart(node, word.index);
    range.setEnd(node, word.index + word[0].length);
    const lines = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
    if (lines.size > 1) { cut.push(node.data); }
  }
}
return cut;
"""


# -- 5: run summaries written by a DAG editor through the REST API ---------------------------------------------
MARK = "pwned"
HOSTILE_WINDOW = {
    "events": f"<script>document.title='{MARK}'</script>",
    "events_by_op": {f"<img src=x onerror=\"document.title='{MARK}'\">": 5, "c": "<b>7</b>"},
    "window_end": f"<svg onload=\"document.title='{MARK}'\">",
    "duration_s": "<i>slow</i>",
}
HOSTILE_SNAPSHOT = {
    "documents": f"<script>document.title='{MARK}'</script>",
    "action": "copied",
    "resnapshot": {"mode": f"<img src=x onerror=\"document.title='{MARK}'\">"},
}


def test_hostile_run_summaries_written_through_the_rest_api_run_no_script(stack, browser):
    """Airflow's REST API lets whoever may edit a DAG change its tasks' XCom: the window's and the
    snapshot's summaries, rewritten with markup, are shown as text (or as unknown where a number
    belongs), the page still answers for everyone, and the browser runs none of it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    api, run = stack.api, stack.hourly_run
    paths = {
        task: f"/api/v2/dags/mongocdc_hourly/dagRuns/{run}/taskInstances/{task}/xcomEntries/return_value"
        for task in ("window", "snapshot")
    }
    originals = {task: api.call("GET", path).json()["value"] for task, path in paths.items()}
    try:
        for task, value in (("window", HOSTILE_WINDOW), ("snapshot", HOSTILE_SNAPSHOT)):
            patched = api.call("PATCH", paths[task], json={"value": value})
            assert patched.status_code == 200, patched.text

        page = api.call("GET", "/mongocdc/")
        assert page.status_code == 200, page.text[-2000:]
        assert "<script>document.title" not in page.text and "<img src=x" not in page.text
        record = api.call("GET", "/mongocdc/api/connectors/default").json()
        window, snapshot = record["last_window"], record["last_snapshot"]
        assert window["events"] is None and window["events_by_op"] == {HOSTILE_WINDOW_OP: 5}
        assert window["window_end"] is None and window["app_duration_s"] is None
        assert snapshot["documents"] is None and snapshot["mode"] == HOSTILE_SNAPSHOT["resnapshot"]["mode"]

        base = str(api.http.base_url).rstrip("/")
        wait = WebDriverWait(browser, BROWSER_TIMEOUT_S)
        browser.get(f"{base}/")
        username = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "input[name='username']"))
        username.send_keys("admin")
        browser.find_element(By.CSS_SELECTOR, "input[name='password']").send_keys(api.password)
        browser.find_element(By.CSS_SELECTOR, "button[type='submit']").click()
        wait.until(lambda b: "/auth/login" not in b.current_url and b.get_cookie("_token"))
        browser.get(f"{base}/mongocdc/")  # the page itself, with the UI's cookie
        row = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, "tr[data-connector='default']"))
        assert HOSTILE_WINDOW_OP in row.text and HOSTILE_SNAPSHOT["resnapshot"]["mode"] in row.text
        assert browser.title == "MongoDB CDC", browser.title
        assert (
            browser.execute_script("return document.querySelectorAll('img, svg[onload], b, i').length") == 0
        )
    finally:
        for task, value in originals.items():
            api.call("PATCH", paths[task], json={"value": value})


HOSTILE_WINDOW_OP = next(iter(HOSTILE_WINDOW["events_by_op"]))
