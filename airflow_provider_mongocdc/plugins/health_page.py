"""The MongoDB CDC page: the health records of :mod:`airflow_provider_mongocdc.core.health.record`
as one HTML table, a row per connector (docs/operations.md, "The MongoDB CDC page and its JSON API",
describes each column).

Plain HTML rendered on the API server: no script is needed to read it. The one script makes the
links to Airflow's own pages (DAGs, task logs, the re-snapshot form) open in the Airflow UI around
the page rather than inside its frame: the UI shows plugin pages in a sandboxed frame, from which a
link may not navigate the window itself, so the script follows the link from the surrounding
(same-origin) page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from html import escape
from typing import Any

from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.health.record import headline

STATUS_WORDS = {"ok": "OK", "warning": "Attention", "error": "Problem"}
OPS = ("c", "u", "d", "r")

STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 16px; color: #1a202c;
       font-size: 14px; }
h1 { font-size: 20px; margin: 0 0 4px 0; }
.meta { color: #4a5568; margin-bottom: 12px; }
table { border-collapse: collapse; width: 100%; }
th, td { border-bottom: 1px solid #e2e8f0; padding: 6px 8px; text-align: left; vertical-align: top; }
th { background: #f7fafc; font-weight: 600; white-space: nowrap; }
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


def duration(seconds: float | int | None) -> str:
    """The two largest units: ``2 d 3 h``, ``3 h 5 min``, ``4 min 10 s``, ``12 s``; ``—`` for None."""
    if seconds is None:
        return "—"
    rest, parts = abs(int(seconds)), []
    for unit, size in UNITS:
        count, rest = divmod(rest, size)
        if count or parts:
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    return ("-" if seconds < 0 else "") + (" ".join(parts) or "0 s")


def when(value: str | None) -> str:
    """An ISO time as ``2026-11-26 18:59:13 UTC``."""
    moment = parse_iso(value) if value else None
    return "—" if moment is None else (iso_z(moment) or "")[:19].replace("T", " ") + " UTC"


def link(href: str, text: str, **attributes: str) -> str:
    extra = "".join(f' {name.replace("_", "-")}="{escape(value)}"' for name, value in attributes.items())
    return f'<a href="{escape(href)}" data-top{extra}>{escape(text)}</a>'


def age(meta: Mapping[str, Any] | None, verb: str = "read") -> str:
    """How old a value is (and its error in words)."""
    if not meta or meta.get("as_of") is None:
        return ""
    text = f'<small class="age">{verb} {duration(meta.get("age_seconds"))} ago</small>'
    if meta.get("error"):
        error = meta["error"]
        text = f'<div class="unreachable" title="{escape(error)}">{escape(headline(error))}</div>' + text
    return text


def ops(counts: Mapping[str, int] | None) -> str:
    if not counts:
        return "no events"
    known = [f"{op} {counts[op]}" for op in OPS if counts.get(op)]
    other = [f"{op} {n}" for op, n in sorted(counts.items()) if op not in OPS and n]
    return ", ".join(known + other) or "no events"


def position_cell(record: Mapping[str, Any]) -> str:
    offsets = record.get("offsets") or {}
    rows = offsets.get("partitions") or []
    parts = []
    for row in rows:
        ts = row.get("cluster_time_ts") or {}
        text = f"{escape(row['partition'])}: {when(row.get('cluster_time'))}"
        if ts:
            text += f" <small>cluster time {ts.get('t')}:{ts.get('i')}"
            if row.get("resume_token"):
                text += f", resume token {escape(row['resume_token'])}"
            text += "</small>"
        if row.get("snapshot", {}).get("status") == "in_progress":
            text += f"<small>snapshot {escape(str(row['snapshot'].get('id')))} in progress</small>"
        parts.append(
            f'<div class="partition" data-partition="{escape(row["partition"])}" '
            f'data-cluster-time="{escape(row.get("cluster_time") or "")}">{text}</div>'
        )
    lag = offsets.get("lag_seconds")
    head = (
        f'<div class="lag" data-lag-seconds="{lag}">lag {duration(lag)}</div>'
        if lag is not None
        else '<div class="lag" data-lag-seconds="">no position</div>'
    )
    if not rows and not offsets.get("error"):
        parts.append("<small>no offsets committed yet</small>")
    return head + "".join(parts) + age(offsets)


def headroom_cell(record: Mapping[str, Any]) -> str:
    oplog = record.get("oplog") or {}
    parts = []
    for row in oplog.get("partitions") or []:
        css = "low" if row.get("low") else ""
        if row.get("status") == "gap":
            value = "gap: position purged"
        elif row.get("headroom_seconds") is not None:
            value = duration(row["headroom_seconds"])
        else:
            value = {"no_offset": "no offset", "no_position": "no position"}.get(row.get("status"), "unknown")
        parts.append(
            f'<div class="{css}" title="{escape(row.get("note") or "")}">{escape(row["partition"])}: {value}</div>'
        )
    threshold = duration(oplog.get("threshold_seconds"))
    return "".join(parts) + f"<small>red below {threshold}</small>" + age(oplog, "checked")


def run_cell(run: Mapping[str, Any] | None, kind: str) -> str:
    if not run:
        return f"<small>no {kind} yet</small>"
    state = run.get("state") or "?"
    css = "failed" if state in ("failed", "upstream_failed", "up_for_retry") else ""
    text = f'<div class="{css}">{escape(state)} · {when(run.get("start_date"))}</div>'
    if kind == "window":
        if run.get("events"):
            text += f"<div>{run['events']} events ({ops(run.get('events_by_op'))})</div>"
        elif run.get("events") == 0:
            text += "<div>no events</div>"
    else:
        if run.get("documents") is not None:
            text += f"<div>{run['documents']} documents</div>"
        if run.get("mode"):
            text += f"<small>re-snapshot, mode {escape(run['mode'])}</small>"
    if run.get("duration_s") is not None:
        text += f"<small>took {duration(run['duration_s'])}</small>"
    return text + link(run["log_url"], "task log")


def incremental_cell(record: Mapping[str, Any]) -> str:
    part = record.get("incremental_snapshot")
    if not part:
        return "<small>none</small>"
    status = part.get("status")
    if status == "requested":
        return f"<div>requested</div><small>{escape(part.get('note') or '')}</small>"
    if status != "running":
        return f"<small>last one {escape(str(status))}: {part.get('documents')} documents</small>"
    text = f"<div>copying {escape(str(part.get('collection')))}</div><div>{part.get('documents')} documents so far</div>"
    chunks = part.get("chunks_left")
    text += f"<div>{part.get('chunks_done')} chunks done, {'?' if chunks is None else chunks} left</div>"
    return text + age(part.get("counted"), "counted")


def lease_cell(record: Mapping[str, Any]) -> str:
    lease = record.get("lease") or {}
    if lease.get("error"):
        return age(lease)
    if lease.get("state") == "free":
        return "<div>free</div>" + age(lease)
    text = f"<div>{'held' if lease.get('state') == 'held' else 'expired (free)'} by {escape(lease.get('kind') or '')}</div>"
    owner = link(lease["url"], lease["owner"]) if lease.get("url") else escape(lease.get("owner") or "")
    return text + f"<div>{owner}</div><small>until {when(lease.get('expires_at'))}</small>" + age(lease)


def pool_cell(record: Mapping[str, Any]) -> str:
    pool = record.get("pool") or {}
    name = escape(pool.get("name") or "")
    if pool.get("exists") is False:
        return f"<div>{name}</div><small>{escape(pool.get('note') or '')}</small>"
    if not pool.get("exists"):
        return f"<div>{name}</div>" + age(pool.get("read"))
    slots = "unlimited" if pool.get("slots") is None else pool["slots"]
    text = (
        f"<div>{name}</div><div>{pool.get('running')} running, {pool.get('queued')} queued of {slots} "
        f"slot{'s' if slots != 1 else ''}</div>"
    )
    for task in pool.get("tasks") or []:
        text += (
            f"<small>{escape(task['state'])}: "
            + link(task["url"], f"{task['dag_id']}.{task['task_id']}")
            + "</small>"
        )
    return text


def chart_cell(record: Mapping[str, Any]) -> str:
    """A bar per window of the last day (events), red for a failed one."""
    points = record.get("windows_last_day") or []
    if not points:
        return "<small>no window in the last 24 h</small>"
    width, height, gap = 180, 40, 1
    highest = max((point.get("events") or 0) for point in points) or 1
    bar = max(2, (width - gap * len(points)) // max(1, len(points)))
    bars = []
    for index, point in enumerate(points):
        events = point.get("events") or 0
        tall = max(1, round(events / highest * (height - 2)))
        css = "bar failed" if point.get("state") not in ("success", None) else "bar"
        bars.append(
            f'<rect class="{css}" x="{index * (bar + gap)}" y="{height - tall}" width="{bar}" height="{tall}">'
            f"<title>{escape(when(point.get('end')))}: {events} events ({escape(str(point.get('state')))})</title></rect>"
        )
    total = sum(point.get("events") or 0 for point in points)
    return (
        f'<svg width="{width}" height="{height}" role="img" aria-label="events per window">{"".join(bars)}</svg>'
        f"<small>{len(points)} windows, {total} events</small>"
    )


def actions_cell(record: Mapping[str, Any]) -> str:
    links = record.get("links") or {}
    resnapshot = (record.get("dag_ids") or {}).get("resnapshot", "")
    return (
        link(links.get("resnapshot_form", ""), "Re-snapshot…", data_action="resnapshot")
        + f"<small>opens {escape(resnapshot)}: press Trigger, choose the mode and the collections</small>"
        + "<div>"
        + link(links.get("hourly", ""), "windows")
        + " · "
        + link(links.get("watchdog", ""), "watchdog")
        + "</div>"
    )


def name_cell(record: Mapping[str, Any]) -> str:
    status = record.get("status", "ok")
    text = (
        f'<div><strong>{escape(record["name"])}</strong> <span class="badge">{STATUS_WORDS.get(status, status)}</span></div>'
        f"<small>topic prefix {escape(record.get('topic_prefix') or '—')}</small>"
        f"<small>MongoDB {escape(record['conn_ids'].get('mongo', ''))}, Kafka {escape(record['conn_ids'].get('kafka', ''))}</small>"
    )
    paused = record.get("paused") or {}
    hourly = (record.get("dag_ids") or {}).get("hourly")
    if paused.get(hourly):
        text += f"<small>{escape(hourly)} is paused</small>"
    problems = record.get("problems") or []
    if problems:
        text += (
            '<ul class="problems">' + "".join(f"<li>{escape(problem)}</li>" for problem in problems) + "</ul>"
        )
    return text


COLUMNS = (
    ("Connector", name_cell),
    ("Committed position · lag", position_cell),
    ("Oplog headroom", headroom_cell),
    ("Last window", lambda record: run_cell(record.get("last_window"), "window")),
    ("Last snapshot", lambda record: run_cell(record.get("last_snapshot"), "snapshot")),
    ("Incremental snapshot", incremental_cell),
    ("Lease", lease_cell),
    ("Pool", pool_cell),
    ("Events per window, 24 h", chart_cell),
    ("Actions", actions_cell),
)


def render_page(
    records: Sequence[Mapping[str, Any]],
    *,
    generated_at: datetime,
    dag_id: str | None,
    list_errors: Sequence[str],
    hidden: int,
    threshold_seconds: float,
) -> str:
    """The whole page."""
    head = "".join(f"<th>{escape(title)}</th>" for title, _ in COLUMNS)
    rows = "".join(
        f'<tr id="connector-{escape(record["name"])}" data-connector="{escape(record["name"])}" '
        f'class="connector status-{escape(record.get("status", "ok"))}">'
        + "".join(f"<td>{cell(record)}</td>" for _, cell in COLUMNS)
        + "</tr>"
        for record in records
    )
    if not records:
        what = (
            f"DAG {dag_id} belongs to no MongoDB CDC connector of the list"
            if dag_id
            else "No connector to show"
        )
        rows = f'<tr><td colspan="{len(COLUMNS)}">{escape(what)}.</td></tr>'
    notes = ""
    if list_errors:
        notes = (
            '<div class="errors">'
            + "".join(f"<div>{escape(error)}</div>" for error in list_errors)
            + "</div>"
        )
    if hidden:
        notes += f'<div class="meta">{hidden} connector(s) not shown: you may not read their DAGs.</div>'
    refresh = "?refresh=true" + (f"&dag_id={escape(dag_id)}" if dag_id else "")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>MongoDB CDC</title><style>{STYLE}</style></head>
<body>
<h1>MongoDB CDC connectors</h1>
<div class="meta">Shown {when(iso_z(generated_at))}. Kafka offsets are read again after 15 s, MongoDB
after 60 s; each value says how old it is. <a href="{refresh}">Read everything again now</a>.
Oplog headroom is red below {duration(threshold_seconds)}, the watchdog's warning.</div>
{notes}
<table id="connectors" data-generated-at="{escape(iso_z(generated_at) or "")}"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>
<script>{SCRIPT}</script>
</body></html>"""


def render_login(status: int, detail: str, login_url: str) -> str:
    """The page of a refused request: why, and where to log in."""
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>MongoDB CDC</title><style>{STYLE}</style></head>
<body><h1>MongoDB CDC connectors</h1>
<p>{status}: {escape(detail)}. The page shows connectors to users logged in to Airflow who may read
their DAGs. <a href="{escape(login_url)}" data-top>Log in to Airflow</a></p>
<script>{SCRIPT}</script></body></html>"""
