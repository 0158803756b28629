"""True or false from what users write: a bool, or one of the words true/1/yes/on, false/0/no/off
(any case, blanks around). Anything else is a :class:`ConfigError` naming the setting."""

from __future__ import annotations

from typing import Any

from airflow_provider_mongocdc.core.base.errors import ConfigError

TRUE_WORDS = frozenset({"true", "1", "yes", "on"})
FALSE_WORDS = frozenset({"false", "0", "no", "off"})
_GOT = object()  # the default cause: "got <value>"


def parse_bool(
    value: Any,
    name: str,
    *,
    problem: str | None = None,
    cause: str | None | object = _GOT,
    fix: str | None = None,
) -> bool:
    """``value`` as True or False.

    Otherwise raises ConfigError: ``problem`` (default ``"<name> must be true or false"``), ``cause``
    (default ``"got <value>"``; None for none) and ``fix`` (default ``"set <name> to true or false"``).
    """
    if isinstance(value, bool):
        return value
    word = str(value).strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ConfigError(
        problem or f"{name} must be true or false",
        cause=f"got {value!r}" if cause is _GOT else cause,
        fix=fix or f"set {name} to true or false",
    )
