"""``python -m bench``: the project's benchmarks, each ratio measured within one run.

    python -m bench                       # everything (about 95 minutes on 2 cores; g and h ~8, i ~15, ib ~20, k ~15, l ~15, m ~4)
    python -m bench events produce        # a subset (names or letters, see --list)
    python -m bench --quick               # smaller sizes and fewer rounds (about 3 minutes)
    python -m bench --json results.json   # also write every figure as JSON

A Kafka broker (devtools/kafka) and a MongoDB simulator (devtools/mongosim) are started when a
selected benchmark needs them and stopped at the end; ``MONGOCDC_TEST_KAFKA_BOOTSTRAP`` and
``MONGOCDC_TEST_MONGODB_URI`` use external servers instead. Timing goals are reported here and
never asserted by the test suite.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench import delta, events, follow, machine, produce, sidebyside, spark, submit, task_tree, watch, window
from bench.services import Services


@dataclass(frozen=True)
class Bench:
    name: str
    letter: str
    title: str
    run: Callable[[Services, bool], dict[str, Any]]
    report: Callable[[dict[str, Any]], list[str]]


def _events(services: Services, quick: bool) -> dict[str, Any]:
    return events.run(count=1000 if quick else 2000, rounds=5 if quick else 9)


def _produce(services: Services, quick: bool) -> dict[str, Any]:
    return produce.run_build_and_produce(services, count=4000 if quick else 10000, rounds=2 if quick else 3)


def _producer(services: Services, quick: bool) -> dict[str, Any]:
    return produce.run_producer_settings(services, count=3000 if quick else 10000, rounds=1 if quick else 2)


def _window(services: Services, quick: bool) -> dict[str, Any]:
    return window.run_eos(services, changes=2000 if quick else 10000, rounds=2 if quick else 3)


def _scaling(services: Services, quick: bool) -> dict[str, Any]:
    if quick:
        return window.run_scaling(
            services,
            sizes=[1000, 10000],
            counts=[250, 500, 1000],
            fixed_changes=500,
            fixed_size=10000,
            rounds=1,
        )
    return window.run_scaling(
        services,
        sizes=[1000, 10000, 50000],
        counts=[250, 500, 1000, 2000],
        fixed_changes=500,
        fixed_size=10000,
        rounds=3,
    )


def _spark_window(services: Services, quick: bool) -> dict[str, Any]:
    return spark.run_empty_window(services, rounds=1 if quick else 2)


def _snapshot(services: Services, quick: bool) -> dict[str, Any]:
    return spark.run_snapshot(
        services, documents=5000 if quick else 20000, threads=[1, 2], rounds=1 if quick else 2
    )


def _submit_window(services: Services, quick: bool) -> dict[str, Any]:
    figures = submit.run_window(
        services, sizes=[1000, 5000] if quick else [10000, 100000], empty_rounds=2 if quick else 4
    )
    figures["operator"] = submit.run_operator_window(services, rounds=2 if quick else 3)
    return figures


def _submit_snapshot(services: Services, quick: bool) -> dict[str, Any]:
    return submit.run_snapshot(services, sizes=[1000, 5000] if quick else [10000, 100000], threads=[1, 2, 4])


def _task_tree(services: Services, quick: bool) -> dict[str, Any]:
    return task_tree.run_scheduled_window(services, rounds=2 if quick else 4)


def _latency(services: Services, quick: bool) -> dict[str, Any]:
    return watch.run_latency(services, rates=[1, 10, 100], seconds=60 if quick else 180)


def _open_latency(services: Services, quick: bool) -> dict[str, Any]:
    return sidebyside.run(services, phases=[(10, 120 if quick else 600)], debezium=False)


def _debezium(services: Services, quick: bool) -> dict[str, Any]:
    if quick:
        return sidebyside.run(
            services, phases=[(0, 30), (10, 300, "start"), (10, 90), (100, 90)], debezium=True
        )
    return sidebyside.run(
        services, phases=[(0, 60), (10, 300, "start"), (10, 300), (100, 300)], debezium=True
    )


def _watcher_cpu(services: Services, quick: bool) -> dict[str, Any]:
    if quick:
        return watch.run_watcher_cpu(services, idle_s=60, sizes=[5000, 20000], rounds=1)
    return watch.run_watcher_cpu(services, idle_s=180, sizes=[20000, 100000], rounds=2)


def _delta(services: Services, quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "apply": delta.run_apply(services, rows=100_000, changes=10_000),
            "apply_iceberg": delta.run_apply(services, rows=100_000, changes=10_000, table_format="iceberg"),
            "files": delta.run_files(services, rows=10_000, applies=20, per_apply=200),
            "files_iceberg": delta.run_files(
                services, rows=10_000, applies=20, per_apply=200, table_format="iceberg"
            ),
        }
    return {
        "apply": delta.run_apply(services, rows=1_000_000, changes=100_000),
        "apply_no_schemas": delta.run_apply(services, rows=1_000_000, changes=100_000, schemas=False),
        "apply_iceberg": delta.run_apply(services, rows=1_000_000, changes=100_000, table_format="iceberg"),
        "files": delta.run_files(services, rows=100_000, applies=100, per_apply=1000),
        "files_iceberg": delta.run_files(
            services, rows=100_000, applies=100, per_apply=1000, table_format="iceberg"
        ),
    }


def _follow(services: Services, quick: bool) -> dict[str, Any]:
    return follow.run(services, rates=[10, 1000], seconds=30 if quick else 120)


def _delta_report(figures: dict[str, Any]) -> list[str]:
    lines = delta.report_apply(figures["apply"])
    if "apply_iceberg" in figures:
        lines += delta.report_apply(figures["apply_iceberg"])
    if "apply_no_schemas" in figures:
        lines += delta.report_apply(figures["apply_no_schemas"])
    lines += delta.report_files(figures["files"])
    if "files_iceberg" in figures:
        lines += delta.report_files(figures["files_iceberg"])
    return lines


BENCHES = [
    Bench("events", "a", "event build cost vs bson.json_util.dumps", _events, events.report),
    Bench(
        "window", "b", "window throughput: exactly-once vs without transactions", _window, window.report_eos
    ),
    Bench(
        "produce", "c", "build + exactly-once produce per core", _produce, produce.report_build_and_produce
    ),
    Bench(
        "spark-window",
        "d",
        "spark-submit overhead of an empty window",
        _spark_window,
        spark.report_empty_window,
    ),
    Bench(
        "scaling",
        "e",
        "window cost vs collection size and number of changes",
        _scaling,
        window.report_scaling,
    ),
    Bench(
        "snapshot", "f", "snapshot docs/s with snapshot.max.threads 1 and 2", _snapshot, spark.report_snapshot
    ),
    Bench(
        "submit-window",
        "g",
        "spark-submit window: wall, CPU of the process tree, fixed and per-change cost",
        _submit_window,
        submit.report_window,
    ),
    Bench(
        "submit-snapshot",
        "h",
        "spark-submit snapshot: wall, tree CPU, per-document cost at 1, 2 and 4 threads",
        _submit_snapshot,
        submit.report_snapshot,
    ),
    Bench(
        "task-tree",
        "m",
        "an empty window's whole task tree run by the scheduler (real Airflow): CPU by process",
        _task_tree,
        task_tree.report_scheduled_window,
    ),
    Bench(
        "open-latency",
        "i",
        "open windows: write -> Kafka at 10 writes/s for 10 minutes, window starts per burst (real Airflow)",
        _open_latency,
        sidebyside.report_latency,
    ),
    Bench(
        "latency",
        "ib",
        "bounded change-driven windows: write -> Kafka at 1, 10, 100 writes/s (real Airflow, max_delay 30 s)",
        _latency,
        watch.report_latency,
    ),
    Bench(
        "watcher-cpu",
        "j",
        "the change watcher's CPU: idle, and per pending change",
        _watcher_cpu,
        watch.report_watcher_cpu,
    ),
    Bench(
        "delta",
        "k",
        "Delta apply: changes per CPU-second on a 1 000 000-row table, start, files after 100 applies",
        _delta,
        _delta_report,
    ),
    Bench(
        "follow",
        "n",
        "Delta tables while an open window runs: write -> first table version at 10 and 1 000 writes/s, CPU per change",
        _follow,
        follow.report,
    ),
    Bench(
        "debezium",
        "l",
        "side by side with Debezium 3.6.1 (Kafka Connect standalone): tree CPU per hour at 10 and 100 writes/s",
        _debezium,
        sidebyside.report_sidebyside,
    ),
    Bench(
        "producer", "p", "producer settings and max.batch.size", _producer, produce.report_producer_settings
    ),
]


def _select(names: list[str]) -> list[Bench]:
    if not names:
        return list(BENCHES)
    chosen = []
    for name in names:
        matches = [bench for bench in BENCHES if name in (bench.name, bench.letter)]
        if not matches:
            raise SystemExit(
                f"unknown benchmark {name!r}; choose from "
                + ", ".join(f"{b.name} ({b.letter})" for b in BENCHES)
            )
        chosen.extend(bench for bench in matches if bench not in chosen)
    return chosen


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="benchmarks to run (default: all)")
    parser.add_argument("--quick", action="store_true", help="smaller sizes, fewer rounds")
    parser.add_argument("--json", metavar="PATH", help="write every figure to this JSON file")
    parser.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    args = parser.parse_args(argv)
    if args.list:
        for bench in BENCHES:
            print(f"{bench.letter}  {bench.name:13} {bench.title}")
        return 0
    selected = _select(args.names)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("airflow_provider_mongocdc.librdkafka").setLevel(logging.ERROR)

    info = machine.describe()
    print(f"mongocdc benchmarks {'(quick) ' if args.quick else ''}{info['date']}")
    print(
        f"machine: {info['nproc']} CPUs ({info['cpu_model']}), {info['memory_gib']} GiB; Python "
        f"{info['python']}, {info['java']}; pymongo {info['pymongo']}, confluent-kafka "
        f"{info['confluent_kafka']} (librdkafka {info['librdkafka']})"
    )
    print(
        f"load average {info['load_at_start']}; reference json.dumps of 1 KB: "
        f"{info['reference_us']} us CPU (smaller = faster machine / less contention)"
    )
    results: dict[str, Any] = {"machine": info, "quick": args.quick, "benchmarks": {}}
    failed = False
    with Services() as services:
        for bench in selected:
            print(f"\n[{bench.letter}] {bench.name}: {bench.title}", flush=True)
            began, load_before = time.perf_counter(), machine.load()
            try:
                figures = bench.run(services, args.quick)
            except Exception as error:  # report and go on with the other benchmarks
                failed = True
                print(f"  FAILED: {error}")
                traceback.print_exc(file=sys.stderr)
                results["benchmarks"][bench.name] = {"error": str(error)}
                continue
            figures["load_before"] = load_before
            figures["load_after"] = machine.load()
            figures["seconds"] = round(time.perf_counter() - began, 1)
            results["benchmarks"][bench.name] = figures
            for line in bench.report(figures):
                print(f"  {line}")
            print(
                f"  (load {load_before[0]} -> {figures['load_after'][0]}, {figures['seconds']} s)", flush=True
            )
        results["servers"] = services.started
    for line in services.started:
        print(f"started and stopped: {line}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2, default=str)
        print(f"figures written to {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
