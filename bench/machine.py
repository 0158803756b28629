"""What a benchmark ran on: CPU, memory, versions, load, and a speed reference of the machine."""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
import time
from typing import Any


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _java_version() -> str:
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30)
        return (done.stderr or done.stdout).splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError, IndexError):
        return "not found"


def load() -> list[float]:
    """The 1, 5 and 15 minute load averages (``uptime``)."""
    return [round(value, 2) for value in os.getloadavg()]


def reference_us(rounds: int = 7) -> float:
    """CPU microseconds of ``json.dumps`` of a fixed 1 KB document: compares machines and loads
    (smaller is faster)."""
    document = {
        "name": "reference",
        "values": list(range(60)),
        "text": "x" * 400,
        "nested": [{"a": index, "b": index / 3, "c": None, "d": True} for index in range(12)],
    }
    best = float("inf")
    for _ in range(rounds):
        started = time.process_time()
        for _ in range(500):
            json.dumps(document)
        best = min(best, time.process_time() - started)
    return round(best / 500 * 1e6, 2)


def describe() -> dict[str, Any]:
    import bson
    import confluent_kafka
    import pymongo

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": _cpu_model(),
        "memory_gib": _memory_gib(),
        "python": platform.python_version(),
        "java": _java_version(),
        "pymongo": pymongo.version,
        "bson_c_extension": bson.has_c(),
        "confluent_kafka": getattr(confluent_kafka, "__version__", None) or str(confluent_kafka.version()),
        "librdkafka": confluent_kafka.libversion()[0],
        "load_at_start": load(),
        "reference_us": reference_us(),
    }
