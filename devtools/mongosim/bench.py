"""Throughput of the simulator, measured through pymongo in one run.

    python -m devtools.mongosim.bench [--docs 50000] [--batch 1000] [--readers 4]

Prints: simulator start time, insert_many documents/s, find documents/s (one client, then
``--readers`` concurrent clients reading disjoint _id ranges), change-stream events/s, and the
same insert rate with a change stream open.
"""

from __future__ import annotations

import argparse
import threading
import time

from pymongo import MongoClient

from devtools.mongosim.launcher import MongoSim


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:,.0f}/s ({count:,} in {seconds:.2f} s)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.mongosim.bench")
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--readers", type=int, default=4)
    args = parser.parse_args(argv)
    payload = "x" * 200

    with MongoSim(mode="replset") as sim:
        print(f"simulator start (process spawn to URI printed): {sim.start_seconds:.2f} s")
        client = MongoClient(sim.uri)
        coll = client.bench.docs

        started = time.perf_counter()
        for low in range(0, args.docs, args.batch):
            coll.insert_many(
                [
                    {"_id": i, "n": i, "payload": payload}
                    for i in range(low, min(args.docs, low + args.batch))
                ],
                ordered=False,
            )
        print(f"insert_many (batches of {args.batch}): {_rate(args.docs, time.perf_counter() - started)}")

        started = time.perf_counter()
        count = sum(1 for _ in coll.find())
        print(f"find, one client, full scan: {_rate(count, time.perf_counter() - started)}")

        started = time.perf_counter()
        count = sum(
            1 for _ in coll.find({"_id": {"$gte": args.docs // 4, "$lt": args.docs // 2}}).sort("_id", 1)
        )
        print(f"find, one client, sorted _id range: {_rate(count, time.perf_counter() - started)}")

        step = args.docs // args.readers
        counts = [0] * args.readers

        def read(index: int) -> None:
            with MongoClient(sim.uri) as own:
                query = {"_id": {"$gte": index * step, "$lt": (index + 1) * step}}
                counts[index] = sum(1 for _ in own.bench.docs.find(query, batch_size=1000))

        threads = [threading.Thread(target=read, args=(i,)) for i in range(args.readers)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        print(
            f"find, {args.readers} concurrent clients, _id ranges: {_rate(sum(counts), time.perf_counter() - started)}"
        )

        events_coll = client.bench.events
        events = min(args.docs, 20_000)
        with events_coll.watch(batch_size=1000) as stream:
            started = time.perf_counter()
            for low in range(0, events, args.batch):
                events_coll.insert_many(
                    [{"_id": i, "payload": payload} for i in range(low, min(events, low + args.batch))]
                )
            insert_seconds = time.perf_counter() - started
            started = time.perf_counter()
            seen = 0
            while seen < events:
                if stream.try_next() is not None:
                    seen += 1
            print(f"insert_many with a change stream open: {_rate(events, insert_seconds)}")
            print(f"change-stream events read: {_rate(seen, time.perf_counter() - started)}")
        client.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
