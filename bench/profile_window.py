"""``python -m bench.profile_window [N]``: cProfile of ``run_window`` in this process on N insert
changes of ~1 KB documents (default 30 000); prints the top entries by own time and cumulative."""

from __future__ import annotations

import cProfile
import pstats
import random
import sys
import time
import uuid

from airflow_provider_mongocdc.core.mongo.change_stream import current_position
from airflow_provider_mongocdc.core.window.stream_window import run_window
from bench.events import make_document
from bench.services import Services
from bench.window import connector, insert_documents, params, seed, window_end_after


def main(argv: list[str]) -> None:
    count = int(argv[0]) if argv else 30000
    top = int(argv[1]) if len(argv) > 1 else 25
    with Services() as services:
        database = f"benchprof{uuid.uuid4().hex[:8]}"
        rng = random.Random(17)
        with services.client() as client:
            probe = connector(f"{database}x", database)
            start = current_position(client, probe)
            last = insert_documents(
                client, database, "c", [make_document(rng, i) for i in range(count)], 1000
            )
            window_end = window_end_after(services, client, last, f"{database}_markers")
        config = connector(f"{database}w", database)
        target = seed(services, config, start)
        profiler = cProfile.Profile()
        cpu, wall = time.process_time(), time.perf_counter()
        profiler.enable()
        summary = run_window(target, config, services.kafka, params(window_end))
        profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"{summary['events']} events, wall {wall:.2f} s, CPU {cpu:.2f} s "
            f"({cpu / max(1, summary['events']) * 1e6:.1f} us/event, profiled), phases {summary['phases_s']}"
        )
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)


if __name__ == "__main__":
    main(sys.argv[1:])
