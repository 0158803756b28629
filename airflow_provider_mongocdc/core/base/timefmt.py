"""Times as the connector writes and reads them: ISO-8601 in UTC with a ``Z``
(``2024-05-01T12:00:00Z``, microseconds when there are some).

A naive datetime is taken as UTC (pymongo and the offsets store hand out naive UTC times); an aware
one is converted to UTC. Both functions let None through.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def iso_z(value: datetime | None) -> str | None:
    """``value`` as ``2024-05-01T12:00:00Z``, or None."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=timezone.utc)
    return value.astimezone(timezone.utc).isoformat().replace("+00:00", "Z")


def parse_iso(value: Any) -> datetime | None:
    """An ISO-8601 text (``Z`` or an offset; none means UTC) as an aware datetime; None for None or "".

    Raises ValueError for a text that is not ISO-8601.
    """
    if value is None or value == "":
        return None
    parsed = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)
