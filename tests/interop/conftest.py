"""The interop suite's JVM: Kafka Connect's JsonConverter and Debezium's MongoDB connector code
(devtools/interop), started once for the whole session."""

from __future__ import annotations

import pytest

# support.assert_debeziums's assertions show the differing values.
pytest.register_assert_rewrite("tests.interop.support")

from devtools.interop import Harness  # noqa: E402


@pytest.fixture(scope="session")
def harness():
    with Harness() as running:
        yield running
