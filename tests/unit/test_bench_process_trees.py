"""The side-by-side benchmark's accounting: CPU of a process tree from /proc counts children that
lived and exited between two samples (through their parent's cutime/cstime), and bursts of writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from bench.sidebyside import ProcessTrees, bursts, cpu_between

pytestmark = pytest.mark.unit

# A parent that starts a child which starts a grandchild; both burn a fixed amount of work and
# exit; the parent reaps them, prints its own and its reaped children's CPU, then waits for stdin.
PARENT = textwrap.dedent(
    """
    import os, resource, subprocess, sys
    work = "sum(i * i for i in range(3_000_000))"
    grandchild = f"import subprocess, sys; {work}; subprocess.run([sys.executable, '-c', {work!r}])"
    sys.stdin.readline()
    subprocess.run([sys.executable, "-c", grandchild], check=True)
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime, flush=True)
    sys.stdin.readline()
    """
)


def test_a_tree_counts_the_cpu_of_children_that_exited_between_samples():
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        trees = ProcessTrees({"tree": [parent.pid]})  # sampled only when marked: no thread
        before = trees.mark()
        parent.stdin.write("go\n")
        parent.stdin.flush()
        own, children = (float(value) for value in parent.stdout.readline().split())
        after = trees.mark()
        counted = cpu_between(before, after)["sides"]["tree"]["cpu_s"]
        before_own = before["total"]["tree"]
        assert children > 0.1
        # Everything the children used is in the tree's figure (one clock tick of rounding each).
        assert counted >= children - 0.05
        assert counted <= children + own - before_own + 0.05
    finally:
        parent.stdin.write("end\n")
        parent.stdin.flush()
        parent.wait(timeout=60)


def test_a_steady_stream_is_one_burst_and_a_gap_longer_than_idle_starts_another():
    assert bursts([], 30) == 0
    assert bursts([0.1 * n for n in range(6000)], 30) == 1
    assert bursts([0, 10, 40, 71, 72], 30) == 2
    assert bursts([5, 0, 200, 100], 30) == 3  # in any order
