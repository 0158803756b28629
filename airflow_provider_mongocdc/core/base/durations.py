"""Durations as users write them in settings: seconds (a number) or a number with a unit,
``"90s"``, ``"5m"`` (or ``"5min"``), ``"2h"``, ``"1d"``."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError

_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(min|[smhd])\s*$")


def parse_duration(value: Any, what: str) -> float:
    """Seconds from a number of seconds or ``"<number><s|m|h|d>"``; a ConfigError naming ``what``."""
    seconds: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str):
        match = _DURATION.match(value)
        if match:
            seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(
            f"{what} must be a duration, got {value!r}",
            fix=f'give {what} as seconds (e.g. 90) or with a unit: "90s", "5m", "2h" or "1d"',
        )
    return seconds


def settings_fields(
    value: Any, name: str, keys: Mapping[str, str], kind: str, example: str
) -> dict[str, Any]:
    """The fields of a settings object of a connector list entry (``"changes"``, ``"open"``): its
    keys (every one optional, ``None`` for all defaults) renamed by ``keys``; anything but a JSON
    object, or an unknown key, is a :class:`ConfigError` naming ``name``."""
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(
            f"'{name}' must be a JSON object of {kind}, got {value!r}",
            fix=f"give e.g. {example}, or {{}} for the defaults",
        )
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise ConfigError(
            f"unknown key(s) {', '.join(unknown)} in '{name}'", fix=f"use only {', '.join(keys)}"
        )
    return {keys[key]: item for key, item in value.items()}
