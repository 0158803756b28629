"""The MongoDB CDC page: the health records of :mod:`airflow_provider_mongocdc.core.health.record`
as one HTML table, a row per connector (docs/operations.md, "The MongoDB CDC page and its JSON API",
describes each column).

Plain HTML rendered on the API server from the Jinja template ``templates/mongocdc_page.html`` with
autoescape on: every value of a record is HTML-escaped where it is written, whoever wrote it (a task
summary comes from XCom, which any user who may edit a DAG can change through Airflow's REST API);
the page's own style and script are the only text written as it is. No script is needed to read it. The one script makes the
links to Airflow's own pages (DAGs, task logs, the re-snapshot form) open in the Airflow UI around
the page rather than inside its frame: the UI shows plugin pages in a sandboxed frame, from which a
link may not navigate the window itself, so the script follows the link from the surrounding
(same-origin) page.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from jinja2 import ChainableUndefined, Environment, FileSystemLoader
from markupsafe import Markup, escape

from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.health.record import headline
from airflow_provider_mongocdc.core.health.summaries import count

log = logging.getLogger(__name__)
STATUS_WORDS = {"ok": "OK", "warning": "Attention", "error": "Problem"}
OPS = ("c", "u", "d", "r")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 16px; color: #1a202c;
       font-size: 14px; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
.meta { color: #4a5568; margin-bottom: 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #f7fafc; font-weight: 600; }
td { overflow-wrap: break-word; }
svg { max-width: 100%; height: auto; }
td small, .age { color: #718096; display: block; }
.badge { display: inline-block; padding: 1px 6px; border-radius: 8px; font-size: 12px; font-weight: 600; }
.status-ok .badge { background: #c6f6d5; color: #22543d; }
.status-warning .badge { background: #fefcbf; color: #744210; }
.status-error .badge { background: #fed7d7; color: #822727; }
.low, .failed, .unreachable { color: #c53030; font-weight: 600; }
.problems { margin: 4px 0 0 0; padding-left: 16px; color: #744210; }
.status-error .problems { color: #822727; }
.lag { font-size: 16px; font-weight: 600; }
a { color: #2b6cb0; }
.errors { background: #fff5f5; border: 1px solid #feb2b2; padding: 8px; margin-bottom: 12px; }
svg .bar { fill: #4299e1; } svg .bar.failed { fill: #e53e3e; }
.watcher-behind { color: #744210; font-weight: 600; }
.open-window, .watcher-open { color: #22543d; font-weight: 600; }
.misfit { color: #744210; font-weight: 600; }
"""

SCRIPT = """
document.addEventListener("click", function (event) {
  var link = event.target.closest ? event.target.closest("a[data-top]") : null;
  if (!link || window.top === window) { return; }
  try {
    var page = window.top.document;  // the Airflow UI around this frame (same origin)
    var follow = page.createElement("a");
    follow.href = link.href;
    page.body.appendChild(follow);
    follow.click();
    follow.remove();
    event.preventDefault();
  } catch (error) {
    // another origin: the link opens in this frame
  }
});
"""


UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))
TEMPLATES = Path(__file__).with_name("templates")
PAGE_TEMPLATE, ROW_TEMPLATE = "mongocdc_page.html", "mongocdc_row.html"
COLUMNS = (
    "Connector",
    "Committed position · lag",
    "Oplog headroom",
    "Last window",
    "Last snapshot",
    "Incremental snapshot",
    "Lease",
    "Pool",
    "Events per window, 24 h",
    "Tables",
    "Actions",
)
CHART_WIDTH, CHART_HEIGHT, CHART_GAP = 180, 40, 1


def duration(seconds: Any) -> str:
    """The two largest units: ``2 d 3 h``, ``3 h 5 min``, ``4 min 10 s``, ``12 s``; ``—`` for what
    is not a number of seconds."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds != seconds:
        return "—"
    if abs(seconds) > 1e12:
        return "—"
    rest, parts = abs(int(seconds)), []
    for unit, size in UNITS:
        amount, rest = divmod(rest, size)
        if amount or parts:
            parts.append(f"{amount} {unit}")
        if len(parts) == 2:
            break
    return ("-" if seconds < 0 else "") + (" ".join(parts) or "0 s")


def when(value: Any) -> str:
    """An ISO time as ``2026-11-26 18:59:13 UTC``; ``—`` for what is not one."""
    try:
        moment = parse_iso(value) if isinstance(value, str) and value else None
    except ValueError:
        moment = None
    return "—" if moment is None else (iso_z(moment) or "")[:19].replace("T", " ") + " UTC"


def ops(counts: Any) -> str:
    """Events per operation, Debezium's ``c u d r`` first: ``c 3, u 1``."""
    if not isinstance(counts, Mapping):
        return "no events"
    known = [f"{op} {counts[op]}" for op in OPS if count(counts.get(op))]
    other = [f"{op} {n}" for op, n in sorted(counts.items(), key=str) if op not in OPS and count(n)]
    return ", ".join(known + other) or "no events"


def headroom(row: Mapping[str, Any]) -> str:
    """One partition's oplog headroom in words."""
    if row.get("status") == "gap":
        return "gap: position purged"
    if row.get("headroom_seconds") is not None:
        return duration(row["headroom_seconds"])
    return {"no_offset": "no offset", "no_position": "no position"}.get(row.get("status"), "unknown")


def chart(points: Any) -> dict[str, Any]:
    """The geometry of the chart of a record's windows of the last day: a bar per window (its
    height its events, red for a failed one), every number computed here."""
    points = [point for point in points or [] if isinstance(point, Mapping)]
    events = [count(point.get("events")) or 0 for point in points]
    highest = max(events, default=0) or 1
    width = max(2, (CHART_WIDTH - CHART_GAP * len(points)) // max(1, len(points)))
    bars = []
    for index, (point, number) in enumerate(zip(points, events)):
        tall = max(1, round(number / highest * (CHART_HEIGHT - 2)))
        bars.append(
            {
                "css": "bar" if point.get("state") in ("success", None) else "bar failed",
                "x": index * (width + CHART_GAP),
                "y": CHART_HEIGHT - tall,
                "width": width,
                "height": tall,
                "end": point.get("end"),
                "events": number,
                "state": str(point.get("state")),
            }
        )
    return {"width": CHART_WIDTH, "height": CHART_HEIGHT, "bars": bars, "total": sum(events)}


@cache
def environment() -> Environment:
    """The page's Jinja environment: autoescape on for every template, missing values empty."""
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=ChainableUndefined,
        trim_blocks=False,
        keep_trailing_newline=True,
    )
    env.filters.update(
        duration=duration,
        when=when,
        ops=ops,
        headline=lambda error: headline(str(error)),
        status_word=lambda status: STATUS_WORDS.get(status, status),
        headroom=headroom,
        chart=chart,
        href=page_href,
        ident=ident,
        thousands=thousands,
    )
    return env


# Where an identifier may wrap: after each of these characters (mongocdc_|default, shop.|orders).
_PARTS = re.compile(r"(?<=[_./-])")


def ident(value: Any) -> Markup:
    """An identifier (a name, a DAG or connection id, a collection, a location) escaped, with a
    line break opportunity (``<wbr>``) after each ``_ . / -`` and nowhere else: a narrow column
    wraps it between its parts, never inside a word. None is empty."""
    if value is None:
        return Markup("")
    return Markup("<wbr>").join(escape(part) for part in _PARTS.split(str(value)))


def thousands(value: Any) -> str:
    """A count with its thousands apart (``10 000``, no-break spaces); anything else as it is."""
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}".replace(",", "\u00a0")
    return "" if value is None else str(value)


def page_href(href: Any) -> str:
    """A link of the page: an address of this server (``/...``, not ``//host``), else ``#``."""
    if isinstance(href, str) and href.startswith("/") and not href.startswith(("//", "/\\")):
        return href
    return "#"


def refresh_url(dag_id: str | None) -> str:
    """The page's own address with ``refresh=true`` (and its ``dag_id``), URL-encoded."""
    return "?" + urlencode({"refresh": "true", **({"dag_id": dag_id} if dag_id else {})})


def rows(records: Sequence[Mapping[str, Any]]) -> list[Markup]:
    """Each record's row (escaped by the template); a record that cannot be rendered becomes a row
    that says so, so one bad value never takes the page away from everyone."""
    cells = environment().get_template(ROW_TEMPLATE).module
    shown = []
    for record in records:
        try:
            shown.append(cells.row(record))
        except Exception as error:  # shown in words in the connector's row
            name = record.get("name") if isinstance(record, Mapping) else None
            log.warning("MongoDB CDC page: the record of %r could not be rendered: %r", name, error)
            shown.append(cells.broken_row(str(name), f"{type(error).__name__}: {error}", len(COLUMNS)))
    return shown


# Narrower than this (a DAG's MongoDB CDC tab shares the window with the grid), a connector's row
# is a grid of its cells, each under its column's title, wrapped to the width: nothing is cut off.
STACKED_BELOW_PX = 1650


def stacked_style() -> str:
    """The style of the narrow layout; each cell's title from :data:`COLUMNS` (constants)."""
    labels = "\n".join(
        f'  #connectors tr.connector:not(.broken) > td:nth-child({number})::before {{ content: "{title}"; }}'
        for number, title in enumerate(COLUMNS, 1)
    )
    return f"""
@media (max-width: {STACKED_BELOW_PX}px) {{
  #connectors thead {{ display: none; }}
  #connectors, #connectors > tbody {{ display: block; }}
  #connectors tr.connector {{ display: grid; grid-template-columns: repeat(auto-fill, minmax(190px, 1fr));
    column-gap: 8px; border-bottom: 2px solid #cbd5e0; padding-bottom: 6px; margin-bottom: 6px; }}
  #connectors tr.connector > td {{ border-bottom: none; min-width: 0; }}
  #connectors tr.connector:not(.broken) > td::before {{ display: block; font-weight: 600; font-size: 12px;
    color: #4a5568; margin-bottom: 2px; }}
{labels}
}}
"""


def _render(**values: Any) -> str:
    # The page's own constants are the only text written unescaped.
    return (
        environment()
        .get_template(PAGE_TEMPLATE)
        .render(style=Markup(STYLE + stacked_style()), script=Markup(SCRIPT), columns=COLUMNS, **values)
    )


def render_page(
    records: Sequence[Mapping[str, Any]],
    *,
    generated_at: datetime,
    dag_id: str | None,
    list_errors: Sequence[str],
    hidden: int,
    threshold_seconds: float,
    hidden_dag: bool = False,
) -> str:
    """The whole page. ``hidden_dag``: ``dag_id`` belongs to a connector the user may not read."""
    if dag_id:
        empty = (
            f"DAG {dag_id} belongs to a MongoDB CDC connector whose DAGs you may not read"
            if hidden_dag
            else f"DAG {dag_id} belongs to no MongoDB CDC connector of the list"
        )
    else:
        empty = "No connector to show"
    return _render(
        rows=rows(records),
        generated_at=iso_z(generated_at) or "",
        refresh_url=refresh_url(dag_id),
        list_errors=list_errors,
        hidden=hidden,
        threshold_seconds=threshold_seconds,
        empty=empty,
        login=None,
    )


def render_login(status: int, detail: str, login_url: str) -> str:
    """The page of a refused request: why, and where to log in."""
    return _render(login={"status": status, "detail": detail, "url": login_url}, rows=[])
