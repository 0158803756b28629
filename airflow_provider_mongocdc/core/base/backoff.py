"""Exponential backoff for reconnecting, as Debezium's ``connect.*`` properties describe it.

The first reconnection attempt waits ``connect.backoff.initial.delay.ms``, each next one twice as
long, up to ``connect.backoff.max.delay.ms``; the error is raised after ``connect.max.attempts``
reconnection attempts. The first contact is not a reconnection: it happens at once, so an
operation runs at most ``1 + max_attempts`` times. :class:`BackoffPolicy` computes the delays; only
:meth:`BackoffPolicy.call` sleeps. The delays with the defaults: docs/design.md, "Reconnecting".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from airflow_provider_mongocdc.core.base.errors import ConfigError

DEFAULT_INITIAL_DELAY_MS = 1000
DEFAULT_MAX_DELAY_MS = 120_000
DEFAULT_MAX_ATTEMPTS = 16

T = TypeVar("T")


@dataclass(frozen=True)
class BackoffPolicy:
    """When to try again after a failed contact. Pure: it computes delays and never sleeps itself
    except in :meth:`call`, whose ``sleep`` can be replaced."""

    initial_delay_ms: int = DEFAULT_INITIAL_DELAY_MS
    max_delay_ms: int = DEFAULT_MAX_DELAY_MS
    max_attempts: int = DEFAULT_MAX_ATTEMPTS

    def __post_init__(self) -> None:
        for prop, value, minimum in (
            ("connect.backoff.initial.delay.ms", self.initial_delay_ms, 0),
            ("connect.backoff.max.delay.ms", self.max_delay_ms, 0),
            ("connect.max.attempts", self.max_attempts, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
                raise ConfigError(
                    f"Invalid value {value!r} for {prop}",
                    cause="the property takes a whole number that is 0 or more",
                    fix=f"set {prop} to a non-negative integer",
                )
        if self.max_delay_ms < self.initial_delay_ms:
            raise ConfigError(
                f"connect.backoff.max.delay.ms ({self.max_delay_ms}) is smaller than "
                f"connect.backoff.initial.delay.ms ({self.initial_delay_ms})",
                cause="the longest delay cannot be shorter than the first one",
                fix="raise connect.backoff.max.delay.ms or lower connect.backoff.initial.delay.ms",
            )

    @classmethod
    def from_config(cls, config) -> BackoffPolicy:
        """The policy of a ConnectorConfig (its connect.* properties)."""
        return cls(
            config.connect_backoff_initial_delay_ms,
            config.connect_backoff_max_delay_ms,
            config.connect_max_attempts,
        )

    def delay_ms(self, attempt: int) -> int:
        """Delay before reconnection attempt ``attempt`` (1-based)."""
        if attempt < 1:
            raise ValueError("reconnection attempts are numbered from 1")
        # Double from the initial delay, capped; stop doubling once the cap is reached so that huge
        # attempt numbers never build huge integers.
        delay = self.initial_delay_ms
        for _ in range(attempt - 1):
            if delay >= self.max_delay_ms:
                break
            delay *= 2
        return min(delay, self.max_delay_ms)

    def delays_ms(self) -> Iterator[int]:
        """The delays before reconnection attempts 1 .. max_attempts."""
        for attempt in range(1, self.max_attempts + 1):
            yield self.delay_ms(attempt)

    def total_delay_ms(self) -> int:
        """Time spent waiting when every attempt fails (the attempts' own duration excluded)."""
        return sum(self.delays_ms())

    @property
    def max_calls(self) -> int:
        """How often :meth:`call` runs the operation at most: the first contact plus the retries."""
        return 1 + self.max_attempts

    def call(
        self,
        operation: Callable[[], T],
        *,
        retry_on: Callable[[BaseException], bool],
        sleep: Callable[[float], None] = time.sleep,
        on_retry: Callable[[int, int, BaseException], None] | None = None,
    ) -> T:
        """Run ``operation`` until it succeeds, waiting between failures.

        ``retry_on(error)`` says whether a failure may be retried; any other failure propagates at
        once. When the last attempt fails its error propagates. ``on_retry(attempt, delay_ms,
        error)`` is called before each wait (for logging).
        """
        delays = self.delays_ms()
        attempt = 0
        while True:
            try:
                return operation()
            except Exception as error:  # noqa: BLE001 - classified by retry_on
                if not retry_on(error):
                    raise
                delay = next(delays, None)
                if delay is None:
                    raise
                attempt += 1
                if on_retry is not None:
                    on_retry(attempt, delay, error)
                sleep(delay / 1000.0)


def format_duration_ms(milliseconds: int) -> str:
    """``1207000`` -> ``"20 min 7 s"``; for messages."""
    seconds = milliseconds / 1000.0
    if seconds < 60:
        return f"{round(seconds, 1):g} s"
    minutes, rest = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min"
