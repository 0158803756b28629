"""Per-event cost of building Debezium events, as a ratio to ``bson.json_util.dumps(document)``.

The same mixed documents (~1 KB: nested documents, arrays, ObjectId, dates, Decimal128, Int64,
binary, unicode text) are serialised with ``bson.json_util.dumps`` (the baseline: a document's own
extended JSON) and turned into events by :class:`EventBuilder` (key, envelope, schema, tombstone)
in the same run, alternating rounds to share machine noise. The goal is a ratio <= 2.0: the key,
envelope and schema must cost no more than the document's extended JSON.

Run ``python -m bench.events``; :func:`run` returns the figures for a combined runner.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
import time
from typing import Any

from bson import Binary, Decimal128, Int64, ObjectId, Timestamp, json_util

from airflow_provider_mongocdc.core.config import ConnectorConfig
from airflow_provider_mongocdc.core.events import EventBuilder

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
        "address": {"street": f"{rng.randrange(1, 999)} Main Street", "city": "Springfield",
                    "zip": f"{rng.randrange(10000, 99999)}",
                    "geo": {"lat": rng.uniform(-90, 90), "lon": rng.uniform(-180, 180)}},
        "orders": [{"order_id": ObjectId(), "total": Decimal128(f"{rng.randrange(1, 999)}.99"),
                    "items": [{"sku": f"SKU-{rng.randrange(10**6)}", "qty": rng.randrange(1, 9),
                               "price": rng.random() * 50} for _ in range(2)]}
                   for _ in range(3)],
        "avatar": Binary(bytes(rng.randrange(256) for _ in range(48)), 0),
        "notes": "Lorem ipsum dolor sit amet, \"quoted\" text with a backslash \\ and a tab\t.",
    }


def make_changes(count: int, seed: int = 7) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(kind, document, change-stream document) triples in the MIX proportions."""
    rng = random.Random(seed)
    kinds = [kind for kind, weight in MIX for _ in range(weight)]
    out = []
    for index in range(count):
        kind = kinds[index % len(kinds)]
        doc = make_document(rng, index)
        base = {"_id": {"_data": f"8263{index:016X}"},
                "clusterTime": Timestamp(1_700_000_000 + index, 1),
                "wallTime": datetime.datetime(2024, 1, 1),
                "ns": {"db": "shop", "coll": "customers"}, "documentKey": {"_id": doc["_id"]}}
        if kind == "insert":
            change = {**base, "operationType": "insert", "fullDocument": doc}
        elif kind == "update":
            change = {**base, "operationType": "update", "fullDocument": doc,
                      "updateDescription": {"updatedFields": {"score": doc["score"],
                                                              "address.city": "Shelbyville"},
                                            "removedFields": ["legacy"], "truncatedArrays": []}}
        elif kind == "replace":
            change = {**base, "operationType": "replace", "fullDocument": doc}
        elif kind == "delete":
            change = {**base, "operationType": "delete"}
        else:
            change = {}
        out.append((kind, doc, change))
    return out


def run(count: int = 2000, rounds: int = 7) -> dict[str, Any]:
    """Measure and return the figures (seconds per event, ratios, events per second)."""
    config = ConnectorConfig.from_properties({"topic.prefix": "bench"})
    builder = EventBuilder(config, replica_set="rs0")
    changes = make_changes(count)
    position = Timestamp(1_700_000_000, 1)
    documents = [doc for _, doc, _ in changes]

    def baseline() -> None:
        dumps = json_util.dumps
        for doc in documents:
            dumps(doc)

    def build() -> int:
        produced = 0
        for kind, doc, change in changes:
            if kind == "snapshot":
                produced += len(builder.build_snapshot(doc, "shop", "customers", position=position))
            else:
                produced += len(builder.build_change(change))
        return produced

    def build_kind(selected: str):
        subset = [(k, d, c) for k, d, c in changes if k == selected]
        docs = [d for _, d, _ in subset]

        def ours() -> None:
            for _, doc, change in subset:
                if selected == "snapshot":
                    builder.build_snapshot(doc, "shop", "customers", position=position)
                else:
                    builder.build_change(change)

        def base() -> None:
            for doc in docs:
                json_util.dumps(doc)
        return ours, base, len(subset)

    build()  # warm caches (schemas, topic names)
    baseline_times, build_times = [], []
    records = 0
    for _ in range(rounds):
        start = time.perf_counter()
        baseline()
        baseline_times.append(time.perf_counter() - start)
        start = time.perf_counter()
        records = build()
        build_times.append(time.perf_counter() - start)
    base_s = statistics.median(baseline_times) / count
    build_s = statistics.median(build_times) / count

    per_kind: dict[str, float] = {}
    for kind, _ in MIX:
        ours, base, n = build_kind(kind)
        ours_t, base_t = [], []
        for _ in range(rounds):
            start = time.perf_counter()
            base()
            base_t.append(time.perf_counter() - start)
            start = time.perf_counter()
            ours()
            ours_t.append(time.perf_counter() - start)
        per_kind[kind] = round(statistics.median(ours_t) / statistics.median(base_t), 3)

    sizes = [len(json_util.dumps(doc)) for doc in documents]
    return {
        "events": count,
        "records": records,
        "document_json_bytes_mean": round(statistics.mean(sizes)),
        "baseline_us_per_document": round(base_s * 1e6, 2),
        "build_us_per_event": round(build_s * 1e6, 2),
        "ratio": round(build_s / base_s, 3),
        "ratio_by_operation": per_kind,
        "events_per_second": round(1 / build_s),
        "goal_ratio": GOAL,
        "meets_goal": build_s / base_s <= GOAL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    figures = run(args.events, args.rounds)
    if args.json:
        print(json.dumps(figures))
        return
    print(f"events: {figures['events']} mixed ({', '.join(f'{k} {w}%' for k, w in MIX)}), "
          f"document JSON ~{figures['document_json_bytes_mean']} bytes")
    print(f"baseline bson.json_util.dumps(document): {figures['baseline_us_per_document']} us")
    print(f"EventBuilder (key + envelope + schema):  {figures['build_us_per_event']} us per event")
    print(f"ratio: {figures['ratio']} (goal <= {GOAL}: "
          f"{'met' if figures['meets_goal'] else 'NOT met'})")
    print("ratio by operation: " + ", ".join(f"{k} {v}" for k, v in
                                             figures["ratio_by_operation"].items()))
    print(f"events/s: {figures['events_per_second']}")


if __name__ == "__main__":
    main()
