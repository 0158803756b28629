"""How far and how long a stream window reads (:class:`WindowParams`), and the window's times.

A window ends at the cluster time ``Timestamp(<whole seconds of window_end>, 0)``
(:func:`end_timestamp`); the idle timeout is at least :data:`MIN_IDLE_TIMEOUT_S`, twice MongoDB's
longest periodic no-op interval (docs/design.md, "Stream windows"). An open window
(:class:`OpenSettings`) reads on past its end while changes keep coming (docs/design.md, "Open
windows").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_provider_mongocdc.core.base.durations import parse_duration, settings_fields
from airflow_provider_mongocdc.core.base.errors import ConfigError
from airflow_provider_mongocdc.core.base.timefmt import iso_z, parse_iso
from airflow_provider_mongocdc.core.config.connector import ConnectorConfig

# bson is imported where a cluster time is made or read: the window operator checks its open window
# settings (OpenSettings) when a DAG file is parsed, which needs no bson.
if TYPE_CHECKING:
    from bson.timestamp import Timestamp

DEFAULT_IDLE_TIMEOUT_S = 30.0
# MongoDB's periodicNoopIntervalSecs: an idle primary writes a no-op to its oplog this often (the
# default, and the largest value the server accepts), which moves the cluster time and the PBRT.
MONGODB_NOOP_INTERVAL_S = 10
# The shortest idle timeout accepted: twice the no-op interval, so a quiet but healthy server
# always shows progress before the window gives up.
MIN_IDLE_TIMEOUT_S = 2.0 * MONGODB_NOOP_INTERVAL_S
DEFAULT_MAX_DURATION_S = 3600.0
DEFAULT_POLL_MS = 1000
# Kafka Connect's offset.flush.interval.ms default: a batch is committed at least this often, so
# that no Kafka transaction stays open near the broker's transaction timeout.
DEFAULT_COMMIT_INTERVAL_S = 60.0
# Open windows: closed after this long without a change, at the latest after this long open (below
# the hourly clock and the window task's 55 min execution_timeout of the example DAGs), and
# committed at least this often while changes come.
DEFAULT_OPEN_IDLE_S = 30.0
DEFAULT_MAX_OPEN_S = 50 * 60.0
DEFAULT_OPEN_COMMIT_INTERVAL_S = 1.0
# The commit interval an open window accepts: shorter costs a Kafka transaction per change burst
# for nothing, longer than Kafka Connect's offset flush interval (the bounded windows' interval).
MIN_OPEN_COMMIT_INTERVAL_S = 0.1
MAX_OPEN_COMMIT_INTERVAL_S = DEFAULT_COMMIT_INTERVAL_S
# The keys of the "open" object of a connector list entry's window_schedule (and of the operator's
# open_window), and the settings' fields they set.
OPEN_KEYS = {"idle": "idle_s", "max_open": "max_open_s", "commit_interval": "commit_interval_s"}


def parse_time(value: Any) -> datetime:
    """An aware UTC datetime from an ISO-8601 text (``Z`` allowed), a datetime or a cluster time
    (its whole seconds)."""
    from bson.timestamp import Timestamp

    if isinstance(value, Timestamp):
        parsed = datetime.fromtimestamp(value.time, timezone.utc)
    elif isinstance(value, datetime):
        parsed = value
    else:
        try:
            parsed = parse_iso(str(value).strip())
        except ValueError:
            parsed = None
        if parsed is None:
            raise ConfigError(
                f"The window end {value!r} is not an ISO-8601 time",
                fix="pass window_end like 2024-05-01T10:00:00Z",
            )
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def end_timestamp(window_end: datetime) -> Timestamp:
    """The cluster time a window ends at: the whole second of ``window_end``, increment 0 (every
    change has an increment of 1 or more, so none sits exactly on it)."""
    from bson.timestamp import Timestamp

    return Timestamp(int(math.floor(window_end.timestamp())), 0)


def _open_settings_error(problems: list[ConfigError]) -> ConfigError:
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


@dataclass(frozen=True)
class OpenSettings:
    """How an open window stays open (durations in seconds, or texts like ``"30s"``, ``"50min"``).

    ``idle_s``: it closes when no change came for this long; ``max_open_s``: it closes (at the next
    point between MongoDB transactions) after this long open; ``commit_interval_s``: it commits
    what it read at least this often while changes come (events and offset in one Kafka
    transaction), which is about its latency."""

    idle_s: float = DEFAULT_OPEN_IDLE_S
    max_open_s: float = DEFAULT_MAX_OPEN_S
    commit_interval_s: float = DEFAULT_OPEN_COMMIT_INTERVAL_S

    def __post_init__(self) -> None:
        """Checks every value; one ConfigError names each bad one (``problems``: their errors)."""
        problems: list[ConfigError] = []
        labels = {field: key for key, field in OPEN_KEYS.items()}
        parsed: dict[str, float] = {}
        for name in ("idle_s", "max_open_s", "commit_interval_s"):
            try:
                seconds = parse_duration(getattr(self, name), labels[name])
            except ConfigError as error:
                problems.append(error)
                continue
            object.__setattr__(self, name, seconds)
            if name == "commit_interval_s" and not (
                MIN_OPEN_COMMIT_INTERVAL_S <= seconds <= MAX_OPEN_COMMIT_INTERVAL_S
            ):
                problems.append(
                    ConfigError(
                        f"commit_interval must lie between {MIN_OPEN_COMMIT_INTERVAL_S:g} s and "
                        f"{MAX_OPEN_COMMIT_INTERVAL_S:g} s, got {seconds:g} s",
                        cause="an open window commits at least this often while changes come: it is "
                        "about the latency of a change",
                        fix=f'leave it out (default {DEFAULT_OPEN_COMMIT_INTERVAL_S:g} s) or give e.g. "1s"',
                    )
                )
            elif seconds <= 0:
                example = {"idle_s": '"30s"', "max_open_s": '"50min"'}[name]
                problems.append(
                    ConfigError(
                        f"{labels[name]} must be longer than 0",
                        fix=f"leave {labels[name]} out for its default, or give e.g. {example}",
                    )
                )
            else:
                parsed[name] = seconds
        if "idle_s" in parsed and "max_open_s" in parsed and self.idle_s > self.max_open_s:
            problems.append(
                ConfigError(
                    f"idle ({self.idle_s:g} s) is longer than max_open ({self.max_open_s:g} s)",
                    fix='give an idle time shorter than the maximum open time, e.g. {"idle": "30s", '
                    '"max_open": "50min"}',
                )
            )
        if problems:
            raise _open_settings_error(problems)

    @classmethod
    def from_entry(cls, value: Any) -> OpenSettings:
        """From the ``"open"`` object of a connector list entry's ``window_schedule`` or the
        operator's ``open_window`` (every key optional; ``{}`` or ``true``: the defaults)."""
        if isinstance(value, OpenSettings):
            return value
        example = '{"idle": "30s", "max_open": "50min", "commit_interval": "1s"}'
        return cls(
            **settings_fields(None if value is True else value, "open", OPEN_KEYS, "durations", example)
        )

    def to_entry(self) -> dict[str, float]:
        """As the ``"open"`` object (seconds)."""
        return {key: getattr(self, field) for key, field in OPEN_KEYS.items()}

    def to_params(self) -> dict[str, float]:
        """The window parameters (:class:`WindowParams`) of an open window with these settings."""
        return {
            "open_idle_s": self.idle_s,
            "max_open_s": self.max_open_s,
            "commit_interval_s": self.commit_interval_s,
        }

    def describe(self) -> str:
        return (
            f"closed after {self.idle_s:g} s without a change or {self.max_open_s:g} s open, "
            f"committed every {self.commit_interval_s:g} s"
        )


@dataclass(frozen=True)
class WindowParams:
    """How far and how long a window reads.

    ``window_end``: where it stops (see :func:`end_timestamp`); ``idle_timeout_s``: stop after
    this long without a change or PBRT progress (at least :data:`MIN_IDLE_TIMEOUT_S`; with the
    end in the past the window then fails, see docs/design.md); ``max_duration_s``:
    stop (at the next point between transactions) after this long; ``poll_ms``: the server's
    wait for new changes per request (``max_await_time_ms``; ``cursor.max.await.time.ms`` when
    set); ``commit_interval_s``: commit the batch at least this often (at a point between
    transactions), even when it holds fewer than ``max.batch.size`` events. ``open_idle_s``: an
    open window (None: a bounded one), which reads on past ``window_end`` and closes when no change
    came for this long, or at the latest after ``max_open_s`` (:class:`OpenSettings`).
    """

    window_end: datetime
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    poll_ms: int = DEFAULT_POLL_MS
    commit_interval_s: float = DEFAULT_COMMIT_INTERVAL_S
    # Whether the window works on a requested incremental snapshot after streaming (only when the
    # connector reads one stream: the chunks are de-duplicated against that stream).
    incremental_snapshots: bool = True
    # Whether a window of one stream runs it in the application's driver process instead of a
    # Spark task (no SparkContext, no Python worker; windows of several streams always use tasks).
    stream_in_driver: bool = False
    # The run's id in the events' __debezium.context.runId header (core/events/headers.py): the
    # application sets one for all its streams; None: each stream's window makes its own.
    run_id: str | None = None
    # The Airflow task instance the window runs for (``dag/run/task``, the same for all its tries;
    # None: not run by a task): each commit records what its tries committed, so that a retry
    # counts the events of the tries before it (core/window/batch.py).
    task_run: str | None = None
    # An open window: closed after this long without a change (None: a bounded window) or after
    # max_open_s open.
    open_idle_s: float | None = None
    max_open_s: float = DEFAULT_MAX_OPEN_S

    def __post_init__(self) -> None:
        object.__setattr__(self, "window_end", parse_time(self.window_end))
        if self.open_idle_s is not None:
            OpenSettings(self.open_idle_s, self.max_open_s, self.commit_interval_s)  # the same checks
        for name in ("idle_timeout_s", "max_duration_s", "commit_interval_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(
                    f"The window parameter {name}={value!r} is invalid",
                    fix=f"give {name} as a number of seconds greater than 0",
                )
        if self.idle_timeout_s < MIN_IDLE_TIMEOUT_S:
            raise ConfigError(
                f"The window parameter idle_timeout_s={self.idle_timeout_s!r} is too short",
                cause="an idle MongoDB replica set moves its cluster time only by the no-op it writes to "
                f"its oplog every {MONGODB_NOOP_INTERVAL_S} s (periodicNoopIntervalSecs), so a window "
                "would give up before the cluster time passes an end that has already passed",
                fix=f"give idle_timeout_s (the operator's idle_timeout) at least {MIN_IDLE_TIMEOUT_S:g} s, "
                f"or leave the default ({DEFAULT_IDLE_TIMEOUT_S:g} s)",
            )
        if not isinstance(self.stream_in_driver, bool):
            raise ConfigError(
                f"The window parameter stream_in_driver={self.stream_in_driver!r} is invalid",
                fix="give stream_in_driver as true or false (the operator's stream_in_driver also takes 'auto')",
            )
        if isinstance(self.poll_ms, bool) or not isinstance(self.poll_ms, int) or self.poll_ms <= 0:
            raise ConfigError(
                f"The window parameter poll_ms={self.poll_ms!r} is invalid",
                fix="give poll_ms as a whole number of milliseconds greater than 0",
            )

    @property
    def end(self) -> Timestamp:
        return end_timestamp(self.window_end)

    @property
    def open(self) -> bool:
        """Whether this is an open window."""
        return self.open_idle_s is not None

    @classmethod
    def from_params(cls, params: Mapping[str, Any], config: ConnectorConfig | None = None) -> WindowParams:
        """From a job spec's ``params`` (``window_end`` required)."""
        if not params.get("window_end"):
            raise ConfigError(
                "The stream window has no end",
                cause="the job parameters lack window_end",
                fix="start the window through MongoStreamWindowOperator, or pass "
                "window_end as an ISO-8601 time",
            )
        poll = params.get("poll_ms")
        if poll is None:
            poll = (
                config.cursor_max_await_time_ms
                if config is not None and config.cursor_max_await_time_ms
                else DEFAULT_POLL_MS
            )
        return cls(
            window_end=parse_time(params["window_end"]),
            idle_timeout_s=float(params.get("idle_timeout_s") or DEFAULT_IDLE_TIMEOUT_S),
            max_duration_s=float(params.get("max_duration_s") or DEFAULT_MAX_DURATION_S),
            poll_ms=int(poll),
            commit_interval_s=float(params.get("commit_interval_s") or DEFAULT_COMMIT_INTERVAL_S),
            incremental_snapshots=bool(params.get("incremental_snapshots", True)),
            stream_in_driver=params.get("stream_in_driver", False),
            run_id=params.get("run_id") or None,
            task_run=params.get("task_run") or None,
            open_idle_s=float(params["open_idle_s"]) if params.get("open_idle_s") is not None else None,
            max_open_s=float(params.get("max_open_s") or DEFAULT_MAX_OPEN_S),
        )

    def to_params(self) -> dict[str, Any]:
        return {
            "window_end": iso_z(self.window_end),
            "idle_timeout_s": self.idle_timeout_s,
            "max_duration_s": self.max_duration_s,
            "poll_ms": self.poll_ms,
            "commit_interval_s": self.commit_interval_s,
            "incremental_snapshots": self.incremental_snapshots,
            "stream_in_driver": self.stream_in_driver,
            "run_id": self.run_id,
            "task_run": self.task_run,
            "open_idle_s": self.open_idle_s,
            "max_open_s": self.max_open_s,
        }
