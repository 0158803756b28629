"""pymongo's own test suite as the judge of the MongoDB simulator (devtools/mongosim/driver_suite.py).

The fast part: the change-stream and retryable-write test files of the installed pymongo's sdist
against a fresh 3-member simulator replica set; every failure must be a non-goal the simulator's
README lists. ``make fidelity-driver`` runs all eight files against 3 members and 1.
"""

from __future__ import annotations

import pytest

from devtools.mongosim import driver_suite
from devtools.mongosim.launcher import REPO

pytestmark = [pytest.mark.fidelity, pytest.mark.driver_suite]

FAST_FILES = ("test_change_stream.py", "test_retryable_writes_unified.py")


@pytest.fixture(scope="module")
def pymongo_tests():
    return driver_suite.ensure_tests()


@pytest.mark.parametrize("file", FAST_FILES)
def test_pymongo_test_file_fails_only_on_documented_non_goals(pymongo_tests, file):
    outcome = driver_suite.run_file(file, members=3, home=pymongo_tests)
    assert outcome.error is None
    assert outcome.passed > 100, f"only {outcome.passed} of pymongo's tests passed"
    assert driver_suite.undocumented([outcome]) == []


def test_every_non_goal_is_listed_in_the_simulator_readme():
    readme = (REPO / "devtools" / "mongosim" / "README.md").read_text()
    section = readme.split("## pymongo's test suite", 1)[1]
    for goal in driver_suite.NON_GOALS:
        assert goal.key in section, f"{goal.key} is not listed as a non-goal in devtools/mongosim/README.md"


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("pymongo.errors.OperationFailure: Unrecognized pipeline stage name: '$out'", "$out and $merge"),
        (
            "OperationFailure: BSON field 'create.viewOn' is an unknown field., full error: {...}",
            "views and time-series collections",
        ),
    ],
)
def test_failures_of_a_non_goal_are_classified_as_such(text, cause):
    assert driver_suite.classify(text) == (cause, cause)


def test_other_failures_are_classified_by_their_first_line():
    cause, goal = driver_suite.classify("AssertionError: 2 != 3 : expected events:\n...")
    assert goal is None and cause == "unclassified: AssertionError: N != N : expected events:"
