"""The reconnection backoff follows Debezium's documented table and property rules."""

from __future__ import annotations

import pytest

from airflow_provider_mongocdc.core.base.backoff import BackoffPolicy, format_duration_ms
from airflow_provider_mongocdc.core.base.errors import ConfigError

pytestmark = pytest.mark.unit

# Debezium MongoDB connector docs, "MongoDB becomes unavailable": delay before each reconnection
# attempt (seconds) and the total delay before it (mm:ss) with the default properties.
DEBEZIUM_TABLE = [
    (1, 1, "00:01"),
    (2, 2, "00:03"),
    (3, 4, "00:07"),
    (4, 8, "00:15"),
    (5, 16, "00:31"),
    (6, 32, "01:03"),
    (7, 64, "02:07"),
    (8, 120, "04:07"),
    (9, 120, "06:07"),
    (10, 120, "08:07"),
    (11, 120, "10:07"),
    (12, 120, "12:07"),
    (13, 120, "14:07"),
    (14, 120, "16:07"),
    (15, 120, "18:07"),
    (16, 120, "20:07"),
]


def test_defaults_reproduce_debeziums_table():
    policy = BackoffPolicy()
    assert (policy.initial_delay_ms, policy.max_delay_ms, policy.max_attempts) == (1000, 120000, 16)
    delays = list(policy.delays_ms())
    assert len(delays) == len(DEBEZIUM_TABLE)
    total = 0
    for delay, (attempt, seconds, cumulative) in zip(delays, DEBEZIUM_TABLE):
        total += delay
        assert delay == seconds * 1000, f"attempt {attempt}"
        minutes, secs = divmod(total // 1000, 60)
        assert f"{minutes:02d}:{secs:02d}" == cumulative, f"attempt {attempt}"
    assert policy.total_delay_ms() == total == 1_207_000
    assert format_duration_ms(policy.total_delay_ms()) == "20 min 7 s"


def test_custom_values_double_and_cap():
    policy = BackoffPolicy(initial_delay_ms=10, max_delay_ms=35, max_attempts=5)
    assert list(policy.delays_ms()) == [10, 20, 35, 35, 35]
    assert policy.max_calls == 6
    assert BackoffPolicy(initial_delay_ms=5, max_delay_ms=5, max_attempts=0).total_delay_ms() == 0


def test_huge_attempt_numbers_stay_capped():
    assert BackoffPolicy().delay_ms(10_000) == 120_000


@pytest.mark.parametrize(
    "kwargs, prop",
    [
        ({"initial_delay_ms": -1}, "connect.backoff.initial.delay.ms"),
        ({"max_delay_ms": "1000"}, "connect.backoff.max.delay.ms"),
        ({"max_attempts": -3}, "connect.max.attempts"),
        ({"max_attempts": True}, "connect.max.attempts"),
        ({"initial_delay_ms": 5000, "max_delay_ms": 1000}, "connect.backoff.max.delay.ms"),
    ],
)
def test_invalid_values_name_the_property(kwargs, prop):
    with pytest.raises(ConfigError) as info:
        BackoffPolicy(**kwargs)
    assert prop in str(info.value)
    assert "Fix:" in str(info.value)


class Flaky:
    def __init__(self, failures: int, error: Exception):
        self.failures = failures
        self.error = error
        self.calls = 0

    def __call__(self):
        self.calls += 1
        if self.calls <= self.failures:
            raise self.error
        return "connected"


def test_call_retries_retriable_errors_with_the_policys_delays():
    slept: list[float] = []
    retries: list[tuple[int, int]] = []
    operation = Flaky(3, ConnectionError("refused"))
    result = BackoffPolicy(initial_delay_ms=100, max_delay_ms=250, max_attempts=5).call(
        operation,
        retry_on=lambda e: isinstance(e, ConnectionError),
        sleep=slept.append,
        on_retry=lambda attempt, delay, error: retries.append((attempt, delay)),
    )
    assert result == "connected"
    assert operation.calls == 4
    assert slept == [0.1, 0.2, 0.25]
    assert retries == [(1, 100), (2, 200), (3, 250)]


def test_call_gives_up_after_max_attempts_with_the_last_error():
    slept: list[float] = []
    operation = Flaky(100, ConnectionError("refused"))
    with pytest.raises(ConnectionError, match="refused"):
        BackoffPolicy(initial_delay_ms=1, max_delay_ms=4, max_attempts=3).call(
            operation, retry_on=lambda e: True, sleep=slept.append
        )
    assert operation.calls == 4  # the first contact and three reconnection attempts
    assert slept == [0.001, 0.002, 0.004]


def test_call_does_not_retry_other_errors():
    slept: list[float] = []
    operation = Flaky(100, PermissionError("bad password"))
    with pytest.raises(PermissionError):
        BackoffPolicy().call(operation, retry_on=lambda e: isinstance(e, ConnectionError), sleep=slept.append)
    assert operation.calls == 1
    assert slept == []


def test_policy_from_a_connector_configuration():
    from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

    config = ConnectorConfig.from_properties(
        {
            "topic.prefix": "fulfillment",
            "connect.backoff.initial.delay.ms": 250,
            "connect.backoff.max.delay.ms": 2000,
            "connect.max.attempts": 5,
        }
    )
    assert list(BackoffPolicy.from_config(config).delays_ms()) == [250, 500, 1000, 2000, 2000]
    defaults = BackoffPolicy.from_config(ConnectorConfig.from_properties({"topic.prefix": "p"}))
    assert defaults == BackoffPolicy()
