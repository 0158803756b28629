"""The MongoDB CDC page and its JSON API on a real Airflow API server, and the page in a real browser.

One stack for the module (api-server, scheduler with LocalExecutor, dag-processor on 127.0.0.1,
the MongoDB simulator, the real Kafka broker) with a connector list of three connectors:
``default`` set up with the README's commands and run once as the UI's Trigger button runs it;
``orders``, whose offset an operator set two hours back with ``mongocdc offsets set``; ``lost``,
whose MongoDB connection points at a port where nothing listens.

1. Every new endpoint refuses a request without credentials (401) and with an invalid token (403).
2. The API lists the three connectors; the default connector's committed position is the one
   ``mongocdc offsets show`` prints and its lag is the API's time minus it; the last window, the
   last snapshot, the lease, the pool and the chart come from the run; no response holds a
   password or a full resume token.
3. ``lost``: MongoDB unreachable is said in words, the rest of its row is still there.
4. A headless Chromium (Debian's chromium and chromium-driver, ``make browser``) logs in through
   the UI's login form, opens *MongoDB CDC* in the navigation bar, finds both connectors' rows with
   their lag, follows the re-snapshot action to the DAG's Trigger form, and finds the *MongoDB CDC*
   tab of a connector's DAG showing that connector only.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.base.timefmt import parse_iso
from airflow_provider_mongocdc.core.health.record import TOKEN_SHOWN
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

            api = start_airflow(stack)
            for dag_id in ("mongocdc_hourly", "mongocdc_orders_hourly", "mongocdc_lost_hourly"):
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
    assert sorted(records) == ["default", "lost", "orders"], body

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
