"""The MongoDB CDC page escapes every value a record can carry, and a task summary (XCom, which any
user who may edit a DAG can write through Airflow's REST API) is coerced to its types on the way in.

A full record (every part the page shows) is rendered with each of its strings, one at a time and
all at once, replaced by markup that would run script; and with each of its values replaced by such
markup (a count that is a string, a table that is a list). The rendered page must hold no element
and no attribute that the page does not write itself, and the hostile text must be on the page as
text.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from html.parser import HTMLParser
from typing import Any

import pytest
from bson.timestamp import Timestamp

from airflow_provider_mongocdc.core.health.record import (
    ConnectorIdentity,
    OffsetsView,
    Reading,
    Sources,
    connector_record,
)
from airflow_provider_mongocdc.core.health.summaries import snapshot_summary, window_summary
from airflow_provider_mongocdc.core.health.tables import add_tables
from airflow_provider_mongocdc.core.offsets.lease import Lease
from airflow_provider_mongocdc.core.offsets.model import OffsetPartition, OffsetState, Position
from airflow_provider_mongocdc.core.snapshot.incremental import IncrementalProgress
from airflow_provider_mongocdc.plugins.health_page import SCRIPT, render_login, render_page

pytestmark = pytest.mark.unit

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=timezone.utc)
HOSTILE = [
    "<img src=x onerror=alert(document.cookie)>",
    "<script>alert(1)</script>",
    '"><svg onload=alert(2)>',
    "' onmouseover='alert(3)",
    "</title><script>alert(4)</script>",
    "javascript:alert(5)",
]
# Every element and attribute the page writes itself.
ELEMENTS = {
    "html", "head", "meta", "title", "style", "body", "h1", "div", "p", "a", "table", "thead",
    "tbody", "tr", "th", "td", "small", "strong", "span", "ul", "li", "svg", "rect", "script", "wbr",
}  # fmt: skip
ATTRIBUTES = {
    "lang", "charset", "class", "id", "href", "title", "colspan", "width", "height", "x", "y", "role",
    "aria-label", "data-top", "data-action", "data-connector", "data-lag-seconds", "data-partition",
    "data-cluster-time", "data-generated-at", "data-watcher-state", "data-pending", "viewbox",
    "data-open-since", "data-events", "data-collection", "data-version", "data-behind", "data-misfits",
    "data-column", "data-total", "data-last-run",
}  # fmt: skip


class PageParts(HTMLParser):
    """The elements, attributes, scripts and text of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: set[str] = set()
        self.attributes: set[str] = set()
        self.hrefs: list[str] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.add(tag)
        self.attributes |= {name for name, _ in attrs}
        self.hrefs += [value or "" for name, value in attrs if name == "href"]
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


def parts_of(html: str) -> PageParts:
    parser = PageParts()
    parser.feed(html)
    parser.close()
    return parser


def assert_inert(html: str) -> PageParts:
    parts = parts_of(html)
    assert parts.elements <= ELEMENTS, parts.elements - ELEMENTS
    assert parts.attributes <= ATTRIBUTES, parts.attributes - ATTRIBUTES
    assert [script.strip() for script in parts.scripts] == [SCRIPT.strip()]
    assert not [href for href in parts.hrefs if href.strip().lower().startswith("javascript:")]
    return parts


def full_record(text: str = "x") -> dict[str, Any]:
    """A record with every part the page shows, ``text`` in each free-text field."""
    partition = OffsetPartition("shop", "rs0")
    progress = IncrementalProgress(
        "incremental-1", pending=("shop.b",), current="shop.a", documents=5, chunks=1
    )
    state = OffsetState(
        position=Position(resume_token={"_data": "82" + "0" * 40}, cluster_time=Timestamp(1764150000, 3)),
        incremental=progress.to_json(),
        # An open window (its marker as the offsets topic holds it: anyone who writes the topic may
        # change it).
        open_window={
            "since": text,
            "events": 3,
            "commits": 2,
            "lag_ms": 900,
            "until": "2026-11-26T12:05:00Z",
        },
    )
    lease = Lease("mongocdc_hourly/run1/window", "window", NOW, NOW + timedelta(minutes=55), "w1")
    identity = ConnectorIdentity(
        name="default",
        dag_ids={"hourly": "mongocdc_hourly", "resnapshot": "mongocdc_resnapshot", "watchdog": "w"},
        conn_ids={"mongo": "m", "kafka": "k", "spark": "s"},
        pool="mongocdc_default",
        topic_prefix="shop",
        offsets_topic="shop.offsets",
        config_error=text,
        change_driven=True,
    )
    watcher = {
        "at": "2026-11-26T11:59:30Z",
        "pending": 3,
        "pending_since": "2026-11-26T11:58:00Z",
        "partitions": {"rs0": {"state": text, "pending": 3, "since": text, "note": text}},
        "incremental_snapshot": text,
    }
    window = {
        "dag_id": "mongocdc_hourly",
        "run_id": "run1",
        "task_id": "window",
        "state": "failed",
        "start_date": "2026-11-26T11:00:00+00:00",
        "duration_s": 12.0,
        "log_url": "/dags/mongocdc_hourly/runs/run1/tasks/window",
        **window_summary({"events": 3, "events_by_op": {"c": 2, text: 1}, "duration_s": 2.0}),
    }
    snapshot = {
        **window,
        "task_id": "resnapshot",
        **snapshot_summary({"documents": 7, "action": text, "resnapshot": {"mode": text}}),
    }
    runs = {
        "last_window": window,
        "last_snapshot": snapshot,
        "windows": [{"end": "2026-11-26T11:00:00Z", "events": 3, "state": text, "run_id": text}],
    }
    pool = {
        "exists": True,
        "slots": 1,
        "running": 1,
        "queued": 0,
        "tasks": [{"dag_id": text, "run_id": text, "task_id": text, "state": text, "url": "/x"}],
    }
    record = connector_record(
        identity,
        Sources(
            offsets=Reading(OffsetsView({partition: state}, None, lease, watcher=watcher), NOW, None),
            oplog=Reading(None, NOW, text),
            documents_left=Reading(None, NOW, text),
            runs=Reading(runs, NOW),
            pool=Reading(pool, NOW),
            registered_dags=frozenset({text}),
        ),
        now=NOW,
        headroom_threshold_seconds=6 * 3600,
    )
    table = {
        "collection": text,
        "topic": text,
        "table": text,
        "ends": {0: 12},
        "earliest": {0: 0},
        "behind": {"records": 4, "complete": True},
        "state": {
            "version": 2,
            "positions": {0: 8},
            "committed_ms": None,
            "misfits": {text: {"type": text, "total": 3, "last_run": 1}},
        },
    }
    add_tables(record, "/lake", Reading([table, {**table, "error": text}], NOW), NOW)
    record["paused"] = {"mongocdc_hourly": True}
    record["links"] = {"resnapshot_form": "/dags/r", "hourly": "/dags/h", "watchdog": "/dags/w"}
    record["lease"]["url"] = "/dags/mongocdc_hourly/runs/run1/tasks/window"
    return record


def leaves(value: Any, path: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    """Every (path, value) of a JSON-like value, containers included."""
    yield path, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, (*path, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from leaves(item, (*path, index))


def replaced(value: Any, path: tuple, new: Any) -> Any:
    if not path:
        return new
    head, *rest = path
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[head] = replaced(value[head], tuple(rest), new)
    return copy


def render(records: list[dict[str, Any]], **kwargs: Any) -> str:
    values = dict(generated_at=NOW, dag_id=None, list_errors=[], hidden=0, threshold_seconds=21600)
    values.update(kwargs)
    return render_page(records, **values)


def test_every_string_of_a_record_replaced_by_markup_is_shown_as_text():
    base = full_record()
    strings = [path for path, value in leaves(base) if isinstance(value, str) and path]
    assert len(strings) > 60, "the record should carry every part the page shows"
    for payload in HOSTILE:
        everything = base
        for path in strings:
            one = replaced(base, path, payload)
            assert_inert(render([one]))
            everything = replaced(everything, path, payload)
        parts = assert_inert(render([everything], list_errors=[payload], dag_id=payload))
        assert payload in "".join(parts.text)


def test_every_value_of_a_record_replaced_by_markup_neither_breaks_the_page_nor_runs():
    base = full_record()
    for path, _ in list(leaves(base))[1:]:
        for payload in (HOSTILE[0], [HOSTILE[1]], {HOSTILE[2]: HOSTILE[3]}, float("nan"), 10**30):
            assert_inert(render([replaced(base, path, payload)]))


def test_hostile_text_in_the_record_fields_is_escaped_in_the_markup():
    html = render([full_record(HOSTILE[0])], list_errors=[HOSTILE[1]])
    assert "<img src=x" not in html and "<script>alert" not in html
    assert "&lt;img src=x onerror=alert(document.cookie)&gt;" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_identifiers_break_only_after_underscores_dots_slashes_and_hyphens():
    # A long name wraps where it has parts (mongocdc_|default, shop.|orders), never inside a word.
    parts = assert_inert(render([full_record("mongocdc_default.shop/orders-2026")]))
    html = render([full_record("mongocdc_default.shop/orders-2026")])
    assert "mongocdc_<wbr>default.<wbr>shop/<wbr>orders-<wbr>2026" in html
    before = [piece[-1:] for piece in html.split("<wbr>")[:-1]]
    assert before and set(before) <= set("_./-"), set(before)
    assert "mongocdc_default.shop/orders-2026" in "".join(parts.text)


def test_refused_request_page_escapes_its_detail_and_login_address():
    parts = assert_inert(render_login(403, HOSTILE[1], '"><script>alert(9)</script>'))
    assert HOSTILE[1] in "".join(parts.text)


def test_refresh_link_url_encodes_the_dag_id():
    html = render([], dag_id="a&b=<c> d")
    assert 'href="?refresh=true&amp;dag_id=a%26b%3D%3Cc%3E+d"' in html


@pytest.mark.parametrize(
    ("summary", "expected"),
    [
        (
            {"events": "<script>", "events_by_op": {"<img>": 1, "c": "2", "u": 3}, "window_end": "<b>"},
            {
                "events": None,
                "events_by_op": {"<img>": 1, "u": 3},
                "window_end": None,
                "app_duration_s": None,
            },
        ),
        (
            '{"events": 4, "events_by_op": [1], "duration_s": 2.5, "window_end": "2026-11-26T11:00:00+00:00"}',
            {"events": 4, "events_by_op": None, "window_end": "2026-11-26T11:00:00Z", "app_duration_s": 2.5},
        ),
        (
            {"events": True, "duration_s": -1, "window_end": 5},
            {"events": None, "events_by_op": None, "window_end": None, "app_duration_s": None},
        ),
        ("not json", {"events": None, "events_by_op": None, "window_end": None, "app_duration_s": None}),
    ],
)
def test_window_summary_fields_are_coerced_to_their_types(summary, expected):
    assert window_summary(summary) == expected


def test_snapshot_summary_fields_are_coerced_to_their_types():
    found = snapshot_summary(
        {
            "documents": "<script>",
            "collections": {"shop.a": 2.0, "shop.b": "x", 3: 4},
            "action": ["new"],
            "snapshot_id": "s" * 500,
            "resnapshot": {"mode": {"x": 1}},
        }
    )
    assert found["documents"] is None and found["action"] is None and found["mode"] is None
    assert found["documents_by_collection"] == {"shop.a": 2}
    assert len(found["snapshot_id"]) == 200
