"""The interop suite's JVM: Kafka Connect's JsonConverter and Debezium's MongoDB connector code
(devtools/interop), started once for the whole session."""

from __future__ import annotations

import pytest

from devtools.interop import Harness


@pytest.fixture(scope="session")
def harness():
    with Harness() as running:
        yield running
