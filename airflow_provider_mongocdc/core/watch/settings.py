"""When a connector's change watcher asks for a window (:class:`WatchSettings`), from the
``"changes"`` object of a connector list entry's ``window_schedule`` or the trigger's arguments.

Durations are seconds (a number) or a number with a unit: ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``.
How the thresholds are used: docs/design.md, "Change-driven windows".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from airflow_provider_mongocdc.core.base.backoff import format_duration_ms
from airflow_provider_mongocdc.core.base.durations import parse_duration, settings_fields
from airflow_provider_mongocdc.core.base.errors import ConfigError

DEFAULT_MIN_CHANGES = 1000
DEFAULT_MAX_DELAY_S = 60.0
DEFAULT_MIN_HEADROOM_S = 12 * 3600.0
DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_REFIRE_AFTER_S = 600.0
# The gap check (stored positions still in the oplog, their headroom) runs every this many polls:
# every minute at the default poll interval.
POLLS_PER_CHECK = 12
# The server's wait for changes per getMore is the poll interval: at least this, at most this.
MIN_POLL_INTERVAL_S = 0.1
MAX_POLL_INTERVAL_S = 60.0

# The keys of the "changes" object: the entry's names, and the settings' fields they set.
ENTRY_KEYS = {
    "min_changes": "min_changes",
    "max_delay": "max_delay_s",
    "min_headroom": "min_headroom_s",
    "poll_interval": "poll_interval_s",
    "refire_after": "refire_after_s",
}


def describe_seconds(seconds: float) -> str:
    """``3600`` -> ``"1 h 0 min"``; for messages."""
    return format_duration_ms(int(round(seconds * 1000)))


@dataclass(frozen=True)
class WatchSettings:
    """When the watcher asks for a window (durations in seconds)."""

    # That many changes are pending.
    min_changes: int = DEFAULT_MIN_CHANGES
    # The oldest pending change is that old.
    max_delay_s: float = DEFAULT_MAX_DELAY_S
    # A stored position leaves the oplog within that time at the current rate (0: never asks for it).
    min_headroom_s: float = DEFAULT_MIN_HEADROOM_S
    # How long the server holds an idle read: how late a threshold may be noticed.
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    # No window committed past an event's changes within that time (its run failed): ask again.
    refire_after_s: float = DEFAULT_REFIRE_AFTER_S

    @property
    def check_interval_s(self) -> float:
        """How often the stored positions are checked against the oplog (gap, headroom)."""
        return POLLS_PER_CHECK * self.poll_interval_s

    def __post_init__(self) -> None:
        """Checks every value; one ConfigError names each bad one (``problems``: their errors)."""
        problems: list[ConfigError] = []
        if (
            isinstance(self.min_changes, bool)
            or not isinstance(self.min_changes, int)
            or self.min_changes < 1
        ):
            problems.append(
                ConfigError(
                    f"min_changes must be a whole number of changes, 1 or more, got {self.min_changes!r}",
                    fix=f"give min_changes like {DEFAULT_MIN_CHANGES}",
                )
            )
        for name in ("max_delay_s", "min_headroom_s", "poll_interval_s", "refire_after_s"):
            label = name.removesuffix("_s")
            try:
                object.__setattr__(self, name, parse_duration(getattr(self, name), label))
            except ConfigError as error:
                problems.append(error)
        if problems:
            raise _settings_error(problems)
        if not MIN_POLL_INTERVAL_S <= self.poll_interval_s <= MAX_POLL_INTERVAL_S:
            problems.append(
                ConfigError(
                    f"poll_interval must lie between {MIN_POLL_INTERVAL_S:g} s and {MAX_POLL_INTERVAL_S:g} s, "
                    f"got {self.poll_interval_s:g} s",
                    cause="the server holds each idle read this long: longer would notice max_delay late, "
                    "shorter costs CPU without benefit",
                    fix=f'leave it out (default {DEFAULT_POLL_INTERVAL_S:g} s) or give e.g. "5s"',
                )
            )
        if self.max_delay_s <= 0:
            problems.append(
                ConfigError(
                    "max_delay must be longer than 0",
                    fix='give the longest a change may wait for its window, e.g. "60s"',
                )
            )
        if self.refire_after_s < self.poll_interval_s:
            problems.append(
                ConfigError(
                    f"refire_after ({describe_seconds(self.refire_after_s)}) is shorter than "
                    f"poll_interval ({describe_seconds(self.poll_interval_s)})",
                    fix=f"leave refire_after out (default {describe_seconds(DEFAULT_REFIRE_AFTER_S)})",
                )
            )
        if problems:
            raise _settings_error(problems)

    @classmethod
    def from_entry(cls, value: Any) -> WatchSettings:
        """From the ``"changes"`` object of a connector list entry (every key optional)."""
        example = '{"min_changes": 1000, "max_delay": "60s", "min_headroom": "12h"}'
        return cls(**settings_fields(value, "changes", ENTRY_KEYS, "thresholds", example))

    def to_kwargs(self) -> dict[str, Any]:
        """The trigger's keyword arguments (JSON numbers)."""
        return asdict(self)

    def describe(self) -> str:
        headroom = describe_seconds(self.min_headroom_s) if self.min_headroom_s else "off"
        return (
            f"min_changes {self.min_changes}, max_delay {describe_seconds(self.max_delay_s)}, "
            f"min_headroom {headroom}"
        )


def _settings_error(problems: list[ConfigError]) -> ConfigError:
    """One error naming every bad value (one alone as it is); ``problems`` keeps each."""
    if len(problems) == 1:
        error = problems[0]
    else:
        listed = "; ".join(f"{number}) {problem}" for number, problem in enumerate(problems, 1))
        error = ConfigError(
            f"{len(problems)} values are not valid: {listed}", fix="correct each value listed"
        )
    error.problems = tuple(problems)  # type: ignore[attr-defined]
    return error
