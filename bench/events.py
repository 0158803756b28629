"""Per-event cost of building Debezium events, as a ratio to ``bson.json_util.dumps(document)``.

The same mixed documents (~1 KB: nested documents, arrays, ObjectId, dates, Decimal128, Int64,
binary, unicode text) are serialised with ``bson.json_util.dumps`` (the baseline: a document's own
extended JSON) and turned into events by :class:`EventBuilder` (key, envelope, schema, tombstone)
in the same run, alternating rounds to share machine noise. The goal is a ratio <= 2.0: the key,
envelope and schema must cost no more than the document's extended JSON.

The timings are CPU time of the benchmark process (``time.process_time``), so other work on the
machine disturbs them less than wall time would. Before timing, the connector's encoder is checked
to write exactly the text ``json_util.dumps`` writes, in every ``extended.json.mode``.

Run ``python -m bench events`` (or ``python -m bench.events``); :func:`run` returns the figures.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import time
from typing import Any

import bson
from bson import Binary, Decimal128, Int64, ObjectId, Timestamp, json_util

from airflow_provider_mongocdc.core.config.connector import ConnectorConfig
from airflow_provider_mongocdc.core.events.builder import EventBuilder
from airflow_provider_mongocdc.core.events.extended_json import SEPARATORS, Encoder, _portable, json_options

MIX = (("insert", 40), ("update", 30), ("replace", 10), ("delete", 10), ("snapshot", 10))
GOAL = 2.0


def make_document(rng: random.Random, index: int) -> dict[str, Any]:
    """A ~1 KB document with the usual BSON types."""
    return {
        "_id": ObjectId(),
        "customer_id": Int64(rng.randrange(1, 10**12)),
        "name": f"Customer {index} Ünïcødé",
        "email": f"user{index}@example.org",
        "active": rng.random() < 0.5,
        "score": rng.random() * 100,
        "balance": Decimal128(f"{rng.randrange(0, 10**7)}.{rng.randrange(0, 100):02d}"),
        "created": datetime.datetime(2024, 1, 1) + datetime.timedelta(seconds=rng.randrange(10**8)),
        "tags": [f"tag{rng.randrange(50)}" for _ in range(6)],
        "address": {
            "street": f"{rng.randrange(1, 999)} Main Street",
            "city": "Springfield",
            "zip": f"{rng.randrange(10000, 99999)}",
            "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)},
        },
        "orders": [
            {
                "order_id": ObjectId(),
                "total": Decimal128(f"{rng.randrange(1, 999)}.99"),
                "items": [
                    {
                        "sku": f"SKU-{rng.randrange(10**6)}",
                        "qty": rng.randrange(1, 9),
                        "price": rng.random() * 50,
                    }
                    for _ in range(2)
                ],
            }
            for _ in range(3)
        ],
        "avatar": Binary(bytes(rng.randrange(256) for _ in range(48)), 0),
        "notes": 'Lorem ipsum dolor sit amet, "quoted" text with a backslash \\ and a tab\t.',
    }


def make_changes(count: int, seed: int = 7) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(kind, document, change-stream document) triples in the MIX proportions."""
    rng = random.Random(seed)
    kinds = [kind for kind, weight in MIX for _ in range(weight)]
    out = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        doc = make_document(rng, index)
        base = {
            "_id": {"_data": f"8263{index:016X}"},
            "clusterTime": Timestamp(1_700_000_000 + index, 1),
            "wallTime": datetime.datetime(2024, 1, 1),
            "ns": {"db": "shop", "coll": "customers"},
            "documentKey": {"_id": doc["_id"]},
        }
        if kind == "insert":
            change = {**base, "operationType": "insert", "fullDocument": doc}
        elif kind == "update":
            change = {
                **base,
                "operationType": "update",
                "fullDocument": doc,
                "updateDescription": {
                    "updatedFields": {"score": doc["score"], "address.city": "Shelbyville"},
                    "removedFields": ["legacy"],
                    "truncatedArrays": [],
                },
            }
        elif kind == "replace":
            change = {**base, "operationType": "replace", "fullDocument": doc}
        elif kind == "delete":
            change = {**base, "operationType": "delete"}
        else:
            change = {}
        out.append((kind, doc, change))
    return out


def _cpu_per_item(function, items, rounds: int) -> list[float]:
    """CPU seconds per item of ``function`` over ``items``, one figure per round."""
    out = []
    for _ in range(rounds):
        started = time.process_time()
        function(items)
        out.append((time.process_time() - started) / len(items))
    return out


def edge_values() -> list[Any]:
    """Values where the C JSON encoder and json_util could disagree: every BSON type, numbers
    that are subclasses or non-finite, mapping and sequence types other than dict and list."""
    import collections
    import re
    import uuid

    from bson import SON, Code, DBRef, MaxKey, MinKey, Regex
    from bson.datetime_ms import DatetimeMS
    from bson.raw_bson import RawBSONDocument

    values: list[Any] = [
        1,
        -(2**40),
        Int64(5),
        Int64(-(2**62)),
        1.5,
        float("nan"),
        float("inf"),
        -0.0,
        True,
        None,
        'é"\\\t\u2603',
        ObjectId(),
        datetime.datetime(2024, 1, 1, 12, 0, 0, 123456),
        datetime.datetime(1960, 1, 1),
        datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc),
        DatetimeMS(-5),
        Decimal128("1.10"),
        Decimal128("NaN"),
        Decimal128("-Infinity"),
        Decimal128("1E+6144"),
        Decimal128("-0.000"),
        Binary(b"\x00\x01", 0),
        Binary(uuid.uuid4().bytes, 4),
        Binary(uuid.uuid4().bytes, 3),
        b"bytes",
        uuid.uuid4(),
        Timestamp(5, 6),
        Regex("^a", "i"),
        re.compile("b.c", re.I | re.M),
        MinKey(),
        MaxKey(),
        Code("function(){}"),
        Code("x", {"a": Int64(1)}),
        DBRef("c", ObjectId(), "db"),
        (1, Int64(2)),
        [1, [2, [Int64(3)]]],
        SON([("b", 1), ("a", Int64(2))]),
        collections.OrderedDict(z=1, y=Int64(2)),
        {1: "int key"},
        [],
        {},
        {"e": {}},
        RawBSONDocument(bson.encode({"a": 1, "b": {"c": Int64(2)}})),
        {"deep": [{"a": [{"b": Int64(1)}]}, {"c": 1.25}]},
    ]
    return values + [
        {"_id": index, "v": value, "n": [value, {"w": value}]} for index, value in enumerate(values)
    ]


def check_identical(documents: list[Any]) -> int:
    """The connector's encoder writes exactly what it wrote as ``json_util.dumps`` alone (and
    its rewrite of non-finite doubles), in every mode; returns how many texts were compared
    (raises AssertionError on the first difference)."""
    compared = 0
    for mode in ("strict", "legacy", "relaxed", "canonical"):
        encoder = Encoder(mode)
        options = json_options(mode)
        lenient = options.json_mode == json_util.JSONMode.LEGACY
        for document in documents:
            try:
                expected = json_util.dumps(
                    document, json_options=options, separators=SEPARATORS, ensure_ascii=False, allow_nan=False
                )
            except ValueError:
                expected = json_util.dumps(
                    _portable(document, lenient),
                    json_options=options,
                    separators=SEPARATORS,
                    ensure_ascii=False,
                    allow_nan=False,
                )
            assert encoder.dumps(document) == expected, (mode, document)
            compared += 1
    return compared


def run(count: int = 2000, rounds: int = 7) -> dict[str, Any]:
    """Measure and return the figures (CPU microseconds per event, ratios, events per second).

    Every figure is CPU time of this process (``time.process_time``), rounds of baseline and
    builder alternate, and each ratio divides medians of the same run.
    """
    config = ConnectorConfig.from_properties({"topic.prefix": "bench"})
    builder = EventBuilder(config, replica_set="rs0")
    changes = make_changes(count)
    position = Timestamp(1_700_000_000, 1)
    documents = [doc for _, doc, _ in changes]
    strict = json_options("strict")
    encoder = Encoder("strict")

    def baseline(docs) -> None:
        dumps = json_util.dumps
        for doc in docs:
            dumps(doc)

    def baseline_strict(docs) -> None:
        dumps = json_util.dumps
        for doc in docs:
            dumps(doc, json_options=strict)

    def encode(docs) -> None:
        dumps = encoder.dumps
        for doc in docs:
            dumps(doc)

    def build(items) -> None:
        for kind, doc, change in items:
            if kind == "snapshot":
                builder.build_snapshot(doc, "shop", "customers", position=position)
            else:
                builder.build_change(change)

    records = sum(
        len(builder.build_snapshot(doc, "shop", "customers", position=position))
        if kind == "snapshot"
        else len(builder.build_change(change))
        for kind, doc, change in changes
    )  # also warms caches (schemas, topic names)
    identical = check_identical(documents[:200] + edge_values())
    times: dict[str, list[float]] = {"baseline": [], "baseline_strict": [], "encoder": [], "build": []}
    for _ in range(rounds):
        times["baseline"] += _cpu_per_item(baseline, documents, 1)
        times["build"] += _cpu_per_item(build, changes, 1)
        times["baseline_strict"] += _cpu_per_item(baseline_strict, documents, 1)
        times["encoder"] += _cpu_per_item(encode, documents, 1)
    median = {name: statistics.median(values) for name, values in times.items()}
    base_s, build_s = median["baseline"], median["build"]

    per_kind: dict[str, float] = {}
    for kind, _ in MIX:
        subset = [item for item in changes if item[0] == kind]
        docs = [doc for _, doc, _ in subset]
        ours_t, base_t = [], []
        for _ in range(rounds):
            base_t += _cpu_per_item(baseline, docs, 1)
            ours_t += _cpu_per_item(build, subset, 1)
        per_kind[kind] = round(statistics.median(ours_t) / statistics.median(base_t), 3)

    sizes = [len(json_util.dumps(doc)) for doc in documents]
    bson_sizes = [len(bson.encode(doc)) for doc in documents]
    return {
        "events": count,
        "records": records,
        "document_json_bytes_mean": round(statistics.mean(sizes)),
        "document_bson_bytes_mean": round(statistics.mean(bson_sizes)),
        "identical_texts_checked": identical,
        "baseline_us_per_document": round(base_s * 1e6, 2),
        "baseline_strict_us_per_document": round(median["baseline_strict"] * 1e6, 2),
        "encoder_us_per_document": round(median["encoder"] * 1e6, 2),
        "encoder_speedup_vs_json_util_strict": round(median["baseline_strict"] / median["encoder"], 2),
        "build_us_per_event": round(build_s * 1e6, 2),
        "ratio": round(build_s / base_s, 3),
        "ratio_vs_strict_json_util": round(build_s / median["baseline_strict"], 3),
        "ratio_by_operation": per_kind,
        "events_per_cpu_second": round(1 / build_s),
        "goal_ratio": GOAL,
        "meets_goal": build_s / base_s <= GOAL,
    }


def report(figures: dict[str, Any]) -> list[str]:
    """Human-readable lines of :func:`run`'s figures."""
    return [
        f"documents: {figures['events']} changes mixed ({', '.join(f'{k} {w}%' for k, w in MIX)}), "
        f"~{figures['document_bson_bytes_mean']} bytes BSON, "
        f"~{figures['document_json_bytes_mean']} bytes JSON",
        f"encoder output identical to json_util.dumps: {figures['identical_texts_checked']} texts "
        "compared (4 modes; bench documents and edge cases of every BSON type)",
        f"bson.json_util.dumps(document):                 {figures['baseline_us_per_document']} us CPU",
        f"bson.json_util.dumps(document, strict options): "
        f"{figures['baseline_strict_us_per_document']} us CPU",
        f"connector encoder (strict):                     {figures['encoder_us_per_document']} us CPU "
        f"(x{figures['encoder_speedup_vs_json_util_strict']} faster than json_util.dumps)",
        f"EventBuilder (key + envelope + schema):         {figures['build_us_per_event']} us CPU per "
        f"event ({figures['events_per_cpu_second']} events per CPU second)",
        f"(a) ratio build / json_util.dumps: {figures['ratio']} (goal <= {GOAL}: "
        f"{'met' if figures['meets_goal'] else 'NOT met'}); vs strict-mode json_util.dumps: "
        f"{figures['ratio_vs_strict_json_util']}",
        "ratio by operation: " + ", ".join(f"{k} {v}" for k, v in figures["ratio_by_operation"].items()),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = run(args.events, args.rounds)
    print(json.dumps(figures) if args.json else "\n".join(report(figures)))


if __name__ == "__main__":
    main()
