"""Print where a test run's time went, from pytest's JUnit XML: tests and seconds per marker (the
``markers`` property tests/conftest.py records; a test with two markers counts under both) and per
folder, the slowest files and the slowest tests. Seconds are each test's own (setup, call and
teardown), summed: with several workers the sum is larger than the run's wall time."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ElementTree
from collections import defaultdict


def main(path: str, slowest: int = 15) -> None:
    cases = []
    per_marker: dict[str, list[float]] = defaultdict(list)
    per_folder: dict[str, list[float]] = defaultdict(list)
    per_file: dict[str, float] = defaultdict(float)
    for case in ElementTree.parse(path).iter("testcase"):
        module = case.get("classname", "")
        parts = module.split(".")
        folder = parts[1] if len(parts) > 1 and parts[0] == "tests" else module
        seconds = float(case.get("time") or 0)
        cases.append((seconds, f"{module.replace('.', '/')}.py::{case.get('name')}"))
        per_folder[folder].append(seconds)
        per_file[module.replace(".", "/") + ".py"] += seconds
        for prop in case.iter("property"):
            if prop.get("name") == "markers":
                for marker in filter(None, (prop.get("value") or "").split(",")):
                    per_marker[marker].append(seconds)
    print(f"== {len(cases)} tests, {sum(seconds for seconds, _ in cases):.0f} test-seconds")
    for title, table in (("marker", per_marker), ("folder", per_folder)):
        print(f"== per {title}")
        for name, times in sorted(table.items(), key=lambda item: -sum(item[1])):
            print(f"   {name:12s} {len(times):5d} tests {sum(times):8.0f} s")
    print(f"== the {slowest} slowest files (a file runs whole in one worker)")
    for name, seconds in sorted(per_file.items(), key=lambda item: -item[1])[:slowest]:
        print(f"   {seconds:7.1f} s  {name}")
    print(f"== the {slowest} slowest tests")
    for seconds, name in sorted(cases, reverse=True)[:slowest]:
        print(f"   {seconds:7.1f} s  {name}")


if __name__ == "__main__":
    main(sys.argv[1])
