"""What the demo prints about the topics: event counts, sample events, and the check that the
state a consumer rebuilds from the topics equals the collections in MongoDB."""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bson import json_util
from bson.json_util import CANONICAL_JSON_OPTIONS
from confluent_kafka.admin import AdminClient
from pymongo.database import Database

from devtools.kafka.reading import read_topic

WIDTH = 118


@dataclass
class Event:
    topic: str
    offset: int
    key: Any  # the key's payload
    value: dict | None  # the value's payload; None for a tombstone


@dataclass
class TopicReport:
    topic: str
    events: list[Event] = field(default_factory=list)

    @property
    def ops(self) -> Counter:
        counts = Counter()
        for event in self.events:
            if event.value is None:
                counts["tombstone"] += 1
            elif "op" in event.value:
                counts[event.value["op"]] += 1
                if event.value.get("transaction"):
                    counts["in_txn"] += 1
            elif "status" in event.value:
                counts[event.value["status"]] += 1
            else:
                counts["other"] += 1
        return counts


def _payload(raw: bytes | None) -> Any:
    if raw is None:
        return None
    data = json.loads(raw)
    if isinstance(data, dict) and set(data) == {"schema", "payload"}:
        return data["payload"]
    return data


def demo_topics(bootstrap: str, prefix: str) -> list[str]:
    """The connector's event topics (data collections, transaction, heartbeat), without the
    offsets topic."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = admin.list_topics(timeout=15).topics
    wanted = [
        name
        for name in names
        if (name.startswith(f"{prefix}.") and name != f"{prefix}.offsets")
        or name == f"__debezium-heartbeat.{prefix}"
    ]
    return sorted(wanted)


def read_events(bootstrap: str, topic: str) -> TopicReport:
    report = TopicReport(topic)
    for record in read_topic(bootstrap, topic, timeout=60):
        report.events.append(Event(topic, record.offset, _payload(record.key), _payload(record.value)))
    return report


def counts_table(reports: list[TopicReport]) -> list[str]:
    lines = [
        f"  {'topic':<34} {'r':>5} {'c':>5} {'u':>5} {'d':>5} {'tombstones':>11} {'in txn':>7}"
        f" {'BEGIN':>6} {'END':>5} {'total':>6}"
    ]
    for report in reports:
        ops = report.ops
        lines.append(
            f"  {report.topic:<34} {ops['r']:>5} {ops['c']:>5} {ops['u']:>5} {ops['d']:>5} "
            f"{ops['tombstone']:>11} {ops['in_txn']:>7} {ops['BEGIN']:>6} {ops['END']:>5} "
            f"{len(report.events):>6}"
        )
    return lines


def trim(text: str, width: int) -> str:
    if len(text) <= width:
        return text
    return text[: width - 14] + f"… (+{len(text) - width + 14} chars)"


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def pretty(value: Any, expand_depth: int, width: int, indent: str = "") -> list[str]:
    """JSON lines: objects (and lists of objects) expanded down to ``expand_depth``, anything
    deeper or any list of plain values on one line, each line trimmed to ``width``. The first
    line carries no indentation (it follows a label or stands alone); the others carry
    ``indent`` and more."""

    def expandable(item: Any) -> bool:
        return (isinstance(item, dict) and bool(item)) or (
            isinstance(item, list) and any(isinstance(x, (dict, list)) for x in item)
        )

    compact = _compact(value)
    if expand_depth <= 0 or not expandable(value) or (indent and len(indent) + len(compact) <= width - 30):
        return [trim(compact, width - len(indent))]
    inner = indent + "  "
    items = list(value.items()) if isinstance(value, dict) else [(None, x) for x in value]
    lines = ["{" if isinstance(value, dict) else "["]
    for number, (key, item) in enumerate(items):
        label = f"{inner}{_compact(key)}: " if key is not None else inner
        comma = "," if number < len(items) - 1 else ""
        sub = pretty(item, expand_depth - 1, width, inner)
        if len(sub) == 1:
            lines.append(trim(label + sub[0] + comma, width))
        else:
            lines.append(label + sub[0])
            lines.extend(sub[1:-1])
            lines.append(sub[-1] + comma)
    lines.append(indent + ("}" if isinstance(value, dict) else "]"))
    return lines


def render_event(event: Event, title: str) -> list[str]:
    """The payload of one event: one field per line; ``after``/``before`` (Extended JSON strings
    in the event) shown parsed, one document field per line; long values trimmed."""
    pad = "     "
    lines = [
        f"  -- {title}: {event.topic} @ offset {event.offset}",
        trim(f"{pad}key: {_compact(event.key)}", WIDTH),
    ]
    if event.value is None:
        lines.append(f"{pad}value: null (tombstone)")
        return lines
    for name, value in event.value.items():
        if name in ("after", "before") and isinstance(value, str):
            document = json.loads(value)
            body = pretty(document, 1, WIDTH - len(pad))
            lines.append(f"{pad}{name} (an Extended JSON string, shown parsed): {body[0]}")
            lines.extend(pad + line for line in body[1:])
        elif name == "source" and isinstance(value, dict):
            fields = [f"{k}={trim(v if isinstance(v, str) else _compact(v), 48)}" for k, v in value.items()]
            lines.extend(
                pad + line
                for line in textwrap.wrap(
                    "source: " + ", ".join(fields),
                    WIDTH - len(pad),
                    subsequent_indent="  ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
        elif isinstance(value, dict):
            body = pretty(value, 1, WIDTH - len(pad))
            lines.append(trim(f"{pad}{name}: {body[0]}", WIDTH))
            lines.extend(pad + line for line in body[1:])
        else:
            lines.append(trim(f"{pad}{name}: {value if isinstance(value, str) else _compact(value)}", WIDTH))
    return lines


def pick_samples(reports: list[TopicReport], prefix: str, database: str) -> list[tuple[str, Event]]:
    """One read, one update inside the transaction (or any update), one delete, and the
    transaction's BEGIN and END, as found on the topics."""
    by_topic = {report.topic: report for report in reports}

    def first(topics: list[str], predicate) -> Event | None:
        for topic in topics:
            for event in by_topic.get(topic, TopicReport(topic)).events:
                if predicate(event):
                    return event
        return None

    data = [f"{prefix}.{database}.orders", f"{prefix}.{database}.products", f"{prefix}.{database}.customers"]
    choices = [
        ("read (snapshot)", first(data, lambda e: e.value is not None and e.value.get("op") == "r")),
        (
            "update inside the transaction",
            first(
                data,
                lambda e: e.value is not None and e.value.get("op") == "u" and e.value.get("transaction"),
            )
            or first(data, lambda e: e.value is not None and e.value.get("op") == "u"),
        ),
        ("delete", first(data, lambda e: e.value is not None and e.value.get("op") == "d")),
        (
            "transaction BEGIN",
            first(
                [f"{prefix}.transaction"], lambda e: e.value is not None and e.value.get("status") == "BEGIN"
            ),
        ),
        (
            "transaction END",
            first(
                [f"{prefix}.transaction"], lambda e: e.value is not None and e.value.get("status") == "END"
            ),
        ),
    ]
    return [(title, event) for title, event in choices if event is not None]


# -- the state check ------------------------------------------------------------------------------------
def canonical(value: Any) -> str:
    return json_util.dumps(value, json_options=CANONICAL_JSON_OPTIONS)


def rebuilt_state(report: TopicReport) -> dict[str, str]:
    """A consumer's view of one collection: the last event per key; a delete or a tombstone
    removes the key. Keys and documents as canonical Extended JSON."""
    state: dict[str, str] = {}
    for event in report.events:
        key = canonical(json_util.loads(event.key["id"]))
        if event.value is None or event.value.get("op") == "d":
            state.pop(key, None)
        else:
            state[key] = canonical(json_util.loads(event.value["after"]))
    return state


def mongo_state(database: Database, collection: str) -> dict[str, str]:
    return {canonical(doc["_id"]): canonical(doc) for doc in database[collection].find()}


@dataclass
class Comparison:
    collection: str
    documents: int
    rebuilt: int
    missing: list[str]  # in MongoDB, not rebuilt
    extra: list[str]  # rebuilt, not in MongoDB
    different: list[str]

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.different)

    def line(self, topic: str) -> str:
        verdict = "OK" if self.ok else "MISMATCH"
        text = (
            f"  {verdict:<8} {self.collection:<16} {self.documents:>4} documents in MongoDB, "
            f"{self.rebuilt:>4} rebuilt from {topic}"
        )
        if not self.ok:
            text += (
                f" ({len(self.missing)} missing, {len(self.extra)} extra, {len(self.different)} different;"
                f" e.g. {(self.missing + self.extra + self.different)[0]})"
            )
        return text


def table_state(path: str) -> dict[str, str]:
    """A Delta table's live rows (read by delta-rs, not the provider's code): ``_id`` and ``_doc``
    as canonical Extended JSON."""
    from deltalake import DeltaTable

    rows = DeltaTable(path).to_pyarrow_table(columns=["_id", "_doc"]).to_pylist()
    return {canonical(json_util.loads(row["_id"])): canonical(json_util.loads(row["_doc"])) for row in rows}


def compare_table(database: Database, collection: str, path: str) -> Comparison:
    """A collection's Delta table against MongoDB."""
    rebuilt = table_state(path)
    actual = mongo_state(database, collection)
    return Comparison(
        collection,
        len(actual),
        len(rebuilt),
        missing=sorted(set(actual) - set(rebuilt)),
        extra=sorted(set(rebuilt) - set(actual)),
        different=sorted(k for k in set(actual) & set(rebuilt) if actual[k] != rebuilt[k]),
    )


def iceberg_table_state(location, namespace: str, collection: str) -> dict[str, str] | None:
    """An Iceberg table's live rows (read by pyiceberg from the SQL catalog under ``location``, not
    by the provider's code), as :func:`table_state`; None when there is no such table."""
    from pyiceberg.catalog import load_catalog
    from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

    catalog = load_catalog(
        "mongocdc", type="sql", uri=f"sqlite:///{location}/catalog.db", warehouse=f"file://{location}"
    )
    try:
        table = catalog.load_table((namespace, collection))
    except (NoSuchTableError, NoSuchNamespaceError):
        return None
    rows = table.scan(selected_fields=("_id", "_doc")).to_arrow().to_pylist()
    return {canonical(json_util.loads(row["_id"])): canonical(json_util.loads(row["_doc"])) for row in rows}


def compare_iceberg_table(database: Database, collection: str, location, namespace: str) -> Comparison | None:
    """A collection's Iceberg table against MongoDB (None: no table)."""
    if not (location / "catalog.db").exists():
        return None
    rebuilt = iceberg_table_state(location, namespace, collection)
    if rebuilt is None:
        return None
    actual = mongo_state(database, collection)
    return Comparison(
        collection,
        len(actual),
        len(rebuilt),
        missing=sorted(set(actual) - set(rebuilt)),
        extra=sorted(set(rebuilt) - set(actual)),
        different=sorted(k for k in set(actual) & set(rebuilt) if actual[k] != rebuilt[k]),
    )


def compare(database: Database, collection: str, report: TopicReport) -> Comparison:
    rebuilt = rebuilt_state(report)
    actual = mongo_state(database, collection)
    return Comparison(
        collection,
        len(actual),
        len(rebuilt),
        missing=sorted(set(actual) - set(rebuilt)),
        extra=sorted(set(rebuilt) - set(actual)),
        different=sorted(k for k in set(actual) & set(rebuilt) if actual[k] != rebuilt[k]),
    )
