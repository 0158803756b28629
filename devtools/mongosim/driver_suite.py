"""pymongo's own test suite as the judge of the simulator.

    python -m devtools.mongosim.driver_suite fetch   # pymongo's test/ folder, for the installed pymongo
    python -m devtools.mongosim.driver_suite run [--members 3 1] [--file test_change_stream.py ...]

``fetch`` downloads the sdist of the installed pymongo version from PyPI with pip (``pip download
--no-binary :all: --no-deps pymongo==<version>``) and keeps its ``test/`` folder under
``devtools/mongosim/target/`` (git-ignored). ``run`` starts a fresh simulator replica set for each
test file (3 members, then 1), runs pytest on the file and prints passed/failed per file and the
failures per cause. Every failure must be a documented non-goal (``NON_GOALS``, listed in
devtools/mongosim/README.md, "pymongo's test suite"); ``run`` exits with 1 otherwise.

The harness works around three things of the test files themselves (not of the simulator), as the
README explains: only ``test/`` is extracted, so that the installed pymongo (with its C extensions)
is the one tested; pytest runs with the harness's own configuration, since the sdist's needs
pytest-asyncio and turns every warning into an error; ``MongoClient()`` without a host (some tests
build one) points to the simulator instead of localhost:27017 (``pytest_configure`` below).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

from devtools.mongosim.launcher import REPO, MongoSim

TARGET = REPO / "devtools" / "mongosim" / "target"
# The files that exercise what the product relies on: change streams, sessions, transactions,
# retryable writes, causal consistency.
FILES = (
    "test_change_stream.py",
    "test_transactions_unified.py",
    "test_retryable_writes_unified.py",
    "test_session.py",
    "test_transactions.py",
    "test_retryable_writes.py",
    "test_sessions_unified.py",
    "test_causal_consistency.py",
)
MEMBERS = (3, 1)
TEST_TIMEOUT_S = 120  # one test (pytest-timeout): a hang fails that test, not the run
FILE_TIMEOUT_S = 1800  # one file's pytest run
PYTEST_INI = """\
[pytest]
# Written by devtools/mongosim/driver_suite.py: the sdist's own configuration needs pytest-asyncio
# (asyncio_default_fixture_loop_scope under --strict-config) and turns every warning into an error.
addopts = -p no:cacheprovider
markers =
    default: pymongo's default suite
    default_async: pymongo's default async suite
    auth: needs authentication
    auth_aws: needs pymongo-auth-aws
    auth_oidc: needs OIDC
    ocsp: needs OCSP
    atlas_connect: needs Atlas
    sfp: needs an Atlas Secure Frontend Processor
    perf: benchmarks
    search_index: search index helpers
    kms: encryption with a KMS
    encryption: encryption
    load_balancer: needs a load balancer
    mockupdb: needs mockupdb
"""


# Tests that read from a secondary inside a transaction to get the server's "read preference in a
# transaction must be primary": a 1-member replica set has no secondary, so pymongo fails in
# server selection first, as against a real 1-member replica set. Deselected on 1 member.
NEEDS_SECONDARY = {
    "test_transactions_unified.py": (
        "TestUnifiedRunCommand::test_run_command_fails_with_explicit_secondary_read_preference",
        "TestUnifiedRunCommand::test_run_command_fails_with_secondary_read_preference_from_transaction_options",
        "TestUnifiedReadPref::test_secondary_readPreference",
    ),
}


class DriverSuiteError(RuntimeError):
    """pymongo's test files could not be fetched or run."""


@dataclasses.dataclass(frozen=True)
class NonGoal:
    """A MongoDB behaviour the simulator leaves out on purpose, and how its failures read."""

    key: str  # the README names it with this text
    pattern: str  # a regular expression searched in the failure's message and traceback


# What the simulator refuses on purpose (devtools/mongosim/README.md, "pymongo's test suite"), each
# with the error it answers: a failure of pymongo's tests with that error is a non-goal.
NON_GOALS = (
    NonGoal("$out and $merge", r"Unrecognized pipeline stage name: '\$(out|merge)'"),
    NonGoal(
        "views and time-series collections",
        r"BSON field 'create\.(viewOn|pipeline|timeseries)' is an unknown field",
    ),
)


@dataclasses.dataclass
class Outcome:
    file: str
    members: int
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    deselected: int = 0  # tests that need a secondary, on 1 member (NEEDS_SECONDARY)
    failures: list = dataclasses.field(default_factory=list)  # (test id, cause, non-goal key or None)
    error: str | None = None  # the run itself failed (no junit report)


# -- fetching --------------------------------------------------------------------------------------
def pymongo_version() -> str:
    return metadata.version("pymongo")


def tests_dir(version: str | None = None) -> Path:
    return TARGET / f"pymongo-{version or pymongo_version()}"


def ensure_tests(quiet: bool = True) -> Path:
    """pymongo's ``test/`` folder for the installed version (downloaded once, then cached)."""
    version = pymongo_version()
    home = tests_dir(version)
    if (home / ".complete").exists():
        return home
    with tempfile.TemporaryDirectory(prefix="mongosim-pymongo-") as tmp:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-binary",
            ":all:",
            "--no-deps",
            "--dest",
            tmp,
            f"pymongo=={version}",
        ]
        result = subprocess.run(command, capture_output=quiet, text=True, check=False)
        if result.returncode != 0:
            raise DriverSuiteError(
                f"Cannot download the pymongo {version} sdist from PyPI (pip exited with "
                f"{result.returncode}): {(result.stderr or '')[-1500:]} Check the network access to "
                "PyPI (or pip's index settings) and run 'make fidelity-driver' again."
            )
        archives = list(Path(tmp).glob(f"pymongo-{version}.tar.gz"))
        if not archives:
            raise DriverSuiteError(f"pip downloaded no pymongo-{version}.tar.gz into {tmp}")
        shutil.rmtree(home, ignore_errors=True)
        home.mkdir(parents=True)
        prefix = f"pymongo-{version}/test/"
        with tarfile.open(archives[0]) as archive:
            members = [m for m in archive.getmembers() if m.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(f"pymongo-{version}/") :]
            extract_filter = getattr(tarfile, "data_filter", None)
            if extract_filter is not None:
                archive.extractall(home, members=members, filter=extract_filter)
            else:  # pragma: no cover - Python without tarfile filters
                archive.extractall(home, members=members)  # the archive comes from PyPI
    (home / "pytest.ini").write_text(PYTEST_INI)
    (home / ".complete").write_text(version + "\n")
    return home


# -- running ---------------------------------------------------------------------------------------
def run_file(
    file: str, members: int, home: Path | None = None, extra_args: list[str] | None = None
) -> Outcome:
    """Run one of pymongo's test files against a fresh simulator replica set."""
    home = home or ensure_tests()
    outcome = Outcome(file, members)
    with tempfile.TemporaryDirectory(prefix="mongosim-driver-") as tmp, MongoSim(members=members) as sim:
        host, _, port = sim.member_addresses[0].rpartition(":")
        report = Path(tmp) / "report.xml"
        env = dict(os.environ)
        env.update(
            DB_IP=host,
            DB_PORT=port,
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        )
        command = [
            sys.executable,
            "-m",
            "pytest",
            "-c",
            str(home / "pytest.ini"),
            "--rootdir",
            str(home),
            "-p",
            "devtools.mongosim.driver_suite",
            "-q",
            "--tb=native",
            f"--timeout={TEST_TIMEOUT_S}",
            f"--junitxml={report}",
            f"test/{file}",
            *(extra_args or []),
        ]
        if members == 1:
            command += [f"--deselect=test/{file}::{test}" for test in NEEDS_SECONDARY.get(file, ())]
            outcome.deselected = len(NEEDS_SECONDARY.get(file, ()))
        try:
            result = subprocess.run(
                command,
                cwd=home,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=FILE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            outcome.error = f"pytest did not finish within {FILE_TIMEOUT_S} s"
            return outcome
        if not report.exists():
            outcome.error = f"pytest exited with {result.returncode} and no report: {result.stdout[-1500:]}"
            return outcome
        _read_report(report, outcome)
    return outcome


def _read_report(report: Path, outcome: Outcome) -> None:
    for case in ET.parse(report).iter("testcase"):
        name = f"{case.get('classname', '').rpartition('.')[2]}::{case.get('name')}"
        status = "passed"
        text = ""
        for child in case:
            if child.tag in ("failure", "error"):
                status = "failed"
                text = f"{child.get('message') or ''}\n{child.text or ''}"
                break
            if child.tag == "skipped":
                status = "skipped"
        if status == "passed":
            outcome.passed += 1
        elif status == "skipped":
            outcome.skipped += 1
        else:
            outcome.failed += 1
            cause, non_goal = classify(text)
            outcome.failures.append((name, cause, non_goal))


def classify(text: str) -> tuple[str, str | None]:
    """(cause, non-goal key or None) of a failure's message and traceback."""
    for goal in NON_GOALS:
        if re.search(goal.pattern, text):
            return goal.key, goal.key
    for pattern, cause in (
        (r"Cannot find failpoint: (\w+)", "fail point {} missing"),
        (r"no such command: '(\w+)'", "command {} missing"),
        (r"(\S+) is not supported by the simulator", "{} refused by the simulator"),
    ):
        found = re.search(pattern, text)
        if found:
            return cause.format(found.group(1)), None
    first = (text.strip().splitlines() or ["(no message)"])[0]
    first = re.sub(r", full error: .*", "", first)
    first = re.sub(r"\d+", "N", first)
    return f"unclassified: {first[:160]}", None


def report_lines(outcomes: list[Outcome]) -> list[str]:
    """The table of results per file (passed / failed / skipped per replica-set size) and the
    failures per cause."""
    sizes = sorted({o.members for o in outcomes}, reverse=True)
    titles = [_members(m) for m in sizes]
    lines = [
        "pymongo's test files against fresh simulator replica sets: passed / failed / skipped",
        "",
        f"{'':34s}" + "".join(f"{title:>20s}" for title in titles),
    ]
    totals: collections.Counter = collections.Counter()
    for file in dict.fromkeys(o.file for o in outcomes):
        cells = []
        for members in sizes:
            found = [o for o in outcomes if o.file == file and o.members == members]
            if not found:
                cells.append("-")
                continue
            o = found[0]
            totals.update({(members, "passed"): o.passed, (members, "failed"): o.failed})
            totals[(members, "skipped")] += o.skipped
            cells.append("run failed" if o.error else f"{o.passed} / {o.failed} / {o.skipped}")
        lines.append(f"{file:34s}" + "".join(f"{cell:>20s}" for cell in cells))
    sums = [f"{totals[(m, 'passed')]} / {totals[(m, 'failed')]} / {totals[(m, 'skipped')]}" for m in sizes]
    lines.append(f"{'all files':34s}" + "".join(f"{cell:>20s}" for cell in sums))
    causes: dict = collections.defaultdict(collections.Counter)
    goals = {}
    for o in outcomes:
        for _name, cause, goal in o.failures:
            causes[cause][o.members] += 1
            goals[cause] = goal
    lines += ["", "failures per cause (" + ", ".join(titles) + "):"]
    if not causes:
        lines.append("  none")
    for cause, counts in sorted(causes.items(), key=lambda item: -sum(item[1].values())):
        tag = "non-goal" if goals[cause] else "to fix"
        lines.append("  " + " ".join(f"{counts[m]:>4d}" for m in sizes) + f"  [{tag}] {cause}")
    deselected = [o for o in outcomes if o.deselected]
    for o in deselected:
        lines.append(
            f"{o.file} ({_members(o.members)}): {o.deselected} tests deselected, they need a secondary"
        )
    for o in outcomes:
        if o.error:
            lines.append(f"run of {o.file} ({_members(o.members)}) failed: {o.error}")
    return lines


def _members(count: int) -> str:
    return f"{count} member" + ("s" if count > 1 else "")


def undocumented(outcomes: list[Outcome]) -> list[str]:
    """Failures that are no documented non-goal (and runs that failed), one line each."""
    out = [f"{o.file} ({_members(o.members)}): {o.error}" for o in outcomes if o.error]
    for o in outcomes:
        out += [
            f"{o.file} ({_members(o.members)}) {name}: {cause}"
            for name, cause, goal in o.failures
            if not goal
        ]
    return out


# -- pytest plugin (loaded into pymongo's test run with -p devtools.mongosim.driver_suite) ----------
def pytest_configure(config) -> None:
    """Harness workaround: some of pymongo's tests build ``MongoClient()`` without a host, i.e. a
    mongod on localhost:27017; point the default host to the simulator under test."""
    from pymongo.synchronous.mongo_client import MongoClient

    if os.environ.get("DB_IP") and os.environ.get("DB_PORT"):
        MongoClient.HOST = os.environ["DB_IP"]
        MongoClient.PORT = int(os.environ["DB_PORT"])


# -- command line ----------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devtools.mongosim.driver_suite",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="download pymongo's test files for the installed version")
    run = sub.add_parser("run", help="run pymongo's test files against fresh simulators")
    run.add_argument("--members", type=int, nargs="+", choices=MEMBERS, default=list(MEMBERS))
    run.add_argument("--file", action="append", choices=FILES, help="one of the files (repeatable)")
    run.add_argument("--verbose", action="store_true", help="list every failing test")
    args = parser.parse_args(argv)
    try:
        home = ensure_tests(quiet=args.command != "fetch")
    except DriverSuiteError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if args.command == "fetch":
        print(home)
        return 0
    outcomes = []
    for members in args.members:
        for file in args.file or FILES:
            outcome = run_file(file, members, home)
            outcomes.append(outcome)
            print(
                f"{file} ({_members(members)}): {outcome.passed} passed, {outcome.failed} failed, "
                f"{outcome.skipped} skipped"
                + (f", {outcome.deselected} deselected (need a secondary)" if outcome.deselected else "")
                + (f" -- {outcome.error}" if outcome.error else ""),
                flush=True,
            )
            if args.verbose:
                for name, cause, _goal in outcome.failures:
                    print(f"    {name}: {cause}", flush=True)
    print()
    print("\n".join(report_lines(outcomes)))
    missing = undocumented(outcomes)
    if missing:
        print(f"\n{len(missing)} failures are no documented non-goal (devtools/mongosim/README.md)")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
